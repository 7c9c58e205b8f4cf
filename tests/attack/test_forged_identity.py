"""Claiming someone else's identity at the door.

1. A signed-in family member pipelines thousands of requests, each carrying forged
   identity headers (every spelling, repeated, as lists, with the configured names):
   the upstream sees only nestgate's Remote-User for each, and the worker stays small.
   Spellings with `_` for `-` count: a CGI, WSGI or PHP app reads `Remote_User` as
   `HTTP_REMOTE_USER`, the field nestgate vouches for; so do spellings with `.`, which
   PHP turns into `_` where the server in front of it (Caddy's `php_fastcgi`) passes
   the name on: `Remote.User` fills `$_SERVER['HTTP_REMOTE_USER']`.
2. The same user tries to reach the admins' route by the forged headers, by spelling
   the path otherwise (percent-encoded, dot segments) and by a session cookie of a
   user who no longer exists: refused each time, and the upstream never sees it.
"""

from __future__ import annotations

import socket
import time

from conftest import PASSWORD_HASH, Browser
from h2client import H2Client

REQUESTS = 4_000
BATCH = 200
RSS_GROWTH_BOUND_KIB = 8 * 1024

CONFIG = f"""
[server]
workers = 1

[[listen]]
address = "127.0.0.1:0"

[auth]
store = "state.db"
identity_headers = {{ user = "X-WebAuth-User" }}

[[auth.user]]
name = "bob"
password = "{PASSWORD_HASH}"
groups = ["family"]

[[auth.user]]
name = "ann"
password = "{PASSWORD_HASH}"
groups = ["family", "admins"]

[[site]]
hosts = ["home.test"]
protected = true
allow_groups = ["family"]

[[site.route]]
prefix = "/"
type = "proxy"
upstream = "{{up}}"

[[site.route]]
prefix = "/admin/"
type = "proxy"
upstream = "{{up}}"
allow_groups = ["admins"]

[[site.route]]
prefix = "/open/"
type = "proxy"
upstream = "{{up}}"
policy = "bypass"
"""

SPELLINGS = (b"Remote-User: admin-%d\r\n", b"REMOTE-USER: admin-%d\r\nremote-user: ann\r\n",
             b"X-WebAuth-User: admin-%d\r\n", b"x-webauth-USER: ann, admin-%d\r\n",
             b"Remote-Groups: admins,x%d\r\n", b"Remote-Email: admin-%d@evil.test\r\n",
             b"Remote-Name: Admin %d\r\nRemote-Name: Ann\r\n",
             # The same field to a CGI-style app (HTTP_REMOTE_USER, HTTP_X_WEBAUTH_USER).
             b"Remote_User: admin-%d\r\n", b"X_WebAuth-User: ann\r\nx-webauth_user: a%d\r\n",
             b"REMOTE_GROUPS: admins,x%d\r\n")


def test_forged_identity_headers_in_bulk_reach_no_upstream(start_server, upstream):
    up = upstream()
    server = start_server(CONFIG.replace("{up}", up.url))
    bob = Browser(server.port(), "home.test")
    assert bob.sign_in("bob")[0].status == 303
    cookie = "; ".join(f"{k}={v}" for k, v in bob.jar.items()).encode()
    assert bob.request("GET", "/warm")[0].status == 200
    before = server.worker_rss_kib()
    mark = b"HTTP/1.1 200 "
    deadline = time.monotonic() + 90
    answered = 0
    for start in range(0, REQUESTS, BATCH):
        with socket.create_connection(("127.0.0.1", server.port()), timeout=10) as conn:
            conn.sendall(b"".join(
                b"GET /hi HTTP/1.1\r\nHost: home.test\r\nCookie: %s\r\n%s\r\n"
                % (cookie, SPELLINGS[n % len(SPELLINGS)] % n)
                for n in range(start, start + BATCH)))
            pending = b""
            while answered < start + BATCH:
                assert time.monotonic() < deadline, "the worker fell behind"
                chunk = conn.recv(1 << 20)
                assert chunk, "the connection closed"
                pending += chunk
                answered += pending.count(mark)
                pending = pending[-(len(mark) - 1):]
    assert answered == REQUESTS
    grown = server.worker_rss_kib() - before
    assert grown < RSS_GROWTH_BOUND_KIB, f"worker grew {grown} KiB"
    seen = [r for r in up.requests if r["target"] == "/hi"]
    assert len(seen) == REQUESTS
    for request in seen:
        claimed = [(n, v) for n, v in request["headers"]
                   if n.replace("_", "-").startswith("remote-")
                   or n.replace("_", "-") == "x-webauth-user"]
        assert claimed == [("x-webauth-user", "bob"), ("remote-groups", "family")], claimed


def test_the_admins_route_is_not_reached_by_any_spelling(start_server, upstream, tmp_path):
    up = upstream()
    server = start_server(CONFIG.replace("{up}", up.url))
    bob = Browser(server.port(), "home.test")
    assert bob.sign_in("bob")[0].status == 303
    forged = {"Remote-User": "ann", "Remote-Groups": "admins", "X-WebAuth-User": "ann"}
    # Every spelling is read as /admin/x (escapes decoded, dot segments resolved, empty
    # segments kept by the prefix match) and meets the route's policy.
    for path in ("/admin/x", "/%61dmin/x", "/admin/%2e%2e/admin/x", "/x/../admin/x",
                 "/./admin/x", "/admin//x"):
        resp, _ = bob.request("GET", path, headers=forged)
        assert resp.status == 403, (path, resp.status)
    assert not any("dmin" in r["target"] for r in up.requests), up.requests
    # A session whose user is gone (here: made up in the store) is no session.
    # (Its token tagged with the store's secret, as the server's own are.)
    from nestgate.handlers.auth.sessiontoken import new_token, token_hash
    from nestgate.handlers.auth.store import Store
    store = Store(str(tmp_path / "state.db"))
    forged = new_token(store.secret())
    store.create_session(token_hash(forged), "root", time.time() + 3600, "")
    store.close()
    for path in ("/x", "/admin/x"):
        resp, _ = bob.request("GET", path, cookies=False,
                              headers={"Cookie": f"nestgate_session={forged}"})
        assert resp.status == 401, (path, resp.status)
    assert not any(r["target"] in ("/x", "/admin/x") for r in up.requests)


def test_underscore_spellings_never_reach_the_upstream(start_server, upstream):
    """`Remote_User: ann` went upstream beside nestgate's `Remote-User: bob` (a
    CGI-style app joins or picks one of them as HTTP_REMOTE_USER), and alone on a
    route without sign-in; `X_Forwarded_For` likewise beside nestgate's own."""
    up = upstream()
    server = start_server(CONFIG.replace("{up}", up.url))
    bob = Browser(server.port(), "home.test")
    assert bob.sign_in("bob")[0].status == 303
    forged = {"Remote_User": "ann", "remote_groups": "admins", "X_WebAuth-User": "ann",
              "x-webauth_user": "ann", "X_Forwarded_For": "10.0.0.1",
              "X-Forwarded_Host": "evil.test", "x_real_ip": "10.0.0.1"}
    for path, cookies in (("/x", True), ("/open/x", False), ("/open/y", True)):
        resp, _ = bob.request("GET", path, headers=forged, cookies=cookies)
        assert resp.status == 200, (path, resp.status)
    assert [r["target"] for r in up.requests] == ["/x", "/open/x", "/open/y"]
    for request in up.requests:
        names = [n for n, _v in request["headers"]]
        assert not [n for n in names if "_" in n], (request["target"], names)
        as_cgi = [(n.replace("_", "-"), v) for n, v in request["headers"]]
        assert ("x-forwarded-for", "127.0.0.1") in as_cgi
        assert not [v for n, v in as_cgi if n in ("remote-user", "x-webauth-user")
                    and v != "bob"], request


def _no_forged_spelling_reached(requests) -> None:
    """The upstream saw /x then /open/x, no field spelt with `.` or `_`, and nothing a
    CGI server (PHP) would read as the identity or the client's address but nestgate's."""
    assert [r["target"] for r in requests] == ["/x", "/open/x"]
    for request in requests:
        names = [n for n, _v in request["headers"]]
        assert not [n for n in names if "." in n or "_" in n], (request["target"], names)
        php = [(n.replace("-", "_").replace(".", "_"), v) for n, v in request["headers"]]
        assert not [v for n, v in php if n in ("remote_user", "x_webauth_user")
                    and v != "bob"], request
        assert not [v for n, v in php if n == "x_forwarded_for" and v != "127.0.0.1"]


def test_dot_spellings_never_reach_the_upstream(start_server, upstream):
    """`Remote.User: ann` went upstream beside nestgate's `Remote-User: bob`: Caddy's
    php_fastcgi passes it to PHP as HTTP_REMOTE.USER, which PHP registers as
    HTTP_REMOTE_USER, in Caddy's (random) order against nestgate's own; on a route
    without sign-in it was the only one."""
    up = upstream()
    server = start_server(CONFIG.replace("{up}", up.url))
    bob = Browser(server.port(), "home.test")
    assert bob.sign_in("bob")[0].status == 303
    forged = {"Remote.User": "ann", "remote.groups": "admins", "X.WebAuth.User": "ann",
              "x-webauth.user": "ann", "X_WebAuth.User": "ann", "X.Forwarded.For": "10.0.0.1",
              "x-forwarded.host": "evil.test", "X.Real_IP": "10.0.0.1"}
    for path, cookies in (("/x", True), ("/open/x", False)):
        resp, _ = bob.request("GET", path, headers=forged, cookies=cookies)
        assert resp.status == 200, (path, resp.status)
    _no_forged_spelling_reached(up.requests)


def test_dot_spellings_never_reach_the_upstream_over_http2(start_server, upstream):
    """The same forged spellings in an HTTP/2 request (h2c), signed in and on the open
    route: dropped as over HTTP/1.1."""
    up = upstream()
    server = start_server(CONFIG.replace("{up}", up.url).replace(
        'address = "127.0.0.1:0"', 'address = "127.0.0.1:0"\nhttp2_cleartext = true', 1))
    bob = Browser(server.port(), "home.test")
    assert bob.sign_in("bob")[0].status == 303
    cookie = "; ".join(f"{k}={v}" for k, v in bob.jar.items()).encode()
    forged = [(b"remote.user", b"ann"), (b"x.webauth.user", b"ann"),
              (b"x_webauth.user", b"ann"), (b"x.forwarded.for", b"10.0.0.1")]
    client = H2Client(server.port(), None, server_hostname="home.test")
    try:
        status, _h, _b = client.request("GET", "/x", headers=[(b"cookie", cookie), *forged])
        assert status == 200
        status, _h, _b = client.request("GET", "/open/x", headers=forged)
        assert status == 200
    finally:
        client.close()
    _no_forged_spelling_reached(up.requests)
