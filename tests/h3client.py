"""An HTTP/3 client for the tests, on aioquic's own client (`aioquic.asyncio.connect`).

`H3Client(port, ca_file)` opens one QUIC connection (SNI `server_name`) and sends
requests on it, each on its own stream, concurrently if asked; `fetch` is one request
on a fresh connection. Answers are `Reply(status, headers, body)`; a stream the server
reset is `Reply(0, ...)` with `reset` set to its error code.
"""

from __future__ import annotations

import asyncio
import http.server
import ssl
from dataclasses import dataclass, field

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import ConnectionTerminated, StreamReset


@dataclass
class Reply:
    status: int = 0
    headers: dict = field(default_factory=dict)
    body: bytes = b""
    reset: int | None = None        # the server reset the stream with this code


class _H3(H3Connection):
    """aioquic's HTTP/3 client, except that the answer to a HEAD may announce the length
    of the GET's body without a byte of it (RFC 9110 9.3.2), which aioquic would take
    for a content-length the DATA does not match."""

    def __init__(self, quic) -> None:
        super().__init__(quic)
        self.head_streams: set[int] = set()

    def _check_content_length(self, stream) -> None:
        if stream.stream_id not in self.head_streams:
            super()._check_content_length(stream)


class _Client(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.http = _H3(self._quic)
        self.replies: dict[int, tuple[Reply, asyncio.Future]] = {}
        self.closed_with: int | None = None    # the server's CONNECTION_CLOSE code

    def quic_event_received(self, event) -> None:
        if isinstance(event, ConnectionTerminated):
            self.closed_with = event.error_code
            for reply, done in self.replies.values():
                if not done.done():
                    done.set_exception(ConnectionError(f"connection closed: {event.error_code:#x}"))
            return
        if isinstance(event, StreamReset) and event.stream_id in self.replies:
            reply, done = self.replies[event.stream_id]
            reply.reset = event.error_code
            if not done.done():
                done.set_result(reply)
            return
        for h3 in self.http.handle_event(event):
            entry = self.replies.get(h3.stream_id)
            if entry is None:
                continue
            reply, done = entry
            if isinstance(h3, HeadersReceived):
                for name, value in h3.headers:
                    if name == b":status":
                        reply.status = int(value)
                    else:
                        reply.headers.setdefault(name.decode(), value.decode())
            elif isinstance(h3, DataReceived):
                reply.body += h3.data
            if h3.stream_ended and not done.done():
                done.set_result(reply)

    def send_request(self, method: str, path: str, authority: str, headers=(),
                     body: bytes | None = None, end: bool = True,
                     scheme: str = "https") -> asyncio.Future:
        stream_id = self._quic.get_next_available_stream_id()
        done = self._loop.create_future()
        self.replies[stream_id] = (Reply(), done)
        fields = [(b":method", method.encode()), (b":scheme", scheme.encode()),
                  (b":authority", authority.encode()), (b":path", path.encode())]
        fields += [(n.lower().encode(), v.encode()) for n, v in headers]
        if method == "HEAD":
            self.http.head_streams.add(stream_id)
        self.http.send_headers(stream_id, fields, end_stream=body is None and end)
        if body is not None:
            self.http.send_data(stream_id, body, end_stream=end)
        self.transmit()
        return done


def client_configuration(ca_file: str, server_name: str = "localhost") -> QuicConfiguration:
    config = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN,
                               server_name=server_name, verify_mode=ssl.CERT_REQUIRED)
    config.load_verify_locations(ca_file)
    return config


async def session(port: int, ca_file: str, server_name: str = "localhost"):
    """An async context manager: the connected `_Client`."""
    return connect("127.0.0.1", port, configuration=client_configuration(ca_file, server_name),
                   create_protocol=_Client, wait_connected=True)


async def requests(port: int, ca_file: str, wanted, server_name: str = "localhost",
                   authority: str = "localhost", timeout: float = 20,
                   schemes=()) -> list[Reply]:
    """Send every (method, path, headers, body) of `wanted` at once on one connection,
    each with the :scheme `schemes` gives it in turn (https for the rest)."""
    schemes = list(schemes) + ["https"] * (len(wanted) - len(schemes))
    async with await session(port, ca_file, server_name) as client:
        futures = [client.send_request(m, p, authority, h, b, scheme=s)
                   for (m, p, h, b), s in zip(wanted, schemes)]
        return list(await asyncio.wait_for(asyncio.gather(*futures), timeout))


def fetch(port: int, ca_file: str, path: str = "/", method: str = "GET", headers=(),
          body: bytes | None = None, server_name: str = "localhost",
          authority: str = "localhost") -> Reply:
    """One request on a fresh connection."""
    return asyncio.run(requests(port, ca_file, [(method, path, headers, body)],
                                server_name, authority))[0]


# Routes for `serve_with_upstream`: "hello" answered by nestgate, /app/ by the upstream.
HELLO_AND_APP = """
[[site.route]]
path = "/hello"
type = "return"
body = "hello"

[[site.route]]
prefix = "/app/"
type = "proxy"
upstream = "{upstream}"
"""


class RecordingUpstream(http.server.BaseHTTPRequestHandler):
    """An upstream for `serve_with_upstream` that records what reached it (`seen`, a
    list of each subclass's own) and answers "ok": a PUT once its (chunked) body has
    come whole."""

    protocol_version = "HTTP/1.1"
    seen: list = []

    def do_PUT(self):
        # The proxy sends a body it has no length for chunked: recorded once whole.
        size = 0
        while (line := self.rfile.readline()) and (n := int(line.split(b";")[0], 16)):
            size += len(self.rfile.read(n + 2)) - 2
        if not line:
            return                      # cut short: never a whole request
        while (trailer := self.rfile.readline()) != b"\r\n":    # trailers, if any
            if not trailer:
                return
        self.seen.append(("PUT", self.path, size))
        self.answer_ok()

    def answer_ok(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


def serve_with_upstream(folder, certs, upstream_handler, workers: int, routes: str):
    """A nestgate with an HTTP/3 TLS listener in front of a threaded upstream running
    `upstream_handler`: yields the server (conftest.Server), then stops both. `routes`
    are [[site.route]] tables; "{upstream}" in them is the upstream's address."""
    import threading

    from conftest import Server, tls_block
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), upstream_handler)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    config = folder / "nestgate.toml"
    config.write_text(f"""
[server]
workers = {workers}

[[listen]]
address = "127.0.0.1:0"
http3 = true
{tls_block(certs)}

[[site]]
hosts = ["*"]
""" + routes.replace("{upstream}", f"http://127.0.0.1:{upstream.server_address[1]}"))
    server = Server(config, ())
    try:
        yield server
    finally:
        server.stop()
        upstream.shutdown()
        upstream.server_close()
