"""Host (or :authority) values that are not host[:port] (RFC 3986 3.2.2): a second
colon, a name after an IPv6 literal's brackets.

Before, `private.test:443:`, `private.test:1:443` and `[::1]private.test` were taken:
routed by a name no site has, so to the catch-all site and past `private.test`'s access
list, with the Host sent upstream as it came (where an app matching hosts its own way
could take it for private.test). Now they are 400, over HTTP/1.1 and HTTP/2 alike."""

from __future__ import annotations

import socket

import pytest

from conftest import config
from h2client import H2Client

pytestmark = pytest.mark.attack

SITES = """
[[site]]
hosts = ["private.test"]
allow = ["10.9.9.9"]

[[site.route]]
prefix = "/"
type = "return"
body = "private"

[[site]]
hosts = ["*"]

[[site.route]]
prefix = "/"
type = "return"
body = "public"
"""
NOT_HOSTS = ["private.test:443:", "private.test:1:443", "[::1]private.test", "::1",
             "[::1]:80]", "private.test]"]


def _h1_status(port: int, host: str) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % host.encode())
        return sock.recv(65536).split(b"\r\n", 1)[0]


@pytest.mark.parametrize("host", NOT_HOSTS)
def test_a_host_that_is_not_host_and_port_is_400(start_server, host):
    server = start_server(config(SITES, "http2_cleartext = true"))
    assert _h1_status(server.port(), host) == b"HTTP/1.1 400 Bad Request"
    h2 = H2Client(server.port(), None)
    status, _headers, _body = h2.request("GET", "/", authority=host.encode())
    h2.close()
    assert status == 400
    # The forms a Host may take still route as before.
    for good, body in (("private.test:443", b"403"), ("PRIVATE.TEST.", b"403"),
                       ("public.test:", b"200"), ("[::1]:8080", b"200")):
        assert _h1_status(server.port(), good).split(b" ")[1] == body, good
