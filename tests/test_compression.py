"""Response compression end to end: a `return` route's body and rendered notes pages
kept in every coding, proxied answers compressed as they stream (`compress = true`),
over HTTP/1.1 and HTTP/2, against a real upstream. Static files: test_static.py."""

from __future__ import annotations

import gzip
import http.client
import http.server
import threading

import brotli
import pytest
import zstandard

from conftest import listeners
from h2client import H2Client

TEXT = b"<p>The quick brown fox jumps over the lazy dog.</p>\n" * 200
DECODE = {"br": brotli.decompress, "gzip": gzip.decompress,
          "zstd": lambda data: zstandard.ZstdDecompressor().decompressobj().decompress(data),
          None: lambda data: data}


def get(port, path, accept=None, method="GET", conn=None, extra=()):
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.putrequest(method, path, skip_accept_encoding=True)
    if accept is not None:
        conn.putheader("Accept-Encoding", accept)
    for name, value in extra:
        conn.putheader(name, value)
    conn.endheaders()
    resp = conn.getresponse()
    body = resp.read()
    headers = {k.lower(): v for k, v in resp.getheaders()}
    return resp.status, headers, body, conn


def decoded(headers, body) -> bytes:
    return DECODE[headers.get("content-encoding")](body)


# ------------------------------------------------------------------ return routes


RETURN_SITE = """
[[site]]
hosts = ["*"]

[[site.route]]
path = "/page"
type = "return"
body_file = "{page}"
content_type = "text/html; charset=utf-8"

[[site.route]]
path = "/plain-page"
type = "return"
body_file = "{page}"
content_type = "text/html; charset=utf-8"
compress = false

[[site.route]]
path = "/short"
type = "return"
body = "short text"

[[site.route]]
path = "/blob"
type = "return"
body_file = "{page}"
content_type = "application/octet-stream"
"""


@pytest.fixture
def return_server(start_server, tmp_path, certs):
    page = tmp_path / "page.html"
    page.write_bytes(TEXT)
    return start_server(listeners(certs) + RETURN_SITE.format(page=page))


def test_return_route_codings_by_q_value(return_server):
    port = return_server.port()
    for accept, coding in (("br, gzip", "br"), ("gzip, deflate", "gzip"), ("zstd", "zstd"),
                           ("gzip;q=0.5, zstd;q=0.8, br;q=0.1", "zstd"),
                           ("br;q=0, *", "zstd"), ("identity", None), (None, None),
                           ("br;q=0.5, identity", None), ("compress, deflate", None)):
        status, headers, body, _ = get(port, "/page", accept)
        assert status == 200, accept
        assert headers.get("content-encoding") == coding, accept
        assert headers["vary"] == "accept-encoding"
        assert int(headers["content-length"]) == len(body)
        assert decoded(headers, body) == TEXT, accept
        if coding:
            assert len(body) < len(TEXT) // 5


def test_return_route_head_keep_alive_and_opt_out(return_server):
    port = return_server.port()
    status, headers, body, conn = get(port, "/page", "br", method="HEAD")
    assert (status, body, headers["content-encoding"]) == (200, b"", "br")
    length = int(headers["content-length"])
    status, headers, body, conn = get(port, "/page", "br", conn=conn)   # same connection
    assert (status, len(body)) == (200, length) and decoded(headers, body) == TEXT
    for path in ("/plain-page", "/short", "/blob"):     # off, too small, not text
        status, headers, body, _ = get(port, path, "br, gzip, zstd")
        assert status == 200 and "content-encoding" not in headers, path
        assert "vary" not in headers, path


def test_return_route_over_http2(return_server, certs):
    client = H2Client(return_server.port("https"), certs["ca"])
    try:
        status, headers, body = client.request("GET", "/page",
                                               headers=[(b"accept-encoding", b"gzip, br")])
        assert (status, headers["content-encoding"]) == (200, "br")
        assert brotli.decompress(body) == TEXT
        status, headers, body = client.request("GET", "/page")
        assert "content-encoding" not in headers and body == TEXT
    finally:
        client.close()


# ------------------------------------------------------------------ notes pages


NOTES_SITE = """
[[site]]
hosts = ["*"]
base_url = "https://notes.example"

[site.notes]
dir = "{notes}"
"""


def test_notes_pages_and_feed_are_kept_compressed(start_server, tmp_path, certs):
    folder = tmp_path / "notes"
    folder.mkdir()
    long_text = "\n\n".join(f"Paragraph {i}: " + "words that repeat " * 20 for i in range(40))
    (folder / "long.md").write_text(f"---\ntitle: Long\ndate: 2026-05-01\n---\n\n{long_text}\n")
    server = start_server(listeners(certs) + NOTES_SITE.format(notes=folder))
    port = server.port()
    _, _, plain, conn = get(port, "/notes/long")
    assert b"Paragraph 39" in plain
    for _ in range(2):                          # the render, then a cache hit
        status, headers, body, conn = get(port, "/notes/long", "gzip, br", conn=conn)
        assert (status, headers["content-encoding"]) == (200, "br")
        assert brotli.decompress(body) == plain and headers["vary"] == "accept-encoding"
    status, headers, body, conn = get(port, "/notes/feed.xml", "gzip", conn=conn)
    assert headers["content-encoding"] == "gzip" and b"<feed" in gzip.decompress(body)
    client = H2Client(server.port("https"), certs["ca"])
    try:
        status, headers, body = client.request("GET", "/notes/long",
                                               headers=[(b"accept-encoding", b"zstd")])
        assert (status, headers["content-encoding"]) == (200, "zstd")
        assert DECODE["zstd"](body) == plain
    finally:
        client.close()


# ------------------------------------------------------------------ proxied answers


class _Upstream(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    answers = {
        # path: (status, headers, body, chunked)
        "/text": (200, [("Content-Type", "text/html"), ("ETag", '"v1"')], TEXT, True),
        "/json": (200, [("Content-Type", "application/json")],
                  b'{"items": [' + b'"same again", ' * 300 + b'"end"]}', False),
        "/png": (200, [("Content-Type", "image/png"), ("ETag", '"p1"')], TEXT, False),
        "/coded": (200, [("Content-Type", "text/plain"), ("Content-Encoding", "gzip")],
                   gzip.compress(TEXT), False),
        "/no-transform": (200, [("Content-Type", "text/plain"),
                                ("Cache-Control", "public, no-transform")], TEXT, False),
        "/tiny": (200, [("Content-Type", "text/plain")], b"tiny", False),
        "/part": (206, [("Content-Type", "text/plain"),
                        ("Content-Range", f"bytes 0-999/{len(TEXT)}")], TEXT[:1000], False),
        "/varies": (200, [("Content-Type", "text/plain"), ("Vary", "Accept-Encoding")],
                    TEXT, False),
    }

    def do_GET(self):
        status, headers, body, chunked = self.answers[self.path]
        etag = dict(headers).get("ETag")
        if etag and self.headers.get("If-None-Match", "").removeprefix("W/") == etag:
            # Weak comparison (RFC 9110 13.1.2), the validators and no Content-Type
            # unless the type is not text (as servers differ in this).
            self.send_response(304)
            self.send_header("ETag", etag)
            if content_type := dict(headers).get("Content-Type", ""):
                if not content_type.startswith("text/"):
                    self.send_header("Content-Type", content_type)
            self.end_headers()
            return
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        if self.command == "HEAD":
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
        elif chunked:
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            third = len(body) // 3
            for part in (body[:third], body[third:2 * third], body[2 * third:]):
                self.wfile.write(b"%x\r\n%b\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


@pytest.fixture
def proxied(start_server, certs):
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{upstream.server_address[1]}"
    server = start_server(listeners(certs) + f"""
[[site]]
hosts = ["*"]

[[site.route]]
prefix = "/plain/"
type = "proxy"
upstream = "{url}"
strip_prefix = true

[[site.route]]
prefix = "/"
type = "proxy"
upstream = "{url}"
compress = true
""")
    yield server
    upstream.shutdown()
    upstream.server_close()


def test_proxied_text_is_compressed_as_it_streams(proxied):
    port = proxied.port()
    conn = None
    for accept, coding in (("gzip, br", "br"), ("gzip", "gzip"), ("zstd, gzip;q=0.1", "zstd")):
        for path, expected in (("/text", TEXT), ("/json", _Upstream.answers["/json"][2])):
            status, headers, body, conn = get(port, path, accept, conn=conn)  # kept alive
            assert status == 200 and headers["content-encoding"] == coding, (path, accept)
            assert headers["transfer-encoding"] == "chunked"
            assert "content-length" not in headers and headers["vary"] == "accept-encoding"
            assert decoded(headers, body) == expected
    _, headers, _, conn = get(port, "/text", "br", conn=conn)
    assert headers["etag"] == 'W/"v1"'            # the bytes are not the upstream's
    status, headers, body, conn = get(port, "/text", "br", method="HEAD", conn=conn)
    assert (status, body, headers["content-encoding"]) == (200, b"", "br")
    status, headers, body, conn = get(port, "/text", None, conn=conn)
    assert "content-encoding" not in headers and body == TEXT
    assert (headers["etag"], headers["vary"]) == ('"v1"', "accept-encoding")


def test_proxied_answers_left_as_they_are(proxied):
    port = proxied.port()
    for path in ("/png", "/coded", "/no-transform", "/tiny", "/part"):
        status, headers, body, _ = get(port, path, "br, gzip, zstd")
        upstream_status, upstream_headers, upstream_body, _ = _Upstream.answers[path]
        assert (status, body) == (upstream_status, upstream_body), path
        assert headers.get("content-encoding") == dict(upstream_headers).get("Content-Encoding")
        assert "vary" not in headers, path
    status, headers, body, _ = get(port, "/varies", "gzip")
    assert headers["content-encoding"] == "gzip" and gzip.decompress(body) == TEXT
    assert headers["vary"] == "Accept-Encoding"      # not named twice
    status, headers, body, _ = get(port, "/plain/text", "br, gzip")  # compress not set
    assert "content-encoding" not in headers and "vary" not in headers and body == TEXT


def test_a_304_carries_the_vary_its_200_would(proxied, certs):
    # Before: the 304 went without Vary, so a cache that kept the coded 200 and
    # refreshed it with this 304 could hand brotli to a client that cannot read it.
    port = proxied.port()
    for accept in ("br", "gzip", None):
        status, headers, body, _ = get(port, "/text", accept, extra=[("If-None-Match", 'W/"v1"')])
        assert (status, body) == (304, b""), accept
        assert headers["vary"] == "accept-encoding", accept
        assert "content-encoding" not in headers
    status, headers, _, _ = get(port, "/png", "br", extra=[("If-None-Match", '"p1"')])
    assert status == 304 and "vary" not in headers          # its 200 has none either
    status, headers, _, _ = get(port, "/plain/text", "br", extra=[("If-None-Match", '"v1"')])
    assert status == 304 and "vary" not in headers          # a route that does not compress
    client = H2Client(proxied.port("https"), certs["ca"])
    try:
        status, headers, body = client.request(
            "GET", "/text", headers=[(b"accept-encoding", b"br"), (b"if-none-match", b'W/"v1"')])
    finally:
        client.close()
    assert (status, body, headers["vary"]) == (304, b"", "accept-encoding")


def test_proxied_text_compressed_over_http2(proxied, certs):
    client = H2Client(proxied.port("https"), certs["ca"])
    try:
        for path, expected in (("/text", TEXT), ("/json", _Upstream.answers["/json"][2])):
            status, headers, body = client.request("GET", path,
                                                   headers=[(b"accept-encoding", b"br")])
            assert (status, headers["content-encoding"]) == (200, "br")
            assert "content-length" not in headers and brotli.decompress(body) == expected
    finally:
        client.close()
