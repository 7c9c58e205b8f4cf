"""Identity at the door: users and groups (inline and in a users file, re-read on
reload), a policy per site and route, the refusal pages, and who signed in told to
the upstream in the identity headers, which no client can forge (HTTP/1.1, h2, h2c,
WebSocket)."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys

import pytest

from conftest import (HASH, HTML, PASSWORD_HASH, REPO, TOTP_SECRET, WS_HANDSHAKE, Browser,
                      _env, admin_headers, admin_token, otp_code, poll, settled_step)
from h2client import H2Client
from nestgate.config import ConfigError, config_warnings, read_config

USERS_FILE = f"""
[[user]]
name = "bob"
password = "{PASSWORD_HASH}"
groups = ["family"]
display_name = "Bob"

[[user]]
name = "guest"
password = "{PASSWORD_HASH}"
"""

HOME = """
[server]
workers = 1

[[listen]]
address = "127.0.0.1:0"
http2_cleartext = true
{listen}

[auth]
store = "state.db"
users_file = "users.toml"
{auth}

[[auth.user]]
name = "ann"
password = "{hash}"
totp = "{totp}"
groups = ["family", "admins"]
display_name = "Ann Example"
email = "ann@example.test"

[[site]]
name = "home"
hosts = ["home.test", "localhost"]
protected = true
allow_groups = ["family"]

[[site.route]]
prefix = "/"
type = "proxy"
upstream = "{up}"
websocket = true

[[site.route]]
prefix = "/admin/"
type = "proxy"
upstream = "{up}"
allow_groups = ["admins"]

[[site.route]]
prefix = "/secure/"
type = "proxy"
upstream = "{up}"
policy = "two_factor"

[[site.route]]
prefix = "/bob/"
type = "proxy"
upstream = "{up}"
allow_users = ["bob"]

[[site.route]]
prefix = "/public/"
type = "proxy"
upstream = "{up}"
policy = "bypass"

[[site.route]]
prefix = "/closed/"
type = "proxy"
upstream = "{up}"
policy = "deny"

[[site]]
name = "open"
hosts = ["open.test"]

[[site.route]]
prefix = "/"
type = "proxy"
upstream = "{up}"
websocket = true
"""


def home_config(up_url: str, auth: str = "", listen: str = "") -> str:
    return HOME.format(up=up_url, hash=PASSWORD_HASH, totp=TOTP_SECRET, auth=auth,
                       listen=listen)


@pytest.fixture
def home(start_server, upstream, tmp_path):
    """home(auth="", listen="") -> (server, upstream): the family's config, its users
    file beside it."""
    up = upstream()

    def start(auth: str = "", listen: str = "", users: str = USERS_FILE):
        (tmp_path / "users.toml").write_text(users)
        return start_server(home_config(up.url, auth, listen)), up
    return start


def signed_in(port: int, user: str, host: str = "home.test") -> Browser:
    browser = Browser(port, host)
    code = otp_code(settled_step()) if user == "ann" else None
    resp, _ = browser.sign_in(user, code=code)
    assert resp.status == 303, user
    return browser


def seen_by_upstream(data: bytes) -> dict[str, list[str]]:
    """The headers the echoing upstream received, by lower-case name."""
    out: dict[str, list[str]] = {}
    for name, value in json.loads(data)["headers"]:
        out.setdefault(name, []).append(value)
    return out


IDENTITY = ("remote-user", "remote-groups", "remote-name", "remote-email")


# ---------------------------------------------------------------- policy


@pytest.mark.parametrize("path, allowed", [
    ("/x", {"ann", "bob"}),               # the site's: family
    ("/admin/x", {"ann"}),                # the route's own: admins
    ("/secure/x", {"ann"}),               # two_factor (the route's policy replaces the site's)
    ("/bob/x", {"bob"}),                  # allow_users
])
def test_each_route_admits_the_users_and_groups_its_policy_names(home, path, allowed):
    server, _up = home()
    for user in ("ann", "bob", "guest"):
        browser = signed_in(server.port(), user)
        resp, body = browser.request("GET", path)
        assert resp.status == (200 if user in allowed else 403), (user, path, body[:200])


def test_bypass_needs_no_sign_in_and_deny_refuses_everyone(home):
    server, _up = home()
    anonymous = Browser(server.port(), "home.test")
    assert anonymous.request("GET", "/public/x")[0].status == 200
    assert anonymous.request("GET", "/x")[0].status == 401
    assert anonymous.request("GET", "/closed/x")[0].status == 403
    assert signed_in(server.port(), "ann").request("GET", "/closed/x")[0].status == 403


def test_the_refusal_names_the_user_and_offers_another_sign_in_without_a_loop(home):
    server, _up = home()
    bob = signed_in(server.port(), "bob")
    resp, page = bob.request("GET", "/admin/page?x=1", headers=HTML)
    assert resp.status == 403 and resp.getheader("location") is None
    assert resp.getheader("content-type").startswith("text/html")
    assert b"signed in as <b>bob</b>" in page and b"home.test" in page
    assert b'action="/__auth__/logout"' in page and b"Sign in as someone else" in page
    assert b'name="next" value="/admin/page?x=1"' in page
    # Asking again changes nothing: the same page, never a redirect.
    resp, page = bob.request("GET", "/admin/page?x=1", headers=HTML)
    assert resp.status == 403 and b"signed in as <b>bob</b>" in page
    token = re.search(rb'name="csrf" value="([0-9a-f]+)"', page).group(1).decode()
    # A forged form (no CSRF token) signs nobody out.
    assert bob.post_form("/__auth__/logout", {"next": "/admin/page?x=1"})[0].status == 403
    assert bob.request("GET", "/x")[0].status == 200
    resp, _ = bob.post_form("/__auth__/logout", {"csrf": token, "next": "/admin/page?x=1"})
    assert resp.status == 303
    assert resp.getheader("location") == "/__auth__/login?next=/admin/page%3Fx%3D1"
    assert "nestgate_session" not in bob.jar
    resp, _ = bob.sign_in("ann", code=otp_code(settled_step()), next_url="/admin/page?x=1")
    assert resp.status == 303 and resp.getheader("location") == "/admin/page?x=1"
    assert bob.request("GET", "/admin/page?x=1")[0].status == 200


def test_an_api_client_refused_gets_json_naming_the_user(home):
    server, _up = home()
    resp, body = signed_in(server.port(), "guest").request("GET", "/x")
    assert resp.status == 403
    assert json.loads(body) == {"error": "forbidden", "reason": "not_allowed",
                                "user": "guest", "logout": "/__auth__/logout"}


def test_two_factor_refuses_a_user_without_one_with_a_page_that_says_so(home):
    server, _up = home()
    resp, page = signed_in(server.port(), "bob").request("GET", "/secure/x", headers=HTML)
    assert resp.status == 403
    assert b"signed in as <b>bob</b>" in page and b"needs a second factor" in page
    assert b"Sign in as someone else" in page


def test_the_sign_in_card_names_the_site_being_entered(home):
    server, _up = home()
    resp, page = Browser(server.port(), "home.test").request("GET", "/x", headers=HTML)
    assert resp.status == 401 and b'<p class="to">to <b>home.test</b></p>' in page


# ---------------------------------------------------------------- identity headers


def test_the_upstream_learns_who_signed_in(home):
    server, _up = home()
    resp, data = signed_in(server.port(), "ann").request("GET", "/x")
    seen = seen_by_upstream(data)
    assert resp.status == 200
    assert (seen["remote-user"], seen["remote-groups"], seen["remote-name"],
            seen["remote-email"]) == (["ann"], ["family,admins"], ["Ann Example"],
                                      ["ann@example.test"])
    resp, data = signed_in(server.port(), "bob").request("GET", "/bob/x")
    seen = seen_by_upstream(data)
    assert seen["remote-user"] == ["bob"] and seen["remote-name"] == ["Bob"]
    assert "remote-email" not in seen                  # bob has none: not sent empty


FORGED = {"Remote-User": "mallory", "REMOTE-GROUPS": "admins", "remote-name": "M",
          "Remote-Email": "m@evil.test"}


@pytest.mark.parametrize("user, host, path", [
    ("ann", "home.test", "/x"),           # protected: nestgate's values only
    ("", "home.test", "/public/x"),       # bypass: no identity at all
    ("", "open.test", "/x"),              # a site without sign-in: none either
])
def test_forged_identity_headers_never_reach_the_upstream(home, user, host, path):
    server, up = home()
    browser = signed_in(server.port(), user, host) if user else Browser(server.port(), host)
    resp, data = browser.request("GET", path, headers=FORGED)
    seen = seen_by_upstream(data)
    assert resp.status == 200
    if user:
        assert seen["remote-user"] == ["ann"] and seen["remote-groups"] == ["family,admins"]
        assert seen["remote-email"] == ["ann@example.test"]
    else:
        assert not set(IDENTITY) & set(seen), seen


def raw_request(port: int, head: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(head)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


# Each spelling with the status it gets: forwarded without the forged fields (200), or
# refused as malformed (400: a folded line is obsolete and refused by the parser).
@pytest.mark.parametrize("lines, expected", [
    (b"Remote-User: mallory\r\nremote-user: eve\r\nREMOTE-USER: trudy\r\n", 200),  # repeated
    (b"ReMoTe-UsEr: mallory\r\nRemote-Groups: admins\r\nRemote-Groups: family\r\n", 200),
    (b"X-Other: one,\r\n Remote-User: mallory\r\n", 400),                     # folded
    (b"Remote-User: \r\n mallory\r\n", 400),                                   # folded value
    (b"Remote-User: mallory, eve\r\n", 200),                                   # a list
])
def test_forged_spellings_over_http1(home, lines, expected):
    """Every spelling on the wire: the upstream sees no Remote-* it did not get from
    nestgate, whether nestgate refuses the request (400) or forwards it."""
    server, up = home()
    ann = signed_in(server.port(), "ann")
    cookie = "; ".join(f"{k}={v}" for k, v in ann.jar.items()).encode()
    for host, who in ((b"home.test", ["ann"]), (b"open.test", None)):
        before = len(up.requests)
        data = raw_request(server.port(), b"GET /x HTTP/1.1\r\nHost: %s\r\nCookie: %s\r\n%s"
                           b"Connection: close\r\n\r\n" % (host, cookie, lines))
        status = int(data.split(b" ", 2)[1])
        assert status == expected, data[:200]
        for request in up.requests[before:]:
            users = [v for n, v in request["headers"] if n == "remote-user"]
            groups = [v for n, v in request["headers"] if n == "remote-groups"]
            assert users == (who or []) and groups == (["family,admins"] if who else [])
            assert not any("mallory" in v or "eve" in v or "trudy" in v
                           for _n, v in request["headers"]), request["headers"]
        if status == 400:
            assert len(up.requests) == before


def test_forged_identity_over_h2c_and_h2(home, certs):
    tls = (f'[[listen]]\naddress = "127.0.0.1:0"\n[[listen.certificate]]\n'
           f'cert = "{certs["local"][0]}"\nkey = "{certs["local"][1]}"\n'
           f'names = ["localhost"]\n')
    server, _up = home(listen=tls)
    ann = signed_in(server.port("http"), "ann")
    cookie = "; ".join(f"{k}={v}" for k, v in ann.jar.items()).encode()
    forged = [(b"remote-user", b"mallory"), (b"remote-user", b"eve"),
              (b"remote-groups", b"admins"), (b"remote-email", b"m@evil.test")]
    for client in (H2Client(server.port("http"), None), H2Client(server.port("https"),
                                                                  certs["ca"])):
        for authority, who in ((b"localhost", "ann"), (b"open.test", None)):
            status, _headers, data = client.request(
                "GET", "/x", headers=[(b"cookie", cookie), *forged], authority=authority)
            seen = seen_by_upstream(data)
            assert status == 200
            if who:
                assert seen["remote-user"] == ["ann"] and seen["remote-groups"] == \
                    ["family,admins"] and seen["remote-email"] == ["ann@example.test"]
            else:
                assert not set(IDENTITY) & set(seen), seen
        client.close()


def test_forged_identity_on_a_websocket_upgrade(home):
    server, up = home()
    ann = signed_in(server.port(), "ann")
    cookie = "; ".join(f"{k}={v}" for k, v in ann.jar.items()).encode()
    for host, who in ((b"home.test", ["ann"]), (b"open.test", [])):
        before = len(up.requests)
        with socket.create_connection(("127.0.0.1", server.port()), timeout=5) as sock:
            sock.sendall(b"GET /ws HTTP/1.1\r\nHost: %s\r\nCookie: %s\r\nConnection: Upgrade\r\n"
                         b"Upgrade: websocket\r\nRemote-User: mallory\r\nremote-USER: eve\r\n"
                         b"Remote-Groups: admins\r\n%s\r\n" % (host, cookie, WS_HANDSHAKE))
            data = b""
            while not data.endswith(b"hello"):
                data += sock.recv(65536)
            assert data.startswith(b"HTTP/1.1 101")
        request, = up.requests[before:]
        assert [v for n, v in request["headers"] if n == "remote-user"] == who
        assert [v for n, v in request["headers"] if n == "remote-groups"] == \
            (["family,admins"] if who else [])


def test_identity_headers_renamed_or_turned_off(home):
    server, _up = home(auth='identity_headers = { user = "X-WebAuth-User", email = "" }')
    ann = signed_in(server.port(), "ann")
    resp, data = ann.request("GET", "/x", headers={"X-WebAuth-User": "mallory",
                                                   "Remote-User": "mallory"})
    seen = seen_by_upstream(data)
    assert seen["x-webauth-user"] == ["ann"] and "remote-user" not in seen
    assert seen["remote-groups"] == ["family,admins"] and "remote-email" not in seen
    # On a route of a site without sign-in, the configured name is removed too.
    resp, data = Browser(server.port(), "open.test").request(
        "GET", "/x", headers={"X-WebAuth-User": "mallory"})
    assert "x-webauth-user" not in seen_by_upstream(data)


def test_identity_headers_off(home):
    server, _up = home(auth="identity_headers = false")
    _resp, data = signed_in(server.port(), "ann").request("GET", "/x", headers=FORGED)
    assert not set(IDENTITY) & set(seen_by_upstream(data))


# ---------------------------------------------------------------- users file


def test_users_file_is_read_again_on_reload(home, tmp_path):
    server, _up = home()
    bob = signed_in(server.port(), "bob")
    assert bob.request("GET", "/x")[0].status == 200
    carol = Browser(server.port(), "home.test")
    assert carol.sign_in("carol")[0].status == 401          # not a user yet
    # Carol joins the family, bob leaves: a reload, no edit of the main file.
    (tmp_path / "users.toml").write_text(f"""
[[user]]
name = "carol"
password = "{PASSWORD_HASH}"
groups = ["family"]
""")
    mark = len(server.lines)
    server.signal(signal.SIGHUP)
    server.wait_for("reloaded", start=mark)
    assert poll(lambda: carol.sign_in("carol")[0].status, lambda s: s == 303) == 303
    assert carol.request("GET", "/x")[0].status == 200
    # bob's session outlives his account nowhere: he is asked to sign in.
    assert poll(lambda: bob.request("GET", "/x")[0].status, lambda s: s == 401) == 401
    # The admin API lists the users the workers now serve.
    listed = poll(lambda: admin_users(server.admin_port()),
                  lambda names: names == ["ann", "carol"])
    assert listed == ["ann", "carol"]


def admin_users(port: int) -> list[str]:
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/v1/users", headers=admin_headers(port))
    body = conn.getresponse().read()
    conn.close()
    return [u["name"] for u in json.loads(body)["users"]]


def test_check_names_the_users_files_problems(tmp_path):
    (tmp_path / "users.toml").write_text('[[user]]\nname = "x"\npassword = "plain"\n'
                                         'groups = "family"\nemail = "not-an-address"\n'
                                         'colour = "blue"\n')
    main = tmp_path / "nestgate.toml"
    main.write_text(f'[[listen]]\naddress = "127.0.0.1:0"\n[auth]\nstore = "s.db"\n'
                    f'users_file = "users.toml"\n[[auth.user]]\nname = "x"\n'
                    f'password = "{HASH}"\n')
    with pytest.raises(ConfigError) as info:
        read_config(main)
    problems = info.value.problems
    users = str((tmp_path / "users.toml").resolve())
    assert f"{users}: user[0].password: expected an argon2 hash" in "\n".join(problems)
    assert f"{users}: user[0].groups: expected a list of strings" in "\n".join(problems)
    assert f"{users}: user[0].email: expected an address" in "\n".join(problems)
    assert f"{users}: user[0].colour: unknown key" in problems
    assert any("auth.user: expected each user name once" in p and "'x'" in p
               for p in problems)
    main.write_text(main.read_text().replace("users.toml", "missing.toml"))
    with pytest.raises(ConfigError) as info:
        read_config(main)
    assert any("auth.users_file: expected a readable TOML file of [[user]] tables" in p
               and "'missing.toml'" in p for p in info.value.problems)


def test_policy_keys_are_checked(tmp_path):
    base = f'[[listen]]\naddress = "127.0.0.1:0"\n[auth]\nstore = "s.db"\n' \
           f'[[auth.user]]\nname = "ann"\npassword = "{HASH}"\ngroups = ["family"]\n'
    main = tmp_path / "nestgate.toml"
    main.write_text(base + '[[site]]\nhosts = ["a.test"]\npolicy = "everyone"\n'
                    'protected = true\n[[site]]\nhosts = ["b.test"]\n'
                    'allow_groups = ["family"]\n[[site]]\nhosts = ["c.test"]\n'
                    'protected = true\npolicy = "bypass"\nallow_users = ["ann"]\n')
    with pytest.raises(ConfigError) as info:
        read_config(main)
    text = "\n".join(info.value.problems)
    assert "site[a.test].policy: expected one of 'one_factor', 'two_factor', 'bypass', 'deny'" \
        in text
    assert "site[b.test].policy: expected protected = true on the site" in text
    assert "site[c.test].allow_users: expected no user or group lists with policy = \"bypass\"" \
        in text
    main.write_text(base + '[[site]]\nhosts = ["a.test"]\nprotected = true\n'
                    'allow_users = ["ann", "anne"]\nallow_groups = ["family", "admins"]\n')
    warnings = config_warnings(read_config(main))
    assert any("site[a.test].allow_users: no configured user is called 'anne'" in w
               for w in warnings)
    assert any("site[a.test].allow_groups: no configured user is in the group 'admins'" in w
               for w in warnings)


# ---------------------------------------------------------------- admin API and ctl


def test_admin_api_and_ctl_list_users_without_secrets(home):
    server, _up = home()
    port = server.admin_port()
    resp = subprocess.run([sys.executable, "-m", "nestgate", "ctl", "--address",
                           f"127.0.0.1:{port}", "--token", admin_token(port), "users", "--json"], capture_output=True,
                          text=True, env=_env(), cwd=REPO, timeout=30)
    assert resp.returncode == 0, resp.stderr
    listed = json.loads(resp.stdout)["users"]
    assert listed == [
        {"name": "ann", "groups": ["family", "admins"], "display_name": "Ann Example",
         "email": "ann@example.test", "second_factor": True},
        {"name": "bob", "groups": ["family"], "display_name": "Bob", "email": "",
         "second_factor": False},
        {"name": "guest", "groups": [], "display_name": "", "email": "",
         "second_factor": False}]
    assert "argon2" not in resp.stdout and TOTP_SECRET not in resp.stdout
    text = subprocess.run([sys.executable, "-m", "nestgate", "ctl", "--address",
                           f"127.0.0.1:{port}", "--token", admin_token(port), "users"], capture_output=True, text=True,
                          env=_env(), cwd=REPO, timeout=30)
    assert text.returncode == 0
    assert re.search(r"^ann\s+family,admins\s+Ann Example <ann@example.test>\s+2FA$",
                     text.stdout, re.M), text.stdout
    assert "argon2" not in text.stdout and TOTP_SECRET not in text.stdout


# ---------------------------------------------------------------- the traps


def test_plain_http_goes_to_https_on_a_protected_site(start_server, upstream, certs):
    from conftest import free_port
    up = upstream()
    https_port = free_port()
    server = start_server(f"""
[server]
workers = 1

[[listen]]
address = "127.0.0.1:0"

[[listen]]
address = "127.0.0.1:{https_port}"
[[listen.certificate]]
cert = "{certs["local"][0]}"
key = "{certs["local"][1]}"
names = ["localhost"]

[auth]
store = "state.db"

[[auth.user]]
name = "ann"
password = "{PASSWORD_HASH}"

[[site]]
hosts = ["localhost"]
protected = true

[[site.route]]
prefix = "/"
type = "proxy"
upstream = "{up.url}"

[[site]]
hosts = ["open.test"]

[[site.route]]
path = "/hello"
type = "return"
body = "hello"
""")
    plain = Browser(server.port("http"), "localhost")
    for method, path in (("GET", "/app/x?y=1"), ("POST", "/__auth__/login"),
                         ("GET", "/__auth__/login?next=/app")):
        resp, _ = plain.request(method, path, headers=HTML)
        assert resp.status == 308, (method, path)
        assert resp.getheader("location") == f"https://localhost:{https_port}{path}"
    assert not up.requests
    # A site without sign-in stays on plain HTTP.
    assert Browser(server.port("http"), "open.test").request("GET", "/hello")[0].status == 200
    # Over HTTPS: the sign-in page, naming the site.
    import http.client
    import ssl
    conn = http.client.HTTPSConnection("127.0.0.1", https_port, timeout=10,
                                       context=ssl.create_default_context(cafile=certs["ca"]))
    conn._context.check_hostname = False
    conn.request("GET", "/app/x", headers={"Host": "localhost", **HTML})
    resp = conn.getresponse()
    assert resp.status == 401 and b"<b>localhost</b>" in resp.read()
    conn.close()


def test_check_warns_where_a_protected_site_is_entered_without_signing_in(tmp_path):
    (tmp_path / "nestgate.toml").write_text(f"""
[[listen]]
address = "127.0.0.1:0"

[auth]
store = "s.db"
ip_grant = "1h"
cookie_secure = false

[[auth.user]]
name = "ann"
password = "{HASH}"
groups = ["admins"]

[[site]]
name = "family"
hosts = ["home.test"]
protected = true
exempt_local = true

[[site.route]]
prefix = "/admin/"
type = "return"
body = "admin"
allow_groups = ["admins"]
allow = ["10.0.0.0/8"]

[[site]]
name = "closed"
hosts = ["closed.test"]
protected = true
allow_dynamic = false
""")
    out = subprocess.run([sys.executable, "-m", "nestgate", "check", "--config",
                          str(tmp_path / "nestgate.toml")], capture_output=True, text=True,
                         env=_env(), cwd=tmp_path, timeout=30)
    assert out.returncode == 0, out.stderr
    warnings = [l for l in out.stderr.splitlines() if "warning:" in l]
    assert any("site[home.test]: protected, but exempt_local = true" in w for w in warnings)
    assert any("site[home.test]: protected, but [auth] ip_grant" in w for w in warnings)
    assert any("site[home.test].route[0]: protected with a user policy, but entries of "
               "the dynamic allow-list" in w for w in warnings)
    assert any("site[home.test].route[0]: protected, but [auth] ip_grant" in w
               for w in warnings)
    assert not any("site[closed.test]" in w for w in warnings), warnings
