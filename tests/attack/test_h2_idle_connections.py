"""Many idle HTTP/2 connections: a client opens 1,000 TLS connections, sends the
preface and SETTINGS on each and then nothing. The worker must hold them cheaply
(under 30 MB more resident memory, read from /proc) and go on answering others."""

from __future__ import annotations

import socket
import ssl
import struct

import pytest
from hyperframe.frame import SettingsFrame

from conftest import tls_hello_config
from h2client import H2Client

pytestmark = pytest.mark.attack

CONNECTIONS = 1000
BUDGET_KIB = 30 * 1024
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"



def _open(port: int, ctx: ssl.SSLContext) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    tls = ctx.wrap_socket(raw, server_hostname="localhost")
    tls.sendall(PREFACE + SettingsFrame(0).serialize())
    return tls


def _first_frame_type(tls: ssl.SSLSocket) -> int:
    head = b""
    while len(head) < 9:
        chunk = tls.recv(9 - len(head))
        assert chunk, "the server closed an idle connection"
        head += chunk
    return struct.unpack(">IBI", head)[0] & 0xFF


def test_a_thousand_idle_h2_connections_cost_under_30_mb(start_server, certs):
    server = start_server(tls_hello_config(
        certs, 'max_connections = 2000\nkeepalive_timeout = "120s"'))
    port = server.port("https")
    ctx = ssl.create_default_context(cafile=certs["ca"])
    ctx.set_alpn_protocols(["h2"])
    warm = H2Client(port, certs["ca"])             # the first connection's one-time costs
    assert warm.request("GET", "/hello")[0] == 200
    before = server.worker_rss_kib()
    idle = []
    try:
        for _ in range(CONNECTIONS):
            idle.append(_open(port, ctx))
        for tls in idle:
            assert _first_frame_type(tls) == 0x4       # the server's SETTINGS
        added = server.worker_rss_kib() - before
        print(f"{CONNECTIONS} idle HTTP/2 connections: {added} KiB")
        assert added < BUDGET_KIB, f"{added} KiB for {CONNECTIONS} idle connections"
        assert warm.request("GET", "/hello")[0] == 200
        fresh = H2Client(port, certs["ca"])
        status, _headers, body = fresh.request("GET", "/hello")
        assert (status, body) == (200, b"hello\n")
        fresh.close()
    finally:
        for tls in idle:
            tls.close()
        warm.close()
