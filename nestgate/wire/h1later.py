"""Ready answers written after the batch of reads that asked for them (`LATER`).

Why: a ready answer (the health JSON, a cached page) is made in a few microseconds,
and writing it wakes the client's reader. On loopback, where nestgate sits behind
another proxy or a load generator, a reader woken per answer goes back to sleep before
the next one, so every answer pays the wake-up (an inter-processor interrupt, a
hypervisor exit on a VM): measured on a 2-core VM, a third of a health answer's CPU.
Written together right after the batch of reads, the first answer wakes the reader and
the rest find it awake.

How: the parser callback hands a keep-alive connection's ready answer to its
`LaterOutput` instead of the transport; the first one in a batch schedules one
`flush` with `call_soon`, which the event loop runs after this poll's read callbacks,
before it polls again. At most one answer per connection waits: a second one
(pipelined) writes the first and then itself at once, so a flood of pipelined
requests is paced by the transport's buffer as before. Every other write and every
close of a connection first writes what waits (`HTTP1Connection.write_later`), so
answers never change order and none is lost to a close.
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
        parts = self.parts
        if not parts:
            return
        transport = self.transport
        if not transport.is_closing():
            if len(parts) == 1:
                transport.write(parts[0])
            else:
                transport.writelines(parts)
        parts.clear()


class LaterBatch:
    """The answers waiting in this worker's event loop."""

    __slots__ = ("waiting",)

    def __init__(self) -> None:
        self.waiting: list[LaterOutput] = []

    def add(self, output: LaterOutput, loop) -> None:
        if not self.waiting:
            loop.call_soon(self.flush)
        self.waiting.append(output)

    def flush(self) -> None:
        waiting, self.waiting = self.waiting, []
        for output in waiting:
            output.flush()


LATER = LaterBatch()
