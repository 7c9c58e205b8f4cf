"""`send_timeout`: a client that stops reading is cut off, whichever way the response
was being sent (sendfile, the transport's buffer, a proxied stream)."""

from __future__ import annotations

import errno
import http.client
import socket
import time

import pytest

from conftest import BASIC_SITE
from nestgate.base.sendwatch import SendWatch

BIG = 16 * 1024 * 1024          # well past what loopback socket buffers hold

# The basic site, a short send_timeout, and the routes of each test.
SERVER = BASIC_SITE + """
[limits]
send_timeout = "1s"
{routes}
"""


class Buffer:
    def __init__(self) -> None:
        self.size = 0

    def get_write_buffer_size(self) -> int:
        return self.size


def test_watch_counts_only_time_without_progress():
    watch, transport = SendWatch(), Buffer()
    transport.size = 1000
    assert not watch.stuck(transport, 0.6, 1.0) and watch.stalled == 0.6
    transport.size = 900                      # the client took 100 bytes: clock restarts
    assert not watch.stuck(transport, 0.6, 1.0) and watch.stalled == 0.0
    assert not watch.stuck(transport, 0.6, 1.0) and watch.stalled == 0.6
    assert watch.stuck(transport, 0.6, 1.0)   # 1.2 s without a byte taken
    transport.size = 0                        # all sent: nothing to watch
    assert not watch.stuck(transport, 5.0, 1.0) and watch.stalled == 0.0


def stalled_reader(port: int, request: bytes) -> socket.socket:
    """A client that asks and then reads nothing (a tiny receive window)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(request)
    return sock


def reset_within(sock: socket.socket, seconds: float) -> bool:
    """True once the server reset the connection, seen without reading from it."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == errno.ECONNRESET:
            return True
        time.sleep(0.05)
    return False


def still_serves(port: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", "/hello")
    assert conn.getresponse().read() == b"hello\n"


@pytest.mark.parametrize("kept", [False, True], ids=["opened", "kept"])
def test_static_file_by_sendfile_to_a_client_that_stopped_reading(start_server, tmp_path, kept):
    """`kept`: the file was just sent whole, so the stalled GET starts from the parser's
    callback (`StaticFiles.begin`) and a task sends what the socket did not take."""
    root = tmp_path / "public"
    root.mkdir()
    (root / "big.bin").write_bytes(b"x" * BIG)              # served as /files/big.bin
    server = start_server(SERVER.format(routes=f"""
[[site.route]]
prefix = "/files/"
type = "static"
root = "{root}"
recheck = "60s"
"""))
    if kept:
        conn = http.client.HTTPConnection("127.0.0.1", server.port(), timeout=10)
        conn.request("GET", "/files/big.bin")
        assert len(conn.getresponse().read()) == BIG
        conn.close()
    with stalled_reader(server.port(), b"GET /files/big.bin HTTP/1.1\r\nHost: a\r\n\r\n") as sock:
        assert reset_within(sock, 10)
    still_serves(server.port())


def test_proxied_stream_to_a_client_that_stopped_reading(start_server, upstream):
    up = upstream()
    server = start_server(SERVER.format(routes=f"""
[[site.route]]
prefix = "/up/"
type = "proxy"
upstream = "{up.url}"
strip_prefix = true
"""))
    request = b"GET /up/big?n=%d HTTP/1.1\r\nHost: a\r\n\r\n" % BIG
    with stalled_reader(server.port(), request) as sock:
        assert reset_within(sock, 10)
    still_serves(server.port())
