"""Sending on an HTTP/2 connection (`Sending`, mixed into `nestgate.wire.http2.HTTP2Connection`):
frames out under the client's windows, the output budget, and request body data
acknowledged as handlers take it.

Flow control: request body data is acknowledged (window reopened) as the handler
consumes it, so a slow handler holds back the client instead of buffering; response
data waits for the client's window. A handler that reads its body from somewhere
asks `room` first, so it reads nothing ahead of the window (ROOM_MIN past a small
one) and a connection's streams together hold at most OUTPUT_BUDGET unsent; no
DATA frame of a streamed answer is written while the transport is over its
high-water mark.
"""

from __future__ import annotations

import asyncio
import collections

from nestgate.wire.h2engine import StreamClosedError

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


class Sending:
    """Frames out, as the client's windows and the transport allow."""

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
    def acknowledge(self, stream_id: int, length: int) -> None:
        self.h2.acknowledge_received_data(length, stream_id)
        self.flush()
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
            if self.write_paused:
                await self._writable.wait()
            elif self._granted >= OUTPUT_BUDGET:
                if self._budget is None or self._budget.done():
                    self._budget = self.loop.create_future()
                await asyncio.shield(self._budget)
            else:
                granted = self.grant(stream_id, wanted)
                if granted:
                    return granted
                await self._wait_window(stream_id)

    def grant(self, stream_id: int, wanted: int) -> int:
        """`room` without waiting: what the stream's handler may produce now (0: none)."""
        budget = OUTPUT_BUDGET - self._granted
        if budget <= 0 or self.write_paused or self.transport.is_closing():
            return 0
        window = self.h2.local_flow_control_window(stream_id)
        if window <= 0:
            return 0
        granted = min(wanted, max(window, ROOM_MIN), budget)
        self._granted += granted
        return granted

    def send_now(self, stream_id: int, data: bytes, end: bool = False) -> bool:
        """`data` out at once as one DATA frame (ending the stream if `end`), when
        nothing of the stream is queued and its window takes it; False (nothing sent)
        otherwise."""
        if stream_id in self.outboxes or self.write_paused:
            return False
        h2 = self.h2
        if len(data) > min(h2.local_flow_control_window(stream_id), h2.max_outbound_frame_size):
            return False
        h2.send_data(stream_id, data, end)
        self._guard.data_sent += 1
        self._flush_soon(len(data))
        return True

    def release(self, req, sent: int) -> None:
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
    def _stop_sender(self, stream_id: int) -> None:
        """A send waiting for the window of a stream that is gone gives up."""
        waiter = self._window_waiters.get(stream_id)
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionResetError("stream reset"))
