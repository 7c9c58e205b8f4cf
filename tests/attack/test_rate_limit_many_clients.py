"""Rate limits against an attacker with many addresses: 60,000 distinct clients
(through a trusted proxy's X-Forwarded-For, the cheapest way to have many) each
spend their burst on a limited site. The limit's state is a fixed table in shared
memory, so the worker does not grow with them; a client whose entry was taken by
others starts afresh (the limit fails open for it, never locks it out); and an
ordinary client is still limited as configured afterwards.
"""

from __future__ import annotations

import socket
import time

import pytest

CLIENTS = 60_000
BATCH = 250                         # requests pipelined per connection
# Measured: +7.5 MB after the first 30,000 clients (the table's 2 MiB of shared pages
# touched, and the heap the pipelined reads use), then 0 to 2 MiB more (the allocator
# extending its heap by a step once is not per client). A leak of 100 bytes per client
# would add 3 MB in the second half.
RSS_GROWTH_BOUND_KIB = 12 * 1024
SECOND_HALF_BOUND_KIB = 2560

CONFIG = """
[server]
workers = 1

[client_ip]
trusted_proxies = ["127.0.0.1/32"]

[[listen]]
address = "127.0.0.1:0"

[[site]]
hosts = ["*"]
rate_limit = { rate = "1/m", burst = 3 }

[[site.route]]
path = "/"
type = "return"
body = "ok"
"""


def _ask(port: int, addresses: list[str]) -> list[int]:
    """One request from each address, pipelined on one connection: their statuses."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(b"".join(b"GET / HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: %s\r\n\r\n"
                              % a.encode() for a in addresses))
        data = b""
        deadline = time.monotonic() + 30
        while data.count(b"HTTP/1.1 ") < len(addresses):
            assert time.monotonic() < deadline, "the worker fell behind"
            chunk = conn.recv(1 << 20)
            assert chunk, "connection closed early"
            data += chunk
    return [int(part[:3]) for part in data.split(b"HTTP/1.1 ")[1:]]


@pytest.mark.attack
def test_many_limited_clients_leave_the_worker_as_it_was(start_server):
    server = start_server(CONFIG)
    port = server.port()
    assert _ask(port, ["192.0.2.1"] * 5) == [200, 200, 200, 429, 429]
    before = server.worker_rss_kib()
    addresses = [f"10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}" for n in range(CLIENTS)]
    halfway = 0
    for start in range(0, CLIENTS, BATCH):
        statuses = _ask(port, addresses[start:start + BATCH])
        assert set(statuses) == {200}                 # each new client's first request
        if start + BATCH == CLIENTS // 2:
            halfway = server.worker_rss_kib()
    grown = server.worker_rss_kib() - before
    assert grown < RSS_GROWTH_BOUND_KIB, f"the worker grew {grown} KiB"
    # Twice the clients, not twice the memory: the second 30,000 add nothing to speak of.
    assert server.worker_rss_kib() - halfway < SECOND_HALF_BOUND_KIB
    # Limiting goes on as configured for a client the flood did not touch.
    assert _ask(port, ["198.51.100.9"] * 5) == [200, 200, 200, 429, 429]
