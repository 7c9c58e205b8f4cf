"""Sign-in before forwarding: the portal, sessions shared by workers, CSRF, back-off,
no open redirect, TOTP (a code is good once), sign-out by form only, post-login IP
grants and the dynamic allow-list."""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import subprocess
import sys
import threading
import time
from urllib.parse import urlencode

import pytest
from attack.h2raw import DataFrame, RawH2
import softauthn

from conftest import (HTML, PASSWORD_HASH, REPO, TOTP_SECRET, WS_HANDSHAKE, Browser, _env, ask,
                      otp_code, protected, settled_step, v1)
from nestgate.handlers.auth import totp
from nestgate.handlers.auth.passwords import verify_password
from nestgate.handlers.auth.config import AuthConfig, User
from nestgate.handlers.auth.portal import REFRESH_AFTER, SessionCheck, SignIn, safe_next
from nestgate.handlers.auth.sessiontoken import SessionTokens
from nestgate.handlers.auth.store import ACCOUNT_MEMORY, Store, StoreUnavailable, account_delay
from nestgate.base.responses import Prebuilt


def test_password_hashes_and_passwd_command():
    assert verify_password(PASSWORD_HASH, "demo-password")
    assert not verify_password(PASSWORD_HASH, "wrong")
    assert not verify_password(None, "demo-password")
    out = subprocess.run([sys.executable, "-m", "nestgate", "passwd", "--stdin"],
                         input="s3cret\n", capture_output=True, text=True, env=_env(),
                         cwd=REPO, timeout=30)
    assert out.returncode == 0 and verify_password(out.stdout.strip(), "s3cret")


@pytest.mark.parametrize("piped, code, printed", [("s3cret\n", 0, ""),
                                                  ("\n", 1, "empty password"),
                                                  ("", 1, "empty password")])
def test_passwd_reads_a_pipe_without_a_prompt(piped, code, printed):
    """`echo s3cret | nestgate passwd` (no --stdin): stdin is not a terminal."""
    out = subprocess.run([sys.executable, "-m", "nestgate", "passwd"], input=piped,
                         capture_output=True, text=True, env=_env(), cwd=REPO, timeout=30,
                         start_new_session=True)       # no controlling terminal either
    assert out.returncode == code and "Traceback" not in out.stderr, out.stderr
    assert printed in out.stderr
    if code == 0:
        assert verify_password(out.stdout.strip(), piped.strip())


def test_totp_rfc6238_vectors():
    secret = "GEZDGNBVGY3TQOJQGEZDGNBVGY3TQOJQ"        # "12345678901234567890"
    assert totp.now_code(secret, 59) == "287082"
    assert totp.now_code(secret, 1111111109) == "081804"
    assert totp.verify(secret, "287082", at=59 + 30)         # one step of skew
    assert not totp.verify(secret, "287082", at=59 + 90)
    assert not totp.verify(secret, "28708", at=59)
    assert totp.matching_step(secret, "287082", at=59) == 1
    assert totp.matching_step(secret, "287082", at=59 + 30) == 1
    assert totp.matching_step(secret, "287082", at=59 + 90) is None
    assert totp.matching_step(secret, "2870 82 ", at=59) == 1


ROUTE = Prebuilt(200, b"ok")


class _Gate:
    """What SignIn.admit reads of a route's gate: the handler each user gets (no
    upgrades passed, so no connection is noted)."""
    answers = {"ann": ROUTE}
    upgrades = False


GATE = _Gate()


class _SessionStore:
    """A SharedState stand-in that answers session checks and counts them."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.asked = 0
        self.tokens = SessionTokens()      # not read from a store: every token is asked

    async def run(self, method: str, hashed: bytes):
        self.asked += 1
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def _checked_ago(store, seconds: float):
    """A SignIn whose worker checked the request's session `seconds` ago."""
    signin = SignIn(AuthConfig(users=(User("ann", PASSWORD_HASH),)), store)
    headers = [(b"cookie", b"nestgate_session=a-token")]
    signin._sessions[signin._session_hash(headers)] = \
        ("ann", time.time() + 3600, time.monotonic() - seconds)
    return signin, headers


def test_a_session_in_use_is_checked_again_before_its_check_runs_out():
    async def scenario():
        store = _SessionStore(("ann", time.time() + 3600, "password totp", ""))
        signin, headers = _checked_ago(store, 0.5)
        assert signin.admit(GATE, headers, "192.0.2.7", None) is ROUTE
        await asyncio.sleep(0.01)
        assert store.asked == 0                     # checked recently enough
        signin, headers = _checked_ago(store, REFRESH_AFTER + 0.05)
        for _ in range(3):                          # nobody waits; one question at a time
            assert signin.admit(GATE, headers, "192.0.2.7", None) is ROUTE
        await asyncio.sleep(0.01)
        assert store.asked == 1
        (_user, _expires, checked), = signin._sessions.values()
        assert time.monotonic() - checked < 0.5     # trusted afresh from the answer
    asyncio.run(scenario())


def test_a_session_ended_elsewhere_is_refused_after_the_check_ahead():
    async def scenario():
        signin, headers = _checked_ago(_SessionStore(None), REFRESH_AFTER + 0.05)
        assert signin.admit(GATE, headers, "192.0.2.7", None) is ROUTE
        await asyncio.sleep(0.01)
        assert isinstance(signin.admit(GATE, headers, "192.0.2.7", None), SessionCheck)
    asyncio.run(scenario())


def test_a_check_ahead_that_finds_the_store_down_changes_nothing(caplog):
    async def scenario():
        store = _SessionStore(StoreUnavailable("down"))
        signin, headers = _checked_ago(store, REFRESH_AFTER + 0.05)
        assert signin.admit(GATE, headers, "192.0.2.7", None) is ROUTE
        await asyncio.sleep(0.01)
        assert store.asked == 1 and not signin._asking
        assert signin.admit(GATE, headers, "192.0.2.7", None) is ROUTE   # until RECHECK ends
    asyncio.run(scenario())
    assert "never retrieved" not in caplog.text


def test_no_open_redirect():
    for evil in ("//evil.example/", "https://evil.example/", "/\\evil.example", "evil",
                 "/ok\r\nset-cookie: x=1", "", None, "/a b"):
        assert safe_next(evil) == "/"
    assert safe_next("/app/page?x=1") == "/app/page?x=1"


def test_sign_in_flow_and_session_shared_by_workers(gate):
    server, up = gate(workers=2)
    port = server.port()
    b = Browser(port)
    # API clients get 401 JSON, browsers the sign-in page; nothing reaches the upstream.
    resp, body = b.request("GET", "/echo", headers={"Accept": "application/json"})
    assert resp.status == 401 and json.loads(body)["login"] == "/__auth__/login"
    resp, body = b.request("GET", "/app/page?x=1", headers=HTML)
    assert resp.status == 401 and b'action="/__auth__/login"' in body
    assert b'name="next" value="/app/page?x=1"' in body
    assert not up.requests
    # Sign in: back to the page asked for, with a session cookie.
    resp, _ = b.sign_in(next_url="/app/page?x=1")
    assert resp.status == 303 and resp.getheader("location") == "/app/page?x=1"
    cookie = [c for c in resp.msg.get_all("set-cookie") if c.startswith("nestgate_session=")][0]
    for attr in ("HttpOnly", "Secure", "SameSite=Lax", "Path=/", "Max-Age=43200"):
        assert attr in cookie
    # The session works on every worker (new connections spread over both).
    pids = set()
    for _ in range(40):
        resp, body = b.request("GET", "/api/v1/health")
        assert resp.status == 200
        pids.add(json.loads(body)["pid"])
        if len(pids) == 2:
            break
    assert pids == set(server.worker_pids())
    resp, body = b.request("GET", "/echo")
    assert resp.status == 200 and json.loads(body)["target"] == "/echo"
    # The session cookie is the gateway's business, but it is forwarded like any cookie;
    # sign-out ends it for every worker within a second.
    resp, _ = b.sign_out()
    assert resp.status == 303 and "nestgate_session" not in b.jar
    stale = Browser(port)
    stale.jar["nestgate_session"] = cookie.split(";")[0].split("=", 1)[1]
    deadline = time.monotonic() + 3
    statuses = set()
    while time.monotonic() < deadline:
        statuses = {stale.request("GET", "/echo")[0].status for _ in range(6)}
        if statuses == {401}:
            break
        time.sleep(0.1)
    assert statuses == {401}


def test_csrf_and_origin_checks(gate):
    server, up = gate()
    b = Browser(server.port())
    resp, _ = b.sign_in(csrf="0" * 64)
    assert resp.status == 403
    b.login_form()                                    # the form's cookie is set
    resp, _ = b.sign_in(csrf="é" * 64)                 # non-ASCII: refused, not a 500
    assert resp.status == 403
    other = Browser(server.port())                    # a form from a page without our cookie
    token = b.login_form()
    resp, _ = other.sign_in(csrf=token)
    assert resp.status == 403
    resp, _ = b.sign_in(headers={"Origin": "https://evil.example"})
    assert resp.status == 403
    resp, _ = b.sign_in(headers={"Origin": "http://private.test"})
    assert resp.status == 303


def test_redirect_after_sign_in_stays_on_the_site(gate):
    server, _up = gate()
    resp, _ = Browser(server.port()).sign_in(next_url="//evil.example/steal")
    assert resp.status == 303 and resp.getheader("location") == "/"


def test_login_back_off(gate):
    server, _up = gate(extra_auth='max_failures = 3\nfailure_window = "60s"')
    b = Browser(server.port())
    for _ in range(3):
        assert b.sign_in(password="nope")[0].status == 401
    resp, _ = b.sign_in()                              # even the right password now waits
    assert resp.status == 429 and resp.getheader("retry-after") == "60"


def test_totp_user(gate):
    server, _up = gate()
    b = Browser(server.port())
    wrong = "000000" if totp.now_code(TOTP_SECRET) != "000000" else "111111"
    assert b.sign_in(user="otp", code=wrong)[0].status == 401
    assert b.sign_in(user="otp")[0].status == 401                  # no code
    resp, _ = b.sign_in(user="otp", code=totp.now_code(TOTP_SECRET))
    assert resp.status == 303


def test_totp_code_is_good_once_on_every_worker(gate):
    server, _up = gate(workers=2, extra_auth="max_failures = 4")
    port = server.port()
    session = Browser(port)                      # a session, to ask workers who they are
    assert session.sign_in()[0].status == 303

    def on_worker(accept=lambda pid: True) -> Browser:
        for _ in range(60):
            b = Browser(port, keep=True)
            b.jar.update(session.jar)
            if accept(b.worker_pid()):
                return b
            b.conn.close()
        raise AssertionError("no connection reached the worker wanted")

    step = settled_step()
    first = on_worker()
    first_pid = first.worker_pid()
    assert first.sign_in(user="otp", code=otp_code(step))[0].status == 303
    # The same code, with a fresh form, through the other worker: refused, with the
    # answer a wrong code gets.
    other = on_worker(lambda pid: pid != first_pid)
    resp, page = other.sign_in(user="otp", code=otp_code(step))
    assert resp.status == 401 and b"Wrong user, password or code." in page
    assert other.worker_pid() != first_pid       # still the same connection and worker
    # ... and through the same worker; an older step, though still within the window.
    assert first.sign_in(user="otp", code=otp_code(step))[0].status == 401
    assert other.sign_in(user="otp", code=otp_code(step - 1))[0].status == 401
    # The next step's code works once (a success clears the failures).
    assert other.sign_in(user="otp", code=otp_code(step + 1))[0].status == 303
    # A refused replay is a failed sign-in: four of them and even a good password waits.
    for b in (first, other, first, other):
        assert b.sign_in(user="otp", code=otp_code(step + 1))[0].status == 401
    assert Browser(port).sign_in()[0].status == 429
    first.conn.close()
    other.conn.close()


def test_totp_steps_recorded_once_across_store_handles(tmp_path):
    path = str(tmp_path / "state.db")
    # A store file from before the table existed: opened, it gains it, keeping its data.
    old = Store(path)
    old.create_session(b"h" * 32, "demo", time.time() + 60, "")
    old.db.execute("DROP TABLE totp_used")
    old.close()
    a, b = Store(path), Store(path)              # two workers' handles on one file
    assert a.session(b"h" * 32)[0] == "demo"
    assert a.use_totp_step("otp", 100)
    assert not b.use_totp_step("otp", 100)       # the same code through another worker
    assert not b.use_totp_step("otp", 99)        # an older one
    assert b.use_totp_step("otp", 101)
    assert not a.use_totp_step("otp", 101)
    assert a.use_totp_step("demo", 100)          # each user has a step of their own
    # The same step offered through eight handles at once: exactly one accepts it.
    stores = [Store(path) for _ in range(8)]
    start = threading.Barrier(len(stores))
    results = []

    def offer(store):
        start.wait()
        results.append(store.use_totp_step("otp", 102))
    threads = [threading.Thread(target=offer, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 7 + [True]
    row = sqlite3.connect(path).execute("SELECT step FROM totp_used WHERE user = 'otp'")
    assert row.fetchone() == (102,)
    for s in (a, b, *stores):
        s.close()


def test_account_delay_shared_by_store_handles(tmp_path, monkeypatch):
    """Failures at one account through one worker's handle hold back attempts through
    another's, whatever the address; the account's known address and its own session
    pass; a success starts the count again."""
    path = str(tmp_path / "state.db")
    a, b = Store(path), Store(path)
    clock = [1000.0]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    delays = (2, 10.0, 40.0)                     # 2 free, then 10 s doubling up to 40 s

    def attempt(store, ip, trusted=False):
        return store.take_sign_in(ip, 60.0, 5, "demo", delays, trusted)
    b.signed_in("demo", "2001:db8:1:2::5")       # a known /64
    assert attempt(a, "192.0.2.1") == 0.0 and attempt(b, "192.0.2.2") == 0.0
    assert attempt(a, "192.0.2.3") == 10.0       # the third waits, recording nothing
    clock[0] += 4
    assert attempt(b, "192.0.2.4") == 6.0
    assert attempt(b, "192.0.2.4", trusted=True) == 0.0         # its own session
    assert attempt(a, "2001:db8:1:2:aaaa::1") == 0.0            # the known /64
    clock[0] += 19
    assert attempt(a, "192.0.2.5") == 40.0 - 19                 # 4 failures: capped
    clock[0] += 21
    assert attempt(a, "192.0.2.5") == 0.0
    assert a.account_wait("other", clock[0], delays) == 0.0     # each account its own
    b.signed_in("demo", "192.0.2.5")
    assert attempt(a, "192.0.2.6") == 0.0 and attempt(a, "192.0.2.7") == 0.0
    clock[0] += ACCOUNT_MEMORY                   # a day of quiet: forgotten
    assert attempt(b, "192.0.2.8") == 0.0
    assert account_delay(60_000, delays) == 40.0
    for s in (a, b):
        s.close()


def test_account_delay_config():
    from nestgate.config import ConfigError, parse_config
    user = {"name": "x", "password": PASSWORD_HASH}
    cfg = parse_config({"listen": [{"address": "127.0.0.1:0"}],
                        "auth": {"store": ":memory:", "user": [user]}}).auth
    assert cfg.account_delays == (3, 1.0, 900.0)
    with pytest.raises(ConfigError) as info:
        parse_config({"listen": [{"address": "127.0.0.1:0"}],
                      "auth": {"store": ":memory:", "user": [user], "account_delay": "0s",
                               "account_delay_max": "1s", "account_failures": -1}})
    shown = "\n".join(info.value.problems)
    assert "auth.account_delay:" in shown and "auth.account_failures:" in shown


PAGE_HEADERS = ("content-type", "cache-control", "x-frame-options", "referrer-policy",
                "content-security-policy")


def test_sign_out_is_a_form_post_with_the_csrf_token(gate):
    server, _up = gate()
    port = server.port()
    b = Browser(port)
    assert b.sign_in()[0].status == 303
    session = b.jar["nestgate_session"]
    # A GET (a link, or an <img> on any page) shows a button and changes nothing.
    resp, page = b.request("GET", "/__auth__/logout", headers=HTML)
    assert resp.status == 200
    assert b'<form method="post" action="/__auth__/logout">' in page
    assert re.search(rb'name="csrf" value="[0-9a-f]{64}"', page)
    assert b"<button" in page and b'name="password"' not in page
    login, _ = Browser(port).request("GET", "/__auth__/login", headers=HTML)
    for name in PAGE_HEADERS:
        assert resp.getheader(name) == login.getheader(name), name
    assert b.request("GET", "/echo")[0].status == 200
    # A POST without the token, with a wrong one, or from another site is refused.
    assert b.post_form("/__auth__/logout", {})[0].status == 403
    assert b.post_form("/__auth__/logout", {"csrf": "0" * 64})[0].status == 403
    assert b.sign_out(headers={"Origin": "https://evil.example"})[0].status == 403
    assert b.request("PUT", "/__auth__/logout")[0].status == 405
    assert b.request("GET", "/echo")[0].status == 200
    # With the form's token: signed out, back to the sign-in page, the session gone.
    resp, _ = b.sign_out()
    assert resp.status == 303 and resp.getheader("location") == "/__auth__/login"
    assert "nestgate_session" not in b.jar
    stale = Browser(port)
    stale.jar["nestgate_session"] = session
    assert stale.request("GET", "/echo")[0].status == 401


def test_ip_grant_after_sign_in(gate):
    server, up = gate(extra_auth='ip_grant = "1h"')
    port = server.port()
    # Sign in as 198.51.100.7 (through a PROXY header from the trusted loopback peer).
    assert ask(port, "private.test", "/echo", proxy=v1("198.51.100.7"))[0] == 401
    b = Browser(port)
    resp, _ = b.sign_in()
    assert resp.status == 303
    # The visitor's address (loopback here) is now allowed without the cookie ...
    assert b.request("GET", "/echo", cookies=False)[0].status == 200
    # ... and other addresses still are not.
    assert ask(port, "private.test", "/echo", proxy=v1("198.51.100.7"))[0] == 401


def test_dynamic_allow_entries_seen_by_every_worker_within_a_second(gate, tmp_path):
    server, _up = gate(workers=2)
    port = server.port()
    assert ask(port, "lan.test", proxy=v1("198.51.100.9"))[0] == 403
    store = Store(str(tmp_path / "state.db"))
    entry = store.add_allow("198.51.100.0/24", ttl=2.0, comment="visiting laptop")
    t0 = time.monotonic()
    while ask(port, "lan.test", proxy=v1("198.51.100.9"))[0] != 200:
        assert time.monotonic() - t0 < 1.5, "not seen within a second"
        time.sleep(0.05)
    time.sleep(max(0.0, t0 + 1.0 - time.monotonic()))   # the promise: every worker by 1 s
    statuses = {ask(port, "lan.test", proxy=v1("198.51.100.9"))[0] for _ in range(10)}
    assert statuses == {200}                       # on both workers
    _id, cidr, _expires, comment = store.allow_entries()[0]
    assert (cidr, comment) == ("198.51.100.0/24", "visiting laptop")
    # It expires on its own, and removal is seen too.
    while ask(port, "lan.test", proxy=v1("198.51.100.9"))[0] != 403:
        assert time.monotonic() - t0 < 5
        time.sleep(0.1)
    store.add_allow("198.51.100.9", ttl=3600)
    while ask(port, "lan.test", proxy=v1("198.51.100.9"))[0] != 200:
        assert time.monotonic() - t0 < 7
        time.sleep(0.05)
    assert store.remove_allow(store.allow_entries()[0][0])
    while ask(port, "lan.test", proxy=v1("198.51.100.9"))[0] != 403:
        assert time.monotonic() - t0 < 9
        time.sleep(0.05)
    with pytest.raises(ValueError):
        store.add_allow("not-an-ip", ttl=60)
    assert entry


def test_cookie_scoped_to_parent_domain(start_server, upstream, tmp_path):
    up = upstream()
    server = start_server(protected(up.url, str(tmp_path / "s.db"),
                                    'cookie_domain = "private.test"\ncookie_samesite = "Strict"'))
    resp, _ = Browser(server.port()).sign_in()
    cookie = [c for c in resp.msg.get_all("set-cookie") if c.startswith("nestgate_session=")][0]
    assert "Domain=private.test" in cookie and "SameSite=Strict" in cookie


def test_protected_site_needs_users():
    from nestgate.config import ConfigError, parse_config
    with pytest.raises(ConfigError) as info:
        parse_config({"listen": [{"address": "127.0.0.1:0"}],
                      "site": [{"hosts": ["*"], "protected": True}]})
    assert "[auth]" in "\n".join(info.value.problems)
    with pytest.raises(ConfigError) as info:
        parse_config({"listen": [{"address": "127.0.0.1:0"}],
                      "auth": {"user": [{"name": "x", "password": "plain"}]}})
    assert "argon2" in "\n".join(info.value.problems)


def test_websocket_behind_sign_in(gate):
    import socket
    server, _up = gate()
    b = Browser(server.port())
    assert b.sign_in()[0].status == 303
    cookie = "; ".join(f"{k}={v}" for k, v in b.jar.items())
    for with_cookie, expected in ((False, b"HTTP/1.1 401"), (True, b"HTTP/1.1 101")):
        sock = socket.create_connection(("127.0.0.1", server.port()), timeout=5)
        sock.sendall(b"GET /ws HTTP/1.1\r\nHost: private.test\r\nConnection: Upgrade\r\n"
                     b"Upgrade: websocket\r\n%s%s\r\n"
                     % (WS_HANDSHAKE, f"Cookie: {cookie}\r\n".encode() if with_cookie else b""))
        data = sock.recv(65536)
        assert data.startswith(expected), data[:80]
        if with_cookie:
            while not data.endswith(b"hello"):
                data += sock.recv(65536)
            sock.sendall(b"ping")
            assert sock.recv(65536) == b"PING"
        sock.close()


def test_the_session_cookie_never_reaches_the_upstream(gate):
    server, up = gate()
    b = Browser(server.port())
    assert b.sign_in()[0].status == 303
    session = b.jar["nestgate_session"]
    b.jar = {"theme": "dark", "nestgate_session": session, "app_sid": "a1"}
    resp, _ = b.request("GET", "/echo")
    assert resp.status == 200
    sent = [(n.lower(), v) for n, v in up.requests[-1]["headers"]]
    cookies = [v for n, v in sent if n == "cookie"]
    assert cookies == ["theme=dark; app_sid=a1"]
    assert session not in json.dumps(up.requests[-1])
    # Only the session cookie: the Cookie line goes altogether.
    b.jar = {"nestgate_session": session}
    assert b.request("GET", "/echo")[0].status == 200
    assert not [n for n, _v in up.requests[-1]["headers"] if n.lower() == "cookie"]
    # Named hop-by-hop by the client's Connection header: not forwarded either.
    b.jar = {"theme": "dark", "nestgate_session": session}
    assert b.request("GET", "/echo", headers={"Connection": "cookie"})[0].status == 200
    assert not [n for n, _v in up.requests[-1]["headers"] if n.lower() == "cookie"]


def test_sign_out_asks_the_browser_to_forget_cached_pages(gate):
    server, _up = gate()
    b = Browser(server.port())
    resp, _ = b.sign_in()
    assert resp.status == 303 and resp.getheader("clear-site-data") is None
    resp, _ = b.sign_out()
    assert resp.status == 303 and resp.getheader("clear-site-data") == '"cache"'


def test_a_protected_sites_answers_are_private_unless_the_upstream_says(gate):
    server, _up = gate()
    b = Browser(server.port(), keep=True)       # one connection: the remembered heads too
    assert b.sign_in()[0].status == 303
    for _ in range(3):
        resp, body = b.request("GET", "/hi")
        assert (resp.status, body) == (200, b"hi")
        assert resp.msg.get_all("cache-control") == ["private"]
        resp, body = b.request("GET", "/cached")
        assert (resp.status, body) == (200, b"hi")
        assert resp.msg.get_all("cache-control") == ["max-age=60"]


def test_passwd_totp_prints_the_qr_code_and_writes_it_as_a_png(tmp_path):
    """The QR code in the terminal and in the PNG holds the otpauth:// URI printed
    (each module compared with segno's own drawing of that URI)."""
    import segno
    from PIL import Image
    png = tmp_path / "ann.png"
    out = subprocess.run([sys.executable, "-m", "nestgate", "passwd", "--stdin", "--totp",
                          "ann", "--png", str(png)], input="s3cret\n", capture_output=True,
                         text=True, env=_env(), cwd=REPO, timeout=30)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert verify_password(lines[0], "s3cret")
    secret = lines[1].split('"')[1]
    assert totp.secret_problem(secret) is None
    uri = lines[2]
    assert uri.startswith("otpauth://totp/nestgate:ann?") and f"secret={secret}" in uri
    matrix = segno.make(uri, error="m").matrix
    # The terminal: half-block characters, two module rows per line, with a border.
    drawn = [line for line in lines[3:] if line.strip()]
    assert len(drawn) >= (len(matrix) + 8) // 2 and any("\u2580" in l or "\u2584" in l
                                                         for l in drawn)
    # The PNG: 8 px per module, a 4-module border, dark where the code is dark.
    image = Image.open(png).convert("L")
    size = len(matrix)
    assert image.size == ((size + 8) * 8,) * 2
    for y, row in enumerate(matrix):
        for x, dark in enumerate(row):
            assert (image.getpixel(((x + 4) * 8 + 4, (y + 4) * 8 + 4)) < 128) == bool(dark)
    # --png without --totp is a usage error.
    bad = subprocess.run([sys.executable, "-m", "nestgate", "passwd", "--stdin", "--png",
                          str(png)], input="s3cret\n", capture_output=True, text=True,
                         env=_env(), cwd=REPO, timeout=30)
    assert bad.returncode == 2 and "--png needs --totp" in bad.stderr


def test_a_form_from_another_port_of_the_same_host_is_refused(gate):
    """Another port is another origin, one that can plant the CSRF cookie (cookies do
    not tell ports apart) beside a token it fetched itself: its Origin is refused. Before,
    only the host name was compared, and the planted pair signed the user out."""
    server, _up = gate(extra_auth='\n[client_ip]\ntrusted_proxies = ["127.0.0.2"]\n')
    victim = Browser(server.port())
    assert victim.sign_in()[0].status == 303
    # Even with the session's own token (a planted pair is refused whatever the Origin:
    # test_a_planted_csrf_pair_passes_for_no_sessions_form), another port's Origin is.
    token = victim.form_token("/__auth__/logout")
    for origin in ("http://private.test:8443", "https://private.test:8443",
                   "http://private.test:0", "http://[::1]:80"):
        resp, _ = victim.post_form("/__auth__/logout", {"csrf": token}, {"Origin": origin})
        assert resp.status == 403, origin
    assert victim.request("GET", "/echo")[0].status == 200        # still signed in
    # The site's own origin, with its default port spelt out or not: signed out.
    assert victim.post_form("/__auth__/logout", {"csrf": token},
                            {"Origin": "http://private.test:80"})[0].status == 303
    # A request on a port of its own names it in Host and Origin alike.
    b = Browser(server.port(), host="private.test:8080")
    assert b.sign_in(headers={"Origin": "http://private.test:8080"})[0].status == 303
    assert Browser(server.port(), host="private.test:8080").sign_in(
        headers={"Origin": "http://private.test"})[0].status == 403
    # Through a trusted proxy, which may have left the port out of Host, the host name
    # is compared alone.
    proxied = Browser(server.port(), source="127.0.0.2")
    assert proxied.sign_in(headers={"Origin": "https://private.test:8443"})[0].status == 303


def test_a_planted_csrf_pair_passes_for_no_sessions_form(gate):
    """A page that can set cookies for this host (its http:// origin, a sibling under
    `cookie_domain`) can plant the CSRF cookie beside a token it fetched itself, and post
    with no Origin or `null` (what a sandboxed frame sends). A form that acts on a session
    takes only that session's token: the planted pair, or another session's token, is
    403 and the session goes on. Before, the pair signed the victim out and made new
    recovery codes. Two workers: a token made by one passes on the other."""
    server, _up = gate(workers=2)
    port = server.port()
    attacker = Browser(port)
    planted = {path: (attacker.form_token(path), attacker.jar["nestgate_csrf"])
               for path in ("/__auth__/login", "/__auth__/logout")}
    assert attacker.sign_in()[0].status == 303
    theirs = attacker.form_token("/__auth__/logout")      # the attacker's own session's
    victim = Browser(port)
    assert victim.sign_in()[0].status == 303
    for token, nonce in planted.values():
        victim.jar["nestgate_csrf"] = nonce
        for origin in ({}, {"Origin": "null"}, {"Origin": "http://private.test"}):
            assert victim.post_form("/__auth__/logout", {"csrf": token},
                                    origin)[0].status == 403
            assert victim.post_form("/__auth__/account", {"csrf": token,
                                                          "action": "recovery"},
                                    origin)[0].status == 403
            status, _ = softauthn.options(victim, "register", token)
            assert status == 403
    assert victim.post_form("/__auth__/logout", {"csrf": theirs})[0].status == 403
    assert victim.request("GET", "/echo")[0].status == 200        # still signed in
    # The session's own token: the forms work, on either worker.
    for _ in range(4):
        assert victim.post_form("/__auth__/account", {
            "csrf": victim.form_token("/__auth__/account"), "action": "rename"})[0].status == 303
    resp, _ = victim.sign_out()
    assert resp.status == 303 and "nestgate_session" not in victim.jar
    # The sign-in form (no session yet) stays a double submit: the token with the
    # cookie it was made for passes, and a made-up or mismatched one does not.
    stranger = Browser(port)
    token, nonce = planted["/__auth__/login"]
    stranger.jar["nestgate_csrf"] = nonce
    assert stranger.sign_in(csrf="0" * 64)[0].status == 403
    stranger.jar["nestgate_csrf"] = "made-up"
    assert stranger.sign_in(csrf=token)[0].status == 403
    stranger.jar["nestgate_csrf"] = nonce
    assert stranger.sign_in(csrf=token)[0].status == 303


def test_a_form_from_another_port_is_refused_over_http2_too(start_server, upstream, tmp_path):
    """The Origin's port is checked against :authority as against Host: a sign-in over
    h2c whose Origin names another port of the host is refused; its own port passes."""
    server = start_server(protected(upstream().url, str(tmp_path / "state.db")).replace(
        'proxy_protocol_from = ["127.0.0.1"]', "http2_cleartext = true", 1))
    attacker = Browser(server.port())
    token = attacker.login_form()
    cookie = f"nestgate_csrf={attacker.jar['nestgate_csrf']}".encode()
    body = urlencode({"user": "demo", "password": "demo-password", "csrf": token,
                      "next": "/"}).encode()

    def sign_in(authority: bytes, origin: bytes) -> int:
        conn = RawH2(server.port(), None)
        try:
            stream = conn.request([
                (b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/__auth__/login"),
                (b":authority", authority), (b"origin", origin), (b"cookie", cookie),
                (b"content-type", b"application/x-www-form-urlencoded"),
                (b"content-length", b"%d" % len(body))], end=False)
            conn.send(DataFrame(stream, body, flags={"END_STREAM"}))
            return conn.answers([stream])[stream].status
        finally:
            conn.close()

    assert sign_in(b"private.test:8080", b"http://private.test") == 403
    assert sign_in(b"private.test", b"http://private.test:8443") == 403
    assert sign_in(b"private.test:8080", b"http://private.test:8080") == 303


def test_a_protected_sites_own_files_and_bodies_are_private(start_server, upstream, tmp_path):
    # A static file on a protected site went out with Last-Modified and no
    # Cache-Control: a shared cache may keep it by heuristic and give it to anyone.
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "report.html").write_text("<p>family only</p>")
    site = (f'[[site.route]]\nprefix = "/files/"\ntype = "static"\nroot = "{tmp_path / "files"}"\n'
            f'listing = true\n'
            f'\n[[site.route]]\nprefix = "/kept/"\ntype = "static"\nroot = "{tmp_path / "files"}"\n'
            f'cache_control = "max-age=60"\nlisting = true\n'
            f'\n[[site.route]]\npath = "/note"\ntype = "return"\nbody = "family note"\n')
    server = start_server(protected(upstream().url, str(tmp_path / "s.db"), site_extra=site))
    b = Browser(server.port())
    assert b.sign_in()[0].status == 303
    # A listing: one field, `no-cache` joined to `private`, or the route's own alone
    # (before: `no-cache` and the other, two fields).
    for path, cache_control in (("/files/report.html", "private"), ("/note", "private"),
                                ("/kept/report.html", "max-age=60"),
                                ("/files/", "private, no-cache"), ("/kept/", "max-age=60")):
        resp, body = b.request("GET", path)
        assert resp.status == 200 and (b"family" in body or b"report.html" in body)
        assert resp.msg.get_all("cache-control") == [cache_control], path
