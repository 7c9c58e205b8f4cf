"""`HTTP1Request`: the protocol-neutral `request.Request` answered on an HTTP/1.x
connection as bytes (a status line, header lines, a body, chunked when HTTP/1.1 and no
length is known). It also takes its turn in the connection's answer queue
(`nestgate.wire.h1queue`) like a ready answer does. It writes through its connection's
`write` and never reads: the parsing is `nestgate.wire.h1parse`'s.
"""

from __future__ import annotations

from nestgate.base.clock import CLOCK
from nestgate.pipeline.request import Request
from nestgate.base.responses import CONNECTION_ENDINGS, SERVER, STATUS_LINES, header_block, \
    status_line


class HTTP1Request(Request):
    """A Request answered on an HTTP/1.x connection: a status line, header lines and
    the body as bytes (chunked when HTTP/1.1 and no length is known)."""

    __slots__ = ("version", "_chunked")

    relays_bytes = True
    answers_from_callbacks = True

    def __init__(self, conn, handler, route, method: bytes, raw_target: bytes, qmark: int,
                 version: str, headers, host: bytes, keep_alive: bool, t0: float) -> None:
        Request.__init__(self, conn, handler, route, method, raw_target, qmark, headers,
                         host, keep_alive, t0)
        self.version = version
        self._chunked = False

    @property
    def protocol(self) -> str:
        return "HTTP/1.0" if self.version == "1.0" else "HTTP/1.1"

    def sendfile_transport(self):
        # Plain TCP only: TLS bytes must pass through the TLS layer (the listener's
        # scheme: the request's may be a trusted proxy's word). The caller writes
        # around the transport: a ready answer still waiting for the batch's end goes
        # into the transport first (the caller waits for its buffer to empty).
        conn = self.connection
        transport = conn.transport
        if conn.ctx.scheme == "http" and transport is not None \
                and transport.get_extra_info("socket") is not None:
            conn.write_later()
            return transport
        return None

    def answered(self, status: int = 0) -> None:
        """For a handler whose `begin` took the request: see `HTTP1Connection.finish`."""
        self.connection.finish(self, status)

    def answer_in_task(self) -> None:
        """For a handler whose `begin` took the request: see `HTTP1Connection.fallback`."""
        self.connection.fallback(self)

    def settle_keep_alive(self) -> bool:
        """Whether the connection outlives this response, decided as the response
        begins (its head says so). Not on a draining worker, and not when the client
        was told to wait for `100 Continue` before its body and none was sent: it may
        never send that body, so what follows on the connection is unknowable
        (RFC 9110 10.1.1)."""
        if self.connection.ctx.draining or (self.body is not None and self.body.awaits_continue):
            self.keep_alive = False
        return self.keep_alive

    # ---- answering
    def start(self, status: int, headers, content_length: int | None = None) -> None:
        """Send the status line and headers. Without a length the body is chunked
        (HTTP/1.1) or ends with the connection (HTTP/1.0)."""
        self.start_raw(status, header_block(headers), content_length)

    def start_raw(self, status: int, block: bytes, content_length: int | None = None) -> None:
        """`start` with the header lines already as bytes (`name: value\r\n` each), for
        headers that were parsed and checked elsewhere, such as an upstream's."""
        self.connection.write(self.head_bytes(status, block, content_length))

    def head_bytes(self, status: int, block: bytes, content_length: int | None = None) -> bytes:
        """The response head `start_raw` would write, returned instead, for a caller that
        writes it together with the first body bytes (one send instead of two)."""
        if content_length is not None:
            framing = b"content-length: %d\r\n" % content_length
        elif status in (204, 304) or 100 <= status < 200:
            framing = b""
        elif self.version == "1.1":
            framing = b"transfer-encoding: chunked\r\n"
            self._chunked = not self.head_only
        else:
            framing = b""
            self.keep_alive = False
        return self.head_from(status, b"".join((STATUS_LINES.get(status) or status_line(status),
                                                SERVER.line, block, framing)))

    def head_from(self, status: int, lines: bytes) -> bytes:
        """`head_bytes` from the status line and header lines as they go out, framing
        included (the Date and Connection lines are added here): for a caller that
        made them once for many responses."""
        if self.started:
            raise RuntimeError("response already started")
        self.started = True
        self.status = status
        conn = self.connection
        data = b"".join((lines, CLOCK.date_line, CONNECTION_ENDINGS[
            conn.keep_alive_mode if self.settle_keep_alive() else conn.close_mode]))
        conn.bytes_out += len(data)                # `sent` counts body bytes only
        return data

    async def write(self, data: bytes) -> None:
        if not self.started:
            raise RuntimeError("write before start")
        if self.head_only or not data:
            return
        conn = self.connection
        size = len(data)
        self.sent += size
        if self._chunked:
            data = b"%x\r\n%b\r\n" % (size, data)
            conn.bytes_out += len(data) - size          # the chunk's framing
        conn.write(data)
        if conn.write_paused:
            await conn.wait_writable()

    def push(self, data: bytes) -> bool:
        """`write` without waiting: True when the client's buffer is full and the caller
        should stop producing until `connection.wait_writable()` returns."""
        data = self.frame(data)
        if data:
            self.connection.write(data)
        return self.connection.write_paused

    def frame(self, data: bytes) -> bytes:
        """Body bytes as they go on the wire (chunk-framed if need be), not written."""
        if self.head_only or not data:
            return b""
        size = len(data)
        self.sent += size
        if self._chunked:
            data = b"%x\r\n%b\r\n" % (size, data)
            self.connection.bytes_out += len(data) - size   # the chunk's framing
        return data

    def end_bytes(self) -> bytes:
        """What `end` would write (the last chunk), returned instead."""
        if self.finished:
            return b""
        self.finished = True
        if self._chunked:
            self.connection.bytes_out += 5
            return b"0\r\n\r\n"
        return b""

    async def send_prebuilt(self, response) -> None:
        """Answer with a `Prebuilt` response (a synchronous handler's answer)."""
        self.answer_ready(response)
        if self.connection.write_paused:
            await self.connection.wait_writable()

    def answer_ready(self, response) -> None:
        """The whole answer from a ready response, written without waiting."""
        conn = self.connection
        data = response.render(conn.keep_alive_mode if self.settle_keep_alive()
                               else conn.close_mode, self.head_only)
        self.started = self.finished = True
        self.status = response.status
        self.count_ready(data, response)
        self.connection.write(data)

    def cut(self) -> None:
        """Bytes of the response are out and it failed: the connection ends after them."""
        self.keep_alive = False
        self.finished = True

    def take_over(self, head: bytes) -> bytes:
        """Switch protocols: write `head` (a whole 101 response) and hand the connection
        to the handler as a byte pipe. Returns the bytes the client sent after its
        request; later bytes go to the sink set with `connection.set_sink`. The
        connection closes when the handler returns."""
        if self.started or not self.upgrade:
            raise RuntimeError("take_over needs an upgrade request with no response yet")
        self.started = self.finished = True
        self.status = 101
        self.keep_alive = False
        self.connection.bytes_out += len(head)
        return self.connection.become_tunnel(head)

    def end(self) -> None:
        if self.finished:
            return
        self.finished = True
        if self._chunked:
            self.connection.write(b"0\r\n\r\n")
            self.connection.bytes_out += 5

    def count_ready(self, data: bytes, response) -> None:
        """A ready response's bytes `data`: its body in `sent`, the rest in the
        connection's bytes out."""
        body = 0 if self.head_only else response.content_length
        self.sent += body
        self.connection.bytes_out += len(data) - body

    # ---- a turn in the connection's queue (as `h1queue.ReadyAnswer`)
    def take_turn(self) -> bool:
        """Its turn has come: the handler starts. False: later answers wait for it."""
        self.connection.start_answer(self)
        return False

    def end_connection(self) -> None:
        self.keep_alive = False

    def abandon(self) -> None:
        if self.body is not None:
            self.body.abort()
