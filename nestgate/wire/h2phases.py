"""The phases of an HTTP/2 connection, their table of allowed moves, and how a
connection ends gracefully (`Ending`, mixed into `nestgate.wire.http2.HTTP2Connection`).

  phase      the streams the client opens                   moves to
  SERVING    served                                         STOPPING LAST GOAWAY CLOSED
  STOPPING   served, on a reload or a stop or after the     LAST GOAWAY CLOSED
             client's own GOAWAY, until none is open;
             after QUIET_GRACE without one, a PING asks
             whether one is on its way
  LAST       served up to the last stream chosen; those     GOAWAY CLOSED
             above it are held (neither started nor reset)
  GOAWAY     none: our GOAWAY is out, the close comes       CLOSED
             DRAIN_IDLE_GRACE later unless the client
             closes first
  CLOSED     none: the transport is gone

Anything else is illegal (`PhaseTable._enter` raises). A connection idle past `keepalive_timeout`
goes from SERVING to GOAWAY; a protection or a protocol error ends it at once, with its
own GOAWAY, whatever its phase.

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
picks the last stream it serves (LAST) and holds (neither starts nor resets) any the
client opens above it; when every stream served is answered, the GOAWAY goes out right
behind the final frame of the last answer.
It is one GOAWAY(NO_ERROR) naming the last stream served, and nothing follows it but the
close, DRAIN_IDLE_GRACE later unless the client closes first: the h2 library (under
httpx) takes no frame after a GOAWAY, not even a PING or the answer to a stream in
flight. A held stream, above the GOAWAY's last stream, was provably not processed, so a
client retries it on a new connection (RFC 9113 6.8), though curl 7.88 retries only one
of several. RFC 9113's two-step stop (GOAWAY(2^31-1), a PING, the final GOAWAY) loses
the requests of clients that read no frame after a GOAWAY.
"""

from __future__ import annotations

from nestgate.wire.phasetable import PhaseTable

SERVING, STOPPING, LAST, GOAWAY, CLOSED = range(5)
PHASE_NAMES = ("serving", "stopping", "last", "goaway", "closed")
NEXT = {
    SERVING: (STOPPING, LAST, GOAWAY, CLOSED),
    STOPPING: (LAST, GOAWAY, CLOSED),
    LAST: (GOAWAY, CLOSED),
    GOAWAY: (CLOSED,),
    CLOSED: (),
}

NO_GOAWAY = 1 << 31              # above any stream id: every stream is served
QUIET_PING = b"nestgate"         # asks whether a stopping connection is really quiet
DRAIN_BUSY_GRACE = 5.0            # seconds a stopping connection serves new streams
QUIET_GRACE = 0.2                 # seconds without a stream before a stopping one asks
# Seconds from our GOAWAY to the close (the client's turn to close first), and that a
# PING asking whether a stream is on its way waits for its ACK; the same grace as an
# idle HTTP/1.1 connection has on a stopping worker.
DRAIN_IDLE_GRACE = 1.0


class Ending(PhaseTable):
    """The phases, and the GOAWAY that ends a connection gracefully."""

    NEXT = NEXT
    PHASE_NAMES = PHASE_NAMES

    def _stop(self) -> None:
        """A reload, a stop or the client's GOAWAY: serve on until no stream is open."""
        if self.phase == SERVING:
            self._enter(STOPPING)

    def _choose_last(self, stream_id: int) -> None:
        """`stream_id` is the last stream served: those above it are held."""
        self._last_stream = stream_id
        if self.phase < LAST:
            self._enter(LAST)

    def _tick_ending(self, elapsed: float) -> bool:
        """The tick's part in ending: the close after our GOAWAY, the PING's answer
        waited for, the stop's DRAIN_BUSY_GRACE. True when the tick has no more to do."""
        if self.phase == GOAWAY:
            self._goaway_wait += elapsed
            if self._goaway_wait >= DRAIN_IDLE_GRACE:
                self.close_gracefully()
            return True
        if self._quiet_ping:
            self._quiet_wait += elapsed
            if self._quiet_wait >= DRAIN_IDLE_GRACE:     # no ACK: go on without it
                self._quiet_ping = False
                self._idle(confirmed=True)
                return True
        if self.phase == STOPPING:
            self._drain_busy += elapsed
            if self._drain_busy >= DRAIN_BUSY_GRACE:     # never idle: hold what comes next
                self._choose_last(self.h2.highest_inbound_stream_id)
                self._idle()
            elif not self._quiet_ping and not self._client_left:
                self._watch_quiet(elapsed)
        return False

    def _idle(self, confirmed: bool = False) -> None:
        """Ending gracefully (see the module's text): once every stream served is
        answered and, while new ones are still served, a PING confirmed none is on its
        way or the client is one that waits for each answer before its next request,
        the GOAWAY and the close."""
        answered, self._answer_ended = self._answer_ended, False
        phase = self.phase
        if phase == SERVING or phase >= GOAWAY or self._streams or self._sending \
                or self._quiet_ping:
            return
        if phase == STOPPING and not confirmed and not self._client_left \
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
            self.h2.ping(QUIET_PING)
            self.flush()

    def close_gracefully(self) -> None:
        """One GOAWAY(NO_ERROR) naming the last stream served, behind every answer
        already queued; the close comes DRAIN_IDLE_GRACE later (the tick), unless the
        client closes first. A close right behind the GOAWAY can reach a client before it
        has read the GOAWAY, and curl then counts a held stream as failed, not refused."""
        if self.transport is None or self.transport.is_closing():
            return
        if self.phase != GOAWAY:
            self._enter(GOAWAY)
            self.h2.close_connection(
                last_stream_id=min(self._last_stream, self.h2.highest_inbound_stream_id))
            self.flush()
            if not self._client_left:
                return
        self.transport.close()

    def finish_and_close(self) -> None:
        """Graceful stop (a reload, a stop): streams are served until none is open,
        then one GOAWAY and the close (see "Ending gracefully" above)."""
        if self.phase != SERVING:
            return
        self._stop()
        self._answer_ended = False       # an answer of before the stop: nothing to ride on
        self._idle()
