"""Two nestgate instances (two `nestgate serve` trees, two workers each) sharing their
state through a real redis-server: sessions, sign-out and revocation, the sign-in
back-off, the TOTP replay guard, the dynamic allow-list with its expiry; and what
happens while Redis does not answer (private sites 503, nobody let in, recovery by
itself)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
from conftest import _env, admin_headers
from conftest import Browser, otp_code, poll, protected, settled_step
from redisserver import REDIS_PASSWORD, free_port as _free_port
from redisserver import redis_server  # noqa: F401 - the fixture


@pytest.fixture
def two(start_server, redis_server, upstream, tmp_path):
    """Two instances of the sign-in gateway of test_auth, with their state in Redis."""
    url = redis_server.url
    # account_delay: long enough that the fourth wrong password still finds the
    # account's back-off running on a loaded machine (the default second can pass
    # between two sign-in forms).
    shared = (f'cookie_secure = false\nmax_failures = 4\naccount_delay = 30\n\n'
              f'[state]\nbackend = "redis"\nurl = "{url}"\nprefix = "gw1:"\n')
    config = protected(upstream().url, str(tmp_path / "unused.db"), extra_auth=shared)
    first = start_server(config, name="a.toml")
    second = start_server(config, name="b.toml")
    return first, second, redis_server


def status(port: int, path: str, host: str = "private.test", cookie: str = "") -> int:
    browser = Browser(port, host)
    if cookie:
        browser.jar["nestgate_session"] = cookie
    return browser.request("GET", path, headers={"Accept": "application/json"})[0].status


def test_a_session_made_on_one_instance_works_on_the_other_until_signed_out(two):
    a, b, _ = two
    visitor = Browser(a.port())
    assert visitor.request("GET", "/secret")[0].status == 401
    resp, _ = visitor.sign_in(next_url="/secret")
    assert resp.status == 303
    cookie = visitor.jar["nestgate_session"]
    resp, body = Browser(b.port()).request("GET", "/secret", headers={"Cookie":
                                                                     f"nestgate_session={cookie}"})
    assert resp.status == 200 and json.loads(body)["target"] == "/secret"   # the upstream
    # Signing out on one instance ends the session on every instance within a second.
    assert visitor.sign_out()[0].status == 303
    assert poll(lambda: {status(b.port(), "/secret", cookie=cookie) for _ in range(4)},
                lambda s: s == {401}, timeout=3) == {401}
    # Nothing secret in either instance's output: not the Redis password.
    assert not any(REDIS_PASSWORD in line for line in a.lines + b.lines)


@pytest.mark.parametrize("change", [
    {"expires": "tomorrow"}, {"expires": "nan"}, {"expires": "inf"}, {"user": b"\xff\xfe"},
    {"last_seen": "never"}, {"factors": b"\xff"}, "string"])
def test_a_session_not_as_nestgate_wrote_it_is_no_session_and_said_once(two, change):
    import redis
    a, b, server = two
    visitor = Browser(a.port())
    assert visitor.sign_in(next_url="/secret")[0].status == 303
    cookie = visitor.jar["nestgate_session"]
    key = "gw1:session:" + hashlib.sha256(cookie.encode()).hexdigest()
    client = redis.Redis.from_url(server.url)
    if change == "string":                     # a key of another type: WRONGTYPE
        client.delete(key)
        client.set(key, "not a hash")
    else:
        client.hset(key, mapping=change)
    client.close()
    for instance in (a, b):
        # Never a 500, never a way in: no session, on every instance (the one that
        # checked it last trusts that for portal.RECHECK, 1 s).
        assert poll(lambda instance=instance: status(instance.port(), "/secret", cookie=cookie),
                    lambda got: got != 200, timeout=3) == 401
        assert {status(instance.port(), "/secret", cookie=cookie) for _ in range(3)} == {401}
        said = instance.wait_for("is not as nestgate wrote it")
        assert key[-64:][:16] in said and "taken as no session" in said
    # Said once per worker that met it (two each), never again for the same session.
    for instance in (a, b):
        assert sum("is not as nestgate wrote it" in line for line in instance.lines) <= 2
    # The admin API's listing leaves it out instead of failing.
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", a.admin_port(), timeout=5)
    conn.request("GET", "/v1/sessions", headers=admin_headers(a.admin_port()))
    answer = conn.getresponse()
    assert answer.status == 200 and json.loads(answer.read())["sessions"] == []
    conn.close()


def test_a_forms_token_is_the_sessions_on_every_instance_and_a_planted_one_on_none(two):
    """The sign-out form's token is bound to the session with the secret both instances
    share through Redis: made on one, it passes on the other; a nonce cookie and token
    another page planted pass on neither."""
    a, b, _ = two
    attacker = Browser(b.port())
    planted = attacker.form_token("/__auth__/logout"), attacker.jar["nestgate_csrf"]
    visitor = Browser(a.port())
    assert visitor.sign_in()[0].status == 303
    cookie = visitor.jar["nestgate_session"]
    token = visitor.form_token("/__auth__/logout")                # made by a
    on_b = Browser(b.port())
    on_b.jar = {**visitor.jar, "nestgate_csrf": planted[1]}
    assert on_b.post_form("/__auth__/logout", {"csrf": planted[0]})[0].status == 403
    assert status(b.port(), "/secret", cookie=cookie) == 200      # still signed in
    assert on_b.post_form("/__auth__/logout", {"csrf": token})[0].status == 303
    assert poll(lambda: status(a.port(), "/secret", cookie=cookie),
                lambda s: s == 401, timeout=3) == 401


def test_revoking_through_one_admin_api_signs_out_everywhere(two):
    a, b, _ = two
    visitor = Browser(b.port())
    assert visitor.sign_in()[0].status == 303
    cookie = visitor.jar["nestgate_session"]
    assert status(a.port(), "/secret", cookie=cookie) == 200
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", a.admin_port(), timeout=5)
    conn.request("GET", "/v1/sessions", headers=admin_headers(a.admin_port()))
    sessions = json.loads(conn.getresponse().read())["sessions"]
    assert [s["user"] for s in sessions] == ["demo"]
    conn.request("DELETE", "/v1/users/demo/sessions", headers=admin_headers(a.admin_port()))
    answer = conn.getresponse()
    assert answer.status == 200 and json.loads(answer.read())["revoked"] == 1
    conn.close()
    for instance in (a, b):
        assert poll(lambda instance=instance: status(instance.port(), "/secret", cookie=cookie),
                    lambda s: s == 401, timeout=3) == 401


def test_the_sign_in_back_off_counts_over_both_instances(two):
    a, b, _ = two
    # The account's delay: after 3 failures in a row (account_failures), the next
    # attempt waits, on whichever instance it comes to.
    wrong = [Browser(port).sign_in(password="wrong")[0].status
             for port in (a.port(), b.port(), a.port(), b.port())]
    assert wrong == [401, 401, 401, 429]
    # The address's count: 4 failures (max_failures), over both instances, then 429
    # for everything from it, even the right password.
    assert Browser(a.port()).sign_in(user="nobody", password="wrong")[0].status == 401
    for port in (a.port(), b.port()):
        assert Browser(port).sign_in(user="otp", code="000000")[0].status == 429


def test_the_sign_in_back_off_counts_an_ipv6_client_by_its_64(redis_server):
    """Addresses of one /64 share one count in Redis, as in the SQLite store."""
    from nestgate.handlers.auth.redisstore import RedisStore, redis_locator
    store = RedisStore(redis_locator(redis_server.url, "v6:"))
    try:
        waits = [store.take_sign_in(f"2001:db8:5:6::{i + 1:x}", 60.0, 3) for i in range(5)]
        assert [w > 0 for w in waits] == [False, False, False, True, True]
        assert store.failures("2001:db8:5:6:ffff::1", 60.0) == 3
        assert store.take_sign_in("2001:db8:5:7::1", 60.0, 3) == 0.0
        store.signed_in("demo", "2001:db8:5:6::abc")
        assert store.failures("2001:db8:5:6::1", 60.0) == 0
    finally:
        store.close()


def test_a_totp_code_is_good_once_on_either_instance(two):
    a, b, _ = two
    step = settled_step()
    code = otp_code(step)
    assert Browser(a.port()).sign_in(user="otp", code=code)[0].status == 303
    assert Browser(b.port()).sign_in(user="otp", code=code)[0].status == 401


def test_allow_entries_reach_both_instances_and_expire(two, tmp_path):
    a, b, _ = two
    config = tmp_path / "a.toml"
    for instance in (a, b):
        assert status(instance.port(), "/hello", host="lan.test") == 403
    out = subprocess.run([sys.executable, "-m", "nestgate", "allow", "add", "127.0.0.1",
                          "--for", "8s", "--comment", "test", "--config", str(config)],
                         capture_output=True, text=True, env=_env(), timeout=30)
    assert out.returncode == 0, out.stderr
    assert REDIS_PASSWORD not in out.stdout + out.stderr
    for instance in (a, b):
        assert poll(lambda instance=instance: status(instance.port(), "/hello", host="lan.test"),
                    lambda s: s == 200, timeout=2) == 200
    listed = subprocess.run([sys.executable, "-m", "nestgate", "allow", "list", "--config",
                             str(config)], capture_output=True, text=True, env=_env(), timeout=30)
    assert "127.0.0.1" in listed.stdout and "test" in listed.stdout
    # 8 s: long enough for `allow list` (a Python start) to see the entry on a busy machine.
    for instance in (a, b):                                   # the entry's time runs out
        assert poll(lambda instance=instance: status(instance.port(), "/hello", host="lan.test"),
                    lambda s: s == 403, timeout=12) == 403


def test_while_redis_does_not_answer_private_sites_say_503_and_recover(two):
    a, b, redis_server = two
    proc = redis_server.proc
    visitor = Browser(a.port())
    assert visitor.sign_in()[0].status == 303
    cookie = visitor.jar["nestgate_session"]
    os.kill(proc.pid, signal.SIGSTOP)                         # Redis hangs
    try:
        time.sleep(1.2)                                       # past the 1 s session cache
        for instance in (a, b):
            resp, body = Browser(instance.port()).request(
                "GET", "/secret", headers={"Cookie": f"nestgate_session={cookie}",
                                           "Accept": "text/html"})
            assert resp.status == 503 and b"target" not in body
            assert b"try again soon" in body
            # A visitor without a session is not let in either.
            assert status(instance.port(), "/secret") == 401
        # Sites without sign-in go on as before.
        assert status(a.port(), "/hello", host="lan.test") == 403
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    for instance in (a, b):
        assert poll(lambda instance=instance: status(instance.port(), "/secret", cookie=cookie),
                    lambda s: s == 200, timeout=10) == 200
    assert any("private sites answer 503" in line for line in a.lines)
    a.wait_for(": back", timeout=10)
    assert not any(REDIS_PASSWORD in line for line in a.lines + b.lines)


def test_while_redis_hangs_every_waiting_visitor_gets_its_503(two):
    """A Redis that hangs costs its 2 s timeout per call, and a worker's store calls
    wait their turn on one thread: sixteen visitors arriving together were answered one
    per 2 s, the last after half a minute (most gave up at their 10 s). After a call
    times out, the calls behind it are answered 503 at once for a second."""
    import threading
    a, _b, redis_server = two
    visitors = [Browser(a.port()) for _ in range(16)]
    for visitor in visitors:
        assert visitor.sign_in()[0].status == 303
    os.kill(redis_server.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(1.2)                                       # past the 1 s session cache
        answers = [None] * len(visitors)

        def visit(i: int) -> None:
            try:                                              # the Browser waits 10 s
                answers[i] = visitors[i].request("GET", "/secret")[0].status
            except OSError as exc:
                answers[i] = type(exc).__name__
        threads = [threading.Thread(target=visit, args=(i,)) for i in range(len(visitors))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert answers == [503] * len(visitors), answers
    finally:
        os.kill(redis_server.proc.pid, signal.SIGCONT)
    assert poll(lambda: visitors[0].request("GET", "/secret")[0].status,
                lambda s: s == 200, timeout=5) == 200


def test_a_rate_limit_holds_over_both_instances(start_server, redis_server):
    """10/s with a burst of 20 on each of two instances sharing Redis, 25 connections
    to each for 8 s: what both let through together is the limit's, not twice it (the
    instances share what they used every 0.1 s)."""
    import asyncio

    from conftest import RATE_LIMIT_SITE, _load
    url = redis_server.url
    config = f'[state]\nbackend = "redis"\nurl = "{url}"\n' + RATE_LIMIT_SITE.format(
        listen="", route="", site='rate_limit = { rate = "10/s", burst = 20 }')
    a = start_server(config, name="a.toml")
    b = start_server(config, name="b.toml")

    async def both():
        return await asyncio.gather(_load(a.port(), 25, 8.0), _load(b.port(), 25, 8.0))
    started = time.monotonic()
    first, second = asyncio.run(both())
    elapsed = time.monotonic() - started
    passed = first.get(200, 0) + second.get(200, 0)
    expected = 20 + 10 * elapsed
    assert first.get(200) and second.get(200)                # both instances served
    assert abs(passed - expected) <= 0.1 * expected, (first, second, elapsed)


def test_rate_limits_go_on_alone_while_redis_does_not_answer(start_server, redis_server):
    from conftest import RATE_LIMIT_SITE, get_from
    url, proc = redis_server.url, redis_server.proc
    server = start_server(f'[state]\nbackend = "redis"\nurl = "{url}"\n' + RATE_LIMIT_SITE.format(
        listen="", route="", site='rate_limit = { rate = "100/s", burst = 100 }'))
    port = server.port()
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        assert {get_from(port, "/")[0] for _ in range(5)} == {200}     # limited here alone
        server.wait_for("each instance limits alone", timeout=10)
        assert {get_from(port, "/")[0] for _ in range(5)} == {200}
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    # Each worker finds Redis again with its next batch: requests (new connections,
    # so both workers get some) until the one that said Redis was away says so.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and \
            not any("shared through Redis again" in line for line in server.lines):
        assert get_from(port, "/")[0] == 200
        time.sleep(0.1)
    server.wait_for("shared through Redis again", timeout=1)
    assert not any(REDIS_PASSWORD in line for line in server.lines)


def test_redis_stopped_and_started_again_under_load(two):
    """Nothing crashes while Redis is away: private sites answer 503 (never the page
    without a session check), other sites as before; once Redis is back (with its
    append-only file) the same session is valid again on both instances."""
    import threading
    a, b, redis_server = two
    visitor = Browser(a.port())
    assert visitor.sign_in()[0].status == 303
    cookie = visitor.jar["nestgate_session"]
    pids = {s: sorted(s.worker_pids()) for s in (a, b)}
    seen: list[tuple[float, int]] = []
    errors: list[Exception] = []
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            for instance in (a, b):
                try:
                    seen.append((time.monotonic(), status(instance.port(), "/secret",
                                                          cookie=cookie)))
                    assert status(instance.port(), "/hello", host="lan.test") == 403
                except Exception as exc:  # noqa: BLE001 - reported below
                    errors.append(exc)
    worker = threading.Thread(target=load)
    worker.start()
    try:
        time.sleep(0.5)
        redis_server.stop()
        stopped = time.monotonic()
        time.sleep(2.5)
        restarting = time.monotonic()
        redis_server.start()
        started = time.monotonic()
        deadline = started + 10
        while time.monotonic() < deadline and not any(
                t > started and code == 200 for t, code in seen[-4:]):
            time.sleep(0.1)
    finally:
        stop.set()
        worker.join(30)
    assert not errors, errors[:3]
    statuses = {code for _t, code in seen}
    assert statuses <= {200, 503}, statuses
    # A checked session is honoured for at most 1 s; after that, 503 until Redis is back.
    assert {code for t, code in seen if stopped + 1.2 < t < restarting} == {503}
    assert seen[-1][1] == 200
    assert {s: sorted(s.worker_pids()) for s in (a, b)} == pids    # no worker restarted


def test_behind_haproxy_a_visitor_keeps_working_while_an_instance_restarts(
        start_server, redis_server, upstream, tmp_path):
    """HAProxy (Debian's) as the L4 balancer in front of two instances: a browser-like
    client signs in through it and keeps being served while one instance is stopped
    and started again (its session lives in Redis, not in either instance)."""
    haproxy = shutil.which("haproxy")
    assert haproxy, "haproxy is installed by `make test` (debian-deps)"
    shared = (f'cookie_secure = false\n\n'
              f'[state]\nbackend = "redis"\nurl = "{redis_server.url}"\n')
    config = protected(upstream().url, str(tmp_path / "unused.db"), extra_auth=shared)
    ports = [_free_port(), _free_port()]
    configs = [config.replace('address = "127.0.0.1:0"', f'address = "127.0.0.1:{port}"', 1)
               for port in ports]
    instances = [start_server(c, name=f"{n}.toml") for n, c in zip("ab", configs)]
    front = _free_port()
    (tmp_path / "haproxy.cfg").write_text(f"""
global
    maxconn 256
defaults
    mode tcp
    timeout connect 1s
    timeout client 10s
    timeout server 10s
    retries 3
    option redispatch
frontend gateway
    bind 127.0.0.1:{front}
    default_backend instances
backend instances
    balance roundrobin
    server a 127.0.0.1:{ports[0]} check inter 200ms fall 1 rise 1
    server b 127.0.0.1:{ports[1]} check inter 200ms fall 1 rise 1
""")
    balancer = subprocess.Popen([haproxy, "-db", "-f", str(tmp_path / "haproxy.cfg")],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", front), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "haproxy did not start"
                time.sleep(0.05)
        visitor = Browser(front)                   # a new connection per request
        assert visitor.sign_in(next_url="/app")[0].status == 303

        def served() -> list[int]:
            return [visitor.request("GET", "/app")[0].status for _ in range(6)]
        assert served() == [200] * 6
        instances[0].stop()                        # one instance goes away ...
        assert served() == [200] * 6
        restarted = start_server(configs[0], name="a.toml")   # ... and comes back
        assert restarted.port() == ports[0]
        time.sleep(0.5)                            # HAProxy's check sees it up
        assert served() == [200] * 6
        instances[1].stop()                        # now only the restarted one is left
        assert served() == [200] * 6
    finally:
        balancer.kill()
        balancer.wait()


def test_a_note_written_on_one_instance_is_told_to_the_others(start_server, redis_server,
                                                              tmp_path):
    """Both sides of the notes broadcast: a write through one instance's API is
    published on `<prefix>notes`; a message from another instance makes this one read
    the note again even when its file looks unchanged (a network filesystem that has
    not shown the new size and mtime yet)."""
    import http.client

    import redis
    from conftest import get_from
    notes = tmp_path / "notes"
    notes.mkdir()
    note = notes / "first.md"
    note.write_text("---\ntitle: First\n---\nOld words.\n")
    config = f"""
[server]
workers = 2
[[listen]]
address = "127.0.0.1:0"
[state]
backend = "redis"
url = "{redis_server.url}"
prefix = "gw1:"
[[site]]
name = "blog"
hosts = ["*"]
[site.notes]
dir = "{notes}"
token = "notes-token-for-the-tests-000"
"""
    a = start_server(config, name="a.toml")
    b = start_server(config, name="b.toml")
    listener = redis.Redis.from_url(redis_server.url).pubsub()
    listener.subscribe("gw1:notes")
    assert listener.get_message(timeout=5)["type"] == "subscribe"

    conn = http.client.HTTPConnection("127.0.0.1", a.port(), timeout=10)
    conn.request("PUT", "/api/v1/notes/second", json.dumps({"title": "Second", "body": "Hi."}),
                 {"Authorization": "Bearer notes-token-for-the-tests-000",
                  "Content-Type": "application/json"})
    assert conn.getresponse().status == 201
    conn.close()
    message = listener.get_message(timeout=5)
    assert json.loads(message["data"])["site"] == "blog"
    assert json.loads(message["data"])["slug"] == "second"

    # Every worker of B has the note's page rendered from the old words ...
    for _ in range(6):
        status_, _h, body = get_from(b.port(), "/notes/first")
        assert status_ == 200 and b"Old words." in body
    # ... the file changes in a way its (inode, mtime, size) do not show ...
    before = note.stat()
    with open(note, "r+b") as f:
        f.write(note.read_bytes().replace(b"Old words.", b"New words."))
    os.utime(note, ns=(before.st_atime_ns, before.st_mtime_ns))
    time.sleep(1.5)                                  # the directory check sees nothing
    assert b"Old words." in get_from(b.port(), "/notes/first")[2]
    # ... and another instance says it wrote it.
    redis.Redis.from_url(redis_server.url).publish(
        "gw1:notes", json.dumps({"site": "blog", "slug": "first", "from": "elsewhere"}))
    for _ in range(6):                               # new connections: both workers
        assert b"New words." in poll(lambda: get_from(b.port(), "/notes/first")[2],
                                     lambda page: b"New words." in page, timeout=2)
    listener.close()


def test_passkeys_and_recovery_codes_are_shared_and_single_use_over_both_instances(two):
    import softauthn
    from softauthn import SoftAuthenticator
    a, b, _ = two
    owner = Browser(a.port())
    assert owner.sign_in()[0].status == 303
    key = SoftAuthenticator()
    assert softauthn.register(owner, key) == 303            # registered through a
    visitor = Browser(b.port())                             # signs in through b
    resp, _ = softauthn.sign_in(visitor, key)
    assert resp.status == 303
    assert status(a.port(), "/x", cookie=visitor.jar["nestgate_session"]) == 200
    # A challenge begun on b, answered on a and then on b: once.
    thief = Browser(b.port())
    csrf, opts = softauthn.begin_sign_in(thief)
    answer = key.assert_(opts, softauthn.origin_of(thief), count=key.count + 1)
    on_a = Browser(a.port())
    on_a.jar = dict(thief.jar)
    assert softauthn.finish_sign_in(on_a, csrf, answer)[0].status == 303
    assert softauthn.finish_sign_in(thief, csrf, answer)[0].status == 401
    # The counter going back is seen by the other instance.
    late = Browser(a.port())
    csrf, opts = softauthn.begin_sign_in(late)
    assert softauthn.finish_sign_in(late, csrf, key.assert_(
        opts, softauthn.origin_of(late), count=1))[0].status == 401
    # Recovery codes made on a, one used on b, refused again on a.
    step = settled_step()
    otp = Browser(a.port())
    assert otp.sign_in(user="otp", code=otp_code(step))[0].status == 303
    csrf = otp.form_token("/__auth__/account")
    page = otp.post_form("/__auth__/account", {"csrf": csrf, "action": "recovery"})[1]
    code = page.decode().split("<code>")[1].split("</code>")[0]
    assert Browser(b.port()).sign_in(user="otp", code=code)[0].status == 303
    assert Browser(a.port()).sign_in(user="otp", code=code)[0].status == 401
    # Revoked through a's account page: refused on b.
    fresh = Browser(a.port())
    assert softauthn.sign_in(fresh, key)[0].status == 303   # changing needs two factors
    page = fresh.request("GET", "/__auth__/account")[1].decode()
    cred = page.split('name="revoke" value="')[1].split('"')[0]
    fresh_csrf = page.split('name="csrf" value="')[1].split('"')[0]
    assert fresh.post_form("/__auth__/account", {"csrf": fresh_csrf, "revoke": cred})[0] \
        .status == 303
    assert softauthn.sign_in(Browser(b.port()), key)[0].status == 401


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_a_user_stays_bound_to_the_provider_account_that_came_first(backend, request,
                                                                     tmp_path):
    """The binding of a configured user to a provider's subject, in either store: the
    first subject stays, per provider, until the owner unbinds the user."""
    from nestgate.handlers.auth.redisstore import RedisStore, redis_locator
    from nestgate.handlers.auth.store import Store
    if backend == "redis":
        store = RedisStore(redis_locator(request.getfixturevalue("redis_server").url, "b:"))
    else:
        store = Store(str(tmp_path / "state.db"))
    one, two = "https://id.example.test", "https://other.example.test"
    try:
        assert store.bind_subject(one, "carol", "sub-1") == "sub-1"
        assert store.bind_subject(one, "carol", "sub-2") == "sub-1"     # renamed account
        assert store.bind_subject(two, "carol", "sub-2") == "sub-2"     # another provider
        assert store.bind_subject(one, "ann", "sub-2") == "sub-2"       # another user
        assert store.unbind_subjects("carol") == 2
        assert store.unbind_subjects("carol") == 0
        assert store.bind_subject(one, "carol", "sub-2") == "sub-2"     # made anew
        assert store.bind_subject(one, "ann", "sub-1") == "sub-2"
    finally:
        store.close()
