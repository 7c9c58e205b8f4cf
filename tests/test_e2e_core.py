"""The core end to end: real server processes, real sockets, plain and TLS alike."""

from __future__ import annotations

import http.client
import json
import socket
import ssl

import pytest

from conftest import TEMPLATE, read_all, tls_block


class Client:
    """Opens plain or TLS connections to one server."""

    def __init__(self, server, scheme: str, certs) -> None:
        self.port = server.port(scheme)
        self.scheme = scheme
        self.ssl = None
        if scheme == "https":
            self.ssl = ssl.create_default_context(cafile=certs["ca"])

    def http(self, host: str = "localhost") -> http.client.HTTPConnection:
        if self.ssl:
            return http.client.HTTPSConnection(host, self.port, context=self.ssl, timeout=5)
        return http.client.HTTPConnection(host, self.port, timeout=5)

    def raw(self, server_hostname: str = "localhost"):
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        if self.ssl:
            sock = self.ssl.wrap_socket(sock, server_hostname=server_hostname)
        return sock


@pytest.fixture(params=["http", "https"])
def client(request, start_server, certs):
    tls = tls_block(certs) if request.param == "https" else ""
    server = start_server(TEMPLATE.format(tls=tls))
    return Client(server, request.param, certs)


def test_health(client):
    conn = client.http("127.0.0.1")
    conn.request("GET", "/api/v1/health")
    resp = conn.getresponse()
    assert resp.status == 200 and json.loads(resp.read())["status"] == "ok"


def test_keep_alive_reuses_the_connection(client):
    conn = client.http()
    for _ in range(3):
        conn.request("GET", "/hello")
        resp = conn.getresponse()
        assert resp.read() == b"hello\n"
    assert not resp.will_close


def test_routes_exact_prefix_wildcard_and_unknown_host(client):
    conn = client.http()
    conn.request("GET", "/docs/a/b")
    assert conn.getresponse().read() == b"docs\n"
    conn.request("GET", "/old")
    resp = conn.getresponse()
    resp.read()
    assert (resp.status, resp.getheader("location")) == (301, "/hello")
    conn.request("GET", "/hello", headers={"Host": "shop.example.test"})
    assert conn.getresponse().read() == b"hello\n"
    conn.request("GET", "/hello", headers={"Host": "nobody.invalid"})
    resp = conn.getresponse()
    assert resp.status == 404 and b"404 Not Found" in resp.read()


def test_pipelined_requests_answered_in_order(client):
    sock = client.raw()
    sock.sendall(b"GET /hello HTTP/1.1\r\nHost: localhost\r\n\r\n"
                 b"GET /docs/x HTTP/1.1\r\nHost: localhost\r\n\r\n"
                 b"GET /hello HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    data = read_all(sock)
    assert data.count(b"HTTP/1.1 200 OK") == 3
    assert data.index(b"hello\n") < data.index(b"docs\n") < data.rindex(b"hello\n")


def test_malformed_request_gets_400_and_close(client):
    sock = client.raw()
    sock.sendall(b"GET /hello HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
    data = read_all(sock)
    assert data.startswith(b"HTTP/1.1 400 ") and b"connection: close" in data


def test_slow_headers_get_408(client):
    sock = client.raw()
    sock.sendall(b"GET /hello HTTP/1.1\r\nHost: local")     # never finished
    data = read_all(sock)                                   # the deadline closes it
    assert data.startswith(b"HTTP/1.1 408 ")


def test_body_too_large_gets_413(client):
    conn = client.http()
    conn.request("POST", "/hello", body=b"x" * 2048)
    resp = conn.getresponse()
    assert resp.status == 413


def test_tls_sni_picks_the_certificate(start_server, certs):
    server = start_server(TEMPLATE.format(tls=tls_block(certs)))
    ctx = ssl.create_default_context(cafile=certs["ca"])
    for name in ("localhost", "other.test"):
        with socket.create_connection(("127.0.0.1", server.port("https"))) as raw:
            with ctx.wrap_socket(raw, server_hostname=name) as tls:   # verifies the name
                assert tls.version() in ("TLSv1.2", "TLSv1.3")


def test_tls_alpn_offers_h2_and_http11(start_server, certs):
    server = start_server(TEMPLATE.format(tls=tls_block(certs)))
    for offered, chosen in ((["h2", "http/1.1"], "h2"), (["http/1.1"], "http/1.1")):
        ctx = ssl.create_default_context(cafile=certs["ca"])
        ctx.set_alpn_protocols(offered)
        with socket.create_connection(("127.0.0.1", server.port("https"))) as raw:
            with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
                assert tls.selected_alpn_protocol() == chosen


def test_plain_listener_redirects_to_https(start_server, certs):
    config = TEMPLATE.format(tls=tls_block(certs)) + """
[[listen]]
address = "127.0.0.1:0"
redirect_https = true
https_port = 8443
"""
    server = start_server(config)
    plain_port = [p for s, _h, p in server.urls if s == "http"][0]
    conn = http.client.HTTPConnection("127.0.0.1", plain_port, timeout=5)
    conn.request("GET", "/a/b?c=d", headers={"Host": "localhost:8080"})
    resp = conn.getresponse()
    assert resp.status == 308
    assert resp.getheader("location") == "https://localhost:8443/a/b?c=d"
    resp.read()
    conn.request("GET", "/", headers={"Host": "evil\"<x>"})
    assert conn.getresponse().status == 400
