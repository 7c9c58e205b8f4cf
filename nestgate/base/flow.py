"""Waiting for a transport to take more bytes: the one helper behind every
backpressure wait (client connections over HTTP/1.1 and HTTP/2, upstream connections,
tunnels, and the handlers that write through them).

asyncio tells a protocol `pause_writing()` when its transport holds more than the
high-water mark and `resume_writing()` once it is below the low one. Each connection
keeps that as a plain `write_paused` attribute (read on the hot path, where a method
call would cost) and a `Writable` for the coroutines that must wait: any number of
them share one future, none is lost when two wait at once, a cancelled waiter does
not cancel the others, and all of them learn when the connection is gone.
"""

from __future__ import annotations

import asyncio


class Writable:
    __slots__ = ("_waiter", "_error", "closed")

    def __init__(self) -> None:
        self._waiter: asyncio.Future | None = None
        self._error: BaseException | None = None
        self.closed = False

    async def wait(self) -> None:
        """Until `wake` (or at once once closed); raises the error `close` was given."""
        if not self.closed:
            waiter = self._waiter
            if waiter is None or waiter.done():
                waiter = self._waiter = asyncio.get_running_loop().create_future()
            await asyncio.shield(waiter)       # one waiter cancelled leaves the others
        if self._error is not None:
            raise self._error

    def wake(self) -> None:
        """The transport takes bytes again (`resume_writing`)."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def close(self, error: BaseException | None = None) -> None:
        """The connection is gone: every wait returns, raising `error` if given."""
        self.closed = True
        self._error = error
        self.wake()
