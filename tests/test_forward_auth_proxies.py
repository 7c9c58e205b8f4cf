"""nestgate as the forward-auth provider of the real programs: Debian's nginx
(auth_request) and Caddy (forward_auth), each in front of an upstream, with the
snippets docs/identity.md gives. Each is started once for the module."""

from __future__ import annotations

import json
import os
from urllib.parse import unquote

import pytest

from conftest import (HTML, PASSWORD_HASH, Browser, Server, Upstream, _env, free_port,
                      one_request)
from nestgate.bench import peers, tools

PROVIDER = """
[server]
workers = 1

[[listen]]
address = "127.0.0.1:0"

[client_ip]
trusted_proxies = ["127.0.0.1"]     # the proxy in front: its X-Forwarded-For counts

[auth]
store = "state.db"
cookie_secure = false               # plain HTTP in this test

[[auth.user]]
name = "ann"
password = "{hash}"
groups = ["family"]
email = "ann@example.test"

[[auth.user]]
name = "eve"
password = "{hash}"

[[auth.forward]]
hosts = ["app.test"]
allow_groups = ["family"]

[[auth.forward]]
hosts = ["lan.test"]
exempt_local = true                 # let in without a user: no identity to copy
"""

# The nginx side, as docs/identity.md gives it (addresses filled in).
NGINX_SERVER = """
server {{
    listen 127.0.0.1:{port};
    server_name app.test lan.test evil.test;

    location /__auth__/ {{                      # nestgate's sign-in pages
        proxy_pass http://127.0.0.1:{nestgate};
        proxy_set_header Host $host;
        proxy_set_header X-Forwarded-For $remote_addr;
    }}

    location = /internal/authz {{
        internal;
        proxy_pass http://127.0.0.1:{nestgate}/api/authz/auth-request;
        proxy_pass_request_body off;
        proxy_set_header Content-Length "";
        proxy_set_header Host $host;
        proxy_set_header X-Original-Method $request_method;
        proxy_set_header X-Original-URL $scheme://$http_host$request_uri;
        proxy_set_header X-Forwarded-For $remote_addr;
    }}

    location / {{
        auth_request /internal/authz;
        auth_request_set $user $upstream_http_remote_user;
        auth_request_set $groups $upstream_http_remote_groups;
        auth_request_set $email $upstream_http_remote_email;
        auth_request_set $signin $upstream_http_location;
        error_page 401 =302 $signin;
        proxy_set_header Remote-User $user;
        proxy_set_header Remote-Groups $groups;
        proxy_set_header Remote-Email $email;
        proxy_pass http://127.0.0.1:{upstream};
    }}
}}
"""

CADDYFILE = """
{{
    admin off
    auto_https off
}}

http://app.test:{port}, http://lan.test:{port}, http://evil.test:{port} {{
    handle /__auth__/* {{
        reverse_proxy 127.0.0.1:{nestgate}
    }}
    route {{                                    # in this order (Caddy's own would
        request_header -Remote-User             # drop the headers after forward_auth
        request_header -Remote-Groups           # copied them)
        request_header -Remote-Name
        request_header -Remote-Email
        forward_auth 127.0.0.1:{nestgate} {{
            uri /api/authz/forward-auth
            copy_headers Remote-User Remote-Groups Remote-Name Remote-Email
        }}
        reverse_proxy 127.0.0.1:{upstream}
    }}
}}
"""


def nginx_conf(folder, port: int, nestgate: int, upstream: int) -> str:
    tmp = folder / "tmp"
    tmp.mkdir()
    return "\n".join([
        "daemon off;", "master_process on;", "worker_processes 1;",
        # As root nginx would run its worker as `nobody`, who cannot enter the test's
        # private folders.
        *(["user root;"] if os.geteuid() == 0 else []),
        f"pid {folder / 'nginx.pid'};", f"error_log {folder / 'error.log'} warn;",
        "events { worker_connections 256; }",
        "http {", "  access_log off;",
        *(f"  {key} {tmp};" for key in ("client_body_temp_path", "proxy_temp_path",
                                         "fastcgi_temp_path", "uwsgi_temp_path",
                                         "scgi_temp_path")),
        NGINX_SERVER.format(port=port, nestgate=nestgate, upstream=upstream), "}", ""])


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """nestgate, an echoing upstream, and nginx and Caddy in front of it asking nestgate."""
    folder = tmp_path_factory.mktemp("forward-proxies")
    (folder / "nestgate.toml").write_text(PROVIDER.format(hash=PASSWORD_HASH))
    nestgate = Server(folder / "nestgate.toml", env=_env())
    up = Upstream("app")
    started = []
    try:
        ports = {}
        nginx_port = ports["nginx"] = free_port()
        (folder / "nginx.conf").write_text(nginx_conf(folder, nginx_port, nestgate.port(),
                                                      up.port))
        nginx = peers.ServerProcess("nginx", [tools.require("nginx"), "-c",
                                              str(folder / "nginx.conf"), "-p", str(folder),
                                              "-e", str(folder / "error.log")], folder)
        caddy_port = ports["caddy"] = free_port()
        (folder / "Caddyfile").write_text(CADDYFILE.format(port=caddy_port,
                                                           nestgate=nestgate.port(),
                                                           upstream=up.port))
        caddy = peers.ServerProcess(
            "caddy", [tools.require("caddy"), "run", "--config", str(folder / "Caddyfile"),
                      "--adapter", "caddyfile"], folder,
            {"XDG_DATA_HOME": str(folder / "caddy"), "XDG_CONFIG_HOME": str(folder / "caddy"),
             "GOMAXPROCS": "1"})
        for name, server in (("nginx", nginx), ("caddy", caddy)):
            server.start(folder)
            started.append(server)
            peers.wait_ready(server, "http", ports[name], "/__auth__/login", "app.test")
        yield ports, up
    finally:
        for server in started:
            server.stop()
        nestgate.stop()
        up.stop()


PROXIES = ["nginx", "caddy"]


def request(port: int, path: str = "/echo", host: str = "app.test", cookie: str = "",
            headers: dict | None = None):
    return one_request(port, path, host, headers, cookie=cookie)


def signed_in(port: int, user: str) -> str:
    """Signed in through the proxy's /__auth__/ pages; the session cookie header."""
    browser = Browser(port, "app.test")
    resp, _ = browser.sign_in(user)
    assert resp.status == 303, user
    return "; ".join(f"{k}={v}" for k, v in browser.jar.items())


def seen(body: bytes) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name, value in json.loads(body)["headers"]:
        out.setdefault(name, []).append(value)
    return out


@pytest.mark.parametrize("proxy", PROXIES)
def test_a_signed_in_user_reaches_the_upstream_as_themselves(stack, proxy):
    ports, _up = stack
    cookie = signed_in(ports[proxy], "ann")
    forged = {"Remote-User": "mallory", "Remote-Groups": "admins"}
    status, _, body = request(ports[proxy], cookie=cookie, headers=forged)
    assert status == 200, body
    headers = seen(body)
    assert headers["remote-user"] == ["ann"]
    assert headers["remote-groups"] == ["family"]
    assert headers["remote-email"] == ["ann@example.test"]


@pytest.mark.parametrize("proxy", PROXIES)
def test_no_session_a_browser_goes_to_sign_in_a_script_gets_401(stack, proxy):
    ports, up = stack
    before = len(up.requests)
    status, headers, _ = request(ports[proxy], "/photos?a=1", headers=HTML)
    assert status == 302
    location = headers["location"]
    assert location.startswith("http://app.test/__auth__/login?next=")
    assert unquote(location.split("next=", 1)[1]) == "/photos?a=1"
    status, _, _ = request(ports[proxy], "/photos", headers={"Accept": "application/json"})
    # nginx answers its 302 for every 401 (error_page); Caddy relays nestgate's 401.
    assert status == (302 if proxy == "nginx" else 401)
    assert len(up.requests) == before


@pytest.mark.parametrize("proxy", PROXIES)
def test_a_user_the_policy_refuses_gets_403(stack, proxy):
    ports, up = stack
    cookie = signed_in(ports[proxy], "eve")
    before = len(up.requests)
    status, _, body = request(ports[proxy], "/echo", cookie=cookie, headers=HTML)
    assert status == 403
    if proxy == "caddy":                                  # the relayed refusal page
        assert b"signed in as <b>eve</b>" in body
    assert len(up.requests) == before


@pytest.mark.parametrize("proxy", PROXIES)
def test_let_in_without_a_user_forged_identity_headers_stay_out(stack, proxy):
    """lan.test lets local clients in without signing in: the answer names nobody
    (empty identity headers), and what the client sent under those names never
    reaches the upstream: nginx sends none, Caddy copies the empty values."""
    ports, _up = stack
    status, _, body = request(ports[proxy], host="lan.test",
                              headers={"Remote-User": "mallory", "Remote-Email": "m@x"})
    assert status == 200
    headers = seen(body)
    for name in ("remote-user", "remote-email", "remote-groups", "remote-name"):
        assert headers.get(name, [""]) == [""], (name, headers.get(name))


@pytest.mark.parametrize("proxy", PROXIES)
@pytest.mark.parametrize("host, path", [
    ("evil.test", "/"),                   # a Host the proxy serves, nestgate guards not
    ("app.test", "//evil.test/x"),        # a way back that is another host
    ("app.test", "/\\evil.test/x"),
])
def test_open_redirect_attempts_are_refused(stack, proxy, host, path):
    ports, up = stack
    before = len(up.requests)
    status, headers, _ = request(ports[proxy], path, host=host, headers=HTML)
    location = headers.get("location", "")
    assert "evil" not in location.split("?", 1)[0], location
    if location:
        assert location.startswith("http://app.test/__auth__/login?next=")
        assert unquote(location.split("next=", 1)[1]) == "/"
    assert status != 200 and len(up.requests) == before
