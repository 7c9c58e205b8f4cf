"""HTTP/3 over QUIC (RFC 9114) on aioquic: one more adapter of the stream sequence.

Theory of operation
-------------------
The QUIC side (the worker's UDP listener, certificates by server name, what becomes of
a client whose address changes) is `nestgate.wire.h3quic`'s; the stream sequence's side
shared with HTTP/2 is `nestgate.wire.streamconn`'s. Each request stream is a head, body and end for the stream sequence
(`nestgate.pipeline.dispatch.open_stream`); `H3Request` puts the answer back as HEADERS and
DATA frames. A head is checked by HTTP/2's rules (nestgate.wire.fieldhead). Nothing else
happens here: routes, guards, handlers, error pages, counts and the request log are the
sequence's.

The abuse limits of HTTP/2 hold here too:
  * concurrent streams: aioquic grants 128 request streams at a time (and more as they
    finish), HTTP/2's MAX_CONCURRENT_STREAMS;
  * header size: the bytes of a request stream before its head is decoded are counted
    as they arrive, and past `max_header_bytes` + HEADER_BLOCK_SLACK (+ one datagram)
    the connection ends with H3_EXCESSIVE_LOAD; a decoded head over `max_header_bytes`
    is a 431 on its stream, as on HTTP/2; the same bound holds for what aioquic keeps
    of any stream waiting for a frame to come whole (trailers, a control stream's);
  * slow heads: a request head not whole `header_timeout` after its first byte ends
    the connection with H3_EXCESSIVE_LOAD, as HTTP/2 ends one for a header block;
  * resets: streams the client resets before their answer are counted as on HTTP/2
    (`too_many_resets`), and too many end the connection with H3_EXCESSIVE_LOAD;
  * bodies in tiny DATA frames: as on HTTP/2 (`body_chunk_allowance`,
    `min_body_chunk_average`, a body's last frame not counted), H3_EXCESSIVE_LOAD;
  * `keepalive_requests` streams per connection, then it ends once they are answered;
    `keepalive_timeout` is QUIC's idle timeout; a stream whose answer the client does
    not acknowledge for `send_timeout` is reset.
A client is judged by its address, as on TCP: the first datagram's, then a new one
the client moved to (RFC 9000 9) once aioquic has validated it; a request from an
address not validated yet is rejected (H3_REQUEST_REJECTED), neither judged by an
address the sender may have forged nor by the one it left.
aioquic gives the client flow-control credit as body bytes arrive in order
(`nestgate.wire.h3quic.grant_credit_as_delivered`), not as a handler reads them: a body the handler has not read yet is held, at most `max_body` per stream
(413 past it). An answer waits for the client: `write` returns once the stream holds
fewer than STREAM_HIGH_WATER bytes the client has not acknowledged, and the connection
fewer than CONNECTION_HIGH_WATER; a ready answer's body larger than READY_AT_ONCE that
does not fit under CONNECTION_HIGH_WATER follows in a task that waits the same way
(aioquic copies what it is given and keeps it until acknowledged: a client that
acknowledged nothing had a worker hold 128 copies of a cached file per connection).

Stopping (a reload, a stop): a connection finishes its streams and closes with
H3_NO_ERROR, for at most `shutdown_timeout`.
"""

from __future__ import annotations

import logging

from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, ErrorCode, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.events import ConnectionTerminated, ProtocolNegotiated, \
    StopSendingReceived, StreamDataReceived, StreamReset
from aioquic.quic.packet import QuicErrorCode, QuicFrameType

from nestgate.base.clock import CLOCK
from nestgate.pipeline.dispatch import GONE, conclude, record, start, take_peer
from nestgate.base.errors import HandlerError
from nestgate.wire.fieldhead import pairs_of, ready_fields, response_fields
from nestgate.wire.h2guard import HEADER_BLOCK_SLACK, too_many_resets
from nestgate.pipeline.ratelimit import count_connection, uncount_connection
from nestgate.pipeline.request import Body, Request
from nestgate.base.responses import header_pairs
from nestgate.wire.streamconn import StreamAdapter
from nestgate.base.tally import H3_PROTECTIONS, TALLY

log = logging.getLogger("nestgate.http3")

STREAM_HIGH_WATER = 256 * 1024    # unacknowledged answer bytes a stream may hold
STREAM_LOW_WATER = 64 * 1024      # ... and where a waiting writer goes on
CONNECTION_HIGH_WATER = 1024 * 1024   # ... all streams of a connection (HTTP/2's budget)
READY_AT_ONCE = 16 * 1024         # a ready answer's body sent whole whatever is held
DATAGRAM = 1500                   # a request stream's bytes past its head in one read, at most
# Why a protection ended a connection: the key of its counter ("h3_<key>") and its words.
PROTECTIONS = {
    "header_block": "request head over max_header_bytes",
    "header_timeout": "request head not whole within header_timeout",
    "rapid_reset": "streams reset before their answer (rapid reset)",
    "small_data_frames": "DATA frames too small (min_body_chunk_average)",
}
assert tuple(PROTECTIONS) == H3_PROTECTIONS


class H3Request(Request):
    """A Request whose answer goes out as HEADERS and DATA frames on one QUIC stream.
    It is also its body's flow (`request.Body`): aioquic takes the body as it comes."""

    __slots__ = ("stream_id",)

    protocol = "HTTP/3"

    def start(self, status: int, headers, content_length: int | None = None) -> None:
        self._send_head(status, response_fields(status, header_pairs(headers), content_length))

    def start_raw(self, status: int, block: bytes, content_length: int | None = None) -> None:
        self._send_head(status, response_fields(status, pairs_of(block), content_length))

    def _send_head(self, status: int, fields: list) -> None:
        if self.started:
            raise RuntimeError("response already started")
        self.started = True
        self.status = status
        fields.append((b"date", CLOCK.date))
        self.connection.send_head(self.stream_id, fields, self.head_only)
        if self.head_only:
            self.finished = True

    async def write(self, data: bytes) -> None:
        if not self.started:
            raise RuntimeError("write before start")
        if self.push(data):
            await self.writable()

    def push(self, data: bytes) -> bool:
        if self.head_only or not data:
            return False
        self.sent += len(data)
        return self.connection.send_body(self.stream_id, data)

    async def writable(self) -> None:
        await self.connection.drained(self.stream_id)

    async def send_prebuilt(self, response) -> None:
        self.answer_ready(response)
        await self.writable()

    def answer_ready(self, response) -> None:
        self.started = self.finished = True
        self.status = response.status
        self.sent = self.connection.send_ready(self.stream_id, response, self.head_only)

    def cut(self) -> None:
        self.connection.reset(self.stream_id)

    def end(self) -> None:
        if self.finished:
            return
        self.finished = True
        self.connection.end_stream(self.stream_id)

    def take_over(self, head: bytes) -> bytes:
        raise HandlerError(501, "HTTP/3 has no protocol upgrade")   # RFC 9114 4.5

    # the body's flow
    def pause_reading_for_body(self) -> None:
        pass

    def resume_reading_for_body(self) -> None:
        pass

    def send_continue(self) -> None:
        pass                   # HTTP/3 clients do not wait for 100 on their own


class HTTP3Connection(StreamAdapter, QuicConnectionProtocol):
    """One QUIC connection carrying HTTP/3 (made by `QuicListener` for a new client)."""

    protocol = "HTTP/3"          # as the request log writes it
    request_class = H3Request
    transport = None             # the UDP socket is the listener's, never this one's to abort

    def __init__(self, ctx, quic, stream_handler=None) -> None:
        QuicConnectionProtocol.__init__(self, quic, stream_handler)
        self.ctx = ctx
        self.router = ctx.router         # (a banned client's page instead: `serve_only`)
        self.limits = ctx.limits
        self.loop = ctx.loop
        self.client = self.peer = ""
        self.decisions = None
        self.client_tag = 0            # counted under max_connections_per_client (ratelimit)
        self.xff_trusted = False
        self.scheme = ctx.scheme       # the client's (take_peer, refresh_client)
        self.known_plain = False       # the client is known to be on plain HTTP
        self.logging = False
        self.bytes_in = self.bytes_out = 0
        self._http: H3Connection | None = None
        self._streams: dict[int, H3Request] = {}
        self._heads: dict[int, int] = {}     # request streams before their head: bytes so far
        self._head_since: dict[int, float] = {}  # ... those begun: when their first byte came
        self._next_stream = 0                # the lowest client stream id not seen yet
        self._head_limit = self.limits.max_header_bytes + HEADER_BLOCK_SLACK + DATAGRAM
        self._opened = self._wasted = 0
        self._pieces = self._piece_bytes = 0  # body DATA frames but a body's last, bytes
        self._piece_stream = -1              # the stream of the last piece counted
        self._waiters: dict[int, list] = {}  # stream id -> [future, seconds waited]
        self._sending: set[int] = set()      # streams of ready answers sent in pieces
        self._draining = False
        self._ended = False
        self._sender = None                  # the address of the datagram being read

    # ------------------------------------------------------------ datagrams and events
    def datagram_received(self, data, addr) -> None:
        self._sender = addr
        if not self.peer:
            self._arrived(addr)
        self.bytes_in += len(data)
        QuicConnectionProtocol.datagram_received(self, data, addr)
        if self._waiters:
            self._wake_writers()

    def _arrived(self, addr) -> None:
        ctx = self.ctx
        take_peer(self, ctx.client_address(addr))
        if self._banned():
            return
        if len(ctx.connections) >= self.limits.max_connections or not self._counted():
            self._busy()
            return
        ctx.connections.add(self)
        self._draining = ctx.draining

    def _banned(self) -> bool:
        """The client is banned (nestgate.bans): closed at once, as QUIC refuses a
        connection (RFC 9000 20.1), and True. A ban answered with the page is served
        it on this connection (`serve_only`)."""
        bans = self.ctx.bans
        if bans is None or not bans.turns_away(self):
            return False
        self._ended = True
        self._quic.close(error_code=QuicErrorCode.CONNECTION_REFUSED,
                         frame_type=QuicFrameType.PADDING, reason_phrase="banned")
        return True

    def _counted(self) -> bool:
        """Counted under `max_connections_per_client` (False: the client has enough)."""
        return not self.ctx.max_per_client or count_connection(self)

    def _busy(self) -> None:
        self._ended = True
        self._quic.close(error_code=ErrorCode.H3_EXCESSIVE_LOAD, reason_phrase="busy")

    def _judged_where_it_is(self) -> bool:
        """Whether a request head that came in the datagram from `self._sender` may be
        served: True when that is the client's address, or a new one of the client's
        that aioquic has validated (RFC 9000 8.2: the client answered a challenge sent
        there), which from then on is the connection's client, judged as a new
        connection from there would be (bans, `max_connections_per_client`, access
        lists, rate limits, the request log). False while it is not validated: a
        datagram's source is the sender's to write, and a request judged by it could
        come from anywhere, or by the old address, from a client that left the only
        address let in and never answers the challenge."""
        client = self.ctx.client_address(self._sender)
        if client == self.peer:
            return True                      # the same address (a NAT's new port)
        path = next((p for p in self._quic._network_paths if p.addr == self._sender), None)
        if path is None or not path.is_validated:
            return False
        take_peer(self, client)
        self.router = self.ctx.router        # a ban's page router was the old address's
        if self._banned():
            self._end()
            return False
        if not self._counted():
            self._busy()
            self._end()
            return False
        return True

    def serve_only(self, router) -> None:
        """Route every stream of this connection with `router` (a banned client's page)."""
        self.router = router

    def end_banned(self) -> None:
        """Its client was banned while it was open (nestgate.bans.watch, `ban_answer =
        "close"`): as a graceful stop, the streams open are answered, then the
        connection closes."""
        self.finish_and_close()

    def quic_event_received(self, event) -> None:
        kind = type(event)
        if kind is ProtocolNegotiated:
            if event.alpn_protocol in H3_ALPN:
                self._http = H3Connection(self._quic)
            return
        if kind is ConnectionTerminated:
            self._end()
            return
        if self._http is None or self._ended:
            return
        if kind is StreamDataReceived and event.stream_id & 3 == 0 and self._over_head(event):
            self._calm("header_block")
            return
        if (kind is StreamReset or kind is StopSendingReceived) and \
                self._stream_reset(event.stream_id):
            self._calm("rapid_reset", f" ({self._wasted} of {self._opened})")
            return
        for h3_event in self._http.handle_event(event):
            h3_kind = type(h3_event)
            if h3_kind is HeadersReceived:
                if h3_event.stream_ended and h3_event.stream_id == self._piece_stream:
                    self._body_ended()                  # trailers
                self._headers(h3_event)
            elif h3_kind is DataReceived:
                if h3_event.stream_ended:
                    self._piece_bytes += len(h3_event.data)
                    if not h3_event.data and h3_event.stream_id == self._piece_stream:
                        self._body_ended()
                elif self._small_pieces(len(h3_event.data), h3_event.stream_id):
                    self._calm("small_data_frames")
                    return
                self._data(h3_event)
        if kind is StreamDataReceived and not self._ended and \
                self._unread(event.stream_id) > self._head_limit:
            self._calm("header_block")

    def _unread(self, stream_id: int) -> int:
        """The bytes aioquic holds of a stream for a frame it reads only whole (a head,
        trailers, a SETTINGS frame) or behind a head it cannot decode yet. A request's
        head is counted before it comes this far (`_over_head`); trailers, or a
        control stream's frame, of any announced size were held whole, and copied
        again with each datagram: a 100 MB trailers frame held the worker's memory
        and a core."""
        stream = self._http._stream.get(stream_id)
        return 0 if stream is None else len(stream.buffer)

    def _body_ended(self) -> None:
        """The last piece counted was its body's last: the stream ended after it
        with trailers or an empty frame (a FIN of its own), so it is not counted
        either (see h2guard's `_body_ended`)."""
        self._pieces -= 1
        self._piece_stream = -1

    def _small_pieces(self, size: int, stream_id: int) -> bool:
        """A piece of a body (aioquic makes one event per DATA frame, or per part of
        one that a datagram cut): past `body_chunk_allowance` of them, True when they
        average under `min_body_chunk_average` bytes (see h2guard)."""
        pieces = self._pieces + 1
        self._pieces = pieces
        self._piece_bytes += size
        self._piece_stream = stream_id
        return pieces > self.limits.body_chunk_allowance and \
            self._piece_bytes < pieces * self.limits.min_body_chunk_average

    def _over_head(self, event) -> bool:
        """Count a request stream's bytes until its head is decoded (see the module)."""
        stream_id = event.stream_id
        if stream_id >= self._next_stream:
            # A stream opens every lower one (RFC 9000 2.1; aioquic makes them too, up
            # to its stream limit): a lower one whose datagram was lost and is sent
            # again, or simply came later, still has its head to come.
            for opened in range(self._next_stream, stream_id + 4, 4):
                self._heads[opened] = 0
            self._next_stream = stream_id + 4
        taken = self._heads.get(stream_id)
        if taken is None:
            return False
        if not taken and event.data:
            self._head_since[stream_id] = CLOCK.now
        taken += len(event.data)
        self._heads[stream_id] = taken
        return taken > self._head_limit

    def _headers(self, event) -> None:
        stream_id = event.stream_id
        self._head_since.pop(stream_id, None)
        if self._heads.pop(stream_id, None) is None:
            # Trailers (never passed on), or a stream answered already. Trailers that
            # end the stream end its body, as an empty DATA frame with a FIN would.
            if event.stream_ended:
                self._body_in(stream_id, b"", True)
            return
        if not self._judged_where_it_is():
            if not self._ended:
                # Not served, and safe for the client to send again (RFC 9114 8.1).
                if not event.stream_ended:
                    self._quic.stop_stream(stream_id, ErrorCode.H3_REQUEST_REJECTED)
                self._quic.reset_stream(stream_id, ErrorCode.H3_REQUEST_REJECTED)
            return
        self._opened += 1
        if self._opened >= self.limits.keepalive_requests:
            self._draining = True
        ended = event.stream_ended
        req, length = self._open_head(stream_id, event.headers, ended, None)
        if req is None:
            if not ended:
                self._quic.stop_stream(stream_id, ErrorCode.H3_NO_ERROR)   # no body wanted
            self._after_answer()
            return
        if not ended:
            req.body = Body(req, False, length)
        self._streams[stream_id] = req
        start(req)

    def _data(self, event) -> None:
        self._body_in(event.stream_id, event.data, event.stream_ended)

    def _body_in(self, stream_id: int, data: bytes, ended: bool) -> None:
        req = self._streams.get(stream_id)
        if req is None or req.body is None:
            return
        body = req.body
        received = body.received + len(data)
        if received > self.limits.max_body:
            self._refuse_body(req, 413)
        elif body.length is not None and (received > body.length or (
                ended and received != body.length)):
            # DATA that disagrees with the content-length: malformed (RFC 9114 4.1.2),
            # and never delivered short or long to a handler that announced it upstream.
            self._refuse_body(req, 400)
        else:
            if data:
                body.feed(data)
            if ended:
                body.finish()

    def _stream_reset(self, stream_id: int) -> bool:
        """The client reset a stream (RESET_STREAM, while it was sending) or asked us to
        stop answering on it (STOP_SENDING: how a request whose body was sent in full is
        cancelled): its work is dropped. True when it did so to too many streams before
        their answer."""
        self._heads.pop(stream_id, None)
        self._head_since.pop(stream_id, None)
        req = self._streams.pop(stream_id, None)
        self._sending.discard(stream_id)
        self._fail_writer(stream_id)
        if req is None:
            return False                       # answered already: nothing was wasted
        self._abandon(req)
        # QUIC's reset ends the client's half only: ours ends too, which frees the
        # stream for the client's next (aioquic grants new ones as streams finish).
        self._quic.reset_stream(stream_id, ErrorCode.H3_REQUEST_CANCELLED)
        self._wasted += 1
        return too_many_resets(self._wasted, self._opened)

    def _refuse_body(self, req: H3Request, status: int) -> None:
        """The rest of a request body will not be taken: `status`, or a reset stream
        when the answer began."""
        stream_id = req.stream_id
        self._streams.pop(stream_id, None)
        self._abandon(req)
        self._quic.stop_stream(stream_id, ErrorCode.H3_REQUEST_CANCELLED)
        if req.started:
            self.reset(stream_id)
            return
        req.answer_ready(req.errors.answer(status, req.headers))
        record(req, req.logged)

    def _calm(self, why: str, detail: str = "") -> None:
        """A protection ends the connection: H3_EXCESSIVE_LOAD, counted."""
        log.warning("HTTP/3 client %s: %s%s: connection closed", self.peer,
                    PROTECTIONS[why], detail)
        TALLY.event("h3_" + why)
        self.close(error_code=ErrorCode.H3_EXCESSIVE_LOAD, reason_phrase=why)
        self._end()

    def _end(self) -> None:
        """The connection is over: its streams are dropped, its figures handed on."""
        if self._ended and self not in self.ctx.connections:
            return
        self._ended = True
        ctx = self.ctx
        if self in ctx.connections:
            ctx.connections.discard(self)
            uncount_connection(self)
            ctx.requests_done += self._opened
            ctx.bytes_in_done += self.bytes_in
            ctx.bytes_out_done += self.bytes_out
        for req in list(self._streams.values()):
            self._abandon(req)
        self._streams.clear()
        for stream_id in list(self._waiters):
            self._fail_writer(stream_id)

    # ------------------------------------------------------------ answering
    def conclude(self, req: H3Request, status: int) -> None:
        """`dispatch.answer`'s outcome for a stream's request (see HTTP2Connection's)."""
        ours = self._streams.get(req.stream_id) is req
        if status == GONE:
            if not ours or self._ended:
                return             # the stream or the connection went away meanwhile
            status = 500           # a reset of the handler's own: its stream still waits
        conclude(req, status)
        self._streams.pop(req.stream_id, None)
        self.bytes_out += req.sent
        self._after_answer()

    def send_ready(self, stream_id: int, response, head_only: bool) -> int:
        """A ready answer on the stream (nestgate.pipeline.dispatch): its body's length."""
        # Its fields are made per answer: a ready answer may be rewritten in place (the
        # health's each second), and QPACK encodes them per answer anyway.
        fields = ready_fields(response)
        fields.append((b"date", CLOCK.date))
        body = b"" if head_only else response.body
        self._http.send_headers(stream_id, fields, end_stream=not body)
        if len(body) <= READY_AT_ONCE or \
                self._held_all() + len(body) <= CONNECTION_HIGH_WATER:
            if body:
                self._http.send_data(stream_id, body, end_stream=True)
        else:
            self._sending.add(stream_id)
            self.loop.create_task(self._send_rest(stream_id, body))
        self._transmit_soon()
        return len(body)

    async def _send_rest(self, stream_id: int, body: bytes) -> None:
        """A ready answer's body, a piece at a time as the client takes it (`drained`:
        `send_timeout` resets a stream that waits that long)."""
        view = memoryview(body)
        try:
            for at in range(0, len(body), STREAM_LOW_WATER):
                await self.drained(stream_id)
                self._check_open(stream_id)
                self._http.send_data(stream_id, bytes(view[at:at + STREAM_LOW_WATER]),
                                     end_stream=at + STREAM_LOW_WATER >= len(body))
                self._transmit_soon()
        except (ConnectionResetError, RuntimeError):
            pass                    # the stream (reset, stopped) or the connection ended
        finally:
            self._sending.discard(stream_id)
            self._after_answer()

    def send_head(self, stream_id: int, fields: list, end: bool) -> None:
        self._check_open(stream_id)
        self._http.send_headers(stream_id, fields, end_stream=end)
        self._transmit_soon()

    def send_body(self, stream_id: int, data: bytes) -> bool:
        """True when the stream holds so much the client has not taken that the caller
        should wait (`drained`)."""
        self._check_open(stream_id)
        self._http.send_data(stream_id, data, end_stream=False)
        self._transmit_soon()
        return self._held(stream_id) > STREAM_HIGH_WATER or \
            self._held_all() > CONNECTION_HIGH_WATER

    def end_stream(self, stream_id: int) -> None:
        self._check_open(stream_id)
        self._http.send_data(stream_id, b"", end_stream=True)
        self._transmit_soon()

    def reset(self, stream_id: int) -> None:
        if not self._ended:
            self._quic.reset_stream(stream_id, ErrorCode.H3_INTERNAL_ERROR)
            self._transmit_soon()

    def _check_open(self, stream_id: int) -> None:
        if self._ended or (stream_id not in self._streams and stream_id not in self._sending):
            raise ConnectionResetError("stream or connection gone")

    def _held(self, stream_id: int) -> int:
        # aioquic keeps a stream's answer bytes until the client acknowledges them.
        stream = self._quic._streams.get(stream_id)
        return 0 if stream is None else len(stream.sender._buffer)

    def _held_all(self) -> int:
        """What every stream of the connection holds unacknowledged, answered ones too."""
        return sum(len(stream.sender._buffer) for stream in self._quic._streams.values())

    async def drained(self, stream_id: int) -> None:
        """Until the stream holds fewer than STREAM_LOW_WATER unacknowledged bytes and
        the connection fewer than CONNECTION_HIGH_WATER (the tick resets the stream if
        that takes `send_timeout`)."""
        while self._held(stream_id) > STREAM_LOW_WATER or \
                self._held_all() > CONNECTION_HIGH_WATER:
            self._check_open(stream_id)
            waiter = self.loop.create_future()
            self._waiters[stream_id] = [waiter, 0.0]
            try:
                await waiter
            finally:
                self._waiters.pop(stream_id, None)

    def _wake_writers(self) -> None:
        if self._held_all() > CONNECTION_HIGH_WATER:
            return
        for stream_id, (waiter, _waited) in list(self._waiters.items()):
            if not waiter.done() and self._held(stream_id) <= STREAM_LOW_WATER:
                waiter.set_result(None)

    def _fail_writer(self, stream_id: int) -> None:
        entry = self._waiters.get(stream_id)
        if entry is not None and not entry[0].done():
            entry[0].set_exception(ConnectionResetError("stream reset"))

    # ------------------------------------------------------------ worker hooks
    @property
    def served(self) -> int:
        """Request streams opened so far (for the worker's figures)."""
        return self._opened

    def _after_answer(self) -> None:
        if self._draining and not self._streams and not self._sending and not self._ended:
            self.close(error_code=ErrorCode.H3_NO_ERROR)

    def tick(self, elapsed: float) -> None:
        """Reset the streams whose answer waited `send_timeout` for the client; end the
        connection when a request head begun `header_timeout` ago is still not whole
        (as HTTP/2 ends one for a header block: a client trickling its heads held up
        to 128 streams' worth of them, and the connection, for as long as it liked)."""
        if self._head_since and not self._ended and \
                CLOCK.now - min(self._head_since.values()) >= self.limits.header_timeout:
            self._calm("header_timeout")
            return
        for stream_id, entry in list(self._waiters.items()):
            entry[1] += elapsed
            if entry[1] >= self.limits.send_timeout:
                self._fail_writer(stream_id)
                self.reset(stream_id)
        self._after_answer()

    def finish_and_close(self) -> None:
        """Graceful stop: the streams open are answered, then the connection closes."""
        self._draining = True
        self._after_answer()

