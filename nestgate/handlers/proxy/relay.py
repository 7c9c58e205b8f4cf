"""The client side of a proxied exchange: one relay per way a client is answered.

The upstream side (`upstream.Exchange`) reads the upstream's response and hands what
it makes of it to its relay: the head (`start`, or `start_counted` for a remembered
head with the first body bytes), body chunks (`body`, `counted`), the end (`end`),
and after each upstream read `flush`. Only the relay writes to the client, and only
the relay decides that the upstream must stop being read because the client is not
taking bytes: the upstream connection's `flow.Reading`, paused and resumed through
`flow.hold` like every other pause.

`ByteRelay` answers a client whose response is one byte stream (HTTP/1.1,
`Request.relays_bytes`): the response is framed here and written once per upstream
read, from the parser's callbacks, so no coroutine runs for it; a client whose
buffer fills pauses the upstream's reading until the client drains.

`StreamRelay` answers a client through its protocol's own `start_raw` and `write`
(HTTP/2 and HTTP/3 streams, both under their flow control). The upstream is read
only while the client's protocol has granted room for the body (`Request.room`), so
a client that opens no window holds at most CLIENT_ROOM plus one socket read per
stream. Body chunks are queued for the handler's coroutine to write (`drain`). On
HTTP/2, when the stream has room at once (`Request.room_now`), there is no coroutine
at first: the answer goes out from the callbacks as on HTTP/1.1 (`write_now`), and
only if a chunk cannot go at once does a task take over the rest, as the handler's
coroutine would have.

A relay is made once per upstream connection and kind of client, and `reset` for
each request (an upstream connection is reused, by clients of either kind).
"""

from __future__ import annotations

import asyncio

from nestgate.base.clock import CLOCK
from nestgate.base.flow import hold

# Response body bytes a stream's relay asks room for at a time (see `StreamRelay`).
CLIENT_ROOM = 64 * 1024


class ByteRelay:
    """HTTP/1.1: the response's bytes, framed, written once per upstream read."""

    __slots__ = ("exchange", "reading", "req", "out")

    relays_bytes = True

    def __init__(self, exchange, reading) -> None:
        self.exchange = exchange
        self.reading = reading          # the upstream connection's
        self.req = None                 # set by the exchange for each request
        self.out: list[bytes] = []      # what this upstream read made, for one write

    # ------------------------------------------------------ from the upstream side
    def start(self, status: int, block: bytes, length: int | None, lines: bytes | None) -> None:
        """The head: `lines` is the status and header lines with their framing when
        the upstream's head was remembered with its length, else None."""
        req = self.req
        self.out.append(req.head_from(status, lines) if lines is not None
                        else req.head_bytes(status, block, length))

    def start_counted(self, status: int, block: bytes, lines: bytes, length: int,
                      first: bytes, whole: bool) -> None:
        """A remembered head framed by its Content-Length, and the body bytes that
        came with it (b"" for none); `whole` when they are all of it."""
        req = self.req
        head = req.head_from(status, lines)
        if first:
            req.sent += len(first)
            head += first
        if not whole:
            self.out.append(head)
            return
        # The usual answer, whole in one read: out after this batch of reads (its
        # length frames it, so there is nothing to end it with; nestgate.base.later).
        req.end_bytes()
        req.connection.write_last(head)

    def body(self, chunk: bytes) -> None:
        data = self.req.frame(chunk)
        if data:
            self.out.append(data)

    def counted(self, chunk: bytes) -> None:
        """Body bytes of a response framed by Content-Length: no framing of ours."""
        self.req.sent += len(chunk)
        self.out.append(chunk)

    def end(self) -> None:
        tail = self.req.end_bytes()
        if tail:
            self.out.append(tail)

    def flush(self) -> None:
        """What the upstream read made, to the client in one write; a client that
        takes no more stops the upstream's reading."""
        out, self.out = self.out, []
        client = self.req.connection
        client.write(out[0] if len(out) == 1 else b"".join(out))
        if client.write_paused and not self.exchange.complete and not self.reading.paused:
            self.reading.pause()
            if self.exchange.fast is not None:
                # Answered from callbacks: nothing waits, so a task holds the pause.
                asyncio.get_running_loop().create_task(self._hold_alone(client))
            else:
                self.exchange.signal.wake()

    async def _hold_alone(self, client) -> None:
        try:
            await hold(self.reading, client.wait_writable)
        except ConnectionError:
            return                      # the client went away: `Request.cancel` cleans up
        self.exchange.last = CLOCK.now  # the read timeout counts from here

    # ------------------------------------------------------ the handler's coroutine
    def ready_now(self) -> bool:
        """Whether the request may go upstream at once, answered from callbacks."""
        return True

    async def ready(self) -> None:
        """Before the request goes upstream: nothing to wait for."""

    def due(self) -> bool:
        """Whether `drain` has something to do."""
        return self.reading.paused

    async def drain(self) -> None:
        await hold(self.reading, self.req.writable)


class StreamRelay:
    """HTTP/2, HTTP/3: the response through the stream's own calls, under its flow
    control; the upstream read only within the room the stream granted."""

    __slots__ = ("exchange", "reading", "req", "out", "credit")

    relays_bytes = False

    def __init__(self, exchange, reading) -> None:
        self.exchange = exchange
        self.reading = reading
        self.req = None                 # set by the exchange for each request
        self.out: list[bytes] = []      # body chunks for `drain` to write
        self.credit = 0                 # body bytes the client's protocol has room for

    def _begin(self) -> None:
        # Chunks a handler left unwritten (its stream was reset while it waited for
        # the client's window, after the upstream's response had all arrived): the
        # connection is sound, the chunks are the last client's and go nowhere.
        self.out.clear()
        self.credit = 0

    # ------------------------------------------------------ from the upstream side
    def start(self, status: int, block: bytes, length: int | None, lines: bytes | None) -> None:
        self.req.start_raw(status, block, length)

    def start_counted(self, status: int, block: bytes, lines: bytes, length: int,
                      first: bytes, whole: bool) -> None:
        req = self.req
        if first and whole and self.exchange.fast is not None:
            if req.answer_now(status, block, length, first):
                return      # the usual answer, whole in one read, and the stream's end
        else:
            req.start_raw(status, block, length)
            if not first:
                return
        self.body(first)

    def body(self, chunk: bytes) -> None:
        self.credit -= len(chunk)
        exchange = self.exchange
        if exchange.fast is None or self.out or not self.req.write_now(chunk):
            self.out.append(chunk)              # for `drain`, in order
        if self.credit <= 0:
            # Past the room the client's protocol granted: read no further until
            # `drain` has written what waits and been granted more.
            self.reading.pause()
        if exchange.fast is not None and (self.out or self.credit <= 0):
            # Answered from callbacks until now, but the client's protocol cannot take
            # more at once: a task writes the rest and waits for room as a handler's
            # coroutine does, then settles the exchange (cancelled with the stream).
            handler, exchange.fast = exchange.fast, None
            self.req.task = asyncio.get_running_loop().create_task(self._finish_alone(handler))

    counted = body

    def end(self) -> None:
        """The response is ended once what is queued is out (`Request.end`, by
        `conclude` after the handler or its callbacks are done)."""

    def flush(self) -> None:
        self.exchange.signal.wake()     # `drain` has chunks to write

    async def _finish_alone(self, handler) -> None:
        exchange = self.exchange
        try:
            await exchange.wait()
        except (asyncio.CancelledError, ConnectionError):
            exchange.fast = handler             # the stream or its connection is gone
            handler.abandon(exchange)
            return
        handler.settled(exchange)

    # ------------------------------------------------------ the handler's coroutine
    def ready_now(self) -> bool:
        """Room for the first part of the body at once (see `ready`): then the answer
        may go from callbacks."""
        self._begin()
        self.credit = self.req.room_now(CLIENT_ROOM)
        return self.credit > 0

    async def ready(self) -> None:
        """Room for the first part of the body before the upstream is asked: a client
        that grants no window never gets anything read for it."""
        self._begin()
        await self._room()

    def due(self) -> bool:
        return bool(self.out) or self.reading.paused

    async def drain(self) -> None:
        """The queued chunks through the stream's `write`; then, if the upstream was
        paused for room and the response is not over, room for more."""
        chunks, self.out = self.out, []
        for chunk in chunks:
            await self.req.write(chunk)
        if self.reading.paused and not self.exchange.complete:
            await hold(self.reading, self._room)

    async def _room(self) -> None:
        while self.credit <= 0:
            self.credit += await self.req.room(CLIENT_ROOM)


class HeldRelay:
    """A relay's calls kept back while the upstream read that completes a response's
    head is parsed: a malformed body in that same read (a bad chunk size) is then a
    502 to a client that has had no byte of the answer, as nginx answers, instead of
    a head already on its way and a cut connection. `release` makes the calls, in
    order, once the read parsed cleanly or the response ended whole within it."""

    __slots__ = ("relay", "calls")

    def __init__(self, relay) -> None:
        self.relay = relay
        self.calls: list[tuple] = []

    def start(self, status: int, block: bytes, length: int | None, lines: bytes | None) -> None:
        self.calls.append((self.relay.start, (status, block, length, lines)))

    def body(self, chunk: bytes) -> None:
        self.calls.append((self.relay.body, (chunk,)))

    def end(self) -> None:
        self.calls.append((self.relay.end, ()))

    def release(self) -> None:
        calls, self.calls = self.calls, []
        for call, args in calls:
            call(*args)


def relay_for(exchange, reading, req):
    """The relay for `req`'s kind of client."""
    return (ByteRelay if req.relays_bytes else StreamRelay)(exchange, reading)
