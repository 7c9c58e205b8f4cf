"""Many addresses from a refused country: a botnet's spread of sources (here through a
trusted proxy's X-Forwarded-For, the cheapest way to have many) is refused with the
403 page naming the country, none of it reaches the upstream, and the worker does not
grow with the addresses: the per-address lookups are a bounded memo (16,384 entries,
emptied when full: tests/test_geoip.py shows the bound) and the 403 pages another (64).
"""

from __future__ import annotations

import socket
import time

from mmdb_writer import MMDBWriter
from netaddr import IPSet

ADDRESSES = 5_000
BATCH = 200                         # requests pipelined per write
RSS_GROWTH_BOUND_KIB = 8 * 1024


def test_a_refused_country_from_many_addresses(start_server, upstream, tmp_path):
    database = tmp_path / "country.mmdb"
    writer = MMDBWriter(ip_version=6, database_type="GeoLite2-Country", ipv4_compatible=True)
    writer.insert_network(IPSet(["100.64.0.0/10"]), {"country": {"iso_code": "XA"}})
    writer.insert_network(IPSet(["198.51.100.0/24"]), {"country": {"iso_code": "DE"}})
    writer.to_db_file(str(database))
    up = upstream()
    server = start_server(f"""
[server]
workers = 1

[client_ip]
trusted_proxies = ["127.0.0.1/32"]

[geoip]
database = "{database}"

[[listen]]
address = "127.0.0.1:0"

[[site]]
hosts = ["*"]
deny_countries = ["XA"]

[[site.route]]
prefix = "/"
type = "proxy"
upstream = "{up.url}"
""")
    mark = b"HTTP/1.1 403 "
    with socket.create_connection(("127.0.0.1", server.port()), timeout=10) as conn:
        conn.sendall(b"GET /hi HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 198.51.100.7\r\n\r\n"
                     b"GET /hi HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 100.64.0.1\r\n\r\n")
        first = b""
        while b"</html>" not in first:
            first += conn.recv(65536)
        assert first.startswith(b"HTTP/1.1 200 ")
        assert b"<code>100.64.0.1</code>, in country <code>XA</code>" in first
    assert len(up.requests) == 1
    before = server.worker_rss_kib()
    deadline = time.monotonic() + 90
    answered = 0
    for start in range(0, ADDRESSES, BATCH):
        with socket.create_connection(("127.0.0.1", server.port()), timeout=10) as conn:
            conn.sendall(b"".join(
                b"GET /hi HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 100.%d.%d.%d\r\n\r\n"
                % (64 + (n >> 16 & 63), n >> 8 & 255, n & 255)
                for n in range(start, start + BATCH)))
            pending = b""
            while answered < start + BATCH:
                assert time.monotonic() < deadline, "the worker fell behind"
                chunk = conn.recv(1 << 20)
                assert chunk, "the connection closed"
                pending += chunk
                answered += pending.count(mark)
                pending = pending[-(len(mark) - 1):]
    assert answered == ADDRESSES
    assert len(up.requests) == 1                  # the German visitor's, nothing since
    grown = server.worker_rss_kib() - before
    assert grown < RSS_GROWTH_BOUND_KIB, f"worker grew {grown} KiB"
