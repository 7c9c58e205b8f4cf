"""An upstream that shows what the proxy's bytes really say.

`RawUpstream` is a plain socket server on 127.0.0.1:0 (a thread per connection).
Each connection is read by one strict parser (httptools) for its whole life, as a
real upstream reads it: bytes the proxy sends past the request it meant are read
as further requests, and recorded, instead of being lost with a per-request
parser. Every request is answered `200` with its own target as the body (a HEAD with
the head alone), so a client that gets someone else's answer can tell; each record
holds the request's method, target, header lines and body.

A target `/head/N` is answered with a response head of exactly N bytes (blank line
included), for the proxy's response-head limit. `/extra/now` and `/extra/later` are
followed by an answer nobody asked for (`/extra/unasked`): in the same write, or
UNASKED_AFTER_S later, as an upstream that reads a hidden request would send it. A
target in `answers` gets those bytes as they are (a misbehaving upstream's answer).
`plant` writes bytes nobody asked for on a connection of the test's choosing, whenever
the test likes (an idle pooled connection). `proxy_toml` is the config of a nestgate in
front of it.
"""

from __future__ import annotations

import socket
import textwrap
import threading
import time
from pathlib import Path

import httptools

QUIET_S = 0.05          # no byte for this long: the proxy has sent all it will
UNASKED_AFTER_S = 0.1
SETTLE_LIMIT_S = 3.0


class _Message:
    """httptools callbacks for one connection: each request, as it completes."""

    def __init__(self, upstream: RawUpstream, conn: socket.socket, number: int) -> None:
        self.upstream = upstream
        self.conn = conn
        self.number = number
        self.current: dict | None = None
        self.parser = None                   # the connection's parser, once made

    def on_message_begin(self) -> None:
        self.current = {"conn": self.number, "target": "", "headers": [], "body": b""}

    def on_headers_complete(self) -> None:
        self.current["method"] = self.parser.get_method().decode("latin-1")

    def on_url(self, url: bytes) -> None:
        self.current["target"] += url.decode("latin-1")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.current["headers"].append((name.decode("latin-1").lower(),
                                        value.decode("latin-1")))

    def on_body(self, body: bytes) -> None:
        self.current["body"] += body

    def on_message_complete(self) -> None:
        record, self.current = self.current, None
        self.upstream.record(record)
        target = record["target"].encode("latin-1")
        canned = self.upstream.answers.get(record["target"])
        if canned is not None:
            self.conn.sendall(canned)
            return
        if target.startswith(b"/head/"):
            self.conn.sendall(_head_of(int(target[6:])))
            return
        if target == b"/extra/now":
            self.conn.sendall(_answer(target) + _answer(b"/extra/unasked"))
            return
        answer = _answer(target)
        if record["method"] == "HEAD":       # the head alone (RFC 9110 9.3.2)
            answer = answer[:answer.index(b"\r\n\r\n") + 4]
        self.conn.sendall(answer)
        if target == b"/extra/later":
            time.sleep(UNASKED_AFTER_S)
            self.conn.sendall(_answer(b"/extra/unasked"))


def _answer(target: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%b" % (len(target), target)


def _head_of(size: int) -> bytes:
    """A 200 response whose head (status line to blank line) is `size` bytes."""
    start = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-fill: "
    end = b"\r\n\r\n"
    return start + b"f" * (size - len(start) - len(end)) + end + b"ok"


class RawUpstream:
    def __init__(self, answers: dict[str, bytes] | None = None) -> None:
        self.answers = answers or {}
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.requests: list[dict] = []
        self.connections = 0
        self.sockets: dict[int, socket.socket] = {}     # by connection number
        self.last_byte = time.monotonic()
        self._lock = threading.Lock()
        self._stopping = False
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def record(self, request: dict) -> None:
        with self._lock:
            self.requests.append(request)

    def take(self) -> list[dict]:
        """The requests recorded since the last call, once the proxy has gone quiet.
        Absence can only be shown by waiting: bytes the proxy wrote may still be in
        flight when its answer reaches the client, so this waits until no byte has
        come for QUIET_S (at most SETTLE_LIMIT_S)."""
        deadline = time.monotonic() + SETTLE_LIMIT_S
        while time.monotonic() < deadline and time.monotonic() - self.last_byte < QUIET_S:
            time.sleep(QUIET_S / 2)
        with self._lock:
            taken, self.requests = self.requests, []
        return taken

    def plant(self, number: int, data: bytes) -> None:
        """`data` on connection `number` (1 is the first accepted), unasked."""
        self.sockets[number].sendall(data)

    def stop(self) -> None:
        self._stopping = True
        self.sock.close()
        for thread in self._threads:
            thread.join(2)

    def _accept(self) -> None:
        while not self._stopping:
            try:
                conn, _addr = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self.connections += 1
            self.sockets[self.connections] = conn
            thread = threading.Thread(target=self._serve, args=(conn, self.connections),
                                      daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket, number: int) -> None:
        conn.settimeout(0.1)
        message = _Message(self, conn, number)
        parser = message.parser = httptools.HttpRequestParser(message)
        with conn:
            while not self._stopping:
                try:
                    data = conn.recv(65536)
                except socket.timeout:
                    continue
                except OSError:
                    return
                if not data:
                    return
                self.last_byte = time.monotonic()
                try:
                    parser.feed_data(data)
                except httptools.HttpParserUpgrade:
                    return          # answered as a plain request; the rest is not HTTP
                except (httptools.HttpParserError, OSError):
                    return


def proxy_toml(url: str, listeners: str = "", routes: str = "") -> str:
    """One worker on 127.0.0.1:0 forwarding everything to `url`, with `listeners`
    (TOML listen tables) and `routes` (more proxy routes, longest prefix wins)."""
    return textwrap.dedent(f"""
        [server]
        workers = 1

        [[listen]]
        address = "127.0.0.1:0"
        """) + textwrap.dedent(listeners) + textwrap.dedent(f"""
        [[site]]
        hosts = ["*"]

        [[site.route]]
        prefix = "/"
        type = "proxy"
        upstream = "{url}"
        """) + textwrap.dedent(routes)


def cleartext_gateway(request, tmp_path_factory, upstream):
    """A module-wide nestgate (tests/conftest.py's Server) in front of `upstream` on one
    plain listener that takes HTTP/1.1 and h2c by prior knowledge. The caller stops it."""
    path = tmp_path_factory.mktemp("gateway") / "nestgate.toml"
    path.write_text(proxy_toml(upstream.url, listeners="http2_cleartext = true"))
    return _shared_server(request)(path)


def _shared_server(request):
    """tests/conftest.py's Server class, as the running test session loaded it."""
    return request.config.pluginmanager.get_plugin(
        str(Path(__file__).resolve().parents[1] / "conftest.py")).Server


def guarded_gateway(request, tmp_path_factory, upstream, certs, refused_prefix: str,
                    cleartext: bool = False):
    """A module-wide nestgate (tests/conftest.py's Server; `start_server` is per test):
    its plain listener (taking h2c by prior knowledge when `cleartext`) and a TLS one
    (ALPN h2) forward everything to `upstream`, `refused_prefix` only to 10.0.0.0/8, so
    never to the loopback clients of the attacks. The caller stops it."""
    path = tmp_path_factory.mktemp("gateway") / "nestgate.toml"
    path.write_text(proxy_toml(upstream.url, listeners=f"""
        {"http2_cleartext = true" if cleartext else ""}

        [[listen]]
        address = "127.0.0.1:0"
        [[listen.certificate]]
        cert = "{certs["local"][0]}"
        key = "{certs["local"][1]}"
        """, routes=f"""
        [[site.route]]
        prefix = "{refused_prefix}"
        type = "proxy"
        upstream = "{upstream.url}"
        allow = ["10.0.0.0/8"]
        """))
    return _shared_server(request)(path)


def refused_corpus_stays_bounded(gateway, up: RawUpstream, corpus, rss_growth_kib: int,
                                 seconds: float = 60) -> None:
    """Run `corpus` (every request of it refused) once to warm up, then three times:
    within `seconds`, nothing reaching `up`, the worker growing under `rss_growth_kib`."""
    corpus()                            # warm-up: imports, caches, allocator arenas
    before = gateway.worker_rss_kib()
    start = time.monotonic()
    for _ in range(3):
        corpus()
    assert time.monotonic() - start < seconds
    grown = gateway.worker_rss_kib() - before
    assert up.take() == []
    assert grown < rss_growth_kib, f"worker grew {grown} KiB"
