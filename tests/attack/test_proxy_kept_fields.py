"""The proxy keeps the header lines it writes for the upstream when a client repeats
its fields (nestgate.handlers.proxy.handler `_head`): a cache, so it must be bounded
against clients that never repeat themselves, and keyed so that one client's lines
are never sent for another."""

from __future__ import annotations

import os
import socket

import pytest
from rawupstream import RawUpstream, proxy_toml

REQUESTS = 3000
PAD_BYTES = 6000                     # under the 8 KB field line limit, over what is kept
RSS_GROWTH_BOUND_KIB = 8 * 1024


@pytest.fixture
def gateway(start_server):
    upstream = RawUpstream()
    server = start_server(proxy_toml(upstream.url))
    yield server, upstream
    upstream.stop()


def _answers(sock: socket.socket, count: int) -> int:
    """Read `count` answers of the raw upstream (its body is the target): how many
    were 200."""
    got, data = 0, b""
    while got < count:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, "the gateway closed the connection"
            data += chunk
        head, _, data = data.partition(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        while len(data) < length:
            data += sock.recv(65536)
        data = data[length:]
        got += head.startswith(b"HTTP/1.1 200")
    return got


def test_never_repeated_large_fields_keep_the_worker_flat(gateway):
    server, upstream = gateway
    sock = socket.create_connection(("127.0.0.1", server.port()), timeout=30)
    sock.sendall(b"GET /warm HTTP/1.1\r\nHost: app.test\r\n\r\n")
    assert _answers(sock, 1) == 1
    base = server.worker_rss_kib()
    batch, ok = 10, 0
    for start in range(0, REQUESTS, batch):
        if start % 500 == 0:            # under keepalive_requests (1,000, as nginx's)
            sock.close()
            sock = socket.create_connection(("127.0.0.1", server.port()), timeout=30)
        sock.sendall(b"".join(
            b"GET /r HTTP/1.1\r\nHost: app.test\r\nX-Pad: %s\r\n\r\n"
            % os.urandom(PAD_BYTES // 2).hex().encode() for _ in range(batch)))
        ok += _answers(sock, batch)
    sock.close()
    grown = server.worker_rss_kib() - base
    print(f"{REQUESTS} requests with distinct {PAD_BYTES}-byte fields: worker RSS "
          f"+{grown / 1024:.1f} MiB")
    assert ok == REQUESTS
    assert grown < RSS_GROWTH_BOUND_KIB
    upstream.take()


def test_the_same_fields_from_two_clients_name_each_client(gateway):
    server, upstream = gateway
    request = b"GET /who HTTP/1.1\r\nHost: app.test\r\nAccept: */*\r\n\r\n"
    for source in ("127.0.0.1", "127.0.0.2", "127.0.0.1", "127.0.0.2"):
        with socket.create_connection(("127.0.0.1", server.port()), timeout=10,
                                      source_address=(source, 0)) as sock:
            sock.sendall(request)
            assert _answers(sock, 1) == 1
    seen = [dict(r["headers"]).get("x-forwarded-for") for r in upstream.take()]
    assert seen == ["127.0.0.1", "127.0.0.2", "127.0.0.1", "127.0.0.2"], seen
