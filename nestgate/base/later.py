"""Writes made while the event loop runs a batch of reads, written after the batch
(`LATER`): an HTTP/1 connection's ready answers, and the proxy's request to its upstream
and the whole answer it relays (nestgate.handlers.proxy).

Why: a ready answer (the health JSON, a cached page) is made in a few microseconds,
and writing it wakes the client's reader. On loopback, where nestgate sits behind
another proxy or a load generator, a reader woken per answer goes back to sleep before
the next one, so every answer pays the wake-up (an inter-processor interrupt, a
hypervisor exit on a VM): measured on a 2-core VM, a third of a health answer's CPU.
Written together right after the batch of reads, the first answer wakes the reader and
the rest find it awake.

How (HTTP/1): the parser callback hands a keep-alive connection's ready answer to its
`LaterOutput` instead of the transport; the first one in a batch schedules one
`flush` with `call_soon`, which the event loop runs after this poll's read callbacks,
before it polls again. At most one answer per connection waits: a second one
(pipelined) writes the first and then itself at once, so a flood of pipelined
requests is paced by the transport's buffer as before. Every other write and every
close of a connection first writes what waits (`HTTP1Connection.write_later`), so
answers never change order and none is lost to a close.

The proxy: a request sent from callbacks goes to its upstream connection's
`LaterOutput` (nothing else writes to that connection until the answer has come, which
needs the request; a client that goes away closes it), and an answer whole in one
upstream read to the client connection's (`HTTP1Connection.write_last`). Paired
proxy-4k runs: -15 to -26 % CPU per request with both, nothing measurable with the
client side alone.
"""

from __future__ import annotations


class LaterOutput:
    """One connection's ready answer that waits for the end of the batch."""

    __slots__ = ("transport", "parts", "write", "writelines")

    def __init__(self, transport) -> None:
        self.transport = transport
        self.parts: list = []
        # `Prebuilt.write_to` writes to this as to a transport.
        self.write = self.parts.append
        self.writelines = self.parts.extend

    def flush(self) -> None:
        write_out((self,))


def write_out(outputs) -> None:
    """Write what each of `outputs` holds to its transport (one that is closing drops
    it) and empty it. An output added to `outputs` while this runs (a write's side
    effect) is reached too: a list is walked by index."""
    for output in outputs:
        parts = output.parts
        if parts:
            transport = output.transport
            if not transport.is_closing():
                if len(parts) == 1:
                    transport.write(parts[0])
                else:
                    transport.writelines(parts)
            parts.clear()


class LaterBatch:
    """The answers waiting in this worker's event loop.

    `waiting` is one list for the worker's life (emptied, never replaced), so the
    HTTP/1 parser callback can hold it and add a connection's output without a call
    (`nestgate.wire.h1parse`): `if not waiting: loop.call_soon(flush)`, then append."""

    __slots__ = ("waiting",)

    def __init__(self) -> None:
        self.waiting: list[LaterOutput] = []

    def add(self, output: LaterOutput, loop) -> None:
        if not self.waiting:
            loop.call_soon(self.flush)
        self.waiting.append(output)

    def append(self, output: LaterOutput, data: bytes, loop) -> None:
        """`data` after whatever `output` holds, written after this batch. (What `add`
        does, written out: the proxy comes here twice per request.)"""
        parts = output.parts
        if not parts:
            waiting = self.waiting
            if not waiting:
                loop.call_soon(self.flush)
            waiting.append(output)
        parts.append(data)

    def flush(self) -> None:
        # One call for the batch, not one per connection answered in it. Emptied
        # even if a write raises: a list left full would never be flushed again.
        try:
            write_out(self.waiting)
        finally:
            self.waiting.clear()


LATER = LaterBatch()
WAITING = LATER.waiting
