"""A flood of made-up session cookies at a protected site, from one client at full speed.

Each distinct made-up cookie cost one question to the store (a SELECT on SQLite, an
HMGET on Redis), on the worker's one store thread, which a real visitor's session
checks share. A session token now carries an HMAC tag under the store's secret,
checked in memory: a made-up cookie is refused without asking the store, whether it
looks like a token of today's form or of the form before the tags (those are asked
about only when the store held them when the worker started). Over HTTP/1.1 pipelined
and over HTTP/2 streams of one connection; the signed-in visitor is answered
throughout, the store is not asked about the flood, and the worker's memory stays
bounded."""

from __future__ import annotations

import secrets
import socket
import threading
import time

import pytest
import redis

from conftest import Browser, poll, protected, rss_kib, scrape
from h2raw import RawH2
from redisserver import redis_server  # noqa: F401 - the fixture

pytestmark = pytest.mark.attack

FLOOD = 20000                # made-up cookies sent, half of each form
ATTACK_SECONDS = 60.0        # the bound on the whole flood
BATCH = 100                  # requests pipelined before their answers are read
GROWTH_KIB = 16 * 1024       # the worker's memory may grow this much during the flood


def site(up_url: str, store: str, extra: str = "") -> str:
    """The protected site of the sign-in tests, its listener taking h2c too."""
    return protected(up_url, store, extra_auth="cookie_secure = false\n" + extra).replace(
        'proxy_protocol_from = ["127.0.0.1"]', "http2_cleartext = true")


def made_up(i: int) -> str:
    """A cookie no server issued: today's form (body.tag) or the form before (body)."""
    body = secrets.token_urlsafe(32)
    return f"{body}.{secrets.token_urlsafe(16)}" if i % 2 else body


def flood_h1(port: int, count: int, until: float) -> int:
    """`count` requests with made-up cookies, pipelined; the answers read (each a
    401: no session). A connection closed after its keep-alive requests is replaced."""
    answered = 0
    while answered < count and time.monotonic() < until:
        answered += pipelined(port, count - answered, until)
    return answered


def pipelined(port: int, count: int, until: float) -> int:
    """Up to `count` of them on one connection, until the server closes it."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    answered, buf = 0, b""
    try:
        while answered < count and time.monotonic() < until:
            batch = min(BATCH, count - answered)
            sock.sendall(b"".join(
                b"GET /secret HTTP/1.1\r\nHost: private.test\r\nAccept: application/json\r\n"
                b"Cookie: nestgate_session=%s\r\n\r\n" % made_up(answered + i).encode()
                for i in range(batch)))
            want = answered + batch
            while answered < want and time.monotonic() < until:
                chunk = sock.recv(1 << 16)
                if not chunk:
                    return answered
                buf += chunk
                answered += buf.count(b"HTTP/1.1 401 ")
                buf = buf[buf.rfind(b"HTTP/1.1 ") + 1:] if b"HTTP/1.1 " in buf else buf
    except OSError:
        pass                     # closed after its last request while more were sent
    finally:
        sock.close()
    return answered


def flood_h2(port: int, count: int, until: float) -> int:
    """`count` streams with made-up cookies over h2c; the 401s read. A connection
    ended after its keep-alive requests (GOAWAY) is replaced."""
    answered = 0
    while answered < count and time.monotonic() < until:
        answered += streamed(port, count - answered, until)
    return answered


def streamed(port: int, count: int, until: float) -> int:
    """Up to `count` of them as streams of one connection, until the server ends it."""
    conn = RawH2(port, None)
    answered = 0
    try:
        while answered < count and time.monotonic() < until and not conn.goaway:
            ids = [conn.request([
                (b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/secret"),
                (b":authority", b"private.test"), (b"accept", b"application/json"),
                (b"cookie", b"nestgate_session=" + made_up(answered + i).encode())])
                for i in range(min(BATCH, count - answered))]
            got = conn.answers(ids, timeout=max(0.1, until - time.monotonic()))
            answered += sum(1 for s in got.values() if s.status == 401)
            for stream_id in ids:
                conn.streams.pop(stream_id, None)
    finally:
        conn.close()
    return answered


def visit_during(port: int, attack) -> tuple[list[int], list[float], int]:
    """A signed-in visitor's requests while `attack()` runs: their statuses, how long
    each took (printed, not asserted), and what the attack returned."""
    visitor = Browser(port, keep=True)
    assert visitor.sign_in(next_url="/secret")[0].status == 303
    assert visitor.request("GET", "/secret")[0].status == 200
    quiet = []
    for _ in range(50):
        began = time.monotonic()
        assert visitor.request("GET", "/secret")[0].status == 200
        quiet.append(time.monotonic() - began)
        time.sleep(0.02)
    report("without the flood", [200], quiet)
    result: list[int] = []
    flood = threading.Thread(target=lambda: result.append(attack()))
    statuses, took = [], []
    flood_began = time.monotonic()
    flood.start()
    while flood.is_alive():
        began = time.monotonic()
        statuses.append(visitor.request("GET", "/secret")[0].status)
        took.append(time.monotonic() - began)
        time.sleep(0.02)
    flood.join()
    print(f"flood: {time.monotonic() - flood_began:.2f} s")
    return statuses, took, result[0]


def forged_count(server) -> int:
    """The server's nestgate_forged_sessions_total, from its admin API."""
    _status, _type, samples = scrape(server.admin_port())
    return int(sum(value for _labels, value in samples["nestgate_forged_sessions_total"]))


def report(name: str, statuses, took) -> None:
    took = sorted(took)
    print(f"{name}: visitor {len(took)} requests, median {took[len(took) // 2] * 1e3:.1f} ms, "
          f"p99 {took[int(len(took) * 0.99)] * 1e3:.1f} ms, max {took[-1] * 1e3:.1f} ms")


def session_lookups(client) -> int:
    """HMGETs Redis has answered (a session check is one)."""
    return client.info("commandstats").get("cmdstat_hmget", {}).get("calls", 0)


def flooded(server, flood, name: str) -> None:
    """`flood` against `server` while a signed-in visitor asks for a page: every made-up
    cookie answered 401, the visitor 200 every time, the worker's memory bounded."""
    port = server.port()
    before_kib = server.worker_rss_kib()
    until = time.monotonic() + ATTACK_SECONDS
    statuses, took, answered = visit_during(port, lambda: flood(port, FLOOD, until))
    report(f"{name} {flood.__name__}", statuses, took)
    assert answered == FLOOD
    assert set(statuses) == {200} and statuses
    assert rss_kib(server.worker_pids()[0]) - before_kib < GROWTH_KIB


@pytest.mark.parametrize("flood", [flood_h1, flood_h2], ids=["h1", "h2"])
def test_made_up_cookies_cost_no_sqlite_question(start_server, upstream, tmp_path, flood):
    server = start_server(site(upstream().url, str(tmp_path / "state.db")))
    before = forged_count(server)
    flooded(server, flood, "sqlite")
    # Every made-up cookie was refused in memory: none reached the store's thread (the
    # workers' counts reach the admin process within a second or so).
    assert poll(lambda: forged_count(server) - before, lambda n: n >= FLOOD) == FLOOD


@pytest.mark.parametrize("flood", [flood_h1, flood_h2], ids=["h1", "h2"])
def test_made_up_cookies_cost_no_redis_command(start_server, upstream, tmp_path,
                                               redis_server, flood):
    url = redis_server.url
    server = start_server(site(upstream().url, str(tmp_path / "unused.db"),
                               f'\n[state]\nbackend = "redis"\nurl = "{url}"\n'))
    client = redis.Redis.from_url(url)
    before = session_lookups(client)
    flooded(server, flood, "redis")
    # Only the visitor's own checks (one a second at most, and the sign-in's) asked.
    asked = session_lookups(client) - before
    assert asked < 100, asked
    client.close()
