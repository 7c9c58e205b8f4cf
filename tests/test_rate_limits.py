"""Rate limits per client and connection limits per client, on real servers with two
workers: the limit holds for the whole server, a refused request gets 429 with
Retry-After (a page or JSON by Accept), other clients are unaffected, and the refusals
are counted in the metrics. The shared table itself is tested directly."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from conftest import _env, poll
from conftest import RATE_LIMIT_SITE, _load, get_from, poll, scrape

from nestgate.base.errorpages import DEFAULT_PAGES
from nestgate.pipeline.ratelimit import Limited, RateTable, client_key, parse_rate, rate_limit_from
from nestgate.base.responses import Prebuilt


def config(site: str = "", route: str = "", listen: str = "") -> str:
    return RATE_LIMIT_SITE.format(site=site, route=route, listen=listen)


# ---------------------------------------------------------------- the table and config
def test_gcra_lets_the_burst_through_then_the_rate():
    table = RateTable(entries=1024)
    interval, tolerance = 0.1, 19 * 0.1            # 10/s, burst 20
    now = 1000.0
    passed = [table.take(*table.place(42), now, interval, tolerance) == 0.0
              for _ in range(25)]
    assert passed == [True] * 20 + [False] * 5
    wait = table.take(*table.place(42), now, interval, tolerance)
    assert wait == pytest.approx(0.1)              # one interval until the next
    assert table.take(*table.place(42), now + 0.1, interval, tolerance) == 0.0
    assert table.take(*table.place(42), now + 0.1, interval, tolerance) > 0
    # Asking every millisecond from 0 to 9.999 s: the burst at 0, then one at each of
    # 0.1, 0.2 ... 9.9 s.
    table = RateTable(entries=1024)
    allowed = sum(table.take(*table.place(7), now + i * 0.001, interval, tolerance) == 0.0
                  for i in range(10_000))
    assert allowed == 20 + 99
    # Another key is unaffected.
    assert table.take(*table.place(43), now, interval, tolerance) == 0.0


def test_the_table_is_bounded_and_reuses_what_expired():
    table = RateTable(entries=64)
    now = 50.0
    for key in range(10_000):                      # far more clients than entries
        table.take(*table.place(key), now, 1.0, 0.0)
    assert len(table.memory) == 64 * 16            # fixed: nothing grows per client
    # A key whose entry was replaced starts afresh (fails open, never locks out)...
    assert table.take(*table.place(0), now, 1.0, 0.0) == 0.0
    # ... and once every entry has expired, a client is limited again from its burst.
    later = now + 10
    assert table.take(*table.place(99_999), later, 1.0, 0.0) == 0.0
    assert table.take(*table.place(99_999), later, 1.0, 0.0) > 0


ROUTE = Prebuilt(200, b"ok")


def _limited(table: RateTable, exempt: tuple[str, ...] = ()) -> Limited:
    limit = rate_limit_from({"rate": "10/s", "burst": 2, "exempt": list(exempt)})
    return Limited(ROUTE, limit, "route:test:/", table, DEFAULT_PAGES)


def test_a_client_whose_entry_was_taken_is_found_again_and_kept_there():
    table = RateTable(entries=64)
    limited = _limited(table)
    conn = SimpleNamespace(client="192.0.2.7", decisions=None)
    assert limited.admit(conn, []) is ROUTE
    _client, tag, first, _key = conn.decisions[limited]
    table.tags[first] = tag + 2                    # another key took the entry
    assert limited.admit(conn, []) is ROUTE        # a fresh entry, along the probes
    moved = conn.decisions[limited][2]
    assert moved != first and table.tags[moved] == tag
    assert limited.admit(conn, []) is ROUTE        # the burst of 2, counted there
    assert limited.admit(conn, []).status == 429
    assert limited.refused == [1]


def test_an_exempt_client_is_never_counted():
    table = RateTable(entries=64)                  # entry 0 unused: its tag is 0
    limited = _limited(table, exempt=("192.0.2.0/24",))
    conn = SimpleNamespace(client="192.0.2.7", decisions=None)
    assert all(limited.admit(conn, []) is ROUTE for _ in range(10))
    assert not any(table.tats) and limited.refused == [0]


@pytest.mark.parametrize("text, per_second", [("10/s", 10.0), ("300/m", 5.0),
                                              ("1/min", 1 / 60), ("2.5/second", 2.5)])
def test_rates_are_read_per_second_or_minute(text, per_second):
    assert parse_rate(text) == pytest.approx(per_second)


def test_ipv6_clients_share_a_limit_per_prefix():
    assert client_key("2001:db8:1:2:aaaa::1", 64) == client_key("2001:db8:1:2:bbbb::9", 64)
    assert client_key("2001:db8:1:2::1", 64) != client_key("2001:db8:1:3::1", 64)
    assert client_key("2001:db8::1", 128) == "2001:db8::1"
    assert client_key("192.0.2.7", 64) == "192.0.2.7"
    assert rate_limit_from({"rate": "10/s"}).burst == 10       # a second's worth


@pytest.mark.parametrize("value, expected", [
    ('"10/s"', "site[*].rate_limit: expected a table such as"),
    ('{ burst = 5 }', "site[*].rate_limit: expected a rate, such as"),
    ('{ rate = "10/h" }', 'a rate above 0 per "s" or "m"'),
    ('{ rate = "0/s" }', 'a rate above 0 per "s" or "m"'),
    ('{ rate = "10/s", burst = 0 }', "burst: an integer 1..1000000"),
    ('{ rate = "10/s", per = "ip" }', "unknown: per"),
    ('{ rate = "10/s", exempt = ["10.0.0.300/8"] }', "10.0.0.300/8"),
    ('{ rate = "10/s", key = "user" }', 'rate_limit.key: expected "ip" on a site without'),
])
def test_a_bad_limit_names_the_file_and_key(tmp_path, value, expected):
    path = tmp_path / "nestgate.toml"
    path.write_text(config(site=f"rate_limit = {value}"))
    out = subprocess.run([sys.executable, "-m", "nestgate", "check", "--config", str(path)],
                         capture_output=True, text=True, env=_env(), timeout=30)
    assert out.returncode != 0 and str(path) in out.stderr and expected in out.stderr, out.stderr


# ---------------------------------------------------------------- on a real server
def test_the_limit_holds_for_the_whole_server_under_load(start_server):
    """10/s with a burst of 20 over 2 workers and 50 connections for 10 s: 20 + 100
    requests through, within 10 %, the rest refused; the metrics count every refusal."""
    server = start_server(config(site='rate_limit = { rate = "10/s", burst = 20 }'))
    port, admin = server.port(), server.admin_port()
    started = time.monotonic()
    counts = asyncio.run(_load(port, 50, 10.0))
    elapsed = time.monotonic() - started
    expected = 20 + 10 * elapsed
    assert set(counts) == {200, 429}, counts
    assert abs(counts[200] - expected) <= 0.1 * expected, (counts, elapsed)
    assert counts[429] > 10 * counts[200]            # the load was far above the limit

    def refused(samples):
        return sum(v for labels, v in samples.get("nestgate_rate_limited_total", [])
                   if labels == {"site": "site0", "route": "/api/*"})
    samples = poll(lambda: scrape(admin)[2], lambda s: refused(s) >= counts[429])
    assert refused(samples) == counts[429]


def test_a_refusal_says_when_to_come_back_as_a_page_or_json(start_server):
    server = start_server(config(route='rate_limit = { rate = "1/m", burst = 2 }'))
    port = server.port()
    assert [get_from(port, "/api/a")[0] for _ in range(2)] == [200, 200]
    status, fields, body = get_from(port, "/api/a", {"Accept": "text/html"})
    assert status == 429 and 1 <= int(fields["retry-after"]) <= 60
    assert b"Too many requests came from your address" in body
    assert fields["content-type"].startswith("text/html")
    status, fields, body = get_from(port, "/api/a", {"Accept": "application/json"})
    assert status == 429 and json.loads(body)["status"] == 429
    assert fields["cache-control"] == "no-store"
    # The route's own limit replaces the site's (there is none): "/" is not limited,
    # and another client address has its own allowance.
    assert {get_from(port, "/")[0] for _ in range(5)} == {200}
    assert get_from(port, "/api/a", source="127.0.0.2")[0] == 200


def test_exempt_addresses_and_the_site_404_and_pages_added_later(start_server, tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "first.md").write_text("---\ntitle: First\n---\nHello.\n")
    server = start_server(config(
        site=f'rate_limit = {{ rate = "1/m", burst = 3, exempt = ["127.0.0.2/32"] }}\n'
             f'[site.notes]\ndir = "{notes}"\ntoken = "t0ken-for-the-notes-api-0000"'))
    port = server.port()
    # Unmatched paths and note pages (rendered, then registered while serving) count
    # against the site's limit like any route: a scanner cannot step around it.
    statuses = [get_from(port, path)[0] for path in ("/nothing", "/notes/first", "/notes/first",
                                                "/notes/first", "/nothing")]
    assert statuses[:3] == [404, 200, 200] and statuses[3:] == [429, 429]
    assert {get_from(port, "/notes/first", source="127.0.0.2")[0] for _ in range(6)} == {200}


def test_signed_in_users_can_be_limited_by_user(start_server, upstream, tmp_path):
    from conftest import Browser, protected
    up = upstream()
    limit = 'rate_limit = { rate = "1/m", burst = 4, key = "user" }'
    server = start_server(protected(up.url, str(tmp_path / "state.db"), site_extra=limit))
    port = server.port()
    visitor = Browser(port, keep=True)              # one connection: one worker
    resp, _ = visitor.sign_in()                      # 2 requests by address: form, post
    assert resp.status == 303
    # From here the session is the key: the address's allowance is left alone ...
    assert [visitor.request("GET", "/echo")[0].status for _ in range(5)] == [200] * 4 + [429]
    stranger = Browser(port, keep=True)
    assert stranger.request("GET", "/echo")[0].status == 401     # 3rd by address
    # ... and a made-up session cookie is no new allowance: it counts by address.
    stranger.jar["nestgate_session"] = "made-up-" + "x" * 30
    statuses = [stranger.request("GET", "/echo")[0].status for _ in range(2)]
    assert statuses == [401, 429]


# ---------------------------------------------------------------- connections per client
def _open(port: int, source: str = "127.0.0.1", ask: bool = True) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
    if ask:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
    return sock


def _answer(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def test_connections_per_client_are_limited_across_workers(start_server):
    server = start_server(config(listen="max_connections_per_client = 4"))
    port = server.port()
    held = [_open(port) for _ in range(4)]
    try:
        assert all(_answer(s).startswith(b"HTTP/1.1 200") for s in held)
        # Connections land on both workers; the count is the server's.
        for _ in range(3):
            extra = _open(port, ask=False)       # answered as it connects, unasked
            answer = _answer(extra)
            assert answer.startswith(b"HTTP/1.1 503") and b"connection: close" in answer
            assert extra.recv(4096) == b""            # then closed
            extra.close()
        other = _open(port, source="127.0.0.2")       # another client is not affected
        assert _answer(other).startswith(b"HTTP/1.1 200")
        other.close()
        held.pop().close()

        def fresh():                     # answered once the worker has counted the close
            sock = _open(port)
            answer = _answer(sock)
            if not answer.startswith(b"HTTP/1.1 200"):
                sock.close()
            return sock, answer
        again, answer = poll(fresh, lambda got: got[1].startswith(b"HTTP/1.1 200"), timeout=5)
        assert answer.startswith(b"HTTP/1.1 200")
        held.append(again)
    finally:
        for sock in held:
            sock.close()


def test_connections_per_client_count_an_ipv6_client_by_its_64(start_server):
    """Counted per address, a client holding a /64 opened as many connections as it
    had addresses: each IPv6 client is counted by its /64, as rate limits count it.
    Clients are named by PROXY headers (loopback has one IPv6 address)."""
    from conftest import v1
    server = start_server(config(listen='max_connections_per_client = 2\n'
                                        'proxy_protocol_from = ["127.0.0.1"]'))
    port = server.port()

    def connect(client: str) -> tuple[socket.socket, bytes]:
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(v1(client) + b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        return sock, _answer(sock)

    held = []
    try:
        for i in range(2):
            sock, answer = connect(f"2001:db8:1:2::{i + 1}")
            held.append(sock)
            assert answer.startswith(b"HTTP/1.1 200"), answer
        for i in range(2, 5):                    # the same /64: over the limit
            sock, answer = connect(f"2001:db8:1:2:{i}::9")
            sock.close()
            assert answer.startswith(b"HTTP/1.1 503"), answer
        sock, answer = connect("2001:db8:1:3::1")         # the next /64: another client
        held.append(sock)
        assert answer.startswith(b"HTTP/1.1 200")
    finally:
        for sock in held:
            sock.close()


def test_connections_per_client_over_http2_get_goaway(start_server, certs):
    import ssl

    import h2.connection
    import h2.errors
    import h2.events
    from conftest import tls_block
    server = start_server(config(listen="max_connections_per_client = 1\n" + tls_block(certs)))
    port = server.port("https")
    context = ssl.create_default_context(cafile=certs["ca"])
    context.set_alpn_protocols(["h2"])

    def connect():
        sock = context.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=5),
                                   server_hostname="localhost")
        conn = h2.connection.H2Connection()
        conn.initiate_connection()
        sock.sendall(conn.data_to_send())
        return sock, conn

    first, _ = connect()
    try:
        time.sleep(0.2)
        second, conn = connect()
        events = []
        while chunk := second.recv(65536):
            events += conn.receive_data(chunk)
        ended = [e for e in events if isinstance(e, h2.events.ConnectionTerminated)]
        assert ended and ended[0].error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
        second.close()
    finally:
        first.close()
