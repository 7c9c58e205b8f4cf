"""The request a handler sees, whatever protocol carried it.

An asynchronous handler gets one `Request`: what was asked (method, target, headers,
the client, the route's parameters), the request body as a `Body`, and the calls
that answer it (`send_prebuilt`, or `start`, `write`, `end`). Each protocol adapter
subclasses `Request` with its own way of putting an answer on the wire:
`http1.HTTP1Request` writes a status line, headers and (chunked) bytes;
`http2.H2Request` writes HEADERS and DATA frames on its stream under flow control.
The protocol-specific part is the subclass itself rather than an object behind the
request, so an answer's write is one method call, as on the hot path it must be.

Handlers never ask which protocol they are on. They may ask what the answer path
can do, which the subclasses say with class attributes:

  `relays_bytes`  True when the response is one byte stream the handler may frame
                  itself (`head_bytes`/`head_from`, `frame`, `end_bytes`) and write
                  to `connection` in batches, and may answer from callbacks
                  The proxy relays an upstream's bytes this way on HTTP/1.1; on
                  HTTP/2 and HTTP/3 it answers through `start_raw` and `write` (or
                  `push`), like any handler.
  `answers_from_callbacks`  True when a handler may take the request to answer it
                  from callbacks, without a task (`begin` returning True, then
                  `answered` or `answer_in_task`; `room_now` and `write_now` tell
                  such a handler what it may send at once). HTTP/1.1 and HTTP/2.
  `sendfile_transport()`  the transport a file's bytes may go to with `sendfile`
                  (a plain TCP socket carrying nothing but this response), or None.

`dispatch.answer` awaits a handler and translates its outcome into one status that
`dispatch.conclude` acts on (through `end`, `answer_ready` or `cut`), so success,
failure and a vanished client are handled once for every protocol.
"""

from __future__ import annotations

import asyncio
import collections
import time

BODY_HIGH_WATER = 256 * 1024      # pause reading when this much body waits unread


class Body:
    """A request body as a stream of chunks with backpressure on its source.

    The source (`flow`) is the HTTP/1.1 connection or an HTTP/2 stream's flow
    control: it has `loop`, `pause_reading_for_body()`, `resume_reading_for_body()`
    and `send_continue()`.

    `length` is the body's length as the adapter frames it (HTTP/1.1's one checked
    Content-Length, HTTP/2's one content-length held against the DATA frames), or
    None when the body runs to the protocol's end of message (chunked, END_STREAM).
    A body that would come out longer or shorter is aborted, never delivered: a
    proxy may announce this length upstream before the first byte."""

    __slots__ = ("_conn", "_chunks", "_buffered", "_done", "_waiter", "_discard",
                 "_expect_continue", "received", "_error", "length")

    def __init__(self, flow, expect_continue: bool, length: int | None = None) -> None:
        self.length = length
        self._conn = flow
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._done = False
        self._waiter: asyncio.Future | None = None
        self._discard = False
        self._expect_continue = expect_continue
        self.received = 0
        self._error: Exception | None = None

    # fed by the connection
    def feed(self, chunk: bytes) -> None:
        self.received += len(chunk)
        if self._discard:
            return
        self._chunks.append(chunk)
        self._buffered += len(chunk)
        if self._buffered > BODY_HIGH_WATER:
            self._conn.pause_reading_for_body()
        self._wake()

    def finish(self) -> None:
        self._done = True
        self._wake()

    def discard(self) -> None:
        """The handler is done without reading the rest: drop it as it arrives."""
        self._discard = True
        self._chunks.clear()
        self._buffered = 0
        self._conn.resume_reading_for_body()

    def abort(self, error: Exception | None = None) -> None:
        """The body will never be complete: readers get `error`, never a short body."""
        self._done = True
        self._error = error or ConnectionResetError("client went away")
        self._chunks.clear()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(self._error)

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # used by handlers
    @property
    def awaits_continue(self) -> bool:
        """The client waits for `100 Continue` before sending this body."""
        return self._expect_continue

    @property
    def done(self) -> bool:
        return self._done and not self._chunks

    async def read(self) -> bytes:
        """The body bytes that have arrived since the last read, at least one byte;
        b"" once the body is complete. The pieces the client sent them in (chunks,
        DATA frames) are joined: a reader pays per read, not per piece, so a body
        sent in very many tiny pieces costs it no more than the same bytes in one
        (the join is bounded by BODY_HIGH_WATER, past which reading pauses)."""
        if self._expect_continue:
            self._expect_continue = False
            self._conn.send_continue()
        chunks = self._chunks
        while not chunks:
            if self._error is not None:
                raise self._error
            if self._done:
                return b""
            self._waiter = self._conn.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if len(chunks) == 1:
            data = chunks.popleft()
        else:
            data = b"".join(chunks)
            chunks.clear()
        self._buffered -= len(data)
        if self._buffered <= BODY_HIGH_WATER // 4:
            self._conn.resume_reading_for_body()
        return data

    async def read_all(self) -> bytes:
        """The whole body (already bounded by `max_body`)."""
        parts = []
        while chunk := await self.read():
            parts.append(chunk)
        return b"".join(parts)


class Request:
    """What an asynchronous handler sees, and how it answers (see the module text)."""

    __slots__ = ("method", "raw_target", "path", "query", "headers", "host",
                 "client", "logged", "params", "route", "handler", "keep_alive", "head_only",
                 "body", "scheme", "status", "sent", "started", "finished", "connection",
                 "_t0", "task", "upgrade", "cancel", "errors", "tally")

    protocol = ""              # as the request log writes it: "HTTP/1.1", "HTTP/2"
    relays_bytes = False
    answers_from_callbacks = False

    def __init__(self, conn, handler, route, method: bytes, raw_target: bytes, qmark: int,
                 headers, host: bytes, keep_alive: bool, t0: float) -> None:
        # `route` is the router's `Route`; `handler` may be the one access control or
        # a PEEK settled on instead of `route.handler`.
        self.params, self.route, self.path = route.params, route.label, route.path
        self.errors = route.errors    # the site's error pages
        self.tally = route.tally      # where its answer is counted
        self.handler = handler
        self.method = method
        self.raw_target = raw_target
        self.query = b"" if qmark < 0 else raw_target[qmark + 1:]
        self.headers = headers
        self.host = host
        # Facts of this request, fixed when its head was read: a connection from a
        # trusted proxy carries many clients (each request's X-Forwarded-For), so by
        # the time the answer is logged, or a handler asks again after an await, the
        # connection's own fields may describe a later request.
        self.client = conn.client
        self.logged = conn.logging    # whether the request log records it
        self.scheme = conn.scheme     # the client's: a trusted proxy's X-Forwarded-Proto
        self.keep_alive = keep_alive
        self.head_only = method == b"HEAD"
        self.body = None
        self.status = self.sent = 0
        self.started = self.finished = False
        self.connection = conn
        # When the request began (for the log and the duration histogram): the
        # connection's reading when it times requests, else now.
        self._t0 = t0 or time.perf_counter()
        self.task = None
        self.upgrade = False
        self.cancel = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self.connection.loop

    @property
    def decisions(self):
        """The connection's cache of access decisions (`nestgate.pipeline.access`), each kept
        with the client it was made for: with the request in the connection's place,
        a gate asked again (`dispatch.resolve` after an await) decides for this
        request's client."""
        return self.connection.decisions

    @decisions.setter
    def decisions(self, value) -> None:
        self.connection.decisions = value

    @property
    def send_timeout(self) -> float:
        return self.connection.limits.send_timeout

    def header(self, name: bytes, default: bytes | None = None) -> bytes | None:
        """First value of a header, `name` in lower case."""
        for key, value in self.headers:
            if key == name:
                return value
        return default

    # ---- answering (each protocol's subclass)
    async def send(self, status: int, headers, body: bytes = b"") -> None:
        """A whole response in one go."""
        self.start(status, headers, len(body))
        if body:
            await self.write(body)
        self.end()

    async def send_prebuilt(self, response) -> None:
        """Answer with a `Prebuilt` response (a synchronous handler's answer)."""
        raise NotImplementedError

    def start(self, status: int, headers, content_length: int | None = None) -> None:
        """Send the status and headers ((name, value) pairs, str or bytes). Without a
        length the body's end is the protocol's to mark."""
        raise NotImplementedError

    def start_raw(self, status: int, block: bytes, content_length: int | None = None) -> None:
        """`start` with the header lines already as bytes (`name: value\\r\\n` each),
        for headers that were parsed and checked elsewhere, such as an upstream's."""
        raise NotImplementedError

    async def write(self, data: bytes) -> None:
        """Body bytes; returns once the client can take more."""
        raise NotImplementedError

    async def room(self, wanted: int) -> int:
        """How many body bytes to produce next, at most `wanted`, for a handler that
        reads them from somewhere (a file, an upstream)."""
        return wanted

    def room_now(self, wanted: int) -> int:
        """`room` without waiting: how many body bytes may be produced at once (0:
        none now; ask `room`)."""
        return wanted

    def write_now(self, data: bytes, last: bool = False) -> bool:
        """`write` when the protocol takes the bytes at once, for a handler answering
        from callbacks; False (nothing taken) when they would have to wait. `last`:
        they end the response, which is then finished (one frame fewer where the
        protocol can mark its end on the data)."""
        return False

    def answer_now(self, status: int, block: bytes, content_length: int | None,
                   body: bytes) -> bool:
        """`start_raw`, then `write_now(body, last=True)`: a whole answer at once, for
        a handler answering from callbacks. False: the head went, the body did not
        (the caller writes it as it would after `write_now`)."""
        self.start_raw(status, block, content_length)
        return self.write_now(body, last=True)

    def push(self, data: bytes) -> bool:
        """`write` without waiting: True when the caller should stop producing until
        `writable()` returns."""
        raise NotImplementedError

    async def writable(self) -> None:
        """Until the client has taken what `push` gave it (enough of it)."""
        await self.connection.wait_writable()

    def end(self) -> None:
        """The response is complete."""
        raise NotImplementedError

    def answer_ready(self, response) -> None:
        """The whole answer from a ready response (the site's error page for a failed
        handler, `dispatch.conclude`), written without waiting."""
        raise NotImplementedError

    def cut(self) -> None:
        """The handler failed after bytes of its answer went out: end the response as
        broken, as the protocol allows (a closed connection, a reset stream)."""
        raise NotImplementedError

    def take_over(self, head: bytes) -> bytes:
        """Switch protocols (HTTP/1.1's Upgrade): see `HTTP1Request.take_over`."""
        raise NotImplementedError

    def sendfile_transport(self):
        """The transport a file may be sent to with `sendfile`, or None; what waits to
        be written on the connection is handed to the transport first."""
        return None
