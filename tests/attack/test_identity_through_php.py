"""Forged identity headers as a PHP app behind Caddy reads them.

nestgate in front of Caddy, whose `php_fastcgi` hands each request to PHP (here
Debian's php-cgi as the FastCGI server). Caddy turns every field into a FastCGI
parameter `HTTP_` + the name upper-cased with `-` made `_`, and keeps other
characters: a client's `Remote.User: ann` became `HTTP_REMOTE.USER`, and PHP, which
turns `.` into `_` in every variable name it registers, filled
`$_SERVER['HTTP_REMOTE_USER']` with it: beside nestgate's `Remote-User: bob` the
parameter Caddy sent last won (Caddy sends them in Go's map order, so about every
other request was ann's), and on a route without sign-in it was the only one.
"""

from __future__ import annotations

import pytest

from conftest import PASSWORD_HASH, Browser, free_port
from nestgate.bench import peers, tools

ATTEMPTS = 24          # each one ann's at even odds before: 2^-24 to miss it by luck

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

[[site]]
hosts = ["home.test"]
protected = true

[[site.route]]
prefix = "/"
type = "proxy"
upstream = "{{up}}"

[[site.route]]
prefix = "/open/"
type = "proxy"
upstream = "{{up}}"
policy = "bypass"
"""

CADDYFILE = """
{{
    admin off
    auto_https off
}}
:{port} {{
    bind 127.0.0.1
    root * {root}
    php_fastcgi 127.0.0.1:{fastcgi}
}}
"""

WHO = b"""<?php
echo ($_SERVER['HTTP_REMOTE_USER'] ?? '-'), ' ', ($_SERVER['HTTP_X_WEBAUTH_USER'] ?? '-');
"""


@pytest.fixture
def php_app(tmp_path):
    """Caddy with php_fastcgi on a free port, php-cgi behind it; the Caddy port."""
    root = tmp_path / "www"
    (root / "open").mkdir(parents=True)
    (root / "who.php").write_bytes(WHO)
    (root / "open" / "who.php").write_bytes(WHO)
    fastcgi = port = free_port()
    while port == fastcgi:              # each asked for alone: they may coincide
        port = free_port()
    (tmp_path / "Caddyfile").write_text(CADDYFILE.format(port=port, root=root,
                                                         fastcgi=fastcgi))
    php = peers.ServerProcess("php-cgi", [tools.require("php-cgi"), "-b",
                                          f"127.0.0.1:{fastcgi}"], tmp_path,
                              {"PHP_FCGI_CHILDREN": "0"})
    caddy = peers.ServerProcess(
        "caddy", [tools.require("caddy"), "run", "--config", str(tmp_path / "Caddyfile"),
                  "--adapter", "caddyfile"], tmp_path,
        {"XDG_DATA_HOME": str(tmp_path / "caddy"), "XDG_CONFIG_HOME": str(tmp_path / "caddy"),
         "GOMAXPROCS": "1"})
    started = []
    try:
        for server in (php, caddy):
            server.start(tmp_path)
            started.append(server)
        peers.wait_ready(caddy, "http", port, "/who.php")
        yield port
    finally:
        for server in reversed(started):
            server.stop()


def test_a_dotted_name_never_becomes_the_user_php_reads(start_server, php_app):
    server = start_server(CONFIG.replace("{up}", f"http://127.0.0.1:{php_app}"))
    bob = Browser(server.port(), "home.test", keep=True)
    assert bob.sign_in("bob")[0].status == 303
    forged = {"Remote.User": "ann", "X.WebAuth.User": "ann", "x-webauth.user": "ann"}
    seen = set()
    for _ in range(ATTEMPTS):
        resp, body = bob.request("GET", "/who.php", headers=forged)
        assert resp.status == 200, body
        seen.add(body)
    assert seen == {b"- bob"}, seen
    resp, body = bob.request("GET", "/open/who.php", headers=forged, cookies=False)
    assert resp.status == 200 and body == b"- -", body
