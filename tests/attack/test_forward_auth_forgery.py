"""Forward auth, attacked from both sides.

1. Open redirect through the provider: forged X-Forwarded-Host, -Uri and
   X-Original-URL (other hosts, user@host, //host and /\\host paths, control
   characters, repeated headers), thousands of them with made-up hosts: every
   sign-in redirect stays on a host the config names and goes back to a path on it,
   and the worker stays small.
2. Forged copy_headers through a nestgate that delegates: every spelling of the
   copied names, repeated and as lists, pipelined: the upstream sees only the auth
   server's value, or none where it named nobody.
3. Guessing passwords through `Authorization: Basic`: counted with the sign-in form's
   failures, so once the client is over the limit the right password is refused too.
4. A path with dot segments asked about: answered for the path without them while the
   proxy asking forwards it as it came, so `/x/../open/y` was let in as `/open/y` and
   went to an upstream that routes it under `/x/`. Such a question is refused.
5. A prefix route's path without its last slash (`/closed` for `/closed/`): answered
   by a shorter prefix's policy, while nestgate's own proxy routes take it as the
   route's and the asking proxy's upstream may serve it as `/closed/`.
"""

from __future__ import annotations

import base64
import re
import socket
import time
from urllib.parse import unquote

from conftest import PASSWORD_HASH, Browser

QUESTIONS = 3_000
BATCH = 150
RSS_GROWTH_BOUND_KIB = 8 * 1024

PROVIDER = f"""
[server]
workers = 1

[[listen]]
address = "127.0.0.1:0"

[auth]
store = "state.db"
cookie_secure = false
identity_headers = {{ user = "X-Auth-User" }}
max_failures = 3

[[auth.user]]
name = "ann"
password = "{PASSWORD_HASH}"
groups = ["family"]

[[auth.forward]]
hosts = ["wiki.test"]

[[site]]
hosts = ["home.test"]
protected = true

[[site.route]]
prefix = "/"
type = "return"
body = "home"

[[site.route]]
prefix = "/open/"
type = "return"
body = "open"
policy = "bypass"

[[site.route]]
prefix = "/closed/"
type = "return"
body = "closed"
policy = "deny"

[[site]]
hosts = ["*"]
protected = true
"""

KNOWN = ("home.test", "wiki.test")

# (headers of the question, path asked on) that try to send the browser elsewhere.
FORGED = [
    ({"X-Forwarded-Host": "evil.test", "X-Forwarded-Uri": "/"}, "forward-auth"),
    ({"X-Forwarded-Host": "home.test@evil.test", "X-Forwarded-Uri": "/"}, "forward-auth"),
    ({"X-Forwarded-Host": "home.test.evil.test", "X-Forwarded-Uri": "/"}, "forward-auth"),
    ({"X-Forwarded-Host": "evil.test/home.test", "X-Forwarded-Uri": "/"}, "forward-auth"),
    ({"X-Forwarded-Host": "home.test, evil.test", "X-Forwarded-Uri": "/"}, "forward-auth"),
    ({"X-Forwarded-Host": "home.test\\evil.test", "X-Forwarded-Uri": "/"}, "forward-auth"),
    ({"X-Forwarded-Host": "home.test", "X-Forwarded-Uri": "//evil.test/x"}, "forward-auth"),
    ({"X-Forwarded-Host": "home.test", "X-Forwarded-Uri": "/\\evil.test/x"}, "forward-auth"),
    ({"X-Forwarded-Host": "home.test", "X-Forwarded-Uri": "https://evil.test/"},
     "forward-auth"),
    ({"X-Forwarded-Host": "home.test", "X-Forwarded-Uri": "/%0d%0aLocation:%20//evil.test"},
     "forward-auth"),
    ({"X-Forwarded-Host": "home.test", "X-Forwarded-Uri": "/\tx"}, "forward-auth"),
    ({"X-Forwarded-Host": "home.test", "X-Forwarded-Proto": "javascript",
      "X-Forwarded-Uri": "/"}, "forward-auth"),
    ({"X-Original-URL": "https://evil.test/"}, "auth-request"),
    ({"X-Original-URL": "https://home.test@evil.test/"}, "auth-request"),
    ({"X-Original-URL": "https://evil.test\\@home.test/"}, "auth-request"),
    ({"X-Original-URL": "https://home.test//evil.test/"}, "auth-request"),
    ({"X-Original-URL": "//evil.test/"}, "auth-request"),
    ({"X-Original-URL": "javascript://home.test/%0aalert(1)"}, "auth-request"),
]


def question(headers: dict, kind: str, extra: bytes = b"") -> bytes:
    lines = b"".join(b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in headers.items())
    return (b"GET /api/authz/%s HTTP/1.1\r\nHost: home.test\r\nAccept: text/html\r\n%s%s\r\n"
            % (kind.encode(), lines, extra))


def answers(port: int, requests: list[bytes]) -> list[tuple[int, dict[str, str]]]:
    """Pipelined on one connection; each answer's status and headers."""
    with socket.create_connection(("127.0.0.1", port), timeout=15) as conn:
        conn.sendall(b"".join(requests))
        data = b""
        out = []
        while len(out) < len(requests):
            chunk = conn.recv(65536)
            assert chunk, f"closed after {len(out)} answers"
            data += chunk
            while b"\r\n\r\n" in data:
                head, _, rest = data.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                headers = {}
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    headers[name.lower()] = value.strip()
                length = int(headers.get("content-length", "0"))
                if len(rest) < length:
                    break
                data = rest[length:]
                out.append((int(lines[0].split()[1]), headers))
    return out


def assert_stays_home(status: int, headers: dict) -> None:
    location = headers.get("location")
    if location is None:
        assert status in (400, 401), status
        return
    m = re.fullmatch(r"(https?)://([^/?#]+)/__auth__/login\?next=(\S*)", location)
    assert m, location
    assert m.group(2) in KNOWN, location
    back = unquote(m.group(3))
    assert back.startswith("/") and not back.startswith(("//", "/\\")), location


def test_forged_forwarded_names_never_redirect_elsewhere(start_server):
    server = start_server(PROVIDER)
    port = server.port()
    for (headers, kind), (status, got) in zip(FORGED, answers(port, [
            question(h, k) for h, k in FORGED])):
        assert_stays_home(status, got)
        assert status != 200, headers
    # Repeated names: which one would the other proxy have served? Neither.
    status, got = answers(port, [question(
        {"X-Forwarded-Uri": "/"}, "forward-auth",
        b"X-Forwarded-Host: home.test\r\nX-Forwarded-Host: evil.test\r\n")])[0]
    assert status == 400 and "location" not in got
    assert answers(port, [question({"X-Forwarded-Host": "home.test",
                                    "X-Forwarded-Uri": "/x"}, "forward-auth")])[0][0] == 302
    before = server.worker_rss_kib()
    deadline = time.monotonic() + 90
    for start in range(0, QUESTIONS, BATCH):
        batch = [question({"X-Forwarded-Host": f"evil-{n}.test",
                           "X-Forwarded-Uri": f"//evil-{n}.test/{n}"}, "forward-auth")
                 for n in range(start, start + BATCH)]
        for status, got in answers(port, batch):
            assert status == 401 and "location" not in got
        assert time.monotonic() < deadline
    grown = server.worker_rss_kib() - before
    assert grown < RSS_GROWTH_BOUND_KIB, f"worker grew by {grown} KiB"


FRONT = """
[server]
workers = 1

[[listen]]
address = "127.0.0.1:0"

[[site]]
hosts = ["home.test"]
forward_auth = {{ url = "http://127.0.0.1:{auth}/api/authz/forward-auth", copy_headers = ["X-Auth-User", "Remote-Groups"] }}

[[site.route]]
prefix = "/"
type = "proxy"
upstream = "{up}"
"""

SPELLINGS = (b"X-Auth-User: admin-%d\r\n", b"x-auth-user: admin-%d\r\nX-AUTH-USER: root\r\n",
             b"X-Auth-User: ann, admin-%d\r\n", b"Remote-Groups: admins,x%d\r\n",
             b"remote-groups: a%d\r\nRemote-Groups: admins\r\n",
             # `_` for `-`: the same field to a CGI-style upstream (HTTP_X_AUTH_USER).
             b"X_Auth_User: admin-%d\r\n", b"x-auth_user: root\r\nREMOTE_GROUPS: a%d\r\n")


def test_forged_copy_headers_never_reach_the_upstream(start_server, upstream):
    up = upstream()
    provider = start_server(PROVIDER, name="provider.toml")
    front = start_server(FRONT.format(auth=provider.port(), up=up.url), name="front.toml")
    ann = Browser(provider.port(), "home.test")
    assert ann.sign_in("ann")[0].status == 303
    cookie = "; ".join(f"{k}={v}" for k, v in ann.jar.items()).encode()
    requests = []
    for n in range(300):
        forged = SPELLINGS[n % len(SPELLINGS)] % n
        if n % 2:       # signed in: the auth server's values
            requests.append(b"GET /me/%d HTTP/1.1\r\nHost: home.test\r\nCookie: %s\r\n%s\r\n"
                            % (n, cookie, forged))
        else:           # let in without a user (bypass): no value at all
            requests.append(b"GET /open/%d HTTP/1.1\r\nHost: home.test\r\n%s\r\n" % (n, forged))
    before = front.worker_rss_kib()
    for status, _ in answers(front.port(), requests):
        assert status == 200
    assert len(up.requests) == len(requests)
    for record in up.requests:
        seen: dict[str, list[str]] = {}
        for name, value in record["headers"]:
            seen.setdefault(name.replace("_", "-"), []).append(value)
        if record["target"].startswith("/me/"):
            assert seen["x-auth-user"] == ["ann"] and seen["remote-groups"] == ["family"]
        else:
            assert "x-auth-user" not in seen and "remote-groups" not in seen, record
    grown = front.worker_rss_kib() - before
    assert grown < RSS_GROWTH_BOUND_KIB, f"worker grew by {grown} KiB"


def basic(user: str, password: str) -> bytes:
    return b"Authorization: Basic %s\r\n" % base64.b64encode(f"{user}:{password}".encode())


def test_basic_guesses_count_like_the_sign_in_forms(start_server):
    server = start_server(PROVIDER)
    asked = {"X-Forwarded-Host": "home.test", "X-Forwarded-Uri": "/"}
    port = server.port()
    assert answers(port, [question(asked, "forward-auth", basic("ann", "demo-password"))]
                   )[0][0] == 200
    t0 = time.monotonic()
    for guess in ("a", "b", "c", "d"):                # max_failures = 3
        status, got = answers(port, [question(asked, "forward-auth", basic("ann", guess))])[0]
        assert status == 401 and got["www-authenticate"] == 'Basic realm="nestgate"'
    # Over the limit: the right password is refused like a wrong one.
    status, got = answers(port, [question(asked, "forward-auth",
                                          basic("ann", "demo-password"))])[0]
    assert status == 401 and "www-authenticate" in got
    assert time.monotonic() - t0 < 60


DOTTED_PATHS = ("/x/../open/y", "/x/%2e%2e/open/y", "/x/%2E./open/", "/open/./y/..",
                "/x/.%2e/open/y?a=b")


def test_a_path_with_dot_segments_is_never_let_in(start_server):
    server = start_server(PROVIDER)
    port = server.port()
    before = server.worker_rss_kib()
    asked = []
    for _round in range(40):
        for path in DOTTED_PATHS:
            asked.append(question({"X-Forwarded-Host": "home.test", "X-Forwarded-Uri": path},
                                  "forward-auth"))
            asked.append(question({"X-Original-URL": "https://home.test" + path},
                                  "auth-request"))
    for status, headers in answers(port, asked):
        assert status == 400 and "location" not in headers, (status, headers)
    # The same paths without dot segments are answered as before: open, or sign in.
    plain = [question({"X-Forwarded-Host": "home.test", "X-Forwarded-Uri": "/open/y"},
                      "forward-auth"),
             question({"X-Original-URL": "https://home.test/open/.well-known/x"},
                      "auth-request"),
             question({"X-Forwarded-Host": "home.test", "X-Forwarded-Uri": "/x/y"},
                      "forward-auth")]
    assert [status for status, _ in answers(port, plain)] == [200, 200, 302]
    grown = server.worker_rss_kib() - before
    assert grown < RSS_GROWTH_BOUND_KIB, f"worker grew by {grown} KiB"


def test_a_prefix_without_its_slash_is_asked_about_as_the_prefix(start_server):
    server = start_server(PROVIDER)
    port = server.port()
    browser = Browser(port, "home.test")
    assert browser.sign_in("ann")[0].status == 303
    cookie = "; ".join(f"{k}={v}" for k, v in browser.jar.items()).encode()
    asked = []
    for path in ("/closed", "/closed?x=1", "/closed/", "/closed/x", "/%63losed", "/closedx"):
        asked.append(question({"X-Forwarded-Host": "home.test", "X-Forwarded-Uri": path},
                              "forward-auth", b"Cookie: " + cookie + b"\r\n"))
        asked.append(question({"X-Original-URL": "https://home.test" + path},
                              "auth-request", b"Cookie: " + cookie + b"\r\n"))
    statuses = [status for status, _ in answers(port, asked)]
    # `/closedx` is not under `/closed/`: the site's own policy lets ann in.
    assert statuses == [403] * 10 + [200, 200], statuses
    # Without a session `/open` is the bypass route's: let in, as `/open/` is.
    opened = answers(port, [question({"X-Forwarded-Host": "home.test", "X-Forwarded-Uri": "/open"},
                                     "forward-auth")])
    assert opened[0][0] == 200
