"""Static files end to end: real server processes, real files in tmp_path."""

from __future__ import annotations

import errno
import gzip
import http.client
import os
import signal
import socket
import ssl
import struct
import time

import pytest

from conftest import STATIC_SITE, serve, tls_block
from wire import parse_responses


def get(port, path, headers=None, method="GET", context=None):
    if context is not None:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)
    else:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request(method, path, headers=headers or {})
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, body


@pytest.fixture
def root(tmp_path):
    site = tmp_path / "public"
    site.mkdir()
    (site / "index.html").write_text("<h1>home</h1>\n")
    (site / "style.css").write_text("body { color: #123; }\n" * 10)
    (site / "docs").mkdir()
    (site / "docs" / "index.html").write_text("docs index\n")
    (site / "empty").mkdir()
    (site / "empty" / "a.txt").write_text("a\n")
    (site / ".secret").write_text("hidden\n")
    (site / "big.bin").write_bytes(os.urandom(300 * 1024))
    return site


def test_small_file_headers_and_body(start_server, root):
    server = serve(start_server, root)
    status, headers, body = get(server.port(), "/style.css")
    assert status == 200 and body == (root / "style.css").read_bytes()
    assert headers["content-type"] == "text/css; charset=utf-8"
    st = os.stat(root / "style.css")
    assert headers["etag"] == f'"{st.st_mtime_ns:x}-{st.st_size:x}"'
    assert headers["last-modified"].endswith("GMT")
    assert headers["accept-ranges"] == "bytes"
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["x-frame-options"] == "DENY"
    assert "default-src 'self'" in headers["content-security-policy"]
    assert "strict-transport-security" not in headers       # no TLS listener
    status, headers, body = get(server.port(), "/style.css", method="HEAD")
    assert status == 200 and body == b"" and int(headers["content-length"]) == st.st_size


def test_conditional_requests(start_server, root):
    server = serve(start_server, root)
    _, headers, _ = get(server.port(), "/style.css")
    etag, modified = headers["etag"], headers["last-modified"]
    status, headers, body = get(server.port(), "/style.css", {"If-None-Match": etag})
    assert (status, body) == (304, b"") and headers["etag"] == etag
    assert "content-length" not in headers
    assert get(server.port(), "/style.css", {"If-None-Match": f'"x", W/{etag}'})[0] == 304
    assert get(server.port(), "/style.css", {"If-None-Match": '"other"'})[0] == 200
    assert get(server.port(), "/style.css", {"If-Modified-Since": modified})[0] == 304
    old = "Mon, 01 Jan 2001 00:00:00 GMT"
    assert get(server.port(), "/style.css", {"If-Modified-Since": old})[0] == 200
    # If-None-Match wins over If-Modified-Since.
    assert get(server.port(), "/style.css",
               {"If-None-Match": '"other"', "If-Modified-Since": modified})[0] == 200
    # The large-file path answers conditionals too.
    _, headers, _ = get(server.port(), "/big.bin", method="HEAD")
    assert get(server.port(), "/big.bin", {"If-None-Match": headers["etag"]})[0] == 304


@pytest.mark.parametrize("path", ["/style.css", "/big.bin"])
def test_ranges(start_server, root, path):
    server = serve(start_server, root)
    data = (root / path[1:]).read_bytes()
    size = len(data)
    status, headers, body = get(server.port(), path, {"Range": "bytes=10-19"})
    assert (status, body) == (206, data[10:20])
    assert headers["content-range"] == f"bytes 10-19/{size}"
    status, _, body = get(server.port(), path, {"Range": "bytes=-5"})
    assert (status, body) == (206, data[-5:])
    status, _, body = get(server.port(), path, {"Range": f"bytes={size - 3}-"})
    assert (status, body) == (206, data[-3:])
    status, headers, _ = get(server.port(), path, {"Range": f"bytes={size}-"})
    assert status == 416 and headers["content-range"] == f"bytes */{size}"
    # Several ranges or a malformed header: the whole file.
    assert get(server.port(), path, {"Range": "bytes=0-1,4-5"})[2] == data
    assert get(server.port(), path, {"Range": "pages=1"})[2] == data
    # If-Range with a stale validator: the whole file.
    status, _, body = get(server.port(), path, {"Range": "bytes=0-3", "If-Range": '"old"'})
    assert (status, body) == (200, data)


def test_precompressed_siblings(start_server, root):
    plain = (root / "style.css").read_bytes()
    (root / "style.css.gz").write_bytes(gzip.compress(plain))
    (root / "style.css.br").write_bytes(b"pretend-brotli")
    big = (root / "big.bin").read_bytes()
    (root / "big.bin.gz").write_bytes(gzip.compress(big))
    server = serve(start_server, root)
    port = server.port()
    status, headers, body = get(port, "/style.css", {"Accept-Encoding": "gzip, br"})
    assert headers["content-encoding"] == "br" and body == b"pretend-brotli"
    assert headers["vary"] == "accept-encoding"
    status, headers, body = get(port, "/style.css", {"Accept-Encoding": "gzip, br;q=0"})
    assert headers["content-encoding"] == "gzip" and gzip.decompress(body) == plain
    assert headers["etag"].endswith('-gzip"')
    status, headers, body = get(port, "/style.css", {"Accept-Encoding": "identity"})
    assert "content-encoding" not in headers and body == plain
    assert headers["vary"] == "accept-encoding"
    status, headers, body = get(port, "/big.bin", {"Accept-Encoding": "gzip"})
    assert headers["content-encoding"] == "gzip" and gzip.decompress(body) == big
    assert get(port, "/style.css.gz")[0] == 200      # the sibling itself is a file too


def test_directories(start_server, root):
    server = serve(start_server, root)
    port = server.port()
    assert get(port, "/")[2] == b"<h1>home</h1>\n"
    assert get(port, "/docs/")[2] == b"docs index\n"
    status, headers, _ = get(port, "/docs?x=1")
    assert status == 308 and headers["location"] == "/docs/?x=1"
    assert get(port, "/empty/")[0] == 404                       # no listing by default
    assert get(port, "/style.css/")[0] == 404


def test_listing_when_enabled(start_server, root):
    (root / "empty" / "<b>.txt").write_text("x")
    server = serve(start_server, root, 'listing = true')
    status, headers, body = get(server.port(), "/empty/")
    assert status == 200 and b'href="a.txt"' in body
    assert b"&lt;b&gt;.txt" in body and b"<b>" not in body


@pytest.mark.parametrize("extra, sent", [
    ("", ["no-cache"]),
    ('cache_control = "public, max-age=600"', ["public, max-age=600"]),
])
def test_a_listing_sends_one_cache_control(start_server, root, extra, sent):
    """A listing is `no-cache` unless the route sets its own Cache-Control; then the
    route's alone (before: `no-cache` and the route's, two fields that disagree)."""
    server = serve(start_server, root, f"listing = true\n{extra}")
    conn = http.client.HTTPConnection("127.0.0.1", server.port(), timeout=10)
    conn.request("GET", "/empty/")
    resp = conn.getresponse()
    assert resp.status == 200 and b'href="a.txt"' in resp.read()
    assert resp.msg.get_all("cache-control") == sent
    conn.close()
    if extra:                                   # a file of the route: the route's value
        assert get(server.port(), "/style.css")[1]["cache-control"] == sent[0]


def test_listing_hides_symlinks_that_lead_outside(start_server, root, tmp_path):
    (tmp_path / "private-keys").mkdir()
    (tmp_path / "secret-plans.txt").write_text("x")
    (root / "empty" / "keys").symlink_to(tmp_path / "private-keys")
    (root / "empty" / "plans.txt").symlink_to(tmp_path / "secret-plans.txt")
    (root / "empty" / "css").symlink_to(root / "style.css")        # inside: listed
    server = serve(start_server, root, 'listing = true')
    status, _, body = get(server.port(), "/empty/")
    assert status == 200 and b'href="css"' in body and b'href="a.txt"' in body
    for hidden in (b"keys", b"plans"):
        assert hidden not in body


def test_change_and_delete_seen_soon(start_server, root):
    server = serve(start_server, root, recheck="100ms")
    port = server.port()
    assert get(port, "/style.css")[2].startswith(b"body")
    (root / "style.css").write_text("changed\n")
    deadline = time.monotonic() + 5
    while get(port, "/style.css")[2] != b"changed\n":
        assert time.monotonic() < deadline, "change never served"
        time.sleep(0.05)
    (root / "style.css").unlink()
    while get(port, "/style.css")[0] != 404:
        assert time.monotonic() < deadline, "deletion never seen"
        time.sleep(0.05)


def test_path_safety(start_server, root, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("secret\n")
    (root / "out-link").symlink_to(outside)
    (root / "out-dir").symlink_to(tmp_path)
    (root / "in-link.css").symlink_to(root / "style.css")
    os.mkfifo(root / "fifo")
    server = serve(start_server, root)
    port = server.port()
    assert get(port, "/out-link")[0] == 404
    assert get(port, "/out-dir/outside.txt")[0] == 404
    assert get(port, "/in-link.css")[0] == 200
    assert get(port, "/fifo")[0] == 404
    assert get(port, "/.secret")[0] == 404
    assert get(port, "/docs/%2e%2e/.secret")[0] == 404
    for path, status in (("/../outside.txt", 400), ("/%2e%2e/outside.txt", 400),
                         ("/a%2f..%2f..%2foutside.txt", 400), ("/style.css%00", 400),
                         ("/..%5coutside.txt", 400)):
        assert get(port, path)[0] == status, path


def test_method_not_allowed(start_server, root):
    server = serve(start_server, root)
    status, headers, _ = get(server.port(), "/style.css", method="POST")
    assert status == 405 and headers["allow"] == "GET, HEAD"


def test_large_file_sendfile_keep_alive_pipelined(start_server, root):
    server = serve(start_server, root)
    big = (root / "big.bin").read_bytes()
    css = (root / "style.css").read_bytes()
    with socket.create_connection(("127.0.0.1", server.port()), timeout=10) as sock:
        sock.sendall(b"GET /big.bin HTTP/1.1\r\nHost: x\r\n\r\n"
                     b"GET /style.css HTTP/1.1\r\nHost: x\r\n\r\n"
                     b"GET /big.bin HTTP/1.1\r\nHost: x\r\nRange: bytes=100-\r\n"
                     b"Connection: close\r\n\r\n")
        data = b""
        while chunk := sock.recv(1 << 20):
            data += chunk
    responses = parse_responses(data)
    assert [r.status for r in responses] == [200, 200, 206]
    assert [r.body for r in responses] == [big, css, big[100:]]


def test_large_file_over_tls(start_server, root, certs):
    tls = f"""
[[listen]]
address = "127.0.0.1:0"
[[listen.certificate]]
cert = "{certs['local'][0]}"
key = "{certs['local'][1]}"
"""
    server = serve(start_server, root, tls=tls)
    context = ssl.create_default_context(cafile=certs["ca"])
    status, headers, body = get(server.port("https"), "/big.bin", context=context)
    assert status == 200 and body == (root / "big.bin").read_bytes()
    assert headers["strict-transport-security"] == "max-age=31536000"
    status, _, body = get(server.port("https"), "/big.bin", {"Range": "bytes=5-9"},
                          context=context)
    assert (status, body) == (206, (root / "big.bin").read_bytes()[5:10])


def test_warm_up_and_cache_bound(start_server, root):
    for i in range(20):
        (root / f"f{i}.txt").write_bytes(bytes([65 + i]) * 4000)
    server = serve(start_server, root, 'warm = true\ncache_bytes = "16KiB"')
    for i in range(20):
        assert get(server.port(), f"/f{i}.txt")[2] == bytes([65 + i]) * 4000


def test_static_under_a_prefix(start_server, root, tmp_path):
    server = start_server(f"""
        [server]
        workers = 1
        [[listen]]
        address = "127.0.0.1:0"
        [[site]]
        hosts = ["*"]
        [[site.route]]
        prefix = "/assets/"
        type = "static"
        root = "{root}"
        cache_control = "public, max-age=3600"
        [site.security]
        enabled = false
    """)
    status, headers, body = get(server.port(), "/assets/style.css")
    assert status == 200 and headers["cache-control"] == "public, max-age=3600"
    assert "x-frame-options" not in headers
    assert get(server.port(), "/assets")[0] == 404       # the router sends it elsewhere
    assert get(server.port(), "/style.css")[0] == 404


def test_missing_root_is_a_config_error(tmp_path):
    from nestgate.config import ConfigError, parse_config
    with pytest.raises(ConfigError) as err:
        parse_config({"listen": [{"address": "127.0.0.1:0"}],
                      "site": [{"route": [{"prefix": "/", "type": "static",
                                           "root": str(tmp_path / "nope")}]}]})
    assert "site[*].route[0].root: expected a path to a readable directory" in str(err.value)


def test_warm_answers_from_the_parser_callback_match_the_task_path(start_server, root):
    """Once a file is cached, `peek` answers GET/HEAD/304/405 and precompressed variants
    without a task; Range still goes to the task. One kept-alive connection, in order."""
    (root / "style.css.gz").write_bytes(gzip.compress((root / "style.css").read_bytes()))
    server = serve(start_server, root)
    conn = http.client.HTTPConnection("127.0.0.1", server.port(), timeout=10)

    def ask(method="GET", headers=None, body=None):
        conn.request(method, "/style.css", body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()

    cold = ask()
    warm = ask()
    assert warm[0] == 200 and warm[2] == cold[2] and warm[1]["etag"] == cold[1]["etag"]
    assert ask("HEAD")[2] == b""
    assert ask(headers={"If-None-Match": cold[1]["etag"]})[0] == 304
    status, headers, body = ask(headers={"Accept-Encoding": "gzip"})
    assert headers["content-encoding"] == "gzip" and gzip.decompress(body) == cold[2]
    gz_etag = headers["etag"]
    assert ask(headers={"Accept-Encoding": "gzip", "If-None-Match": gz_etag})[0] == 304
    assert ask(headers={"Accept-Encoding": "gzip", "If-None-Match": cold[1]["etag"]})[0] == 200
    assert ask(headers={"Range": "bytes=0-3"})[2] == cold[2][:4]
    status, headers, _ = ask("POST", body=b"x")
    assert status == 405 and headers["allow"] == "GET, HEAD"
    status, headers, _ = ask("DELETE")
    assert status == 405
    assert ask()[2] == cold[2]                  # the connection is still in step
    conn.close()


def test_compressed_variants(start_server, root):
    """Cached text files are compressed once per coding; q-values pick the coding."""
    import brotli
    import zstandard
    plain = b"body { color: #123; }\n" * 100
    (root / "style.css").write_bytes(plain)
    server = serve(start_server, root)
    port = server.port()
    status, headers, body = get(port, "/style.css", {"Accept-Encoding": "br, gzip"})
    assert headers["content-encoding"] == "br" and brotli.decompress(body) == plain
    assert headers["vary"] == "accept-encoding" and headers["etag"].startswith('W/"')
    assert int(headers["content-length"]) == len(body)
    etag = headers["etag"]
    _, headers, body = get(port, "/style.css", {"Accept-Encoding": "gzip, br;q=0"})
    assert headers["content-encoding"] == "gzip" and gzip.decompress(body) == plain
    _, headers, body = get(port, "/style.css", {"Accept-Encoding": "gzip;q=0.5, zstd"})
    assert headers["content-encoding"] == "zstd"
    assert zstandard.ZstdDecompressor().decompress(body) == plain
    _, headers, body = get(port, "/style.css", {"Accept-Encoding": "br", "If-None-Match": etag})
    assert (_, headers["etag"], body) == (304, etag, b"")
    _, headers, body = get(port, "/style.css", {"Accept-Encoding": "br", "Range": "bytes=0-3"})
    assert (_, body) == (206, plain[:4]) and "content-encoding" not in headers
    _, headers, body = get(port, "/style.css", {"Accept-Encoding": "br"}, method="HEAD")
    assert headers["content-encoding"] == "br" and body == b""
    _, headers, body = get(port, "/index.html", {"Accept-Encoding": "br"})  # under 256 B
    assert "content-encoding" not in headers


def test_a_client_that_goes_away_during_sendfile_is_a_normal_end(start_server, root):
    # A downloader that resets after part of a large file, and one that stops reading
    # until send_timeout cuts it off: neither is a handler failure, and neither fills
    # the error log with a traceback.
    (root / "large.bin").write_bytes(os.urandom(16 * 1024 * 1024))
    server = serve(start_server, root, extra='\n[limits]\nsend_timeout = "1s"')
    port = server.port()
    request = b"GET /large.bin HTTP/1.1\r\nHost: x\r\n\r\n"
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(request)
            got = 0
            while got < 256 * 1024:
                chunk = sock.recv(65536)
                assert chunk
                got += len(chunk)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.connect(("127.0.0.1", port))
    stalled.sendall(request)
    deadline = time.monotonic() + 10
    while stalled.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != errno.ECONNRESET:
        assert time.monotonic() < deadline, "the stalled client was never cut off"
        time.sleep(0.05)
    stalled.close()
    assert get(port, "/style.css")[0] == 200
    time.sleep(0.5)                         # a failure would be logged by now
    errors = [line for line in server.lines if "Traceback" in line or "failed" in line]
    assert errors == [], "\n".join(server.lines)


def test_warm_files_carry_the_servers_name_and_a_reloaded_configs_headers(start_server,
                                                                          root):
    """Warm files are loaded by the supervisor before it forks the workers
    (nestgate.sites.build.build_shared): they answer as a worker's own would, with the version
    under server_tokens, and after a reload with the new config's headers."""
    from nestgate import __version__
    config = STATIC_SITE.replace("[server]\n", "[server]\n{tokens}\n", 1)
    tokens = start_server(config.format(root=root, extra="warm = true", recheck="1s",
                                        workers=1, tls="", tokens="server_tokens = true"))
    assert get(tokens.port(), "/style.css")[1]["server"] == f"nestgate/{__version__}"
    server = serve(start_server, root, 'warm = true\ncache_control = "max-age=60"')
    status, headers, _ = get(server.port(), "/style.css")
    assert (status, headers["server"], headers["cache-control"]) == (200, "nestgate",
                                                                     "max-age=60")
    server.config_path.write_text(STATIC_SITE.format(
        root=root, extra='warm = true\ncache_control = "max-age=120"', recheck="1s",
        workers=1, tls=""))
    mark = len(server.lines)
    server.signal(signal.SIGHUP)
    server.wait_for("reloaded", start=mark)
    deadline = time.monotonic() + 10     # the old workers stop accepting a moment later
    while get(server.port(), "/style.css")[1]["cache-control"] != "max-age=120":
        assert time.monotonic() < deadline, "the reloaded workers answer the old headers"
        time.sleep(0.1)


SHRINK_FROM, SHRINK_TO = 16 * 1024 * 1024, 1024 * 1024


def shrink_while_sent(sock, path) -> tuple[bytes, int]:
    """Ask for `path` on `sock` (a small receive buffer: the answer waits on the
    client), shrink the file once 256 KiB of it arrived, and read to the end: the
    head and how many body bytes came."""
    sock.sendall(b"GET /shrinking.bin HTTP/1.1\r\nHost: x\r\n\r\n")
    got = b""
    while len(got) < 256 * 1024:
        chunk = sock.recv(65536)
        assert chunk
        got += chunk
    os.truncate(path, SHRINK_TO)
    while chunk := sock.recv(65536):         # the connection ends: no length to keep
        got += chunk
    head, _, body = got.partition(b"\r\n\r\n")
    return head, len(body)


@pytest.mark.parametrize("transport", ["sendfile", "tls"])
def test_a_file_that_shrinks_while_sent_ends_the_answer_with_one_line(start_server, root,
                                                                       certs, transport):
    # Before: the answer was cut too, but the error log got a "handler failed" line
    # and a Python traceback for it, each time.
    server = serve(start_server, root, tls='[[listen]]\naddress = "127.0.0.1:0"\n'
                   + tls_block(certs))
    path = root / "shrinking.bin"
    # The first answer opens the file (a task), the second sends from the descriptor
    # kept open (the parser's callback, then a task for what the socket did not take).
    for _ in range(2):
        path.write_bytes(os.urandom(SHRINK_FROM))
        raw = socket.socket()
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        raw.settimeout(10)
        if transport == "tls":
            raw.connect(("127.0.0.1", server.port("https")))
            sock = ssl.create_default_context(cafile=certs["ca"]).wrap_socket(
                raw, server_hostname="localhost")
        else:
            raw.connect(("127.0.0.1", server.port()))
            sock = raw
        with sock:
            head, body_bytes = shrink_while_sent(sock, path)
        assert head.startswith(b"HTTP/1.1 200 ")
        assert f"content-length: {SHRINK_FROM}".encode() in head
        assert body_bytes < SHRINK_FROM
    assert get(server.port(), "/style.css")[0] == 200         # the worker serves on
    time.sleep(0.5)                         # a failure would be logged by now
    assert not [line for line in server.lines if "Traceback" in line or "failed" in line], \
        "\n".join(server.lines)
    shrank = [line for line in server.lines if "shrank" in line]
    assert len(shrank) == 2 and all(str(path) in line for line in shrank), shrank
