"""A client of a proxied route that stops reading while a large answer comes.

The relay that answers the client (HTTP/1.1 from the parser's callbacks, HTTP/1.1
from the handler's coroutine, HTTP/2 from callbacks that hand over to a task once
the stream must wait) pauses the
upstream's reading once the client takes no more, so what the upstream manages to
send stays bounded by the sockets' buffers on the way, not by the answer's size, and
the worker's memory stays flat. When the client reads again the upstream is read
again, and the whole answer arrives intact.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest
from h2raw import SETTINGS_INITIAL_WINDOW_SIZE, RawH2, WindowUpdateFrame, get
from rawupstream import proxy_toml

BODY_BYTES = 64 << 20
BLOCK = bytes(range(256)) * 256                    # 64 KiB
# What may be on the way when the client stops: the kernel's buffers between the
# upstream and the proxy and between the proxy and the client (a few MiB each, as
# the kernel sizes them), the proxy's transport buffers, one read per step.
IN_FLIGHT_BOUND = 24 << 20
RSS_GROWTH_BOUND_KIB = 24 * 1024
STILL_S = 0.5                                      # no more bytes sent for this long: held


class CountingUpstream:
    """Answers `/big` on 127.0.0.1:0 with BODY_BYTES (Content-Length), sent a block at
    a time with blocking writes, counting the bytes the kernel took; anything else
    with a 2-byte answer. Connections are kept alive, so a warm-up request leaves one
    idle in the proxy's pool (the proxy answers from callbacks on an idle one)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = "http://127.0.0.1:%d" % self.sock.getsockname()[1]
        self.sent = 0
        self.done = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(60)
        data = b""
        try:
            while True:
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                # The request's body too: closing with bytes unread would reset the
                # connection, and the proxy would lose what it had not read yet.
                head, _, data = data.partition(b"\r\n\r\n")
                lines = head.split(b"\r\n")
                fields = dict(line.lower().split(b": ", 1) for line in lines[1:])
                length = int(fields.get(b"content-length", b"0"))
                while len(data) < length:
                    data += conn.recv(65536)
                data = data[length:]
                if lines[0].split(b" ")[1] != b"/big":
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    continue
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n"
                             b"content-type: application/octet-stream\r\n\r\n" % BODY_BYTES)
                left = BODY_BYTES
                while left:
                    part = BLOCK[:min(left, len(BLOCK))]
                    conn.sendall(part)
                    self.sent += len(part)
                    left -= len(part)
                self.done.set()
        except OSError:
            pass
        finally:
            conn.close()

    def held(self, seconds: float = 10.0) -> int:
        """The bytes sent once sending has stalled (nothing more for STILL_S)."""
        deadline = time.monotonic() + seconds
        last, since = -1, time.monotonic()
        while time.monotonic() < deadline:
            if self.sent != last:
                last, since = self.sent, time.monotonic()
            elif time.monotonic() - since >= STILL_S and last > 0:
                return last
            time.sleep(0.05)
        return self.sent

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def gateway(start_server, certs):
    up = CountingUpstream()
    server = start_server(proxy_toml(up.url, listeners=f"""
        [[listen]]
        address = "127.0.0.1:0"
        [[listen.certificate]]
        cert = "{certs["local"][0]}"
        key = "{certs["local"][1]}"
        names = ["localhost"]

        [limits]
        send_timeout = "60s"
        """))
    yield server, up
    up.close()


def _held_then_read(server, up, base: int) -> int:
    """The upstream's bytes once it stalls, with the worker's RSS checked meanwhile."""
    sent = up.held()
    rss = server.worker_rss_kib()
    print(f"slow client: upstream sent {sent >> 20} of {BODY_BYTES >> 20} MiB while the "
          f"client read nothing; worker RSS {base} -> {rss} KiB (+{(rss - base) / 1024:.1f} MiB)")
    assert 0 < sent <= IN_FLIGHT_BOUND
    assert rss - base < RSS_GROWTH_BOUND_KIB
    return sent


def _read_http1(sock: socket.socket) -> tuple[bytes, int, bytes]:
    """The head, the body's length as read and its last block, reading everything."""
    sock.settimeout(30)
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    got, tail = len(body), body[-len(BLOCK):]
    while got < BODY_BYTES:
        chunk = sock.recv(1 << 20)
        if not chunk:
            break
        got += len(chunk)
        tail = (tail + chunk)[-len(BLOCK):]
    return head, got, tail


@pytest.mark.parametrize("request_bytes", [
    # No body, an idle upstream connection: answered from the parser's callbacks
    # (the proxy's `begin`).
    b"GET /big HTTP/1.1\r\nHost: app.test\r\n\r\n",
    # A body: answered from the handler's coroutine (`handle`).
    b"POST /big HTTP/1.1\r\nHost: app.test\r\nContent-Length: 5\r\n\r\nhello",
], ids=["callbacks", "coroutine"])
def test_an_http1_client_that_stops_reading_holds_the_upstream(gateway, request_bytes):
    server, up = gateway
    warm = socket.create_connection(("127.0.0.1", server.port()), timeout=10)
    warm.sendall(b"GET /small HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n")
    assert warm.recv(65536).startswith(b"HTTP/1.1 200")     # an upstream connection idles
    warm.close()
    base = server.worker_rss_kib()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    sock.connect(("127.0.0.1", server.port()))
    sock.sendall(request_bytes)
    _held_then_read(server, up, base)
    head, got, tail = _read_http1(sock)
    sock.close()
    assert head.startswith(b"HTTP/1.1 200") and got == BODY_BYTES and tail == BLOCK
    assert up.done.wait(10) and up.sent == BODY_BYTES


def test_an_http2_client_that_stops_reading_holds_the_upstream(gateway, certs):
    server, up = gateway
    # Windows wide open: only the client's socket (read by nobody) holds the answer back.
    conn = RawH2(server.port("https"), certs["ca"],
                 settings={SETTINGS_INITIAL_WINDOW_SIZE: 2**31 - 1}, timeout=30)
    base = server.worker_rss_kib()
    warm = conn.request(get(b"/small"))
    assert conn.wait(lambda: conn.streams[warm].done) and conn.streams[warm].status == 200
    sid = conn.new_stream()
    conn.send(WindowUpdateFrame(0, window_increment=2**31 - 1 - 65535),
              conn.headers_frame(sid, get(b"/big")))
    _held_then_read(server, up, base)
    assert conn.wait(lambda: conn.streams[sid].done, timeout=60)
    stream = conn.streams[sid]
    conn.close()
    assert stream.status == 200 and len(stream.data) == BODY_BYTES
    assert bytes(stream.data[-len(BLOCK):]) == BLOCK
    assert up.done.wait(10) and up.sent == BODY_BYTES
