"""HTTP/2 (over TLS, ALPN "h2", or in clear with prior knowledge) on `nestgate.wire.h2engine`:
one `HTTP2Connection` per client connection, the HTTP/2 adapter of the request pipeline
(see `nestgate.pipeline.dispatch`).

Theory of operation
-------------------
The connection is put together from one part per job, composed at class definition:

  module               part            its job
  nestgate.wire.h2select    ALPNSwitch,     which protocol a connection speaks (before it is
                       PriorKnowledge  one of these)
  nestgate.wire.h2guard     FrameGuard      the abuse limits, counted before frames are parsed
  nestgate.wire.h2stream    H2Request       a handler's answer as frames on its stream
  nestgate.wire.h2send      Sending         frames out under the client's windows
  nestgate.wire.h2phases    Ending          the connection's phases (a table) and its
                                       graceful end

This module keeps the transport's callbacks, the engine's events turned into streams
of the stream sequence, and the worker's tick. Handlers see the same `Request`
interface as on HTTP/1.1: a synchronous handler's `Prebuilt` response is sent from the
event callback, an asynchronous one runs as a task per stream. Streams are
independent, so there is no pipelining queue.

Malformed requests (bad fields, missing or repeated pseudo-fields, connection-
specific fields, a Host other than :authority or repeated) are checked by
`nestgate.wire.fieldhead`, so they cost their stream a 400 and the connection goes on (RFC
9113 8.1.1); the engine checks the frames and stream states, and holds a body to its
one content-length (anything else is RST_STREAM(PROTOCOL_ERROR)), the length the proxy
announces upstream.

A `Prebuilt` answer carries its header block encoded once (`h2_block`); with the Date
field (encoded once a second) it goes out as HEADERS and DATA frames from the event
callback, with no task and no encoder.

Abuse (`nestgate.wire.h2guard`): a flood of frames that carry no request, a header block
past `max_header_bytes`, or too many streams reset before their answer (rapid reset)
end the connection with GOAWAY(ENHANCE_YOUR_CALM). A connection carries at most
`keepalive_requests` streams. A fault while handling a read ends only its connection,
with GOAWAY(INTERNAL_ERROR) and one log line. The worker's tick resets a stream that
waited `send_timeout` for the client's window, or `body_timeout` for request body
data the handler is ready to take.
"""

from __future__ import annotations

import asyncio
import collections
import logging

from nestgate.wire import h2engine as engine
from nestgate.wire.h2engine import (CANCEL, ENHANCE_YOUR_CALM, INTERNAL_ERROR, NO_ERROR,
                                    ConnectionError_, StreamClosedError)
from nestgate.pipeline.dispatch import GONE, conclude, record, start, take_peer
from nestgate.base.clock import CLOCK
from nestgate.base.flow import Writable
from nestgate.wire.h2guard import (DECODED_BUDGET, DECODED_LIST_FACTOR,
                                   MAX_CONCURRENT_STREAMS, PROTECTIONS, FrameGuard,
                                   too_many_resets)
from nestgate.wire.h2phases import (CLOSED, DRAIN_IDLE_GRACE, NO_GOAWAY, QUIET_PING,
                                    SERVING, Ending)
from nestgate.wire.h2send import Sending
from nestgate.wire.h2stream import H2Request, _StreamFlow, date_field, h2_block
from nestgate.pipeline.request import Body
from nestgate.pipeline.ratelimit import count_connection, uncount_connection
from nestgate.base.tally import TALLY, UNROUTED
from nestgate.base.sendwatch import SendWatch, cut
from nestgate.wire.streamconn import StreamAdapter

log = logging.getLogger("nestgate.http2")


class HTTP2Connection(StreamAdapter, Sending, Ending):
    """One HTTP/2 client connection (after ALPN chose h2)."""

    protocol = "HTTP/2"           # as the request log writes it
    request_class = H2Request

    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self.router = ctx.router         # (a banned client's page instead: `serve_only`)
        self.limits = ctx.limits
        self.loop = ctx.loop
        self.date_field = date_field(ctx)
        self.phase = SERVING
        self.transport = None
        self.client = self.peer = ""
        self.decisions = None
        self.client_tag = 0            # counted under max_connections_per_client (ratelimit)
        self.xff_trusted = False       # the peer may tell us the client in X-Forwarded-For
        self.scheme = ctx.scheme       # the client's (take_peer, refresh_client)
        self.known_plain = False       # the client is known to be on plain HTTP
        self.logging = False
        self.write_paused = False
        self._stalled = 0.0
        self._send_watch = SendWatch()
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
        self._last_stream = NO_GOAWAY  # the last stream served (see "Ending gracefully")
        self._sending: set[int] = set()   # streams answered by a background send
        self._streams: dict[int, H2Request] = {}
        self._window_waiters: dict[int, asyncio.Future] = {}
        self._window_stalled: dict[int, tuple[asyncio.Future, float]] = {}  # tick's view
        self.outboxes: dict[int, collections.deque] = {}   # data queued by `push`, per stream
        self._sent_waiters: dict[int, list[asyncio.Future]] = {}
        self._end_after: set[int] = set()
        self._writable = Writable()      # senders waiting for the transport to take more
        self._guard = FrameGuard(self.limits, CLOCK.now)
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
        if ctx.draining:
            self._stop()
        self.h2.initiate_connection()
        self.flush()

    def set_client(self, address: str) -> None:
        """After connection_made: the client is the one a PROXY header named
        (nestgate.wire.proxytls)."""
        take_peer(self, address)
        if self.client_tag and not count_connection(self):
            self.refuse_over_client_limit()

    def serve_only(self, router) -> None:
        """Route every stream of this connection with `router` (a banned client's page)."""
        self.router = router

    def end_banned(self) -> None:
        """Its client was banned while it was open (nestgate.bans.watch, `ban_answer =
        "close"`): as a graceful stop, the streams open are answered, then one GOAWAY
        and the close."""
        self.finish_and_close()

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
        self._enter(CLOSED)
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
                if event.data == QUIET_PING and self._quiet_ping:
                    self._quiet_ping = False
                    self._idle(confirmed=True)
            elif kind is engine.ConnectionTerminated:
                if event.code != NO_ERROR:       # the client gives up on everything
                    self.flush()
                    self.transport.close()
                    self._drop_streams()
                    return
                self._stop()                     # answer what it asked, then close
                self._client_left = True
        if self._opened - opened > 1:
            self._multiplexed = True     # streams sent together, however fast answered
        if self.phase != SERVING:
            self._idle()                 # before the flush: a GOAWAY rides with the answers
            self.flush()
        else:
            self._flush_soon()

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
        if self._opened >= self.limits.keepalive_requests and self._last_stream == NO_GOAWAY:
            self._choose_last(stream_id)
        req, length = self._open_head(stream_id, event.headers, event.ended, event.length)
        if req is None:
            if not event.ended and not self.h2.can_send(stream_id):
                # Answered in full without the body: the client may stop sending it
                # (RFC 9113 8.1), rather than have us take and drop any amount of it.
                self._reset(stream_id, NO_ERROR)
            return
        if not event.ended:
            req.body = Body(req.flow, False, None if length < 0 else length)
        self._streams[stream_id] = req
        start(req)

    def new_request(self, stream_id, handler, route, method, raw_target, qmark, headers,
                    authority, t0) -> H2Request:
        req = StreamAdapter.new_request(self, stream_id, handler, route, method, raw_target,
                                        qmark, headers, authority, t0)
        req.granted = 0
        req.flow = _StreamFlow(self, stream_id)
        return req

    def send_ready(self, stream_id: int, response, head_only: bool) -> int:
        """A ready answer on the stream (nestgate.pipeline.dispatch): its body's length. A body
        larger than the window follows in a task (`can_send` then still says so)."""
        body = b"" if head_only else response.body
        if self.h2.send_answer(stream_id, h2_block(response) + self.date_field.current(),
                               body):
            if body:
                self._guard.data_sent += 1
            self._answer_ended = True
        else:
            self.loop.create_task(self._send_rest(stream_id, body))
            self._answer_ended = False            # (_send_rest says so when it is)
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

    # ------------------------------------------------------------ worker hooks
    def tick(self, elapsed: float) -> None:
        """Called by the worker's tick: abort a connection whose client stopped reading
        (send_timeout), time out streams, close one idle past keepalive_timeout: no
        byte from the client and no answer in progress for that long."""
        transport = self.transport
        if transport is not None and \
                self._send_watch.stuck(transport, elapsed, self.limits.send_timeout):
            cut(transport)
            return
        if self._tick_ending(elapsed):
            return
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
        limit = self.limits.keepalive_timeout if self.phase == SERVING else DRAIN_IDLE_GRACE
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
