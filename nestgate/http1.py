"""HTTP/1.1 on httptools: one `HTTP1Connection` per client connection, the HTTP/1
adapter of the request pipeline (see `nestgate.dispatch`).

Theory of operation
-------------------
httptools (llhttp, strict: no lenient flag is ever set) calls back as bytes arrive.
The callbacks fill a handful of attributes for the request being read; at
`on_headers_complete` the route is looked up and resolved (`dispatch.resolve`) and a
ready response is written straight from the callback (at `on_message_complete` when
a body comes first). Only asynchronous handlers (they wait on disk, an upstream or a
request body) get an `HTTP1Request` (the protocol-neutral `request.Request` answered
as HTTP/1 bytes) and a task awaiting `dispatch.answer`, started at
`on_headers_complete` so they can stream the body; `conclude` acts on its outcome.

Every response says `connection: keep-alive` or `connection: close` (as nginx
does), so the answer never depends on the request's minor version.

Pipelined requests are answered in order: while a task is answering, later
requests are parsed and queued and take their turn when the one ahead finishes.
Each queued answer is a ready response (`_ReadyAnswer`) or a waiting
`HTTP1Request`; both take their turn, end the connection or are abandoned the same
way. A request that breaks the protocol or a limit queues its error response and
the connection closes after it.

A connection's life is a few phases; each says what becomes of the client's next
bytes, and a phase only moves to one listed in `_NEXT` (checked on each move):

  phase         the client's bytes                           moves to
  OPEN          parsed as requests                           LAST CLOSING UPGRADING CLOSED
  LAST          the rest of the request that ends the        CLOSING UPGRADING CLOSED
                connection; a request after it ends reading
  PROXY_HEADER  a PROXY protocol header, then OPEN           OPEN CLOSING CLOSED
  CLOSING       dropped; answers ahead still go out          CLOSED
  UPGRADING     kept for the handler of an upgrade request   TUNNEL CLOSING CLOSED
                (reading is stopped), which may wait its
                turn behind answers to pipelined requests
  TUNNEL        handed to the handler's sink                 CLOSING CLOSED
  CLOSED        none: the transport is gone

While requests are read, `state` says where in one the reading is: IDLE (between
requests), HEAD or BODY; the tick's timeouts follow it.

A client that pipelines and does not read must not make the worker hold its input:
reading stops (the unparsed rest of a read is kept, at most one read) while the
transport holds more than WRITE_HIGH_WATER unsent bytes or more than PIPELINE_HIGH
answers are queued, and starts again once both are low. Ready answers are queued,
not written, while the transport is above its mark. The client's socket then fills
and `send_timeout` counts. Once a request is the last one (`keepalive_requests`,
`Connection: close`, a drain), nothing after it is parsed: the rest is dropped.

Timeouts cost nothing per request: the worker's tick (a few times a second) asks
each connection how long it has made no progress in its current state, and
  * reading a request head: `header_timeout`, counted from the first byte and not
    extended by a trickle of bytes (408, then close);
  * reading a body: `body_timeout` between pieces of it (408, then close);
  * between requests (or before the first): `keepalive_timeout` (`header_timeout`
    for a connection that never sent a byte), then a silent close.
While a handler answers (and nothing is being read), no timeout runs.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time

import httptools

from nestgate.bans.watch import BANS
from nestgate.dispatch import (GATED, GONE, PEEK, conclude, log_ready, ready, record,
                               refresh_client, resolve, run, start, take_peer)
from nestgate.request import Body, Request
from nestgate.clientip import ProxyHeaderError, take_proxy_header
from nestgate.clock import CLOCK
from nestgate.errorpages import DEFAULT_PAGES, ERRORS
from nestgate.errors import RequestError
from nestgate.flow import Writable
from nestgate.responses import (ALT_SVC, CLOSE, CONNECTION_ENDINGS, CONTINUE,
                                KEEP_ALIVE_EXPLICIT, SERVER, STATUS_LINES, header_block,
                                status_line)
from nestgate.sendwatch import SendWatch, cut
from nestgate.ratelimit import count_connection, uncount_connection
from nestgate.tally import UNROUTED

log = logging.getLogger("nestgate.http1")

# Reading-side states.
IDLE, HEAD, BODY = 0, 1, 2

# `_header_bytes` while a body is read: any trailer field goes past the limit check.
_TRAILERS = 1 << 62

# Request header fields the engine reads itself, by lower-case name.
_HOST, _TRANSFER_ENCODING, _CONTENT_LENGTH, _CONNECTION = range(4)
_HEAD_FIELDS = {b"host": _HOST, b"transfer-encoding": _TRANSFER_ENCODING,
                b"content-length": _CONTENT_LENGTH, b"connection": _CONNECTION}
# Field names as clients spell them (they repeat): (lower-case name, _HEAD_FIELDS
# kind or None), so a known spelling costs one lookup and no new bytes.
_SPELLED: dict[bytes, tuple[bytes, int | None]] = {}
_SPELLED_LIMIT = 4096


def _learn_spelling(name: bytes) -> tuple[bytes, int | None]:
    lower = name.lower()
    known = _SPELLED.get(lower) or (lower, _HEAD_FIELDS.get(lower))
    if len(_SPELLED) >= _SPELLED_LIMIT:
        _SPELLED.clear()                # many odd names: start over rather than grow
    _SPELLED[name] = known
    return known

WRITE_HIGH_WATER = 64 * 1024
# Pipelining backpressure: reading stops while more than PIPELINE_HIGH answers wait in
# the queue (or the transport is above WRITE_HIGH_WATER) and starts again at
# PIPELINE_LOW. A read bigger than FEED_SLICE is parsed a slice at a time, so one read
# full of tiny requests cannot queue more than a slice's worth before the check.
PIPELINE_HIGH = 16
PIPELINE_LOW = 4
FEED_SLICE = 16 * 1024
# How an HTTP/2 client with prior knowledge starts (RFC 9113 3.4): told apart from other
# malformed requests so that it gets a hint instead of a bare 400.
H2_PREFACE_LINE = b"PRI * HTTP/2.0\r\n"
DRAIN_IDLE_GRACE = 1.0            # seconds an idle connection may still send one request

# The connection's phases (see the module docstring). Those before CLOSING read the
# client's bytes; a phase changes a few times in a connection's life, never per request.
OPEN, LAST, PROXY_HEADER, CLOSING, UPGRADING, TUNNEL, CLOSED = range(7)
PHASE_NAMES = ("open", "last", "proxy-header", "closing", "upgrading", "tunnel", "closed")
_NEXT = {
    OPEN: (LAST, CLOSING, UPGRADING, CLOSED),
    LAST: (CLOSING, UPGRADING, CLOSED),
    PROXY_HEADER: (OPEN, CLOSING, CLOSED),
    CLOSING: (CLOSED,),
    UPGRADING: (TUNNEL, CLOSING, CLOSED),
    TUNNEL: (CLOSING, CLOSED),
    CLOSED: (),
}


class HTTP1Request(Request):
    """A Request answered on an HTTP/1.x connection: a status line, header lines and
    the body as bytes (chunked when HTTP/1.1 and no length is known)."""

    __slots__ = ("version", "_chunked")

    relays_bytes = True

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
        # Plain TCP only: TLS bytes must pass through the TLS layer.
        transport = self.connection.transport
        if self.scheme == "http" and transport is not None \
                and transport.get_extra_info("socket") is not None:
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

    # ---- a turn in the connection's queue (as `_ReadyAnswer`)
    def take_turn(self) -> bool:
        """Its turn has come: the handler starts. False: later answers wait for it."""
        self.connection.start_answer(self)
        return False

    def end_connection(self) -> None:
        self.keep_alive = False

    def abandon(self) -> None:
        if self.body is not None:
            self.body.abort()


class _ReadyAnswer:
    """A ready response that waits in the queue for the answers ahead of it."""

    __slots__ = ("connection", "response", "mode", "head_only")

    def __init__(self, connection, response, mode: int, head_only: bool) -> None:
        self.connection = connection
        self.response = response
        self.mode = mode
        self.head_only = head_only

    def take_turn(self) -> bool:
        """Written; False when the connection ends with it."""
        conn = self.connection
        mode = conn.close_mode if conn.ctx.draining else self.mode
        conn.bytes_out += self.response.write_to(conn.transport, mode, self.head_only)
        if mode == conn.close_mode:
            conn.close_now()
            return False
        return True

    def end_connection(self) -> None:
        self.mode = self.connection.close_mode

    def abandon(self) -> None:
        pass



class _AfterLast(Exception):
    """Raised from `on_url` to stop parsing after the request that ends the connection."""


class HTTP1Connection(asyncio.Protocol):
    """One client connection. `ctx` is the listener's `ServerContext`."""

    first_phase = OPEN
    protocol = "HTTP/1.1"         # as the request log writes a ready answer

    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self.limits = ctx.limits
        # How ready answers end their head (nestgate.responses' modes): after an
        # Alt-Svc line on a listener that also serves HTTP/3.
        alt = ALT_SVC if ctx.alt_svc else 0
        self.keep_alive_mode, self.close_mode = KEEP_ALIVE_EXPLICIT + alt, CLOSE + alt
        self._known_site = ctx.router.memo.get     # the router's Host memo, asked first
        self.loop = ctx.loop
        self.transport = None
        self.parser = httptools.HttpRequestParser(self)
        limits = ctx.limits      # copied: read on every request
        self._max_url = limits.max_url
        self._max_header_bytes = limits.max_header_bytes
        self._max_headers = limits.max_headers
        self._max_body = limits.max_body
        self._header_timeout = limits.header_timeout
        self._body_timeout = limits.body_timeout
        self._keepalive_timeout = limits.keepalive_timeout
        self._keepalive_requests = limits.keepalive_requests
        self.client = ""
        self.peer = ""                 # socket peer, or the address a PROXY header gave
        self.decisions = None          # access decisions for this peer (nestgate.access)
        self.client_tag = 0            # counted under max_connections_per_client (ratelimit)
        self.xff_trusted = False      # the peer may tell us the client in X-Forwarded-For
        self._sink = None              # after an upgrade: where client bytes go
        self._upgrade_tail = None      # after an accepted upgrade: the bytes that followed
        self.logging = False
        self._timing = False           # requests are timed: they may be logged
        self._peer_logged = False      # whether the peer's own requests are logged
        self.write_paused = False
        self._writable = Writable()      # handlers waiting for the client to take more
        self._body_paused = False
        self._held = None              # unparsed input kept while reading is stopped
        self._release_due = False      # a call to parse `_held` is scheduled
        self.phase = self.first_phase
        self._requests = 0
        # HTTP bytes read and written (after TLS), for the worker's figures: reads are
        # counted as they arrive, ready answers as they are written, a handler's answer
        # (`Request.sent`) once it is done.
        self.bytes_in = 0
        self.bytes_out = 0
        # reading side
        self.state = IDLE
        # Progress bookkeeping for the worker's tick (see the module docstring).
        self._seen = (0, IDLE)
        self._stalled = 0.0
        self._send_watch = SendWatch()
        self._body_progress = False
        # answering side: the running async request, then the answers waiting behind it
        # (`HTTP1Request`s and `_ReadyAnswer`s)
        self._active: HTTP1Request | None = None
        self._queue: collections.deque = collections.deque()
        # the request being parsed
        self._url = b""
        self._headers: list = []
        self._header_bytes = 0
        self._head_taken = None        # bytes of an unfinished head after its first read
        self._trailer_bytes = 0        # trailer fields of the body being read
        self._trailer_stray = 0        # bytes read in a row without body bytes
        self._body_seen = 0            # _body_size at the last read
        self._host = None
        self._chunked = False
        self._content_length = None
        self._body_length = None       # the Content-Length the body is read by (None: chunked)
        self._unusual = False          # Transfer-Encoding, Content-Length or Connection seen
        self._body: Body | None = None
        self._body_size = 0
        self._sync = None
        self._parsing: HTTP1Request | None = None     # async request whose body is arriving
        self._t0 = 0.0

    # ------------------------------------------------------------ transport
    def connection_made(self, transport) -> None:
        self.transport = transport
        ctx = self.ctx
        self.set_client(ctx.client_address(transport.get_extra_info("peername")))
        if ctx.bans is not None and ctx.bans.refuses(self):
            self._enter(CLOSING)           # banned (nestgate.bans): closed unanswered
            return
        transport.set_write_buffer_limits(WRITE_HIGH_WATER)
        # A connection accepted just before a graceful stop is still served (with
        # `connection: close`); only overload turns one away.
        if len(ctx.connections) >= self.limits.max_connections:
            # Overload: a ready 503 is cheaper than letting the backlog time out.
            self._enter(CLOSING)
            self.write_closing(ERRORS[503])
            UNROUTED.count(503)
            return
        if ctx.max_per_client and not count_connection(self):
            self.refuse_over_client_limit()
            return
        if ctx.draining:
            self.finish_and_close()
        ctx.connections.add(self)

    @property
    def served(self) -> int:
        """Requests read on this connection so far (for the worker's figures)."""
        return self._requests

    def _enter(self, phase: int) -> None:
        """Move to `phase` (staying in the same one is no move)."""
        if phase != self.phase:
            if phase not in _NEXT[self.phase]:
                raise RuntimeError(f"an HTTP/1 connection cannot go from "
                                   f"{PHASE_NAMES[self.phase]} to {PHASE_NAMES[phase]}")
            self.phase = phase

    def connection_lost(self, exc) -> None:
        self._enter(CLOSED)
        ctx = self.ctx
        ctx.connections.discard(self)
        ctx.requests_done += self._requests
        uncount_connection(self)
        if self._active is not None:
            self.bytes_out += self._active.sent
        ctx.bytes_in_done += self.bytes_in
        ctx.bytes_out_done += self.bytes_out
        if self._body is not None:
            self._body.abort()
        if self._active is not None:
            if self._active.task is not None:
                self._active.task.cancel()
            elif self._active.cancel is not None:
                self._active.cancel()
        for waiting in self._queue:
            waiting.abandon()
        self._queue.clear()
        self._writable.close(ConnectionResetError("client went away"))
        # Break the cycles parser -> self -> transport.
        self.parser = None
        self._active = None
        self._sink = None

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._writable.wake()
        if self._active is None and self._queue:
            self._run_queue()             # ready answers that waited for room
        elif self._held is not None:
            self._release()

    async def wait_writable(self) -> None:
        """Wait until the client's socket buffer is below the high-water mark."""
        while self.write_paused and not self._closing_transport():
            await self._writable.wait()

    def _closing_transport(self) -> bool:
        return self.transport is None or self.transport.is_closing()

    def write(self, data: bytes) -> None:
        """Bytes of a `Request`'s answer (counted in its `sent`)."""
        if not self.transport.is_closing():
            self.transport.write(data)

    def write_closing(self, response) -> None:
        """A ready `response` as the last thing on this connection, which then closes."""
        data = response.render(self.close_mode)
        self.bytes_out += len(data)
        self.transport.write(data)
        self.transport.close()

    def pause_reading_for_body(self) -> None:
        if not self._body_paused:
            self._body_paused = True
            self.transport.pause_reading()

    def resume_reading_for_body(self) -> None:
        if self._body_paused:
            self._body_paused = False
            if self._held is not None:
                self._release()
            elif not self._closing_transport():
                self.transport.resume_reading()

    def _must_wait(self) -> bool:
        """Reading stops: answers or body bytes wait for the client or a handler."""
        return self.write_paused or self._body_paused or len(self._queue) > PIPELINE_HIGH

    def _hold(self, rest) -> None:
        """Stop reading; `rest` (the unparsed part of a read) is parsed on release."""
        self._held = rest
        if not self._closing_transport():
            self.transport.pause_reading()

    def _release(self) -> None:
        """Read again once the queue is short and nothing else waits. The kept input
        is parsed from a fresh call: this may run inside a parser callback."""
        if self._held is None or self._release_due or self.phase >= CLOSING \
                or self.write_paused or self._body_paused or len(self._queue) > PIPELINE_LOW:
            return
        self._release_due = True
        self.loop.call_soon(self._read_held)

    def _read_held(self) -> None:
        self._release_due = False
        held, self._held = self._held, None
        if held is None or self.phase >= CLOSING or self._closing_transport():
            return
        if self._must_wait():                  # filled up again meanwhile
            self._held = held
            return
        self.transport.resume_reading()
        if held:
            self._feed_all(held)

    def become_tunnel(self, head: bytes) -> bytes:
        self.state = IDLE
        self.write(head)
        tail, self._upgrade_tail = self._upgrade_tail or b"", None
        return tail

    def set_sink(self, sink) -> None:
        """After `Request.take_over`: `sink(bytes)` gets what the client sends; reading
        resumes. Nothing to do when the client has gone meanwhile."""
        if self.phase != UPGRADING:
            return
        self._enter(TUNNEL)
        self._sink = sink
        if not self._closing_transport():
            self.transport.resume_reading()

    def set_client(self, address: str) -> None:
        """The client is `address`: the socket peer, or what a PROXY header said.
        Whether requests are logged is decided here, once, unless the peer is a
        trusted proxy: then each request's client (from X-Forwarded-For) decides."""
        take_peer(self, address)
        self._peer_logged = self.logging
        self._timing = self.logging or (self.xff_trusted and self.ctx.access_log is not None)
        if self.client_tag and not count_connection(self):   # a PROXY header named it
            self.refuse_over_client_limit()

    def serve_only(self, router) -> None:
        """Route every request of this connection with `router` (a banned client's
        page, nestgate.bans.watch.BannedRouter)."""
        self._known_site = router.site_for

    def refuse_over_client_limit(self) -> None:
        """The client has `max_connections_per_client` open already: 503, then close."""
        self._enter(CLOSING)
        if not self._closing_transport():
            self.write_closing(ERRORS[503])
        UNROUTED.count(503)

    def send_continue(self) -> None:
        if self._active is not None and not self._active.started:
            self.bytes_out += len(CONTINUE)
            self.transport.write(CONTINUE)

    # ------------------------------------------------------------ reading
    def data_received(self, data: bytes) -> None:
        self.bytes_in += len(data)
        if self.phase >= CLOSING:
            if self.phase == TUNNEL:
                self._sink(data)
            return
        if self._held is not None:       # came after reading stopped: keep the order
            self._held = bytes(self._held) + data
            return
        if len(data) > FEED_SLICE:
            return self._feed_all(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if isinstance(cause, _AfterLast):
                self._enter(CLOSING)         # answered up to the last; drop the rest
                return
            status = cause.status if isinstance(cause, RequestError) else 500
            if status == 500:
                log.exception("request callback failed", exc_info=cause)
            self._fail(status)
        except httptools.HttpParserUpgrade as exc:
            # Only handlers that take over the connection accept an upgrade; for the
            # rest the request was answered as usual and the connection ends after it.
            # The upgrade request is the last one read: being answered, or waiting its
            # turn behind answers to pipelined requests ahead of it.
            req = self._queue[-1] if self._queue else self._active
            if (type(req) is HTTP1Request and req.upgrade
                    and getattr(req.handler, "upgrades", False)):
                # Hold the client's next bytes until the handler knows the answer.
                self._enter(UPGRADING)
                req.keep_alive = False
                self._upgrade_tail = bytes(data[exc.args[0]:])
                self.transport.pause_reading()
                return
            self._enter(CLOSING)
            self._close_when_idle()
        except httptools.HttpParserError:
            if not self._requests and bytes(data[:len(H2_PREFACE_LINE)]) == H2_PREFACE_LINE:
                self._fail(400, DEFAULT_PAGES.h2c_off)
                return
            self._fail(400)
            return
        if self.state:
            self._unfinished(len(data))
        if self.write_paused or len(self._queue) > PIPELINE_HIGH:
            if self.phase < CLOSING:
                self._hold(b"")

    def _feed_all(self, data) -> None:
        """Parse `data` a slice at a time, stopping when answers pile up."""
        self.bytes_in -= len(data)       # counted already; each slice counts itself again
        view = memoryview(data)
        for offset in range(0, len(view), FEED_SLICE):
            end = offset + FEED_SLICE
            self.data_received(view[offset:end])
            if self.phase >= CLOSING:
                if self.phase == UPGRADING:            # the tunnel's first bytes
                    self._upgrade_tail += bytes(view[end:])
                return
            if self._held is not None or self._body_paused:
                self._hold(view[end:])
                return

    def _unfinished(self, size: int) -> None:
        """A read ended inside a request. httptools holds a header or trailer line
        until it ends, so one line without an end would grow without limit.
        In a head, the reads after the one that began it may bring
        `max_url + max_header_bytes` bytes in all (the first read is bounded by the
        transport's buffer and left uncounted, since it may begin with pipelined
        requests ahead of this one). In a body, reads that bring no body bytes (chunk
        sizes, trailers) may bring `max_header_bytes` in a row."""
        if self.state == BODY:
            if self._body_size != self._body_seen:
                self._body_seen = self._body_size
                self._trailer_stray = 0
                return
            self._trailer_stray += size
            if self._trailer_stray > self._max_header_bytes:
                self._fail(431)
            return
        taken = self._head_taken
        if taken is None:
            self._head_taken = 0
            return
        taken += size
        self._head_taken = taken
        if taken > self._max_url + self._max_header_bytes:
            self._fail(431)

    # The callbacks below run for every request: each callback and each attribute
    # touched costs, so there is no on_message_begin (the first piece of the target
    # starts a request) and what a request rarely sets (_chunked, _content_length,
    # _unusual) is put back by on_headers_complete only when it was set.
    def on_url(self, url: bytes) -> None:
        if self.state == IDLE:
            if self.phase:                 # not OPEN: the last request was read
                raise _AfterLast()
            self.state = HEAD
            self._headers = []
            self._header_bytes = 0
            self._head_taken = None
            if self._timing:
                self._t0 = time.perf_counter()
                if self.xff_trusted:
                    # Until its head names a client, a request is its peer's: one
                    # refused before that (408, 414, 431) is not logged for the client
                    # of the request before it.
                    self.client, self.logging = self.peer, self._peer_logged
        else:
            url = self._url + url
        if len(url) > self._max_url:
            raise RequestError(414)
        self._url = url

    def on_header(self, name: bytes, value: bytes, _spelled=_SPELLED.get) -> None:
        size = self._header_bytes + len(name) + len(value) + 4
        self._header_bytes = size
        if size > self._max_header_bytes:
            return self._over_limit(name, value)
        # The header count is checked once the head is complete: the byte limit
        # already bounds how many fields can arrive before that.
        known = _spelled(name)
        if known is None:
            known = _learn_spelling(name)
        lower, kind = known
        self._headers.append((lower, value))
        if kind is None:
            return
        if kind == _HOST:
            # The characters of a Host value are checked once per distinct value, by
            # the router (Router.site_for); here only repeats and emptiness.
            if self._host is not None or not value:
                raise RequestError(400, "repeated or empty Host")
            self._host = value
            return
        # The rest make the request unusual: on_headers_complete then asks its version
        # and checks its framing.
        self._unusual = True
        if kind == _TRANSFER_ENCODING:
            # Only a single `chunked`: anything else is a smuggling shape.
            if self._chunked or value.lower() != b"chunked":
                raise RequestError(400, "Transfer-Encoding other than a single chunked")
            self._chunked = True
        elif kind == _CONTENT_LENGTH:
            self._content_length = int(value)      # llhttp has checked: digits, no repeat

    def _over_limit(self, name: bytes, value: bytes) -> None:
        """Past a header limit, or a trailer field: once a body follows, `_framing`
        puts `_header_bytes` out of reach so that trailers come here instead of
        costing the usual path a check. Trailer fields are never merged into the
        header section (RFC 9110 6.5.1): they are counted against the header limit
        and dropped."""
        if self.state != BODY:
            raise RequestError(431)
        self._trailer_bytes += len(name) + len(value) + 4
        if self._trailer_bytes > self._max_header_bytes:
            raise RequestError(431)

    def _framing(self, version: str) -> bool:
        """Checks a request that declared a body; True when a body follows."""
        chunked, length = self._chunked, self._content_length
        self._chunked = False
        self._content_length = None
        if chunked and version == "1.0":
            raise RequestError(400, "Transfer-Encoding in HTTP/1.0")   # RFC 9112 6.1
        if length is not None and length > self._max_body:
            raise RequestError(413)
        if chunked or length:
            self._body_length = None if chunked else length
            self._body = None
            self._body_size = self._body_seen = 0
            self._header_bytes = _TRAILERS
            self._trailer_bytes = self._trailer_stray = 0
            return True
        return False

    def _checked_version(self) -> str:
        version = self.parser.get_http_version()
        if version != "1.1" and version != "1.0":
            # llhttp reports a request line without a version as 0.9: malformed here.
            raise RequestError(400 if version == "0.9" else 505)
        return version

    def _unusual_head(self, host: bytes | None) -> tuple[bytes, str, bool]:
        """A request without Host or keep-alive, with a Connection header or with a
        body: its version, its Host (b"" for HTTP/1.0 without one) and whether a body
        follows."""
        self._host = None
        self._unusual = False
        version = self._checked_version()
        if host is None:
            if version == "1.1":
                raise RequestError(400, "HTTP/1.1 needs a Host")
            host = b""
        has_body = (self._chunked or self._content_length is not None) and self._framing(version)
        return host, version, has_body

    def on_headers_complete(self) -> None:
        headers = self._headers
        if len(headers) > self._max_headers:
            raise RequestError(431)
        if self.xff_trusted:
            banned = refresh_client(self, headers)   # (the ban page's router, or None)
        else:
            banned = None
        parser = self.parser
        host = self._host
        keep_alive = parser.should_keep_alive()
        if host is None or self._unusual or not keep_alive:
            host, version, has_body = self._unusual_head(host)
            self.state = BODY if has_body else IDLE
        else:
            # Kept alive without a Connection header is HTTP/1.1 (HTTP/1.0 needs
            # `Connection: keep-alive`, other versions are not kept alive), so the
            # version is not asked of httptools (a str.format there).
            self._host = None
            self.state = IDLE
            version = "1.1"
            has_body = False
        self._requests += 1
        if keep_alive and self._requests >= self._keepalive_requests:
            keep_alive = False          # (finish_and_close() makes this every request's case)
        if not keep_alive:
            self._enter(LAST)                # nothing after this request is parsed

        site = banned or self._known_site(host) or self.ctx.router.site_for(host)
        url = self._url
        # An exact route is looked up with the target as it came: a key never holds
        # "?" or "#" and always begins with "/", so a hit needs no splitting.
        route = site.exact_raw.get(url)
        if route is not None:
            qmark = -1
        else:
            if url[0] != 47:                               # not "/"
                url = self._absolute_form(url, host)
            if 63 in url:                                  # "?"
                qmark = url.find(b"?")
                raw_path = url[:qmark]
                if 35 in url:                              # "#"
                    raise RequestError(400, "fragment in request target")
            else:
                qmark = -1
                raw_path = url
            route = site.route(raw_path)
        handler = route.handler
        path = route.path
        method = parser.get_method()
        if method == b"CONNECT":
            raise RequestError(400, "CONNECT: nestgate is not a forward proxy")
        kind = handler.is_async
        if kind:
            if kind is PEEK:                # the common cached-file/page case, inline
                handler = handler.peek(path, method, headers) or handler
            elif kind is GATED:
                handler = resolve(handler, self, path, method, headers)
            kind = handler.is_async

        if not kind and not has_body and keep_alive and not self.logging \
                and self._active is None and not self._queue and not self.write_paused:
            # The common case, answered from here: a ready response, nothing ahead of it.
            self.bytes_out += handler.write_to(self.transport, self.keep_alive_mode,
                                               method == b"HEAD")
            route.tally.codes[handler.status] += 1     # RouteTally.count, inline
            return

        if not kind:                             # a ready response
            expect = has_body and self._expect_continue()
            if expect:
                keep_alive = False   # the client may or may not send the body now
                self._enter(CLOSING)
            mode = self.keep_alive_mode if keep_alive else self.close_mode
            if has_body and not expect:
                self._sync = (handler, mode, method, path, host, route)  # after the body
            else:
                # Nothing more belongs to this request: answer now, from the callback.
                self._answer_sync(handler, mode, method, path, host, route)
            return

        req = HTTP1Request(self, handler, route, method, url, qmark, version, headers, host,
                           keep_alive, self._t0)
        req.body = self._body = Body(self, self._expect_continue(), self._body_length) \
            if has_body else None
        req.upgrade = parser.should_upgrade()
        self._sync = None
        self._parsing = req if has_body else None
        if self._active is None and not self._queue:
            self.start_answer(req)
        else:
            self._queue.append(req)

    def _expect_continue(self) -> bool:
        for name, value in self._headers:
            if name == b"expect":
                if value.lower() != b"100-continue":
                    raise RequestError(417)
                return True
        return False

    def _absolute_form(self, url: bytes, host: bytes) -> bytes:
        # RFC 9112 3.2.2: servers accept absolute-form. Its authority must name the
        # same host as the Host header (a disagreement is how requests get smuggled
        # past a front end); the path is what routes. Authority-form and "*" are not
        # served here.
        for scheme, default_port in ((b"http://", b":80"), (b"https://", b":443")):
            if url[:len(scheme)].lower() == scheme:
                slash = url.find(b"/", len(scheme))
                authority = url[len(scheme):slash if slash > 0 else len(url)].lower()
                host = host.lower()
                if b"@" in authority or authority.removesuffix(default_port) != \
                        host.removesuffix(default_port):
                    raise RequestError(400, "absolute-form target and Host disagree")
                return url[slash:] if slash > 0 else b"/"
        raise RequestError(400, "request target must be a path")

    def on_body(self, chunk: bytes) -> None:
        self._body_size += len(chunk)
        if self._body_size > self._max_body:
            raise RequestError(413)
        self._body_progress = True
        if self._body is not None:
            self._body.feed(chunk)

    def on_message_complete(self) -> None:
        # Only a request with a body has anything left to do here.
        if self.state == BODY:
            self.state = IDLE
            if self._sync is not None:
                self._answer_sync(*self._sync)
                self._sync = None
            elif self._body is not None:
                self._body.finish()
                self._body = None
                self._parsing = None

    def _answer_sync(self, response, mode, method, path, host, route) -> None:
        route.tally.count(response.status)
        head_only = method == b"HEAD"
        if self._active is None and not self._queue and not self.write_paused:
            if mode == self.close_mode or self.ctx.draining:
                self._enter(CLOSING)
                self.bytes_out += response.write_to(self.transport, self.close_mode, head_only)
                self.transport.close()
            else:
                self.bytes_out += response.write_to(self.transport, mode, head_only)
        else:
            self._queue.append(_ReadyAnswer(self, response, mode, head_only))
        if self.logging:
            log_ready(self, response.status, 0 if head_only else response.content_length,
                      method, host, path, route.label, self._headers, self._t0)

    # ------------------------------------------------------------ answering
    def start_answer(self, req: HTTP1Request) -> None:
        """`req`'s turn: its handler answers it, from callbacks or in a task."""
        self._active = req
        start(req)

    def finish(self, req: HTTP1Request, status: int = 0) -> None:
        """For a handler whose `begin(req)` took the request: it is answered, or failed
        with `status` (the answer if nothing was sent yet, else the connection is cut).
        A handler may set `req.cancel` to be told if the client goes away first."""
        if self._active is not req:
            return                          # the client went away meanwhile
        req.cancel = None
        if status or not req.finished:
            conclude(req, status)
        else:
            record(req, req.logged)         # answered in full
        self._done(req)

    def fallback(self, req: HTTP1Request) -> None:
        """A handler's `begin` took `req` but cannot answer it from callbacks after all
        (nothing was sent): answer it with `handle` in a task, as usual."""
        req.cancel = None
        if self._active is req:
            req.task = self.loop.create_task(run(req))

    def conclude(self, req: HTTP1Request, status: int) -> None:
        """`dispatch.answer`'s outcome for the request being answered."""
        if self._active is not req:
            return                          # the connection was lost: nothing to say
        if status == GONE:
            # Not from this connection (it is still here): the answer cannot go on.
            status = 500
        conclude(req, status)
        self._done(req)

    def _done(self, req: HTTP1Request) -> None:
        """`req` is answered and recorded: the connection goes on to the next, or ends."""
        self.bytes_out += req.sent
        self._active = None
        if req.body is not None and not req.body.done:
            if req.keep_alive:
                req.body.discard()        # read and drop the rest to reach the next request
            else:
                req.body.abort()
        if not req.keep_alive:
            self.close_now()
            return
        if self._queue:
            self._run_queue()

    def close_now(self) -> None:
        """The answer just written was the last: nothing after it is read or answered."""
        self._enter(CLOSING)
        for waiting in self._queue:
            waiting.abandon()
        self._queue.clear()
        if self.transport is not None:
            self.transport.close()

    def _run_queue(self) -> None:
        """The answers waiting take their turns while the client takes the bytes."""
        queue = self._queue
        while queue and not self.write_paused:
            if not queue.popleft().take_turn():
                break
        if self._held is not None:
            self._release()

    def _fail(self, status: int, response=None) -> None:
        """A protocol error or limit: answer `status` (or `response`) after what is
        ahead, then close."""
        if self._closing_transport():
            return       # bytes after a closing response: nothing more is answered
        self._enter(CLOSING)
        self.state = IDLE
        response = response or ERRORS.get(status) or ERRORS[400]
        broken, self._parsing = self._parsing, None
        if broken is not None:
            # The request whose body broke the rules gets the error as its answer.
            broken.body.abort(ConnectionResetError(f"request body refused ({status})"))
            if broken is self._active:
                if broken.started:
                    self.transport.close()     # a response is under way: only cutting is left
                    return
                broken.task.cancel()
                self._active = None
            elif broken in self._queue:
                self._queue.remove(broken)
        if self._active is None and not self._queue:
            self.write_closing(response)
        else:
            self._queue.append(_ReadyAnswer(self, response, self.close_mode, False))
        ready(self, UNROUTED, response, response.content_length, b"-", b"", "-", "",
              self._headers, self._t0)
        if status == 400:
            BANS.note("malformed", self.client)      # [[ban]] rules on = "malformed"

    def _close_when_idle(self) -> None:
        """The connection ends after the answers ahead: the last of them says so."""
        if self._queue:
            self._queue[-1].end_connection()
        elif self._active is not None:
            self._active.end_connection()
        elif self.transport is not None:
            self.transport.close()

    # ------------------------------------------------------------ worker hooks
    def tick(self, elapsed: float) -> None:
        """Called by the worker's tick with the seconds since the last one."""
        transport = self.transport
        if transport is not None and \
                self._send_watch.stuck(transport, elapsed, self.limits.send_timeout):
            cut(transport)
            return
        if self.phase >= CLOSING:
            return
        state = self.state
        if state == IDLE and (self._active is not None or self._queue):
            self._stalled = 0.0              # answering, not waiting for the client
            self._seen = None
            return
        progress = (self._requests, state)
        if progress != self._seen or self._body_progress:
            self._seen = progress
            self._body_progress = False
            self._stalled = 0.0
            return
        self._stalled += elapsed
        if state == HEAD:
            limit = self._header_timeout
        elif state == BODY:
            limit = self._body_timeout
        elif self.ctx.draining:
            limit = DRAIN_IDLE_GRACE
        else:
            limit = self._keepalive_timeout if self._requests else self._header_timeout
        if self._stalled < limit or self._closing_transport():
            return
        if state == IDLE:
            self._enter(CLOSING)
            self.transport.close()
        else:
            self._fail(408)           # after any answer still ahead of it

    def finish_and_close(self) -> None:
        """Graceful stop. In-flight requests finish and are answered with
        `connection: close`; an idle connection may still send one request for
        DRAIN_IDLE_GRACE, then the tick closes it."""
        self._keepalive_requests = 0         # every answer from now on ends the connection


class ProxyProtocolConnection(HTTP1Connection):
    """A connection on a listener that takes PROXY protocol v1/v2 headers, read here
    before httptools sees a byte. Only peers in the listener's `proxy_protocol_from`
    may send one (the header is optional for them); anyone else sending one gets 400."""

    first_phase = PROXY_HEADER
    _pp_buf = b""

    def data_received(self, data: bytes) -> None:
        if self.phase != PROXY_HEADER:
            return HTTP1Connection.data_received(self, data)
        buf = self._pp_buf + data
        try:
            parsed = take_proxy_header(buf, self.peer, self.ctx.proxy_protocol_from)
        except ProxyHeaderError:
            return self._refuse()
        if parsed is None:
            self._pp_buf = buf
            return
        consumed, source = parsed
        self._enter(OPEN)
        self._pp_buf = b""
        if source:
            self.set_client(source)
            if self.ctx.bans is not None and self.ctx.bans.refuses(self):
                self._enter(CLOSING)
                return
        if len(buf) > consumed:
            HTTP1Connection.data_received(self, buf[consumed:])

    def _refuse(self) -> None:
        self._enter(CLOSING)
        if not self._closing_transport():
            self.write_closing(ERRORS[400])
