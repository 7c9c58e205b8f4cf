"""A client that pipelines requests and never reads its answers.

Before reading stopped when answers pile up, one such connection grew a worker by
hundreds of MB in seconds: every pipelined request was parsed and answered into the
transport's buffer, or queued behind an answer that could not go out. Now the worker
stops reading while answers wait (and while more than a few requests are queued), so
the client's own socket fills and its sends block; `send_timeout` then resets it.
"""

from __future__ import annotations

import errno
import socket
import time

import pytest

from conftest import still_serves

SEND_TIMEOUT = 2.0
ATTACK_SECONDS = 5.0        # longer than send_timeout: the reset must come first
RSS_GROWTH_BOUND_KIB = 20 * 1024

CONFIG = """
[server]
workers = 1

[[listen]]
address = "127.0.0.1:0"

[limits]
send_timeout = "2s"
keepalive_requests = {keepalive_requests}

[[site]]
hosts = ["*"]

[[site.route]]
path = "/hello"
type = "return"
body = "hello\\n"

[[site.route]]
prefix = "/files/"
type = "static"
root = "{root}"
"""

# (first request, the request pipelined after it without end, keepalive_requests)
CASES = {
    # A cached page answered straight from the parser callback.
    "cached-page": (b"", b"GET /files/page.html HTTP/1.1\r\nHost: a\r\n\r\n", 10**9),
    # A `return` route, far past keepalive_requests: nothing after the last answered
    # request may be kept.
    "return-past-keepalive-requests": (b"", b"GET /hello HTTP/1.1\r\nHost: a\r\n\r\n", 100),
    # Behind a big file the client does not read, every later request is queued.
    "queued-behind-sendfile": (b"GET /files/big.bin HTTP/1.1\r\nHost: a\r\n\r\n",
                               b"GET /hello HTTP/1.1\r\nHost: a\r\n\r\n", 1000),
}


def attack(server, first: bytes, request: bytes) -> tuple[int, float | None]:
    """Pipeline for ATTACK_SECONDS without reading: (RSS peak - start in KiB, seconds
    until the server reset or closed the connection, or None)."""
    port = server.port()
    start = server.worker_rss_kib()
    peak = start
    burst = request * 400
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.setblocking(False)
    t0 = time.monotonic()
    ended = None
    pending = memoryview(first + burst)
    try:
        while time.monotonic() - t0 < ATTACK_SECONDS:
            try:
                sent = sock.send(pending)
                pending = pending[sent:] if sent < len(pending) else memoryview(burst)
            except BlockingIOError:
                time.sleep(0.002)       # the server stopped reading: that is the point
            except OSError as exc:
                assert exc.errno in (errno.ECONNRESET, errno.EPIPE), exc
                ended = time.monotonic() - t0
                break
            peak = max(peak, server.worker_rss_kib())
    finally:
        sock.close()
    return peak - start, ended


@pytest.mark.parametrize("case", CASES)
def test_pipelining_without_reading_is_bounded_and_reset(case, start_server, tmp_path):
    first, request, keepalive_requests = CASES[case]
    root = tmp_path / "public"
    root.mkdir()
    (root / "page.html").write_bytes(b"<p>" + b"x" * 16000 + b"</p>\n")   # cached
    (root / "big.bin").write_bytes(b"x" * (8 * 1024 * 1024))               # sendfile
    server = start_server(CONFIG.format(root=root, keepalive_requests=keepalive_requests))
    port = server.port()
    still_serves(port)                       # warm: the page cache, the Date line
    growth, ended = attack(server, first, request)
    assert growth < RSS_GROWTH_BOUND_KIB, f"worker grew {growth / 1024:.0f} MiB"
    assert ended is not None and ended < SEND_TIMEOUT + 2.0, \
        f"connection not ended by send_timeout (ended: {ended})"
    still_serves(port)
