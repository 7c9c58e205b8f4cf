"""Forward auth, both ways: nestgate answering another proxy's question
(/api/authz/forward-auth, /api/authz/auth-request) with the policy of the site or
[[auth.forward]] entry the forwarded host names, and nestgate asking another server
first (`forward_auth` on a site or route), here a second nestgate."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from urllib.parse import unquote

import pytest

from conftest import (HASH, HTML, PASSWORD_HASH, TOTP_SECRET, Browser, Server, Upstream, _env,
                      one_request, otp_code, refused_port, settled_step)
from h2client import H2Client
from nestgate.config import ConfigError, config_warnings, read_config

PROVIDER = """
[server]
workers = 1

[[listen]]
address = "127.0.0.1:0"

[client_ip]
trusted_proxies = ["127.0.0.2"]

[auth]
store = "state.db"
cookie_secure = false
identity_headers = {{ user = "X-Auth-User" }}

[[auth.user]]
name = "ann"
password = "{hash}"
groups = ["family", "admins"]
display_name = "Ann"

[[auth.user]]
name = "bob"
password = "{hash}"
groups = ["family"]

[[auth.user]]
name = "tom"
password = "{hash}"
totp = "{totp}"
groups = ["family", "admins"]

[[auth.forward]]
name = "wiki"
hosts = ["wiki.test", "*.apps.test"]
allow_groups = ["admins"]

[[auth.forward]]
name = "lan"
hosts = ["lan.test"]
allow = ["10.0.0.0/8"]

[[site]]
name = "home"
hosts = ["home.test"]
protected = true
allow_groups = ["family"]

[[site.route]]
prefix = "/"
type = "return"
body = "home"

[[site.route]]
prefix = "/admin/"
type = "return"
body = "admin"
allow_groups = ["admins"]

[[site.route]]
prefix = "/strict/"
type = "return"
body = "strict"
policy = "two_factor"

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
name = "everything-else"
hosts = ["*"]
protected = true

[[site.route]]
prefix = "/"
type = "return"
body = "catch-all"
"""


def write_config(folder, text: str, name: str = "nestgate.toml") -> Server:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text)
    return Server(path, env=_env())


@pytest.fixture(scope="module")
def provider(tmp_path_factory):
    server = write_config(tmp_path_factory.mktemp("provider"),
                          PROVIDER.format(hash=PASSWORD_HASH, totp=TOTP_SECRET))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def sessions(provider):
    """A session cookie header value for ann and bob, signed in on home.test."""
    out = {}
    for user in ("ann", "bob"):
        browser = Browser(provider.port(), "home.test")
        resp, _ = browser.sign_in(user)
        assert resp.status == 303, user
        out[user] = "; ".join(f"{k}={v}" for k, v in browser.jar.items())
    return out


def ask(port: int, forwarded: dict, cookie: str = "", path: str = "/api/authz/forward-auth",
        host: str = "home.test", headers: dict | None = None, source: str = "127.0.0.1"):
    """One question to the provider; (status, headers by lower-case name, body)."""
    return one_request(port, path, host, {**forwarded, **(headers or {})}, cookie=cookie,
                       source=source)


def fwd(host: str = "home.test", uri: str = "/photos?a=1", method: str = "GET",
        proto: str = "https") -> dict:
    return {"X-Forwarded-Method": method, "X-Forwarded-Proto": proto,
            "X-Forwarded-Host": host, "X-Forwarded-Uri": uri}


def original(url: str = "https://home.test/photos?a=1", method: str = "GET") -> dict:
    return {"X-Original-Method": method, "X-Original-URL": url}


SIGN_IN = "https://home.test/__auth__/login?next="


# ---------------------------------------------------------------- the provider

@pytest.mark.parametrize("path, asked", [("/api/authz/forward-auth", fwd()),
                                         ("/api/authz/auth-request", original())])
def test_a_signed_in_user_is_let_through_with_the_identity_headers(provider, sessions,
                                                                     path, asked):
    status, headers, _ = ask(provider.port(), asked, sessions["ann"], path)
    assert status == 200
    assert headers["x-auth-user"] == "ann"          # renamed by identity_headers
    assert headers["remote-groups"] == "family,admins"
    assert headers["remote-name"] == "Ann"
    assert "remote-email" not in headers            # ann has none: left out


def test_a_browser_not_signed_in_is_sent_to_sign_in_and_back(provider):
    status, headers, _ = ask(provider.port(), fwd(), headers=HTML)
    assert status == 302
    assert headers["location"].startswith(SIGN_IN)
    assert unquote(headers["location"][len(SIGN_IN):]) == "/photos?a=1"
    # A form's POST that lost its session: 303, so the browser comes back with GET.
    status, headers, _ = ask(provider.port(), fwd(method="POST"), headers=HTML)
    assert status == 303 and headers["location"].startswith(SIGN_IN)


@pytest.mark.parametrize("headers", [
    {"Accept": "application/json"},                                   # a script
    {**HTML, "X-Requested-With": "XMLHttpRequest"},                   # an XHR
])
def test_scripts_and_xhr_get_401_with_the_sign_in_address(provider, headers):
    status, got, body = ask(provider.port(), fwd(), headers=headers)
    assert status == 401
    assert got["location"].startswith(SIGN_IN)
    assert json.loads(body)["error"] == "sign-in required"


def test_auth_request_never_redirects(provider):
    """nginx's auth_request takes 2xx, 401 and 403 only: a browser gets 401 with the
    sign-in address in Location, for `error_page 401` to send it there."""
    status, headers, _ = ask(provider.port(), original(), path="/api/authz/auth-request",
                             headers=HTML)
    assert status == 401
    assert headers["location"].startswith(SIGN_IN)
    assert unquote(headers["location"][len(SIGN_IN):]) == "/photos?a=1"


def test_a_user_the_policy_refuses_gets_403(provider, sessions):
    port = provider.port()
    status, _, body = ask(port, fwd(uri="/admin/x"), sessions["bob"])
    assert status == 403
    assert json.loads(body) == {"error": "forbidden", "reason": "not_allowed", "user": "bob"}
    # A browser through forward-auth gets the refusal page, which goes back to the
    # path asked about after "sign in as someone else".
    status, _, body = ask(port, fwd(uri="/admin/x"), sessions["bob"], headers=HTML)
    assert status == 403
    assert b"signed in as <b>bob</b>" in body
    assert b'name="next" value="/admin/x"' in body
    status, _, _ = ask(port, original("https://home.test/admin/x"), sessions["bob"],
                       "/api/authz/auth-request", headers=HTML)
    assert status == 403
    assert ask(port, fwd(uri="/admin/x"), sessions["ann"])[0] == 200


def test_route_policies_bypass_and_deny(provider, sessions):
    port = provider.port()
    status, headers, _ = ask(port, fwd(uri="/open/x"))
    # No user: the identity headers name nobody (empty, so no proxy copies another value).
    assert status == 200 and headers["x-auth-user"] == "" and headers["remote-groups"] == ""
    assert ask(port, fwd(uri="/closed/x"), sessions["ann"])[0] == 403
    # The sign-in pages themselves are never behind the sign-in.
    assert ask(port, fwd(uri="/__auth__/login?next=/"))[0] == 200


@pytest.mark.parametrize("host", ["wiki.test", "notes.apps.test", "WIKI.test:8443"])
def test_a_forward_entry_guards_hosts_nestgate_does_not_serve(provider, sessions, host):
    port = provider.port()
    # Asked under the guarded host's own name, as Caddy and nginx ask.
    status, headers, _ = ask(port, fwd(host=host, uri="/"), sessions["ann"], host=host)
    assert status == 200 and headers["x-auth-user"] == "ann"
    assert ask(port, fwd(host=host, uri="/"), sessions["bob"], host=host)[0] == 403
    status, headers, _ = ask(port, fwd(host=host, uri="/page"), host=host, headers=HTML)
    assert status == 302
    assert headers["location"] == f"https://{host.lower()}/__auth__/login?next=/page"


def test_a_host_no_protected_site_names_is_not_asked_about(provider, sessions):
    """A catch-all site ("*") names no host: the sign-in redirect would go wherever
    the forwarded host says."""
    status, headers, body = ask(provider.port(), fwd(host="elsewhere.test"), sessions["ann"],
                                headers=HTML)
    assert status == 401 and "location" not in headers
    assert json.loads(body)["host"] == "elsewhere.test"


def test_the_client_address_comes_from_trusted_proxies_only(provider):
    port, lan = provider.port(), fwd(host="lan.test", uri="/")
    # 127.0.0.1 is not a trusted proxy: its X-Forwarded-For is not believed, and
    # 127.0.0.1 is not in lan.test's allow list.
    assert ask(port, {**lan, "X-Forwarded-For": "10.1.2.3"})[0] == 403
    # 127.0.0.2 is: the client it names is let on to sign in, or not.
    assert ask(port, {**lan, "X-Forwarded-For": "10.1.2.3"}, source="127.0.0.2")[0] == 401
    assert ask(port, {**lan, "X-Forwarded-For": "192.0.2.7"}, source="127.0.0.2")[0] == 403


def basic(user: str, password: str) -> dict:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_basic_with_a_users_password(provider):
    port = provider.port()
    status, headers, _ = ask(port, fwd(), headers=basic("ann", "demo-password"))
    assert status == 200 and headers["x-auth-user"] == "ann"
    assert ask(port, fwd(uri="/admin/"), headers=basic("bob", "demo-password"))[0] == 403
    status, headers, _ = ask(port, fwd(), headers={**HTML, **basic("ann", "wrong")})
    assert status == 401 and headers["www-authenticate"] == 'Basic realm="nestgate"'
    assert "location" not in headers                     # a script's credential: no redirect
    # A password is one factor: a user who has a second one is refused it.
    status, headers, _ = ask(port, fwd(), headers=basic("tom", "demo-password"))
    assert status == 401 and "www-authenticate" in headers
    assert ask(port, fwd(), headers={"Authorization": "Basic %%%"})[0] == 401


def test_a_two_factor_route_refuses_one_factor_as_its_gate_does(provider, sessions):
    """The answer about a route is the one its own gate gives the same session: ann
    and bob signed in with a password alone (one factor), tom with a password and a
    TOTP code (two); Basic is a password, one factor."""
    port = provider.port()
    tom = Browser(port, "home.test")
    assert tom.sign_in("tom", code=otp_code(settled_step()))[0].status == 303
    signed_in = {**sessions, "tom": "; ".join(f"{k}={v}" for k, v in tom.jar.items())}
    for user, cookie in signed_in.items():
        itself = one_request(port, "/strict/x", "home.test", cookie=cookie)[0]
        status, headers, body = ask(port, fwd(uri="/strict/x"), cookie)
        assert status == itself == (200 if user == "tom" else 403), user
        if status == 200:
            assert headers["x-auth-user"] == user
        else:
            assert json.loads(body) == {"error": "forbidden", "reason": "no_second_factor",
                                        "user": user}
        # The same session is one the route's one_factor neighbours let in.
        assert ask(port, fwd(uri="/x"), cookie)[0] == 200
    status, _, body = ask(port, fwd(uri="/strict/x"), headers=basic("ann", "demo-password"))
    assert status == 403 and json.loads(body)["reason"] == "no_second_factor"
    # A browser gets the route's own refusal page, naming the user (not the session key).
    status, _, body = ask(port, fwd(uri="/strict/x"), sessions["ann"], headers=HTML)
    assert status == 403 and b"signed in as <b>ann</b>" in body
    assert b"needs a second factor" in body


@pytest.mark.parametrize("asked, path", [
    ({"X-Forwarded-Host": "home.test"}, "/api/authz/forward-auth"),       # no -Uri
    ({"X-Forwarded-Uri": "/"}, "/api/authz/forward-auth"),                # no -Host
    ({"X-Original-Method": "GET"}, "/api/authz/auth-request"),            # no -URL
    (fwd(proto="gopher"), "/api/authz/forward-auth"),
    (original("home.test/photos"), "/api/authz/auth-request"),
    # A method nestgate would not take itself (before: any token, `get` upper-cased).
    (fwd(method="BREW"), "/api/authz/forward-auth"),
    (fwd(method="get"), "/api/authz/forward-auth"),
    (fwd(method="CONNECT"), "/api/authz/forward-auth"),
    (fwd(method="GET_PARAMETER"), "/api/authz/forward-auth"),
    (original(method="FOO"), "/api/authz/auth-request"),
])
def test_a_question_that_names_no_request_is_400(provider, asked, path):
    status, _, body = ask(provider.port(), asked, path=path)
    assert status == 400, body


@pytest.mark.parametrize("method", ["PROPFIND", "M-SEARCH", "QUERY", "DELETE"])
def test_every_method_nestgate_takes_may_be_asked_about(provider, method):
    """The methods nestgate's own parser takes are asked about like GET: not signed in,
    401 from a script, 303 for a browser (not GET)."""
    assert ask(provider.port(), fwd(method=method))[0] == 401
    status, headers, _ = ask(provider.port(), fwd(method=method), headers=HTML)
    assert status == 303 and "/__auth__/login" in headers["location"]


# ---------------------------------------------------------------- nestgate as the client

FRONT = """
[server]
workers = 1

[[listen]]
address = "127.0.0.1:0"
http2_cleartext = true

[[site]]
name = "app"
hosts = ["home.test", "wiki.test"]
forward_auth = {{ url = "http://127.0.0.1:{auth}/api/authz/forward-auth", copy_headers = ["X-Auth-User", "Remote-Groups"] }}

[[site.route]]
prefix = "/"
type = "proxy"
upstream = "{up}"

[[site.route]]
prefix = "/down/"
type = "proxy"
upstream = "{up}"
forward_auth = {{ url = "http://127.0.0.1:{refused}/", timeout = "2s" }}

[[site.route]]
prefix = "/slow/"
type = "proxy"
upstream = "{up}"
forward_auth = {{ url = "{stalling}/stall", timeout = "1s" }}

[[site.route]]
prefix = "/recorded/"
type = "proxy"
upstream = "{up}"
forward_auth = {{ url = "{recorder}/status/204" }}
"""


@pytest.fixture(scope="module")
def front(provider, tmp_path_factory):
    """(front nestgate, its upstream): home.test and wiki.test asking the provider."""
    # `stalling` reads each question and never answers it; `recorder` says yes to
    # all and keeps the questions.
    up, stalling, recorder = Upstream("app"), Upstream("auth"), Upstream("recorder")
    server = write_config(tmp_path_factory.mktemp("front"), FRONT.format(
        auth=provider.port(), up=up.url, refused=refused_port(), stalling=stalling.url,
        recorder=recorder.url))
    server.recorder = recorder
    yield server, up
    server.stop()
    for upstream in (up, stalling, recorder):
        upstream.unblock()
        upstream.stop()


def through(port: int, path: str = "/echo", host: str = "home.test", cookie: str = "",
            headers: dict | None = None, method: str = "GET"):
    return one_request(port, path, host, headers, method,
                       b"x" if method == "POST" else None, cookie)


def upstream_saw(body: bytes) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name, value in json.loads(body)["headers"]:
        out.setdefault(name, []).append(value)
    return out


def test_a_yes_passes_with_the_copied_headers_and_no_forged_ones(front, sessions):
    server, _up = front
    forged = {"X-Auth-User": "mallory", "Remote-Groups": "admins"}
    status, _, body = through(server.port(), cookie=sessions["ann"], headers=forged)
    assert status == 200
    seen = upstream_saw(body)
    assert seen["x-auth-user"] == ["ann"]
    assert seen["remote-groups"] == ["family,admins"]
    # Let in without a user (a bypass route of the provider): the provider says no
    # name, and the client's copies are gone all the same.
    status, _, body = through(server.port(), "/open/echo", headers=forged)
    assert status == 200
    seen = upstream_saw(body)
    assert "x-auth-user" not in seen and "remote-groups" not in seen


def test_a_no_is_relayed_status_location_and_body(front, sessions):
    server, up = front
    before = len(up.requests)
    status, headers, _ = through(server.port(), "/photos", headers=HTML)
    assert status == 302
    assert headers["location"] == "http://home.test/__auth__/login?next=/photos"
    status, headers, body = through(server.port(), "/photos")
    assert status == 401 and json.loads(body)["error"] == "sign-in required"
    status, _, body = through(server.port(), "/admin/x", cookie=sessions["bob"])
    assert status == 403 and json.loads(body)["user"] == "bob"
    status, _, _ = through(server.port(), "/", host="wiki.test", cookie=sessions["bob"])
    assert status == 403
    status, _, _ = through(server.port(), "/x", method="POST", cookie=sessions["bob"])
    assert status == 200                                   # family may post to home
    status, headers, _ = through(server.port(), "/x", method="POST", headers=HTML)
    assert status == 303
    assert all(r["target"] == "/x" for r in up.requests[before:])   # only the let-in POST


def test_an_auth_server_that_fails_is_502_or_504(front):
    server, up = front
    before = len(up.requests)
    status, _, _ = through(server.port(), "/down/x")
    assert status == 502
    status, _, _ = through(server.port(), "/slow/x")
    assert status == 504
    assert len(up.requests) == before                       # nothing went through


# ---------------------------------------------------------------- the config

def problems_of(tmp_path, text: str) -> str:
    path = tmp_path / "nestgate.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        read_config(path)
    return "\n".join(info.value.problems)


def test_forward_keys_are_checked(tmp_path):
    base = f'[[listen]]\naddress = "127.0.0.1:0"\n[auth]\nstore = "s.db"\n' \
           f'[[auth.user]]\nname = "ann"\npassword = "{HASH}"\n'
    text = problems_of(tmp_path, base + """
[[auth.forward]]
hosts = ["*"]
[[auth.forward]]
hosts = ["app.test"]
policy = "everyone"
color = "blue"
[[auth.forward]]
hosts = []
[[site]]
hosts = ["app.test"]
forward_auth = { url = "ftp://auth.test/", copy_headers = ["Remote User"], wait = 1 }
[[site.route]]
prefix = "/"
type = "return"
forward_auth = "http://auth.test/"
""")
    assert "auth.forward[0].hosts: expected host names or \"*.example.com\" wildcards " \
           "(not \"*\"), got '*'" in text
    assert "auth.forward[1].policy: expected one of 'one_factor'" in text
    assert "auth.forward[1].color: unknown key" in text
    assert "auth.forward[2].hosts: expected at least one host name" in text
    assert "auth.forward[1].hosts: expected hosts no other site claims, got 'app.test' " \
           "(site[app.test].hosts claims it too)" in text
    assert "site[app.test].forward_auth.url: expected the auth server's address" in text
    assert "site[app.test].forward_auth.copy_headers: expected header names" in text
    assert "site[app.test].forward_auth.wait: unknown key" in text
    assert "site[app.test].route[0].forward_auth: expected a table such as" in text
    # A forward entry needs users to ask about; a protected site's endpoints are its own.
    text = problems_of(tmp_path, '[[listen]]\naddress = "127.0.0.1:0"\n[auth]\n'
                       'store = "s.db"\n[[auth.forward]]\nhosts = ["a.test"]\n')
    assert "auth: expected an [auth] table with at least one [[auth.user]]" in text
    text = problems_of(tmp_path, base + '[[site]]\nhosts = ["a.test"]\nprotected = true\n'
                       '[[site.route]]\npath = "/api/authz/auth-request"\ntype = "return"\n')
    assert "site[a.test].protected: expected a path no other route of the site has, got " \
           "'/api/authz/auth-request' (site[a.test].route[0].path has it too)" in text


def test_check_warns_when_no_proxy_is_trusted(tmp_path):
    path = tmp_path / "nestgate.toml"
    base = f'[[listen]]\naddress = "127.0.0.1:0"\n{{top}}[auth]\nstore = "s.db"\n' \
           f'[[auth.user]]\nname = "ann"\npassword = "{HASH}"\n' \
           f'[[auth.forward]]\nhosts = ["wiki.test"]\nexempt_local = true\n'
    path.write_text(base.format(top=""))
    warnings = config_warnings(read_config(path))
    assert any("auth.forward: no [client_ip] trusted_proxies" in w for w in warnings)
    # An entry is a protected site: warned about the same ways in without signing in.
    assert any("auth.forward[0]: protected, but exempt_local = true" in w
               for w in warnings)
    path.write_text(base.format(top='[client_ip]\ntrusted_proxies = ["127.0.0.1"]\n'))
    assert not any("trusted_proxies" in w for w in config_warnings(read_config(path)))


def test_the_question_carries_the_request_and_one_cookie_line(front):
    """What the auth server is told: the request (X-Forwarded-*), the client's Cookie as
    one line even when an HTTP/2 client split it (an auth server may read only the
    first), Authorization and Accept; nothing else of the client's."""
    server, _up = front
    client = H2Client(server.port(), None, "home.test")
    status, _, _ = client.request("POST", "/recorded/x?y=1", body=b"secret", headers=[
        (b"cookie", b"a=1"), (b"cookie", b"nestgate_session=abc"),
        (b"authorization", b"Bearer t"), (b"accept", b"text/html"), (b"x-other", b"no")])
    client.close()
    assert status == 200
    asked = server.recorder.requests[-1]
    seen = upstream_saw(json.dumps(asked).encode())
    assert asked["method"] == "GET" and asked["target"] == "/status/204" and asked["size"] == 0
    assert seen["cookie"] == ["a=1; nestgate_session=abc"]
    assert seen["x-forwarded-method"] == ["POST"]
    assert seen["x-forwarded-uri"] == ["/recorded/x?y=1"]
    assert seen["x-forwarded-host"] == ["home.test"] and seen["host"] == ["home.test"]
    assert seen["x-forwarded-proto"] == ["http"] and seen["x-forwarded-for"] == ["127.0.0.1"]
    assert seen["authorization"] == ["Bearer t"] and seen["accept"] == ["text/html"]
    assert "x-other" not in seen


PROBE = """
import json, sys
from pathlib import Path
from nestgate.config import parse_config
config = parse_config({
    "listen": [{"address": "127.0.0.1:0"}],
    "auth": {"store": ":memory:", "user": [{"name": "ann", "password": sys.argv[1]}],
             "forward": [{"hosts": ["wiki.test"]}]},
    "site": [{"hosts": ["app.test"], "protected": True,
              "forward_auth": {"url": "http://127.0.0.1:9/api/authz/forward-auth"},
              "route": [{"prefix": "/", "type": "return", "body": "hi",
                         "forward_auth": {"url": "http://127.0.0.1:9/"}}]}]}, "t.toml", Path("."))
import importlib
import nestgate.server.supervisor, nestgate.server.worker
from nestgate.sites.build import build_router, handler_modules
for name in handler_modules(config):
    importlib.import_module(name)
before = set(sys.modules)
build_router(config)
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def test_the_supervisor_imports_the_forward_auth_modules_before_forking(tmp_path):
    """Workers share what the supervisor imported (nestgate.server.supervisor.share_before_fork):
    a config with forward auth has its modules imported there, not in each worker."""
    out = subprocess.run([sys.executable, "-c", PROBE, HASH], capture_output=True, text=True,
                         env=_env(), timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    imported = json.loads(out.stdout)
    assert not [m for m in imported if m in ("nestgate.handlers.auth.delegate", "nestgate.handlers.auth.provider")]
