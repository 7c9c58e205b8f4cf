"""Refused from many addresses: every built-in 403 page names the address it refused,
so each distinct address makes a ready page of its own. They are kept in a bounded
memo (64 pages, emptied when full; with 1,024 this test measured +34 MB), so an
attacker who cycles source addresses (here through a trusted proxy's X-Forwarded-For,
the cheapest way to have many) cannot grow the worker with them.
"""

from __future__ import annotations

import socket
import time

ADDRESSES = 20_000
BATCH = 200                         # requests pipelined per write
RSS_GROWTH_BOUND_KIB = 12 * 1024

CONFIG = """
[server]
workers = 1

[client_ip]
trusted_proxies = ["127.0.0.1/32"]

[[listen]]
address = "127.0.0.1:0"

[[site]]
hosts = ["*"]
allow = ["10.0.0.0/8"]

[[site.route]]
path = "/"
type = "return"
body = "private"
"""


def test_pages_for_many_refused_addresses_stay_bounded(start_server):
    server = start_server(CONFIG)
    mark = b"HTTP/1.1 403 "
    with socket.create_connection(("127.0.0.1", server.port()), timeout=10) as conn:
        conn.sendall(b"GET / HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 198.51.100.7\r\n\r\n")
        first = b""
        while b"</html>" not in first:
            first += conn.recv(65536)
        assert first.startswith(mark) and b"<code>198.51.100.7</code>" in first
    before = server.worker_rss_kib()
    deadline = time.monotonic() + 60
    answered = 0
    for start in range(0, ADDRESSES, BATCH):
        # A connection per batch: keepalive_requests (1,000) ends a connection sooner.
        with socket.create_connection(("127.0.0.1", server.port()), timeout=10) as conn:
            conn.sendall(b"".join(
                b"GET / HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 10%d.%d.%d.%d\r\n\r\n"
                % (n >> 24 & 7, n >> 16 & 255, n >> 8 & 255, n & 255)
                for n in range(start, start + BATCH)))
            pending = b""
            while answered < start + BATCH:
                assert time.monotonic() < deadline, "the worker fell behind"
                chunk = conn.recv(1 << 20)
                assert chunk, "the connection closed"
                pending += chunk
                answered += pending.count(mark)
                pending = pending[-(len(mark) - 1):]    # a mark cut in two is found next
    assert answered == ADDRESSES
    grown = server.worker_rss_kib() - before
    assert grown < RSS_GROWTH_BOUND_KIB, f"worker grew {grown} KiB"
