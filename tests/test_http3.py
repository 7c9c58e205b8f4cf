"""HTTP/3 over QUIC on a TLS listener with `http3 = true`, end to end: aioquic's own
client (tests/h3client.py) and headless Chromium forced onto QUIC ask a real server
with two workers sharing the port by SO_REUSEPORT."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import http.client
import http.server
import os
import ssl

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

import h3client

TEXT = b"0123456789abcdef" * 4096                 # 64 KiB: more than one DATA frame
PAGE = b"<!doctype html><title>over quic</title><p id=done>ok</p>\n"


class _Upstream(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _answer(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self._answer(f"upstream saw {self.path}".encode())

    def do_POST(self):
        if self.headers["Content-Length"] is not None:
            self._answer(self.rfile.read(int(self.headers["Content-Length"])))
            return
        body = b""
        while size := int(self.rfile.readline().split(b";")[0], 16):   # chunked
            body += self.rfile.read(size)
            self.rfile.readline()
        self.rfile.readline()
        self._answer(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server(tmp_path_factory, certs):
    folder = tmp_path_factory.mktemp("h3")
    (folder / "www").mkdir()
    (folder / "www" / "text.txt").write_bytes(TEXT)
    (folder / "www" / "index.html").write_bytes(PAGE)
    yield from h3client.serve_with_upstream(folder, certs, _Upstream, 2, f"""
[[site.route]]
prefix = "/files/"
type = "static"
root = "{folder / 'www'}"
warm = true          # warm files answer with the Alt-Svc line too (site.build_shared)

[[site.route]]
prefix = "/app/"
type = "proxy"
upstream = "{{upstream}}"
""")


def test_a_static_file_over_http3(server, certs):
    reply = h3client.fetch(server.port("https"), certs["ca"], "/files/text.txt")
    assert (reply.status, reply.body) == (200, TEXT)
    assert reply.headers["content-length"] == str(len(TEXT))
    assert reply.headers["content-type"].startswith("text/plain")


def test_a_proxy_route_over_http3(server, certs):
    reply = h3client.fetch(server.port("https"), certs["ca"], "/app/page?q=1")
    assert (reply.status, reply.body) == (200, b"upstream saw /app/page?q=1")


def test_an_unknown_path_is_the_sites_404(server, certs):
    reply = h3client.fetch(server.port("https"), certs["ca"], "/nothing-here")
    assert reply.status == 404
    assert b"404" in reply.body and reply.headers["content-type"].startswith("text/html")


def test_a_request_body_reaches_the_upstream_whole(server, certs):
    body = os.urandom(300 * 1024)
    reply = h3client.fetch(server.port("https"), certs["ca"], "/app/echo", "POST",
                           (("content-type", "application/octet-stream"),
                            ("content-length", str(len(body)))), body)
    assert (reply.status, reply.body) == (200, body)


@pytest.mark.parametrize("declared", [True, False])
def test_a_body_over_max_body_is_refused_with_413(server, certs, declared):
    # Declared, it is refused from its head; without a length, once it passes max_body
    # (the proxy's request upstream is dropped unfinished).
    body = b"x" * (1024 * 1024 + 1)                  # max_body's default is 1 MiB
    headers = (("content-length", str(len(body))),) if declared else ()
    reply = h3client.fetch(server.port("https"), certs["ca"], "/app/echo", "POST", headers,
                           body)
    assert reply.status == 413


def test_a_body_without_length_reaches_the_upstream(server, certs):
    body = os.urandom(100 * 1024)
    reply = h3client.fetch(server.port("https"), certs["ca"], "/app/echo", "POST", (), body)
    assert (reply.status, reply.body) == (200, body)


def test_many_streams_on_one_connection(server, certs):
    # More than the 128 streams open at a time: the rest wait for their turn.
    wanted = [("GET", f"/app/n{i}", (), None) if i % 2 else ("GET", "/files/index.html", (), None)
              for i in range(300)]
    replies = asyncio.run(h3client.requests(server.port("https"), certs["ca"], wanted))
    for (_, path, _, _), reply in zip(wanted, replies):
        expected = PAGE if path.startswith("/files/") else f"upstream saw {path}".encode()
        assert (reply.status, reply.body) == (200, expected), path


def test_the_certificate_is_chosen_by_server_name(server, certs):
    # The client checks the certificate against the name it asked for: other.test is
    # only in the second certificate of the listener.
    reply = h3client.fetch(server.port("https"), certs["ca"], "/files/index.html",
                           server_name="other.test", authority="other.test")
    assert (reply.status, reply.body) == (200, PAGE)


def test_https_answers_over_http1_name_the_http3_port(server, certs):
    port = server.port("https")
    context = ssl.create_default_context(cafile=certs["ca"])
    conn = http.client.HTTPSConnection("localhost", port, context=context, timeout=10)
    try:
        for path in ("/files/index.html", "/app/x", "/nothing-here"):
            conn.request("GET", path)
            resp = conn.getresponse()
            resp.read()
            assert resp.getheader("alt-svc") == f'h3=":{port}"; ma=86400', path
    finally:
        conn.close()


def _spki_hash(cert_file: str) -> str:
    """base64(SHA-256(SubjectPublicKeyInfo)) of the leaf, as Chromium's
    --ignore-certificate-errors-spki-list takes it."""
    with open(cert_file, "rb") as pem:
        leaf = x509.load_pem_x509_certificate(pem.read())
    spki = leaf.public_key().public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(spki).digest()).decode()


def test_chromium_loads_a_page_over_http3(server, certs):
    from browser import Browser
    port = server.port("https")
    # 127.0.0.1, not localhost: Chromium would try ::1 first, where nothing listens. Over
    # QUIC it checks the certificate even with --ignore-certificate-errors; the SPKI
    # list is what lets it take the test CA's.
    browser = Browser("about:blank", args=[
        "--enable-quic", f"--origin-to-force-quic-on=127.0.0.1:{port}",
        f"--ignore-certificate-errors-spki-list={_spki_hash(certs['local'][0])}"])
    try:
        browser.evaluate(f"location.href = 'https://127.0.0.1:{port}/files/index.html'")
        assert browser.wait_for("document.getElementById('done') && "
                                "document.getElementById('done').textContent") == "ok"
        assert browser.evaluate("performance.getEntriesByType('navigation')[0]"
                                ".nextHopProtocol") == "h3"
        fetched = browser.evaluate("fetch('/app/from-chromium').then(r => r.text())")
        assert fetched == "upstream saw /app/from-chromium"
    finally:
        browser.close()


def test_the_bench_driver_for_http3_counts_answers(server, tmp_path):
    # The h3-health scenario's client (nestgate.bench.h3load), for half a second on one
    # connection: what it counts is what the server answered.
    from nestgate.bench import h3load
    result = h3load.run(server.port("https"), "/files/index.html", 1, 2, 0.5,
                        tmp_path / "raw.txt")
    assert result.requests > 0 and result.status == {"2xx": result.requests}
    assert result.bytes == result.requests * len(PAGE)
    assert result.protocol == "h3"


def test_http3_is_refused_where_it_cannot_be_served(certs):
    from nestgate.config import ConfigError, parse_config
    certificate = {"cert": certs["local"][0], "key": certs["local"][1], "names": ["localhost"]}
    for listener, expected in (
            ({"address": "127.0.0.1:0", "http3": True}, "QUIC is always TLS"),
            ({"address": "127.0.0.1:0", "http3": True, "certificate": [certificate],
              "proxy_protocol_from": ["10.0.0.1"]}, "QUIC datagrams carry none")):
        with pytest.raises(ConfigError) as refused:
            parse_config({"listen": [listener]})
        assert "listen[0].http3" in str(refused.value) and expected in str(refused.value)
    served = parse_config({"listen": [{"address": "127.0.0.1:0", "http3": True,
                                        "certificate": [certificate]}]})
    assert served.listeners[0].http3
