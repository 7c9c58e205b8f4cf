"""An upstream's redirect to its own address, which only nestgate can reach.

An app told `Host: 127.0.0.1:9001` (`host_header = "target"`), or one that knows no
other name, writes its redirects with that address; they went to the browser as they
were, so the visitor was sent to a loopback or LAN address it cannot reach (and was
told the upstream's address). Like nginx's `proxy_redirect default`, a `Location` or
`Refresh` URL on the upstream's own scheme, host and port now becomes a path through
nestgate (with the route's prefix when it is stripped); any other URL is left alone.
"""

from __future__ import annotations

import socket

import pytest

from conftest import read_all
from h2client import H2Client
from rawupstream import RawUpstream, proxy_toml


def redirects(port: int) -> dict[str, bytes]:
    me = b"127.0.0.1:%d" % port
    return {
        "/login": b"HTTP/1.1 302 Found\r\nLocation: http://%b/login/form?next=/\r\n"
                  b"content-length: 0\r\n\r\n" % me,
        "/bare": b"HTTP/1.1 301 Moved\r\nlocation:HTTP://%b\r\ncontent-length: 0\r\n\r\n" % me,
        "/refresh": b"HTTP/1.1 200 OK\r\nRefresh: 0; url=http://%b/home\r\n"
                    b"content-length: 2\r\n\r\nok" % me,
        "/elsewhere": b"HTTP/1.1 302 Found\r\nLocation: https://id.example/auth?"
                      b"back=http://%b/cb\r\ncontent-length: 0\r\n\r\n" % me,
        "/other-port": b"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:%d/x\r\n"
                       b"content-length: 0\r\n\r\n" % (port + 1),
        "/relative": b"HTTP/1.1 302 Found\r\nLocation: /x\r\ncontent-length: 0\r\n\r\n",
    }


@pytest.fixture
def gateway(start_server):
    up = RawUpstream()
    up.answers.update(redirects(up.port))
    for path, answer in list(up.answers.items()):
        up.answers["/api" + path] = answer          # as the stripped route sends them
    server = start_server(proxy_toml(up.url, listeners="http2_cleartext = true", routes=f"""
        [[site.route]]
        prefix = "/app/"
        type = "proxy"
        upstream = "{up.url}"
        strip_prefix = true
        """))
    yield server, up
    up.stop()


def field(port: int, path: str, name: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET %b HTTP/1.1\r\nHost: app.example\r\nConnection: close\r\n\r\n"
                     % path.encode())
        got = read_all(sock)
    for line in got.split(b"\r\n\r\n")[0].split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.lower() == name:
            return value.strip()
    return b""


@pytest.mark.parametrize("path, expected", [
    ("/login", b"/login/form?next=/"),
    ("/bare", b"/"),
    ("/relative", b"/x"),
    ("/app/login", b"/app/login/form?next=/"),
    ("/app/bare", b"/app/"),
])
def test_a_redirect_to_the_upstream_goes_through_nestgate(gateway, path, expected):
    server, _up = gateway
    assert field(server.port(), path, b"location") == expected


def test_a_refresh_to_the_upstream_goes_through_nestgate(gateway):
    server, _up = gateway
    assert field(server.port(), "/refresh", b"refresh") == b"0; url=/home"
    assert field(server.port(), "/app/refresh", b"refresh") == b"0; url=/app/home"


def test_other_urls_are_left_alone(gateway):
    server, up = gateway
    assert field(server.port(), "/elsewhere", b"location") == \
        b"https://id.example/auth?back=http://127.0.0.1:%d/cb" % up.port
    assert field(server.port(), "/other-port", b"location") == \
        b"http://127.0.0.1:%d/x" % (up.port + 1)


def test_over_http2_and_again_from_the_remembered_head(gateway):
    server, _up = gateway
    for _ in range(3):              # the head is read once, then remembered
        assert field(server.port(), "/login", b"location") == b"/login/form?next=/"
    client = H2Client(server.port(), None)
    try:
        for _ in range(3):
            status, headers, _body = client.request("GET", "/app/login")
            assert (status, headers["location"]) == (302, "/app/login/form?next=/")
    finally:
        client.close()
