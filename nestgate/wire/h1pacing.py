"""Read backpressure of an HTTP/1 connection (`ReadPacing`, mixed into
`nestgate.wire.http1.HTTP1Connection`): when to stop reading the client and when to start
again.

A client that pipelines and does not read must not make the worker hold its input:
reading stops (the unparsed rest of a read is kept, at most one read) while the
transport holds more than WRITE_HIGH_WATER unsent bytes or more than PIPELINE_HIGH
answers are queued, and starts again once both are low. Ready answers are queued,
not written, while the transport is above its mark. The client's socket then fills
and `send_timeout` counts. A handler that is not ready for more of a request body
stops reading too (`pause_reading_for_body`).
"""

from __future__ import annotations

from nestgate.wire.h1phases import CLOSING, UPGRADING

WRITE_HIGH_WATER = 64 * 1024
# Pipelining backpressure: reading stops while more than PIPELINE_HIGH answers wait in
# the queue (or the transport is above WRITE_HIGH_WATER) and starts again at
# PIPELINE_LOW. A read bigger than FEED_SLICE is parsed a slice at a time, so one read
# full of tiny requests cannot queue more than a slice's worth before the check.
PIPELINE_HIGH = 16
PIPELINE_LOW = 4
FEED_SLICE = 16 * 1024


class ReadPacing:
    """Stops and restarts reading as the transport, the queue and body handlers allow."""

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
