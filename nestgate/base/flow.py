"""Backpressure: the one wait behind every pause, on the write side and the read side
(client connections over HTTP/1.1 and HTTP/2, upstream connections, the proxy's relays
and tunnels, and the handlers that write through them).

asyncio tells a protocol `pause_writing()` when its transport holds more than the
high-water mark and `resume_writing()` once it is below the low one. Each connection
keeps that as a plain `write_paused` attribute (read on the hot path, where a method
call would cost) and a `Signal` (its `Writable`) for the coroutines that must wait:
any number of them wait at once, none is lost when two wait together, a cancelled
waiter does not cancel the others, and all of them learn when the connection is gone.

The read side is the other half: bytes read from one peer that another cannot take
yet must stop being read (`Reading`), and be read again once the other side takes
more (`hold`). Every such pause goes through `hold`, so a pause is never left on by a
waiter that lost its turn: `Reading` counts its pauses, and a `hold` that outlived
its pause (the reader was resumed, then paused again for something else) leaves the
newer pause alone.
"""

from __future__ import annotations

import asyncio


class Signal:
    """Something changed (a transport takes bytes again, an exchange moved on): every
    coroutine waiting in `wait` wakes. Each waiter has its own future, so cancelling
    one leaves the others; a wake with nobody waiting is not remembered (waiters look
    at their condition first, then wait)."""

    __slots__ = ("_waiters", "_error", "closed")

    def __init__(self) -> None:
        self._waiters: list[asyncio.Future] = []
        self._error: BaseException | None = None
        self.closed = False

    async def wait(self) -> None:
        """Until `wake` (or at once once closed); raises the error `close` was given."""
        if not self.closed:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter in self._waiters:     # not woken: not kept either
                    self._waiters.remove(waiter)
                raise
        if self._error is not None:
            raise self._error

    def wake(self) -> None:
        """Every waiter returns (`resume_writing`, an exchange's next step)."""
        waiters = self._waiters
        if waiters:
            self._waiters = []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def close(self, error: BaseException | None = None) -> None:
        """The connection is gone: every wait returns, raising `error` if given."""
        self.closed = True
        self._error = error
        self.wake()


# A connection's write side: `wait` until the transport takes bytes again.
Writable = Signal


class Reading:
    """Whether one transport is read: paused while what it feeds cannot take more.
    Pausing or resuming twice is harmless; `pauses` counts the pauses, for `hold`."""

    __slots__ = ("transport", "paused", "pauses")

    def __init__(self, transport=None) -> None:
        self.transport = transport
        self.paused = False
        self.pauses = 0

    def pause(self) -> None:
        if not self.paused:
            self.paused = True
            self.pauses += 1
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.paused:
            self.paused = False
            transport = self.transport
            if not transport.is_closing():
                transport.resume_reading()


async def hold(reading: Reading, until) -> None:
    """`reading` stays paused until `until()` returns (the other side takes bytes
    again, a client's protocol grants room), then reads again, unless it was resumed
    and paused anew meanwhile (that pause is someone else's). An error from `until`
    (the other side is gone) leaves the reading paused for its owner to close."""
    reading.pause()
    pause = reading.pauses
    await until()
    if reading.pauses == pause:
        reading.resume()
