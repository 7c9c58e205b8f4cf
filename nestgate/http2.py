"""HTTP/2 over TLS (ALPN "h2"), on `nestgate.h2engine`, answering from the same routes.

Theory of operation
-------------------
`ALPNSwitch` is the protocol a TLS listener starts with: once the handshake is done
it looks at what ALPN chose and hands the transport to an `HTTP2Connection` or to
the listener's HTTP/1.1 protocol. Handlers see the same `Request` interface as on
HTTP/1.1 (`H2Request` speaks frames instead of bytes): a synchronous handler's
`Prebuilt` response is sent from the event callback, an asynchronous one runs as a
task per stream. Streams are independent, so there is no pipelining queue.

Flow control: request body data is acknowledged (window reopened) as the handler
consumes it, so a slow handler holds back the client instead of buffering; response
data waits for the client's window. A handler that reads its body from somewhere
asks `room` first, so it reads nothing ahead of the window (ROOM_MIN past a small
one) and a connection's streams together hold at most OUTPUT_BUDGET unsent; no
DATA frame of a streamed answer is written while the transport is over its
high-water mark.

Malformed requests (bad fields, missing or repeated pseudo-fields, connection-
specific fields, a Host other than :authority or repeated) are checked here, so they
cost their stream a 400 and the connection goes on (RFC 9113 8.1.1); the engine checks
the frames and stream states, and holds a body to its one content-length (anything
else is RST_STREAM(PROTOCOL_ERROR)), the length the proxy announces upstream.

A `Prebuilt` answer carries its header block encoded once (`h2_block`); with the Date
field (encoded once a second) it goes out as HEADERS and DATA frames from the event
callback, with no task and no encoder.

Abuse: `FrameGuard` reads the frame headers of every read before the engine parses it and
ends the connection with GOAWAY(ENHANCE_YOUR_CALM) on a flood of frames that carry no
request (PING, SETTINGS, WINDOW_UPDATE, PRIORITY, empty DATA) or a header block past
`max_header_bytes`, each bound named below. A stream costs work (a task, maybe an
upstream request) before the client can cancel it, so streams the client resets
before they were answered are counted and too many end the connection with
GOAWAY(ENHANCE_YOUR_CALM) (rapid reset, CVE-2023-44487). A connection carries at
most `keepalive_requests` streams.

Ending gracefully: on a reload or a stop the connection goes on serving until the client
has no stream open, for at most DRAIN_BUSY_GRACE. No stream open here may still mean
streams on their way, and a client that has just read an answer often sends the next
request at once: so the quiet must last QUIET_GRACE, and then a PING confirms it (its
ACK comes after every stream the client sent before it). Still none open then (curl and
Chromium between their requests, httpx between its own), the GOAWAY goes out; a stream
that came meanwhile is served and the next quiet moment is confirmed again. A client that
has opened each stream (three at least, none two in one read) only once the one before was
answered, as a proxy's pooled connection does, may send its next request the moment it has
read an answer, and nginx's grpc module fails (502), rather than retries, a request that
crosses a GOAWAY: such a client gets the GOAWAY in the same write as the next answer.
Past DRAIN_BUSY_GRACE, or once `keepalive_requests` streams were opened, the connection
picks the last stream it serves and holds (neither starts nor resets) any the client
opens above it; when every stream served is answered, the GOAWAY goes out right behind
the final frame of the last answer.
It is one GOAWAY(NO_ERROR) naming the last stream served, and nothing follows it but the
close, DRAIN_IDLE_GRACE later unless the client closes first: the h2 library (under
httpx) takes no frame after a GOAWAY, not even a PING or the answer to a stream in
flight. A held stream, above the GOAWAY's last stream, was provably not processed, so a
client retries it on a new connection (RFC 9113 6.8), though curl 7.88 retries only one
of several. RFC 9113's two-step stop (GOAWAY(2^31-1), a PING, the final GOAWAY) loses
the requests of clients that read no frame after a GOAWAY. A fault while handling a read ends only its connection,
with GOAWAY(INTERNAL_ERROR) and one log line. The worker's tick resets a stream that
waited `send_timeout` for the client's window, or `body_timeout` for request body
data the handler is ready to take.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import struct

from nestgate import h2engine as engine
from nestgate.h2engine import (CANCEL, ENHANCE_YOUR_CALM,
                               INTERNAL_ERROR, NO_ERROR, ConnectionError_,
                               StreamClosedError, encode_field, encode_fields)
from nestgate.dispatch import (GONE, conclude, open_stream, record, refresh_client, refuse,
                               start, take_peer)
from nestgate.fieldhead import pairs_of, read_head, ready_fields, response_fields
from nestgate.clock import CLOCK
from nestgate.errors import HandlerError, RequestError
from nestgate.http1 import DRAIN_IDLE_GRACE, HTTP1Connection
from nestgate.request import Body, Request
from nestgate.flow import Writable
from nestgate.responses import SERVER, alt_svc_value
from nestgate.ratelimit import count_connection, uncount_connection
from nestgate.tally import H2_PROTECTIONS, TALLY, UNROUTED
from nestgate.sendwatch import SendWatch, cut

log = logging.getLogger("nestgate.http2")

MAX_CONCURRENT_STREAMS = 128     # advertised; a stream past it is refused alone
# Rapid reset (CVE-2023-44487). A browser leaving a page cancels what it has in
# flight, at most MAX_CONCURRENT_STREAMS at a time, so a few hundred resets are
# ordinary. Past RESET_ALLOWANCE, a connection on which the client reset more than
# half of the streams it opened (before they were answered) is only making us work
# for nothing; RESET_CAP bounds the resets of any connection whatever its streams
# (it matters when `keepalive_requests` allows more than that many streams).
RESET_ALLOWANCE = 2 * MAX_CONCURRENT_STREAMS
RESET_CAP = 1000


def too_many_resets(wasted: int, opened: int) -> bool:
    """Whether a client that reset `wasted` of the `opened` streams before their answer
    only makes us work for nothing (HTTP/3 holds its clients to the same rule)."""
    return wasted >= RESET_CAP or (wasted > RESET_ALLOWANCE and 2 * wasted > opened)


_NO_GOAWAY = 1 << 31              # above any stream id: every stream is served
_QUIET_PING = b"nestgate"         # asks whether a stopping connection is really quiet
DRAIN_BUSY_GRACE = 5.0            # seconds a stopping connection serves new streams
QUIET_GRACE = 0.2                 # seconds without a stream before a stopping one asks
# A decoded header list may exceed `max_header_bytes` (the request gets 431 and the
# connection goes on) up to this many times it; past that it is an HPACK bomb and the
# connection ends (COMPRESSION_ERROR).
DECODED_LIST_FACTOR = 4
# Decoded header blocks all the connections of this worker keep together (each at most
# h2engine.DECODED_CONNECTION_BYTES): 64 connections' worth, whatever max_connections
# allows. Past it a connection decodes every block, which costs CPU, not memory.
DECODED_BUDGET = engine.DecodedBudget(4 * 1024 * 1024)

# Frames a client may send that carry no request. Each costs us work, and PING and
# SETTINGS an answer, so a flood of them alone can hold a worker: each kind has a
# bound, passing it ends the connection with GOAWAY(ENHANCE_YOUR_CALM). The frame
# headers are counted as bytes arrive, before they are parsed, so a flood in one read
# is stopped before any of it is handled.
# PING and SETTINGS (each acknowledged): Envoy lets a client leave at most 1000
# control frames unread (max_outbound_control_frames); we allow that many at once,
# then 100 a second over the connection's life. A browser sends a handful. A SETTINGS
# frame counts as many as the entries it holds (up to 2,730 in one frame; a browser
# sends about six), each being work to check and apply.
CONTROL_FRAME_BURST = 1000
CONTROL_FRAMES_PER_SECOND = 100
# PRIORITY: Envoy's max_inbound_priority_frames_per_stream (100), per stream opened.
PRIORITY_FRAMES_PER_STREAM = 100
# WINDOW_UPDATE: Envoy's max_inbound_window_update_frames_per_data_frame_sent (10):
# a client opens windows for what we send it, so at most 5 + 2 x (streams opened +
# 10 x DATA frames sent) of them, as Envoy counts.
WINDOW_UPDATES_PER_DATA_FRAME = 10
# DATA, HEADERS and CONTINUATION frames with nothing in them and no END_STREAM move
# nothing forward: Envoy's max_consecutive_inbound_frames_with_empty_payload (1).
EMPTY_FRAMES_IN_A_ROW = 1
# One header block (HEADERS and its CONTINUATION frames) is held whole until it ends:
# it may take `max_header_bytes`, the SETTINGS_MAX_HEADER_LIST_SIZE we advertise (a
# list within it never encodes larger: each field counts 32 bytes more there than its
# literal costs), plus padding (256), a priority (5) and table-size updates.
HEADER_BLOCK_SLACK = 256 + 5 + 16
# Response body read ahead of the client's window (`H2Request.room`): a stream may
# read a frame's worth past a small window, nothing at all with none, and all streams
# of a connection together hold at most OUTPUT_BUDGET bytes not yet sent.
ROOM_MIN = 16 * 1024
OUTPUT_BUDGET = 1024 * 1024
# Frames a handler sends are written at the end of the loop's turn, all at once (one
# TLS record and one syscall for the HEADERS, DATA and END_STREAM of an answer, and for
# the answers of other streams made in the same turn), or at once when this many body
# bytes wait, so that the transport's high-water mark still holds a producer back.
FLUSH_AT = 64 * 1024

_PREFACE_BYTES = 24                # "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_FRAME_HEAD = struct.Struct(">IBI")   # length (24 bits) and type; flags; stream id
_DATA, _HEADERS, _PRIORITY, _SETTINGS = 0x0, 0x1, 0x2, 0x4        # frame types
_PING, _WINDOW_UPDATE, _CONTINUATION = 0x6, 0x8, 0x9
_END_STREAM = _ACK = 0x1
_END_HEADERS = 0x4


class ALPNSwitch:
    """Starts every TLS connection; becomes HTTP/2 or HTTP/1.1 as ALPN decided."""

    def __init__(self, ctx, http1_factory) -> None:
        self.ctx = ctx
        self.http1_factory = http1_factory

    def connection_made(self, transport) -> None:
        ssl_object = transport.get_extra_info("ssl_object")
        chosen = ssl_object.selected_alpn_protocol() if ssl_object is not None else None
        protocol = HTTP2Connection(self.ctx) if chosen == "h2" else self.http1_factory()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)

    def connection_lost(self, exc) -> None:
        pass

    def data_received(self, data) -> None:  # not reached: replaced in connection_made
        raise RuntimeError("ALPNSwitch received data before choosing a protocol")

    def eof_received(self):
        return None

    def pause_writing(self) -> None:
        pass

    def resume_writing(self) -> None:
        pass


def h2_block(response) -> bytes:
    """The header block of a `Prebuilt` without its Date, encoded once and kept."""
    block = response.h2_cache
    if block is not None:
        return block
    block = response.h2_cache = encode_fields(ready_fields(response))
    return block


class PriorKnowledge:
    """Starts every connection of a plain listener with `http2_cleartext = true`: a
    client whose first bytes are the HTTP/2 connection preface speaks HTTP/2 in clear
    ("h2c" with prior knowledge, RFC 9113 3.3), any other HTTP/1.1. Counted among the
    worker's connections from the accept, and closed if the first bytes take
    `header_timeout`, as a request head would be."""

    served = 0                         # no request yet (for the worker's figures)
    bytes_in = bytes_out = 0

    def __init__(self, ctx, http1_factory) -> None:
        self.ctx = ctx
        self.http1_factory = http1_factory
        self.transport = None
        self._seen = b""
        self._age = 0.0

    def connection_made(self, transport) -> None:
        self.transport = transport
        if len(self.ctx.connections) >= self.ctx.limits.max_connections:
            transport.close()
            return
        self.ctx.connections.add(self)

    def data_received(self, data: bytes) -> None:
        seen = self._seen + data
        if len(seen) < len(engine.PREFACE) and engine.PREFACE.startswith(seen):
            self._seen = seen
            return                     # not sure yet
        self.ctx.connections.discard(self)
        protocol = HTTP2Connection(self.ctx) if seen.startswith(engine.PREFACE) \
            else self.http1_factory()
        self.transport.set_protocol(protocol)
        protocol.connection_made(self.transport)
        if not self.transport.is_closing():
            protocol.data_received(seen)

    def connection_lost(self, exc) -> None:
        self.ctx.connections.discard(self)

    def eof_received(self):
        return None

    def pause_writing(self) -> None:
        pass

    def resume_writing(self) -> None:
        pass

    def tick(self, elapsed: float) -> None:
        self._age += elapsed
        if self._age >= self.ctx.limits.header_timeout and not self.transport.is_closing():
            self.transport.close()

    def finish_and_close(self) -> None:
        self.transport.close()         # no request has begun


class _DateField:
    """The Date field as HPACK bytes, encoded again only when the clock's date moves;
    on a listener that also serves HTTP/3, its Alt-Svc field follows (`extra`), so the
    answers there carry it at no cost of their own."""

    __slots__ = ("date", "field", "extra")

    def __init__(self, extra: bytes = b"") -> None:
        self.date = None
        self.field = b""
        self.extra = extra

    def current(self) -> bytes:
        date = CLOCK.date
        if date is not self.date:
            self.date, self.field = date, encode_field(b"date", date) + self.extra
        return self.field


DATE_FIELD = _DateField()


def date_field(ctx) -> _DateField:
    """The Date field of the answers on `ctx`'s listener (see _DateField)."""
    if not ctx.alt_svc:
        return DATE_FIELD
    value = alt_svc_value()
    found = _ALT_SVC_DATES.get(value)
    if found is None:
        found = _ALT_SVC_DATES[value] = _DateField(encode_field(b"alt-svc", value))
    return found


_ALT_SVC_DATES: dict[bytes, _DateField] = {}

# (status, header lines, length, Server) -> the encoded fields of a proxied head (`start_raw`),
# cleared when full rather than grown by an upstream that varies its headers; only heads
# of up to _RAW_BLOCK_MAX bytes, so it holds about 1 MB at most.
_RAW_BLOCKS: dict[tuple, bytes] = {}
_RAW_BLOCKS_LIMIT = 256
_RAW_BLOCK_MAX = 2048


# Why a protection ended a connection or a stream: the key of its counter
# (nestgate.tally's H2_PROTECTIONS, the `nestgate_http2_protections` metric) and the
# words of its log line.
PROTECTIONS = {
    "control_flood": "PING/SETTINGS flood",
    "window_update_flood": "WINDOW_UPDATE flood",
    "priority_flood": "PRIORITY flood",
    "empty_frames": "empty frame flood",
    "header_block": "header block over max_header_bytes",
    "header_timeout": "preface or header block not complete within header_timeout",
    "rapid_reset": "streams reset before their answer (rapid reset)",
    "protocol_error": "protocol error",
    "send_timeout": "stream waited send_timeout for the client's window",
}
assert tuple(PROTECTIONS) == H2_PROTECTIONS


class FrameGuard:
    """Counts what a client's frames cost before they are parsed: bytes in, the
    reason to end the connection out (a key of PROTECTIONS, or None). It reads only the 9-byte frame
    headers, so it runs in front of any frame engine and costs a few operations per
    frame; the payloads are left to the engine."""

    __slots__ = ("skip", "partial", "born", "block_limit", "last_stream", "opened",
                 "data_sent", "control", "priorities", "window_updates", "empty", "block")

    def __init__(self, max_header_bytes: int, now: float) -> None:
        self.skip = _PREFACE_BYTES     # payload bytes of the frame under way
        self.partial = b""             # a frame header split between reads
        self.born = now
        self.block_limit = max_header_bytes + HEADER_BLOCK_SLACK
        self.last_stream = self.opened = 0
        self.data_sent = 0             # DATA frames we sent (the connection counts)
        self.control = self.priorities = self.window_updates = self.empty = 0
        self.block = 0                 # bytes of the header block under way

    def feed(self, data: bytes, now: float) -> str | None:
        if self.partial:
            data, self.partial = self.partial + data, b""
        pos, end = self.skip, len(data)
        unpack = _FRAME_HEAD.unpack_from
        while pos + 9 <= end:
            head, flags, stream = unpack(data, pos)
            length, kind = head >> 8, head & 0xFF
            pos += 9 + length
            if kind == _DATA:
                why = self._payload(length, flags & _END_STREAM)
            elif kind == _HEADERS or kind == _CONTINUATION:
                why = self._header_frame(kind, flags, stream & 0x7FFFFFFF, length)
            elif kind == _PING:
                why = None if flags & _ACK else self._control(now, 1)
            elif kind == _SETTINGS:
                # Each entry is work (checked, maybe applied): entries are what counts.
                # (A frame past the frame size is the engine's FRAME_SIZE_ERROR.)
                why = None if flags & _ACK else self._control(
                    now, length // 6 if 6 <= length <= engine.DEFAULT_FRAME_SIZE else 1)
            elif kind == _WINDOW_UPDATE:
                self.window_updates += 1
                why = "window_update_flood" if self.window_updates > 5 + 2 * (
                    self.opened + WINDOW_UPDATES_PER_DATA_FRAME * self.data_sent) else None
            elif kind == _PRIORITY:
                self.priorities += 1
                why = "priority_flood" if self.priorities > \
                    PRIORITY_FRAMES_PER_STREAM * (1 + self.opened) else None
            else:
                continue
            if why is not None:
                return why
        if pos >= end:
            self.skip = pos - end
        else:
            self.skip, self.partial = 0, data[pos:]
        return None

    def _payload(self, length: int, ends: int) -> str | None:
        if length:
            self.empty = 0
        elif not ends:
            self.empty += 1
            if self.empty > EMPTY_FRAMES_IN_A_ROW:
                return "empty_frames"
        return None

    def _header_frame(self, kind: int, flags: int, stream: int, length: int) -> str | None:
        if kind == _HEADERS:
            self.block = 0
            if stream > self.last_stream:
                self.last_stream = stream
                self.opened += 1
        self.block += length
        if self.block > self.block_limit:
            return "header_block"
        if flags & _END_HEADERS:
            self.block = 0
            return self._payload(length, 1)
        return self._payload(length, flags & _END_STREAM and kind == _HEADERS)

    def _control(self, now: float, count: int) -> str | None:
        self.control += count
        if self.control > CONTROL_FRAME_BURST and self.control > \
                CONTROL_FRAME_BURST + CONTROL_FRAMES_PER_SECOND * (now - self.born):
            return "control_flood"
        return None


class _StreamFlow:
    """What `Body` needs from its connection, for one stream."""

    __slots__ = ("conn", "stream_id", "paused", "unacked", "loop", "_active",
                 "ended", "seen", "stalled")

    def __init__(self, conn: HTTP2Connection, stream_id: int) -> None:
        self.conn = conn
        self.stream_id = stream_id
        self.loop = conn.loop
        self.paused = False
        self.unacked = 0
        self.ended = False         # the client sent the whole body
        self.seen = 0              # body bytes received at the last tick
        self.stalled = 0.0         # seconds since the body last grew (tick's view)

    def pause_reading_for_body(self) -> None:
        self.paused = True

    def resume_reading_for_body(self) -> None:
        if self.paused:
            self.paused = False
            if self.unacked:
                self.conn.acknowledge(self.stream_id, self.unacked)
                self.unacked = 0

    def send_continue(self) -> None:
        pass                   # HTTP/2 clients do not wait for 100 on their own


class H2Request(Request):
    """A Request whose answer goes out as HEADERS and DATA frames on one stream."""

    __slots__ = ("stream_id", "flow", "granted")

    protocol = "HTTP/2"

    def start(self, status: int, headers, content_length: int | None = None) -> None:
        pairs = [(n.encode("latin-1") if isinstance(n, str) else n,
                  v.encode("latin-1") if isinstance(v, str) else v) for n, v in headers]
        self._start_pairs(status, pairs, content_length)

    def start_raw(self, status: int, block: bytes, content_length: int | None = None) -> None:
        # A proxied response's head: the same few heads come back from an upstream
        # again and again, so each is encoded once (without its Date) and kept.
        kept = len(block) <= _RAW_BLOCK_MAX
        key = (status, block, content_length, SERVER.value)
        encoded = _RAW_BLOCKS.get(key) if kept else None
        if encoded is None:
            encoded = encode_fields(response_fields(status, pairs_of(block), content_length))
            if kept:
                if len(_RAW_BLOCKS) >= _RAW_BLOCKS_LIMIT:
                    _RAW_BLOCKS.clear()
                _RAW_BLOCKS[key] = encoded
        self._send_head(status, encoded + self.connection.date_field.current())

    def _start_pairs(self, status, pairs, content_length) -> None:
        self._send_head(status, encode_fields(response_fields(status, pairs, content_length))
                        + self.connection.date_field.current())

    def _send_head(self, status: int, block: bytes) -> None:
        if self.started:
            raise RuntimeError("response already started")
        self.started = True
        self.status = status
        self.connection.send_block(self.stream_id, block, end_stream=self.head_only)
        if self.head_only:
            self.finished = True

    async def write(self, data: bytes) -> None:
        if not self.started:
            raise RuntimeError("write before start")
        if self.head_only or not data:
            return
        self.sent += len(data)
        conn = self.connection
        if self.stream_id in conn.outboxes:          # behind pushed data: keep the order
            conn.queue_data(self.stream_id, data)
            await conn.wait_sent(self.stream_id)
        else:
            await conn.send_data(self.stream_id, data)
        if self.granted:
            conn.release(self, len(data))

    async def room(self, wanted: int) -> int:
        # Nothing is read ahead of the client's window (beyond ROOM_MIN) nor past the
        # connection's OUTPUT_BUDGET: a client that grants no window holds no data.
        granted = await self.connection.room(self.stream_id, wanted)
        self.granted += granted
        return granted

    def push(self, data: bytes) -> bool:
        # Frames need the client's window: queue them (in order) and tell the caller
        # to wait with `connection.wait_writable()`.
        if self.head_only or not data:
            return False
        self.sent += len(data)
        self.connection.queue_data(self.stream_id, data)
        return True

    async def send_prebuilt(self, response) -> None:
        self.started = True
        self.status = response.status
        body = b"" if self.head_only else response.body
        conn = self.connection
        conn.send_block(self.stream_id, h2_block(response) + conn.date_field.current(),
                        end_stream=not body)
        if body:
            self.sent += len(body)
            await self.connection.send_data(self.stream_id, body, end=True)
        self.finished = True

    def answer_ready(self, response) -> None:
        """The whole answer from a ready response (an error page), without waiting."""
        conn = self.connection
        if conn.transport.is_closing():
            return
        self.started = self.finished = True
        self.status = response.status
        self.sent = conn.send_ready(self.stream_id, response, self.head_only)
        conn._flush_soon()

    def cut(self) -> None:
        self.connection._reset(self.stream_id, INTERNAL_ERROR)

    def take_over(self, head: bytes) -> bytes:
        raise HandlerError(501, "HTTP/2 has no protocol upgrade")   # RFC 9113 8.6

    def end(self) -> None:
        if self.finished:
            return
        self.finished = True
        self.connection.end_stream(self.stream_id)


class HTTP2Connection:
    """One HTTP/2 client connection (after ALPN chose h2)."""

    protocol = "HTTP/2"           # as the request log writes it

    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self.router = ctx.router         # (a banned client's page instead: `serve_only`)
        self.limits = ctx.limits
        self.loop = ctx.loop
        self.date_field = date_field(ctx)
        self.transport = None
        self.client = self.peer = ""
        self.decisions = None
        self.client_tag = 0            # counted under max_connections_per_client (ratelimit)
        self.xff_trusted = False       # the peer may tell us the client in X-Forwarded-For
        self.logging = False
        self.write_paused = False
        self._stalled = 0.0
        self._send_watch = SendWatch()
        self._draining = False
        self._goaway_sent = False
        self._goaway_wait = 0.0          # seconds since our GOAWAY: the client's turn to close
        self._drain_busy = 0.0           # seconds stopping with streams open
        self._client_left = False        # the client's own GOAWAY came: no grace for it
        self._quiet_ping = False         # a PING out to confirm no stream is on its way
        self._quiet_wait = 0.0
        self._quiet_for = 0.0            # seconds stopping with no stream open or opened
        self._quiet_mark = 0             # the highest stream id when that began
        self._multiplexed = False        # the client has had two streams open at once
        self._alone = 0                  # streams opened alone in their read, none open
        self._answer_ended = False       # an answer ended since the last _idle
        self._opened = 0               # streams accepted, for keepalive_requests
        self.bytes_in = 0              # HTTP/2 bytes read and written, frames and all
        self.bytes_out = 0
        self._wasted = 0               # streams reset by the client before an answer
        self._last_stream = _NO_GOAWAY  # the last stream served (see "Ending gracefully")
        self._sending: set[int] = set()   # streams answered by a background send
        self._streams: dict[int, H2Request] = {}
        self._window_waiters: dict[int, asyncio.Future] = {}
        self._window_stalled: dict[int, tuple[asyncio.Future, float]] = {}  # tick's view
        self.outboxes: dict[int, collections.deque] = {}   # data queued by `push`, per stream
        self._sent_waiters: dict[int, list[asyncio.Future]] = {}
        self._end_after: set[int] = set()
        self._writable = Writable()      # senders waiting for the transport to take more
        self._guard = FrameGuard(self.limits.max_header_bytes, CLOCK.now)
        self._granted = 0                  # body bytes `room` let handlers hold unsent
        self._budget: asyncio.Future | None = None   # woken when some are sent
        self._unflushed = 0            # body bytes queued in the engine, not yet written
        self._header_mark = -1         # the engine's header block the tick is timing
        self._header_wait = 0.0        # ... and for how long it has been under way
        self._flush_pending = False    # a write at the end of this turn is scheduled
        self.h2 = engine.H2Engine(MAX_CONCURRENT_STREAMS, self.limits.max_header_bytes,
                                  DECODED_LIST_FACTOR * self.limits.max_header_bytes,
                                  DECODED_BUDGET)

    # ------------------------------------------------------------ transport
    def connection_made(self, transport) -> None:
        self.transport = transport
        ctx = self.ctx
        take_peer(self, ctx.client_address(transport.get_extra_info("peername")))
        if len(ctx.connections) >= self.limits.max_connections:
            transport.close()
            return
        if ctx.bans is not None and ctx.bans.refuses(self):
            return                          # banned (nestgate.bans): closed unanswered
        if ctx.max_per_client and not count_connection(self):
            self.h2.initiate_connection()
            self.refuse_over_client_limit()
            return
        ctx.connections.add(self)
        self._draining = ctx.draining
        self.h2.initiate_connection()
        self.flush()

    # After connection_made: the client is the one a PROXY header named (nestgate.proxytls).
    set_client = HTTP1Connection.set_client

    def serve_only(self, router) -> None:
        """Route every stream of this connection with `router` (a banned client's page)."""
        self.router = router

    def refuse_over_client_limit(self) -> None:
        """The client has `max_connections_per_client` open already: GOAWAY
        (ENHANCE_YOUR_CALM) before any stream, then close."""
        if self.transport.is_closing():
            return
        self.h2.close_connection(ENHANCE_YOUR_CALM)
        self.flush()
        self.transport.close()
        UNROUTED.count(503)

    @property
    def served(self) -> int:
        """Streams opened on this connection so far (for the worker's figures)."""
        return self._opened

    def connection_lost(self, exc) -> None:
        ctx = self.ctx
        ctx.connections.discard(self)
        self.h2.forget_decoded()             # their bytes, back to the worker's budget
        ctx.requests_done += self._opened
        uncount_connection(self)
        ctx.bytes_in_done += self.bytes_in
        ctx.bytes_out_done += self.bytes_out
        for req in list(self._streams.values()):
            self._abandon(req)
        self._streams.clear()
        gone = ConnectionResetError("client went away")
        self._writable.close(gone)
        for waiter in self._window_waiters.values():
            if not waiter.done():
                waiter.set_exception(gone)
        if self._budget is not None and not self._budget.done():
            self._budget.set_result(None)        # `room` sees the transport closed

    def pause_writing(self) -> None:
        # The client is not taking what we send: stop reading from it too, or the
        # answers the engine makes on its own and those sent from callbacks (PING acks,
        # cached responses) pile up in the transport without bound. Nothing else
        # pauses reading here: request bodies are held back by flow control.
        self.write_paused = True
        if not self.transport.is_closing():
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        if not self.transport.is_closing():
            self.transport.resume_reading()
        self._writable.wake()

    def eof_received(self):
        return None

    async def wait_writable(self) -> None:
        """For handlers using `push`: wait until every queued frame went out."""
        while self.outboxes or self.write_paused:
            if self.transport is None or self.transport.is_closing():
                raise ConnectionResetError("client went away")
            if self.write_paused:
                await self._writable.wait()
            else:
                await self.wait_sent(next(iter(self.outboxes)))

    def flush(self) -> None:
        self._unflushed = 0
        data = self.h2.data_to_send()
        if data and not self.transport.is_closing():
            self.bytes_out += len(data)
            self.transport.write(data)

    def _flush_soon(self, size: int = 0) -> None:
        """Write what the engine holds at the end of this turn (see FLUSH_AT)."""
        self._unflushed += size
        if self._unflushed >= FLUSH_AT:
            self.flush()
        elif not self._flush_pending:
            self._flush_pending = True
            self.loop.call_soon(self._scheduled_flush)

    def _scheduled_flush(self) -> None:
        self._flush_pending = False
        if self.transport is not None:
            self.flush()

    # ------------------------------------------------------------ events
    def data_received(self, data: bytes) -> None:
        self.bytes_in += len(data)
        self._stalled = 0.0            # keepalive_timeout counts idle time only
        why = self._guard.feed(data, CLOCK.now)
        if why is not None:
            self._calm(why)
            return
        try:
            events = self.h2.receive_data(data)
        except ConnectionError_ as exc:
            log.info("HTTP/2 client %s: %s: connection closed", self.peer, exc)
            TALLY.event("h2_protocol_error")
            self.flush()              # the engine has queued GOAWAY with the error code
            self.transport.close()
            self._drop_streams()
            return
        except Exception as exc:
            self._fault(exc)
            return
        try:
            self._handle(events)
        except Exception as exc:
            self._fault(exc)

    def _fault(self, exc: Exception) -> None:
        # A fault of ours costs only this connection, ended with a GOAWAY, and leaves
        # one line in the log rather than a traceback per connection.
        log.error("HTTP/2 connection from %s ended by an internal error: %r", self.peer, exc)
        self._end(INTERNAL_ERROR)

    def _handle(self, events) -> None:
        # The engine refuses streams past MAX_CONCURRENT_STREAMS itself (REFUSED_STREAM,
        # that stream only, RFC 9113 5.1.2) and answers what the protocol answers.
        opened = self._opened
        for event in events:
            kind = type(event)
            if kind is engine.RequestReceived:
                try:
                    self._request(event)
                except StreamClosedError:
                    pass               # reset in this same read
            elif kind is engine.DataReceived:
                self._data(event)
            elif kind is engine.StreamEnded:
                req = self._streams.get(event.stream_id)
                if req is not None and req.body is not None:
                    req.flow.ended = True
                    req.body.finish()
            elif kind is engine.WindowUpdated:
                self._window_opened(event.stream_id)
            elif kind is engine.StreamReset:
                if self._stream_gone(event.stream_id, event.remote):
                    self._calm("rapid_reset", f" ({self._wasted} of {self._opened})")
                    return
            elif kind is engine.PingAcknowledged:
                if event.data == _QUIET_PING and self._quiet_ping:
                    self._quiet_ping = False
                    self._idle(confirmed=True)
            elif kind is engine.ConnectionTerminated:
                if event.code != NO_ERROR:       # the client gives up on everything
                    self.flush()
                    self.transport.close()
                    self._drop_streams()
                    return
                self._draining = True            # answer what it asked, then close
                self._client_left = True
        if self._opened - opened > 1:
            self._multiplexed = True     # streams sent together, however fast answered
        if self._draining or self._last_stream != _NO_GOAWAY:
            self._idle()                 # before the flush: a GOAWAY rides with the answers
        self.flush()

    def _stream_gone(self, stream_id: int, by_client: bool) -> bool:
        """A stream was reset (by the client, or by the engine for a stream error):
        drop its work. True when the client reset too many streams before they were
        answered (see RESET_ALLOWANCE)."""
        req = self._streams.pop(stream_id, None)
        if req is not None:
            self._abandon(req)
        elif stream_id not in self._sending:
            return False                     # answered already: nothing was wasted
        self._stop_sender(stream_id)
        if not by_client:
            return False
        self._wasted += 1
        return too_many_resets(self._wasted, self._opened)

    def _calm(self, why: str, detail: str = "") -> None:
        """A protection ends the connection: GOAWAY(ENHANCE_YOUR_CALM), counted."""
        log.warning("HTTP/2 client %s: %s%s: connection closed", self.peer,
                    PROTECTIONS[why], detail)
        TALLY.event("h2_" + why)
        self._end(ENHANCE_YOUR_CALM)

    def _end(self, code) -> None:
        """GOAWAY(`code`), then close: the streams in flight are dropped."""
        self.h2.close_connection(code)
        self.flush()
        self.transport.close()
        self._drop_streams()

    def _drop_streams(self) -> None:
        for req in list(self._streams.values()):
            self._abandon(req)
        self._streams.clear()

    def _request(self, event) -> None:
        stream_id = event.stream_id
        if stream_id > self._last_stream:
            return                 # held: the GOAWAY will tell the client to retry it
        self._opened += 1
        if self._streams or self._sending:
            self._multiplexed = True
        else:
            self._alone += 1
        if self._opened >= self.limits.keepalive_requests and self._last_stream == _NO_GOAWAY:
            self._last_stream = stream_id
        method, raw_target, authority, headers, problem = read_head(
            event.headers, event.ended, self.limits)
        # Per request: streams may carry many clients (a banned one gets the page).
        banned = refresh_client(self, headers) if self.xff_trusted else None
        if problem is None and event.length > self.limits.max_body:
            problem = RequestError(413)                 # before a byte of it comes
        if problem is not None:
            refuse(self, stream_id, problem.status, method, authority, headers)
            req = None
        else:
            req = open_stream(self, stream_id, method, raw_target, authority, headers,
                              banned)
        if req is None:
            if not event.ended and not self.h2.can_send(stream_id):
                # Answered in full without the body: the client may stop sending it
                # (RFC 9113 8.1), rather than have us take and drop any amount of it.
                self._reset(stream_id, NO_ERROR)
            return
        if not event.ended:
            req.body = Body(req.flow, False, None if event.length < 0 else event.length)
        self._streams[stream_id] = req
        start(req)

    def new_request(self, stream_id, handler, route, method, raw_target, qmark, headers,
                    authority, t0) -> H2Request:
        """The stream sequence's `Request` for a stream (nestgate.dispatch)."""
        req = H2Request(self, handler, route, method, raw_target, qmark, headers,
                        authority, True, t0)
        req.stream_id = stream_id
        req.granted = 0
        req.flow = _StreamFlow(self, stream_id)
        return req

    def send_ready(self, stream_id: int, response, head_only: bool) -> int:
        """A ready answer on the stream (nestgate.dispatch): its body's length. A body
        larger than the window follows in a task (`can_send` then still says so)."""
        body = b"" if head_only else response.body
        fits = len(body) <= min(self.h2.local_flow_control_window(stream_id),
                                self.h2.max_outbound_frame_size)
        self.h2.send_block(stream_id, h2_block(response) + self.date_field.current(),
                           end_stream=not body)
        if body and fits:
            self.h2.send_data(stream_id, body, end_stream=True)
            self._guard.data_sent += 1
        elif body:
            self.loop.create_task(self._send_rest(stream_id, body))
        self._answer_ended = fits or not body     # (else _send_rest says so when it is)
        return len(body)

    async def _send_rest(self, stream_id: int, body: bytes) -> None:
        self._sending.add(stream_id)
        try:
            await self.send_data(stream_id, body, end=True)
        except (ConnectionResetError, StreamClosedError):
            pass                           # the stream or the connection ended under us
        finally:
            self._sending.discard(stream_id)
        self._answer_ended = True
        self._idle()

    def _data(self, event) -> None:
        req = self._streams.get(event.stream_id)
        if req is None or req.body is None:
            self.acknowledge(event.stream_id, event.flow_length)
            return
        if req.body.received + len(event.data) > self.limits.max_body:
            # 413, not REFUSED_STREAM: that tells the client nothing was processed and
            # it may retry (RFC 9113 8.7), which is not so once a handler has run.
            self.acknowledge(event.stream_id, event.flow_length)
            self._refuse_body(req, 413)
            return
        req.body.feed(event.data)
        if req.flow.paused:
            req.flow.unacked += event.flow_length
        else:
            self.acknowledge(event.stream_id, event.flow_length)

    def acknowledge(self, stream_id: int, length: int) -> None:
        self.h2.acknowledge_received_data(length, stream_id)
        self.flush()

    # ------------------------------------------------------------ answering
    def conclude(self, req: H2Request, status: int) -> None:
        """`dispatch.answer`'s outcome for a stream's request: END_STREAM after a whole
        answer; the site's error page if nothing was sent; else RST_STREAM."""
        stream_id = req.stream_id
        ours = self._streams.pop(stream_id, None) is req
        self.release(req, req.granted)
        if status == GONE:
            if not ours or self.transport.is_closing() or not self.h2.can_send(stream_id):
                # The stream or the connection went away (reset, closed) while the
                # handler answered: nothing can be sent, and nothing failed on our side.
                return
            # A ConnectionResetError of the handler's own (a connection it opened
            # elsewhere): the client's stream is still open and waits, so it fails as
            # any handler error does and its slot is freed (HTTP/1.1 answers so too).
            status = 500
        conclude(req, status)
        self._answer_ended = True
        self._idle()

    def send_headers(self, stream_id: int, headers, end_stream: bool = False) -> None:
        self.h2.send_headers(stream_id, headers, end_stream=end_stream)
        self._flush_soon()

    def send_block(self, stream_id: int, block: bytes, end_stream: bool = False) -> None:
        self.h2.send_block(stream_id, block, end_stream=end_stream)
        self._flush_soon()

    def end_stream(self, stream_id: int) -> None:
        if stream_id in self.outboxes:
            self._end_after.add(stream_id)          # after the queued data
            return
        try:
            self.h2.end_stream(stream_id)
        except StreamClosedError:
            return
        self._flush_soon()

    async def send_data(self, stream_id: int, data: bytes, end: bool = False) -> None:
        view = memoryview(data)
        while view or end:
            if self.write_paused:          # before writing: the transport holds one frame
                await self._writable.wait()   # past its high-water mark, at most
            window = min(self.h2.local_flow_control_window(stream_id),
                         self.h2.max_outbound_frame_size)
            if window <= 0 and view:
                await self._wait_window(stream_id)
                continue
            chunk, view = view[:window], view[window:]
            self.h2.send_data(stream_id, bytes(chunk), end_stream=end and not view)
            self._guard.data_sent += 1
            self._flush_soon(len(chunk))
            if end and not view:
                break

    async def room(self, stream_id: int, wanted: int) -> int:
        """How many body bytes the stream's handler may produce now, at most `wanted`:
        waits until the client can take some and the connection's OUTPUT_BUDGET allows."""
        while True:
            if self.transport.is_closing():
                raise ConnectionResetError("client went away")
            budget = OUTPUT_BUDGET - self._granted
            if self.write_paused:
                await self._writable.wait()
            elif budget <= 0:
                if self._budget is None or self._budget.done():
                    self._budget = self.loop.create_future()
                await asyncio.shield(self._budget)
            else:
                window = self.h2.local_flow_control_window(stream_id)
                if window > 0:
                    granted = min(wanted, max(window, ROOM_MIN), budget)
                    self._granted += granted
                    return granted
                await self._wait_window(stream_id)

    def release(self, req: H2Request, sent: int) -> None:
        """`sent` bytes that `room` granted to `req` are out (or will never be)."""
        sent = min(sent, req.granted)
        if sent:
            req.granted -= sent
            self._granted -= sent
            if self._budget is not None and not self._budget.done():
                self._budget.set_result(None)

    async def _wait_window(self, stream_id: int) -> None:
        """Until the client opens the stream's window (the tick's `_watch_windows`
        resets the stream if that takes `send_timeout`)."""
        waiter = self._window_waiters[stream_id] = self.loop.create_future()
        try:
            await waiter
        finally:
            self._window_waiters.pop(stream_id, None)


    def queue_data(self, stream_id: int, data: bytes) -> None:
        """Send `data` after what is already queued on the stream, as windows allow."""
        outbox = self.outboxes.get(stream_id)
        if outbox is None:
            outbox = self.outboxes[stream_id] = collections.deque()
            self.loop.create_task(self._pump(stream_id, outbox))
        outbox.append(data)

    async def _pump(self, stream_id: int, outbox) -> None:
        self._sending.add(stream_id)
        try:
            while outbox:
                await self.send_data(stream_id, outbox[0])
                outbox.popleft()
            del self.outboxes[stream_id]
            if stream_id in self._end_after:
                self._end_after.discard(stream_id)
                self.end_stream(stream_id)
        except (ConnectionResetError, StreamClosedError):
            self.outboxes.pop(stream_id, None)
            self._end_after.discard(stream_id)
        finally:
            self._sending.discard(stream_id)
            for waiter in self._sent_waiters.pop(stream_id, ()):
                if not waiter.done():
                    waiter.set_result(None)
        self._answer_ended = True
        self._idle()

    async def wait_sent(self, stream_id: int) -> None:
        """Until the data queued on the stream is out (or the stream is gone)."""
        if stream_id in self.outboxes:
            waiter = self.loop.create_future()
            self._sent_waiters.setdefault(stream_id, []).append(waiter)
            await waiter

    def _window_opened(self, stream_id: int) -> None:
        if stream_id == 0:
            waiters = list(self._window_waiters.values())
        else:
            waiters = [self._window_waiters.get(stream_id)]
        for waiter in waiters:
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    def _reset(self, stream_id: int, code) -> None:
        try:
            self.h2.reset_stream(stream_id, code)
        except StreamClosedError:
            pass
        self.flush()
        req = self._streams.pop(stream_id, None)
        if req is not None:
            self._abandon(req)
        self._stop_sender(stream_id)

    def _stop_sender(self, stream_id: int) -> None:
        """A send waiting for the window of a stream that is gone gives up."""
        waiter = self._window_waiters.get(stream_id)
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionResetError("stream reset"))

    def _refuse_body(self, req: H2Request, status: int) -> None:
        """The rest of the request body will not be taken (too slow, too large): the
        handler is abandoned and the client gets `status` if no answer began, else a
        cancelled stream. After a whole answer, RST_STREAM(NO_ERROR) tells the client
        to stop sending the body (RFC 9113 8.1)."""
        stream_id = req.stream_id
        if req.started:
            self._reset(stream_id, CANCEL)
            return
        self._streams.pop(stream_id, None)
        self._abandon(req)
        # Counted and logged for the stream's own client, not the connection's latest.
        req.answer_ready(req.errors.answer(status, req.headers))
        if not self.h2.can_send(stream_id):
            self._reset(stream_id, NO_ERROR)
        record(req, req.logged)
        self.flush()

    def _abandon(self, req: H2Request) -> None:
        if req.body is not None:
            req.body.abort()
        if req.task is not None and not req.task.done():
            req.task.cancel()

    # ------------------------------------------------------------ worker hooks
    def _idle(self, confirmed: bool = False) -> None:
        """Ending gracefully (see the module's text): once every stream served is
        answered and, while new ones are still served, a PING confirmed none is on its
        way or the client is one that waits for each answer before its next request,
        the GOAWAY and the close."""
        answered, self._answer_ended = self._answer_ended, False
        if self._streams or self._sending or self._goaway_sent or self._quiet_ping or (
                self._last_stream == _NO_GOAWAY and not self._draining):
            return
        if self._last_stream == _NO_GOAWAY and not confirmed and not self._client_left \
                and not (answered and self._one_at_a_time):
            return          # the tick waits for QUIET_GRACE, then asks with a PING
        self.close_gracefully()

    @property
    def _one_at_a_time(self) -> bool:
        """The client has opened each stream only once the one before was answered, as
        a proxy's pooled connection does (nginx's grpc module): its next request may
        leave the moment it has read an answer, so a GOAWAY must share that answer's
        write, or it crosses the request, which such a client fails rather than retries.
        Two streams prove little: curl opens the first of a parallel batch alone and
        the rest right after it, and an answer made at once leaves no stream open."""
        return not self._multiplexed and self._alone >= 3

    def _watch_quiet(self, elapsed: float) -> None:
        """Stopping and serving on: after QUIET_GRACE with no stream open nor opened,
        the PING that asks whether any is on its way."""
        highest = self.h2.highest_inbound_stream_id
        if self._streams or self._sending or highest != self._quiet_mark:
            self._quiet_mark, self._quiet_for = highest, 0.0
            return
        self._quiet_for += elapsed
        if self._quiet_for >= QUIET_GRACE:
            self._quiet_ping, self._quiet_wait = True, 0.0
            self.h2.ping(_QUIET_PING)
            self.flush()

    def tick(self, elapsed: float) -> None:
        """Called by the worker's tick: abort a connection whose client stopped reading
        (send_timeout), time out streams, close one idle past keepalive_timeout: no
        byte from the client and no answer in progress for that long."""
        transport = self.transport
        if transport is not None and \
                self._send_watch.stuck(transport, elapsed, self.limits.send_timeout):
            cut(transport)
            return
        if self._goaway_sent:
            self._goaway_wait += elapsed
            if self._goaway_wait >= DRAIN_IDLE_GRACE:
                self.close_gracefully()
            return
        if self._quiet_ping:
            self._quiet_wait += elapsed
            if self._quiet_wait >= DRAIN_IDLE_GRACE:     # no ACK: go on without it
                self._quiet_ping = False
                self._idle(confirmed=True)
                return
        if self._draining and self._last_stream == _NO_GOAWAY:
            self._drain_busy += elapsed
            if self._drain_busy >= DRAIN_BUSY_GRACE:     # never idle: hold what comes next
                self._last_stream = self.h2.highest_inbound_stream_id
                self._idle()
            elif not self._quiet_ping and not self._client_left:
                self._watch_quiet(elapsed)
        if self.h2.awaiting_headers:
            # The preface, or a header block begun (HEADERS without END_HEADERS), held
            # open by a client trickling its frames: header_timeout for each, as for an
            # HTTP/1.1 request head, however often bytes arrive.
            mark = self.h2.header_blocks
            if mark != self._header_mark:
                self._header_mark, self._header_wait = mark, 0.0
            self._header_wait += elapsed
            if self._header_wait >= self.limits.header_timeout:
                self._calm("header_timeout")
                return
        if self._window_waiters or self._window_stalled:
            self._watch_windows(elapsed)
        if self._streams:
            self._watch_bodies(elapsed)
        if self._streams or self._sending:     # answers in progress are activity
            self._stalled = 0.0
            return
        self._stalled += elapsed
        limit = DRAIN_IDLE_GRACE if self._draining else self.limits.keepalive_timeout
        if self._stalled >= limit:
            self.close_gracefully()

    def _watch_windows(self, elapsed: float) -> None:
        """Reset the streams whose send waited `send_timeout` for the client's window.
        A wait that ended (the window opened) is progress: each wait is counted apart."""
        limit = self.limits.send_timeout
        before, now, late = self._window_stalled, {}, []
        for stream_id, waiter in self._window_waiters.items():
            seen = before.get(stream_id)
            waited = seen[1] + elapsed if seen is not None and seen[0] is waiter else 0.0
            if waited >= limit:
                late.append(stream_id)
            else:
                now[stream_id] = (waiter, waited)
        self._window_stalled = now
        for stream_id in late:
            TALLY.event("h2_send_timeout")
            self._reset(stream_id, CANCEL)

    def _watch_bodies(self, elapsed: float) -> None:
        """Time out the request bodies that did not grow for `body_timeout` while the
        handler was ready for more (a paused body waits for the handler, not the client)."""
        limit = self.limits.body_timeout
        for req in list(self._streams.values()):
            flow = req.flow
            if req.body is None or flow.ended or flow.paused or req.body.received != flow.seen:
                if req.body is not None:
                    flow.seen = req.body.received
                flow.stalled = 0.0
                continue
            flow.stalled += elapsed
            if flow.stalled >= limit:
                self._refuse_body(req, 408)

    def close_gracefully(self) -> None:
        """One GOAWAY(NO_ERROR) naming the last stream served, behind every answer
        already queued; the close comes DRAIN_IDLE_GRACE later (the tick), unless the
        client closes first. A close right behind the GOAWAY can reach a client before it
        has read the GOAWAY, and curl then counts a held stream as failed, not refused."""
        if self.transport is None or self.transport.is_closing():
            return
        if not self._goaway_sent:
            self._goaway_sent = True
            self.h2.close_connection(
                last_stream_id=min(self._last_stream, self.h2.highest_inbound_stream_id))
            self.flush()
            if not self._client_left:
                return
        self.transport.close()

    def finish_and_close(self) -> None:
        """Graceful stop (a reload, a stop): streams are served until none is open,
        then one GOAWAY and the close (see "Ending gracefully" above)."""
        if self._draining:
            return
        self._draining = True
        self._answer_ended = False       # an answer of before the stop: nothing to ride on
        self._idle()
