"""Slow HTTP/2 heads (slowloris over h2): a client that completes the TLS handshake and
never sends the connection preface, or begins a header block and trickles its
CONTINUATION frames so that bytes keep arriving, is cut off after `header_timeout`
with GOAWAY(ENHANCE_YOUR_CALM), counted, while others are served."""

from __future__ import annotations

import socket
import ssl
import time

import pytest
from conftest import h2_protections, poll, tls_hello_config
from h2raw import PREFACE, ContinuationFrame, HeadersFrame, RawH2, SettingsFrame, get

pytestmark = pytest.mark.attack

ENHANCE_YOUR_CALM = 0xB
HEADER_TIMEOUT_S = 1.0



@pytest.fixture
def server(start_server, certs):
    return start_server(tls_hello_config(
        certs, 'header_timeout = "1s"\nkeepalive_timeout = "60s"'))


def _closed_within(sock: ssl.SSLSocket, seconds: float) -> tuple[float | None, bytes]:
    """Read until the server closes: when (None if it did not), and what it sent."""
    sock.settimeout(0.2)
    start, data = time.monotonic(), b""
    while time.monotonic() - start < seconds:
        try:
            chunk = sock.recv(65536)
        except (TimeoutError, ssl.SSLWantReadError):
            continue
        except OSError:
            chunk = b""
        if not chunk:
            return time.monotonic() - start, data
        data += chunk
    return None, data


def _goaway_code(data: bytes) -> int | None:
    pos = 0
    while pos + 9 <= len(data):
        length, kind = int.from_bytes(data[pos:pos + 3], "big"), data[pos + 3]
        if kind == 0x7:
            return int.from_bytes(data[pos + 13:pos + 17], "big")
        pos += 9 + length
    return None


def test_a_preface_that_never_comes_is_cut_off(server, certs):
    ctx = ssl.create_default_context(cafile=certs["ca"])
    ctx.set_alpn_protocols(["h2"])
    raw = socket.create_connection(("127.0.0.1", server.port("https")), timeout=5)
    tls = ctx.wrap_socket(raw, server_hostname="localhost")
    took, data = _closed_within(tls, HEADER_TIMEOUT_S + 4)
    tls.close()
    assert took is not None and took < HEADER_TIMEOUT_S + 2, took
    assert _goaway_code(data) == ENHANCE_YOUR_CALM
    counted = poll(lambda: h2_protections(server), lambda c: c.get("header_timeout", 0) >= 1)
    assert counted["header_timeout"] >= 1


def test_a_trickled_header_block_is_cut_off_and_others_are_served(server, certs):
    port = server.port("https")
    slow = RawH2(port, certs["ca"])
    # The server's SETTINGS read and acknowledged first: nothing may come between the
    # frames of a header block (the acknowledgement would, a protocol error).
    assert slow.wait(lambda: slow.received >= 1, timeout=5)
    block = slow.block(get())
    stream = slow.new_stream()
    slow.send(HeadersFrame(stream, block[:1], flags={"END_STREAM"}))
    start = time.monotonic()
    goaway_at = None
    for byte in block[1:-1] * 20:           # one byte every 0.1 s, never the end
        slow.send(ContinuationFrame(stream, bytes([byte])))
        slow.pump(0.1)
        if slow.goaway is not None or slow.closed:
            goaway_at = time.monotonic() - start
            break
        if time.monotonic() - start > HEADER_TIMEOUT_S + 3:
            break
    # Meanwhile and after, another client is answered.
    other = RawH2(port, certs["ca"])
    answer = other.answers([other.request(get(b"/hello"))])
    assert [a.status for a in answer.values()] == [200]
    other.close()
    slow.wait(lambda: slow.goaway is not None, timeout=1)
    slow.close()
    assert goaway_at is not None and goaway_at < HEADER_TIMEOUT_S + 2, goaway_at
    assert slow.goaway.error_code == ENHANCE_YOUR_CALM
    counted = poll(lambda: h2_protections(server), lambda c: c.get("header_timeout", 0) >= 1)
    assert counted["header_timeout"] >= 1
