"""HTTP/1.1 on httptools: one `HTTP1Connection` per client connection, the HTTP/1
adapter of the request pipeline (see `nestgate.pipeline.dispatch`).

Theory of operation
-------------------
The connection is put together from one part per job, each a mixin in its own module,
composed here at class definition (so a request pays no call or lookup for the split):

  module               part            its job
  nestgate.wire.h1phases    Phases          the phases and their table of allowed moves
  nestgate.wire.h1parse     RequestReader   httptools' callbacks: limits, framing, the route,
                                       a ready answer written from the callback
  nestgate.wire.h1request   HTTP1Request    a handler's answer as HTTP/1 bytes
  nestgate.wire.h1queue     AnswerQueue     pipelined answers in order; error answers
  nestgate.base.later       LaterOutput     ready answers written after the batch of reads
  nestgate.wire.h1pacing    ReadPacing      when reading stops and starts again
  nestgate.wire.h1tunnel    Tunnels         upgrade requests and the tunnels after them
  nestgate.wire.h1proxyheader               a PROXY protocol header before the first request

This module keeps the transport's callbacks (a connection made, bytes read, lost), the
client's name and the worker's tick.

Every response says `connection: keep-alive` or `connection: close` (as nginx
does), so the answer never depends on the request's minor version. Once a request is
the last one (`keepalive_requests`, `Connection: close`, a drain), nothing after it is
parsed: the rest is dropped.

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

import httptools

from nestgate.pipeline.dispatch import take_peer
from nestgate.base.errorpages import DEFAULT_PAGES, ERRORS
from nestgate.base.errors import RequestError
from nestgate.base.flow import Writable
from nestgate.wire.h1pacing import FEED_SLICE, PIPELINE_HIGH, WRITE_HIGH_WATER, ReadPacing
from nestgate.base.later import LATER, LaterOutput
from nestgate.wire.h1parse import AfterLast, RequestReader
from nestgate.wire.h1phases import (BODY, CLOSED, CLOSING, HEAD, IDLE, OPEN, TUNNEL, UPGRADING,
                                   Phases)
from nestgate.wire.h1queue import AnswerQueue
from nestgate.wire.h1request import HTTP1Request
from nestgate.wire.h1tunnel import Tunnels
from nestgate.pipeline.ratelimit import count_connection, uncount_connection
from nestgate.pipeline.request import Body
from nestgate.base.responses import ALT_SVC, CLOSE, CONTINUE, KEEP_ALIVE_EXPLICIT
from nestgate.base.sendwatch import SendWatch, cut
from nestgate.base.tally import UNROUTED

log = logging.getLogger("nestgate.http1")

# How an HTTP/2 client with prior knowledge starts (RFC 9113 3.4): told apart from other
# malformed requests so that it gets a hint instead of a bare 400.
H2_PREFACE_LINE = b"PRI * HTTP/2.0\r\n"
DRAIN_IDLE_GRACE = 1.0            # seconds an idle connection may still send one request


class HTTP1Connection(Phases, RequestReader, AnswerQueue, ReadPacing, Tunnels,
                      asyncio.Protocol):
    """One client connection. `ctx` is the listener's `ServerContext`."""

    first_phase = OPEN
    protocol = "HTTP/1.1"         # as the request log writes a ready answer

    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self.limits = ctx.limits
        # How ready answers end their head (nestgate.base.responses' modes): after an
        # Alt-Svc line on a listener that also serves HTTP/3.
        alt = ALT_SVC if ctx.alt_svc else 0
        self.keep_alive_mode, self.close_mode = KEEP_ALIVE_EXPLICIT + alt, CLOSE + alt
        self._known_site = ctx.router.memo.get     # the router's Host memo, asked first
        self.loop = ctx.loop
        self.transport = None
        self._later = None             # a ready answer waiting for the batch's end (nestgate.base.later)
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
        self._chunk_allowance = limits.body_chunk_allowance
        self._min_chunk_average = limits.min_body_chunk_average
        self.client = ""
        self.peer = ""                 # socket peer, or the address a PROXY header gave
        self.decisions = None          # access decisions for this peer (nestgate.pipeline.access)
        self.client_tag = 0            # counted under max_connections_per_client (ratelimit)
        self.xff_trusted = False      # the peer may tell us the client in X-Forwarded-For
        self.scheme = ctx.scheme       # the client's (take_peer, refresh_client)
        self.known_plain = False       # the client is known to be on plain HTTP
        self._sink = None              # after an upgrade: where client bytes go (h1tunnel)
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
        # (`HTTP1Request`s and `ReadyAnswer`s)
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
        self._pieces: list = []        # body pieces of the read being parsed (h1parse)
        self._chunks_counted = 0       # body pieces on this connection (h1parse._pass_body)
        self._chunk_bytes = 0          # bytes of the bodies finished on this connection
        self._sync = None
        self._parsing: HTTP1Request | None = None     # async request whose body is arriving
        self._t0 = 0.0

    # ------------------------------------------------------------ transport
    def connection_made(self, transport) -> None:
        self.transport = transport
        self._later = LaterOutput(transport)
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

    def eof_received(self) -> None:
        # The client sent its last bytes: the transport closes itself after this
        # returns, so a ready answer still waiting for the batch's end goes out first.
        # (libuv stops reading a socket at a short read, so the end usually comes a
        # poll later, after the batch's flush; a read that filled its buffer does not.)
        self.write_later()

    @property
    def served(self) -> int:
        """Requests read on this connection so far (for the worker's figures)."""
        return self._requests

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

    def _closing_transport(self) -> bool:
        return self.transport is None or self.transport.is_closing()

    def write_later(self) -> None:
        """Write the ready answer waiting for the batch's end (nestgate.base.later)
        now: before any other write or a close, so answers keep their order."""
        if self._later.parts:
            self._later.flush()

    def write_ready(self, response, mode: int, head_only: bool) -> None:
        """A ready `response` that keeps the connection open, written after this batch
        of reads (nestgate.base.later); at once, behind the one waiting, when another
        waits (pipelined requests)."""
        later = self._later
        if later.parts:
            later.flush()
            self.bytes_out += response.write_to(self.transport, mode, head_only)
        else:
            LATER.add(later, self.loop)
            self.bytes_out += response.write_to(later, mode, head_only)

    def write_last(self, data: bytes) -> None:
        """The last bytes of an answer (a proxied response whole in one upstream read),
        written after this batch of reads like a ready answer."""
        LATER.append(self._later, data, self.loop)

    def write(self, data: bytes) -> None:
        """Bytes of a `Request`'s answer (counted in its `sent`)."""
        if self._later.parts:
            self._later.flush()
        if not self.transport.is_closing():
            self.transport.write(data)

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
            if isinstance(cause, AfterLast):
                self._enter(CLOSING)         # answered up to the last; drop the rest
                return
            status = cause.status if isinstance(cause, RequestError) else 500
            if status == 500:
                log.exception("request callback failed", exc_info=cause)
            self._fail(status)
        except httptools.HttpParserUpgrade as exc:
            if self._upgrade(data, exc.args[0]):      # accepted (nestgate.wire.h1tunnel)
                return
        except httptools.HttpParserError:
            if not self._requests and bytes(data[:len(H2_PREFACE_LINE)]) == H2_PREFACE_LINE:
                self._fail(400, DEFAULT_PAGES.h2c_off)
                return
            self._fail(400)
            return
        if self.state:
            self._unfinished(len(data))
        if self.write_paused or self._queue and len(self._queue) > PIPELINE_HIGH:
            if self.phase < CLOSING:
                self._hold(b"")

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
            self.write_later()
            self.transport.close()
        else:
            self._fail(408)           # after any answer still ahead of it

    def end_banned(self) -> None:
        """Its client was banned while it was open (nestgate.bans.watch, `ban_answer =
        "close"`): the answers under way go out, the last saying `connection: close`,
        and the connection ends, at once when idle (a graceful stop's grace for one more
        request is not given); a tunnel is cut."""
        if self.phase in (CLOSING, CLOSED):
            return
        if self.phase in (UPGRADING, TUNNEL):
            self.transport.close()
            return
        self._enter(CLOSING)
        self._close_when_idle()

    def finish_and_close(self) -> None:
        """Graceful stop. In-flight requests finish and are answered with
        `connection: close`; an idle connection may still send one request for
        DRAIN_IDLE_GRACE, then the tick closes it."""
        self._keepalive_requests = 0         # every answer from now on ends the connection
