"""`nestgate.wire.tlssocket`: TLS on the socket itself, as the transport asyncio protocols
expect. A real uvloop server (accepting in clear and adopting the descriptor, as
`proxytls.TLSHandshake` does) and real TLS clients in threads, with trustme's
certificates."""

from __future__ import annotations

import socket
import ssl
import time

import pytest

from tlsserver import Server


@pytest.fixture
def server(certs):
    started = Server(certs)
    yield started
    started.stop()


def _client(server, certs, alpn=("h2",)):
    ctx = ssl.create_default_context(cafile=certs["ca"])
    ctx.set_alpn_protocols(list(alpn))
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    return ctx.wrap_socket(raw, server_hostname="localhost")


def _read_until(tls, end: bytes, limit: int = 1 << 24) -> bytes:
    """Until `data` ends with `end` (b"": until `limit` bytes) or the stream ends."""
    data = b""
    while not (end and data.endswith(end)) and len(data) < limit:
        chunk = tls.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def _wait_for(check, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.01)
    return False


def test_echo_alpn_and_a_clean_close(server, certs):
    with _client(server, certs) as tls:
        tls.sendall(b"hello\nworld\n")
        assert _read_until(tls, b"WORLD\n") == b"HELLO\nWORLD\n"
        tls.sendall(b"bye\n")
        assert _read_until(tls, b"BYE\n") == b"BYE\n"
        assert tls.recv(100) == b""               # close_notify, then the close
    protocol = server.protocols[0]
    assert protocol.alpn == "h2"
    assert _wait_for(lambda: protocol.lost == "clean")


def test_a_big_write_to_a_slow_reader_pauses_then_resumes_and_arrives_whole(server, certs):
    size = 8 * 1024 * 1024
    with _client(server, certs) as tls:
        tls.sendall(b"big %d\n" % size)
        time.sleep(0.5)                           # the socket buffers fill: write waits
        protocol = server.protocols[0]
        assert protocol.paused == 1
        assert protocol.transport.get_write_buffer_size() > 0
        got = len(_read_until(tls, b"", limit=size))
        assert got == size
        assert _wait_for(lambda: protocol.resumed == protocol.paused >= 1)
        assert protocol.transport.get_write_buffer_size() == 0
        tls.sendall(b"after\n")                   # the connection goes on
        assert _read_until(tls, b"AFTER\n") == b"AFTER\n"


def test_pause_reading_holds_bytes_until_resumed(server, certs):
    with _client(server, certs) as tls:
        tls.sendall(b"pause\n")
        time.sleep(0.05)
        start = time.monotonic()
        tls.sendall(b"late\n")
        assert _read_until(tls, b"LATE\n") == b"LATE\n"
        assert time.monotonic() - start >= 0.2     # read only after resume_reading


def test_client_eof_and_abrupt_reset_end_the_connection(server, certs):
    tls = _client(server, certs)
    tls.sendall(b"one\n")
    assert _read_until(tls, b"ONE\n") == b"ONE\n"
    tls.unwrap().close()                          # close_notify, then FIN
    assert _wait_for(lambda: server.protocols[0].lost is not None)
    assert server.protocols[0].eof
    raw = _client(server, certs)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    raw.close()                                   # RST
    assert _wait_for(lambda: len(server.protocols) == 2 and server.protocols[1].lost)


def test_a_client_that_is_not_tls_fails_the_handshake(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw:
        raw.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            data = raw.recv(100)                  # an alert record (0x15), or the close
        except ConnectionResetError:
            data = b""                            # closed with our bytes unread: a reset
        assert data == b"" or data[:1] == b"\x15"
        assert _wait_for(lambda: server.stages and server.stages[0].outcome == "failed")
    assert server.protocols[0].lost is None       # the protocol never began


def test_abort_during_the_handshake_reports_failure(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=5):
        assert _wait_for(lambda: server.stages)
        stage = server.stages[0]
        server.loop.call_soon_threadsafe(stage.transport.abort)
        assert _wait_for(lambda: stage.outcome == "failed")
