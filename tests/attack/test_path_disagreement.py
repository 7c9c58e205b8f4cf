"""Requests the access rule reads one way and the upstream another.

A protected site lets everyone into `/public/` (policy "bypass") and only admins into
`/admin/`. nestgate picks the route, and so the policy, by the normalised path; the
upstream (here one strict parser per connection, as `rawupstream.RawUpstream`) routes
by the bytes it is sent, as Node, Express and many apps do, without removing dot
segments or merging slashes.

1. Dot segments and doubled slashes: `/admin/../public/x` was matched as `/public/x`
   (no sign-in) and sent upstream as written, where it names `/admin/`. The upstream
   must see the path the route was chosen by, over HTTP/1.1 and h2c, and a flood of
   such spellings must not grow the worker.
2. The prefix without its slash: `/admin` is not under `/admin/`, so it fell to the
   `/` route and its policy, while an upstream that serves `/admin` as `/admin/`
   (Express's `app.use("/admin", ...)`) showed the admins' page to any user. It must
   meet the `/admin/` route's guard, and whoever passes it is sent to `/admin/`.
   Java servers (Tomcat, Jetty, Spring) drop a segment's `;` parameters before its
   dot segments: `/public/..;/admin/x` is `/admin/x` there, a path under `/public/` to
   the route match. Such a segment is refused.
3. Headers that give the app another path, prefix, port or client address than the
   request nestgate checked (`X-Original-URL: /admin/` on a `/public/` request, which
   IIS, Zend and older Symfony route by; `X-Forwarded-Prefix`, `True-Client-IP`...):
   from a client (no trusted proxy) none reaches the upstream.
"""

from __future__ import annotations

import socket
import time

import pytest

from conftest import PASSWORD_HASH, Browser
from h2client import H2Client
from rawupstream import RawUpstream

RSS_GROWTH_BOUND_KIB = 8 * 1024
FLOOD = 2_000
BATCH = 200

CONFIG = f"""
[server]
workers = 1

[[listen]]
address = "127.0.0.1:0"
http2_cleartext = true

[auth]
store = "state.db"

[[auth.user]]
name = "bob"
password = "{PASSWORD_HASH}"
groups = ["family"]

[[site]]
hosts = ["home.test"]
protected = true

[[site.route]]
prefix = "/"
type = "proxy"
upstream = "{{up}}"

[[site.route]]
prefix = "/public/"
type = "proxy"
upstream = "{{up}}"
policy = "bypass"

[[site.route]]
prefix = "/admin/"
type = "proxy"
upstream = "{{up}}"
allow_groups = ["admins"]
"""

# Spellings of a path under /public/ that begin in /admin/ (or elsewhere on the
# site) before a dot segment leaves it; each with the path nestgate routes it by.
DOTTED = [
    ("/admin/../public/x", "/public/x"),
    ("/admin/%2e%2e/public/x", "/public/x"),
    ("/admin/%2E%2e/public/x?next=/admin/../x", "/public/x?next=/admin/../x"),
    ("/admin/.%2e/public/", "/public/"),
    ("/admin/x/../../public/x", "/public/x"),
    ("/secret//../public/x", "/public/x"),      # slashes merged, then climbed
    ("/secret/x/..", "/secret/"),               # not public: the sign-in, nothing upstream
    ("/admin/./../public/a%20b", "/public/a%20b"),
    ("//public/x", "/public/x"),
    ("/public/./x", "/public/x"),
    ("/public//x/.", "/public/x/"),
]


@pytest.fixture
def home(start_server):
    up = RawUpstream()
    server = start_server(CONFIG.replace("{up}", up.url))
    yield server, up
    up.stop()


def _get(port: int, target: str) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(b"GET %s HTTP/1.1\r\nHost: home.test\r\nConnection: close\r\n\r\n"
                     % target.encode())
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer


def test_dot_segments_reach_the_upstream_as_the_route_read_them(home):
    server, up = home
    for target, routed in DOTTED:
        answer = _get(server.port(), target)
        seen = [r["target"] for r in up.take()]
        if routed.startswith("/public/"):
            assert answer.startswith(b"HTTP/1.1 200 "), (target, answer[:80])
            assert seen == [routed], (target, seen)
        else:                                   # the site's sign-in, nothing upstream
            assert answer.startswith(b"HTTP/1.1 401 "), (target, answer[:80])
            assert seen == [], (target, seen)
    h2 = H2Client(server.port(), None, server_hostname="home.test")
    try:
        for target, routed in DOTTED:
            status, _headers, _body = h2.request("GET", target)
            seen = [r["target"] for r in up.take()]
            assert (status, seen) == ((200, [routed]) if routed.startswith("/public/")
                                      else (401, [])), target
    finally:
        h2.close()


def test_a_flood_of_dotted_paths_never_names_another_route_upstream(home):
    server, up = home
    assert _get(server.port(), "/public/warm").startswith(b"HTTP/1.1 200 ")
    up.take()
    before = server.worker_rss_kib()
    deadline = time.monotonic() + 60
    mark = b"HTTP/1.1 200 "
    for start in range(0, FLOOD, BATCH):
        with socket.create_connection(("127.0.0.1", server.port()), timeout=10) as conn:
            conn.sendall(b"".join(
                b"GET /admin/n%d/%%2e%%2e/..//public/%d HTTP/1.1\r\nHost: home.test\r\n\r\n"
                % (n, n) for n in range(start, start + BATCH)))
            answered, pending = 0, b""
            while answered < BATCH:
                assert time.monotonic() < deadline, "the worker fell behind"
                chunk = conn.recv(1 << 20)
                assert chunk, "the connection closed"
                pending += chunk
                answered += pending.count(mark)
                pending = pending[-(len(mark) - 1):]
    grown = server.worker_rss_kib() - before
    assert grown < RSS_GROWTH_BOUND_KIB, f"worker grew {grown} KiB"
    seen = [r["target"] for r in up.take()]
    assert len(seen) == FLOOD
    assert all(t.startswith("/public/") and "." not in t and "//" not in t for t in seen), \
        [t for t in seen if not t.startswith("/public/")][:5]


def test_a_prefix_without_its_slash_meets_the_prefix_routes_guard(home):
    server, up = home
    port = server.port()
    # Not signed in: the protected site's sign-in for /admin, the bypass route's
    # redirect (query kept) for /public; nothing upstream either way.
    assert _get(port, "/admin").startswith(b"HTTP/1.1 401 ")
    answer = _get(port, "/public?a=1&b=/../x")
    assert answer.startswith(b"HTTP/1.1 308 "), answer[:80]
    assert b"\r\nlocation: /public/?a=1&b=/../x\r\n" in answer
    assert up.take() == []
    bob = Browser(port, "home.test")
    assert bob.sign_in("bob")[0].status == 303
    for path in ("/admin", "/admin?x=1", "/%61dmin", "/x/../admin"):
        resp, _ = bob.request("GET", path)
        assert resp.status == 403, (path, resp.status)
    resp, _ = bob.request("POST", "/admin", body=b"x=1",
                          headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert resp.status == 403
    resp, _ = bob.request("GET", "/public")
    assert (resp.status, resp.getheader("location")) == (308, "/public/")
    h2 = H2Client(port, None, server_hostname="home.test")
    try:
        status, headers, _body = h2.request("GET", "/public")
        assert (status, headers.get("location")) == (308, "/public/")
        assert h2.request("GET", "/admin")[0] == 401
    finally:
        h2.close()
    assert [r["target"] for r in up.take()] == []
    # The prefix itself and what is under it are served as before.
    assert bob.request("GET", "/public/")[0].status == 200
    assert bob.request("GET", "/adminx")[0].status == 200       # the "/" route's path
    assert [r["target"] for r in up.take()] == ["/public/", "/adminx"]


OVERRIDES = {"X-Original-URL": "/admin/x", "X-Rewrite-URL": "/admin/x",
             "X-Original-Host": "evil.test", "X-Forwarded-Prefix": "/admin",
             "X-Forwarded-Port": "8443", "X-Forwarded-Ssl": "on",
             "X-Forwarded-Scheme": "https", "X-Forwarded-Server": "evil.test",
             "X-Url-Scheme": "https", "Front-End-Https": "on", "Client-IP": "10.0.0.1",
             "X-Client-IP": "10.0.0.1", "True-Client-IP": "10.0.0.1",
             "CF-Connecting-IP": "10.0.0.1", "X-Cluster-Client-IP": "10.0.0.1",
             "Fastly-Client-IP": "10.0.0.1", "X_Original_URL": "/admin/x"}


def test_path_and_address_overrides_from_a_client_never_reach_the_upstream(home):
    server, up = home
    port = server.port()
    before = server.worker_rss_kib()
    lines = b"".join(b"%s: %s\r\n" % (n.encode(), v.encode()) for n, v in OVERRIDES.items())
    for n in range(500):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
            conn.sendall(b"GET /public/%d HTTP/1.1\r\nHost: home.test\r\n%s"
                         b"Connection: close\r\n\r\n" % (n, lines))
            answer = b""
            while chunk := conn.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 200 "), answer[:80]
    h2 = H2Client(port, None, server_hostname="home.test")
    try:
        pairs = [(n.lower().encode(), v.encode()) for n, v in OVERRIDES.items()
                 if "_" not in n]
        assert h2.request("GET", "/public/h2", headers=pairs)[0] == 200
    finally:
        h2.close()
    grown = server.worker_rss_kib() - before
    assert grown < RSS_GROWTH_BOUND_KIB, f"worker grew {grown} KiB"
    seen = up.take()
    assert len(seen) == 501
    refused = {n.lower().replace("_", "-") for n in OVERRIDES}
    for request in seen:
        names = {n.replace("_", "-") for n, _v in request["headers"]}
        assert not names & refused, (request["target"], names & refused)


def test_dot_segments_with_parameters_are_refused(home):
    server, up = home
    port = server.port()
    spellings = ("/public/..;/admin/x", "/public/%2e%2e;/admin/x", "/public/..;a=b/admin/",
                 "/public/.;/x", "/public/..%3b/admin/x", "/public/%2E.%3Bx/admin/x")
    for target in spellings:
        answer = _get(port, target)
        assert answer.startswith(b"HTTP/1.1 400 "), (target, answer[:80])
    h2 = H2Client(port, None, server_hostname="home.test")
    try:
        for target in spellings:
            assert h2.request("GET", target)[0] == 400, target
    finally:
        h2.close()
    assert up.take() == []
    # Parameters on other segments are the app's business: forwarded as they came.
    assert _get(port, "/public/a;jsessionid=1/x").startswith(b"HTTP/1.1 200 ")
    assert [r["target"] for r in up.take()] == ["/public/a;jsessionid=1/x"]
