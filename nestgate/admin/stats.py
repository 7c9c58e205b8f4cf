"""Figures each worker publishes for the admin process, without a syscall, lock or
allocation on the request path.

The supervisor maps one shared, anonymous memory table before it forks anything; each
worker is given a slot and, once per tick of its clock, writes its figures there with
one `pack_into`. The admin process reads every slot when asked. A reader may see a slot
half-written: the figures are counters and gauges read by people and scrapers, and the
next read is whole; a slot whose pid is 0 is free.

Requests are counted without a per-request step: each connection already counts its
requests (for `keepalive_requests`); a closed connection adds its count to its
listener's total, and the tick adds the open connections' counts to that.

Beside each slot, a second table holds the worker's answer counts and durations
(`nestgate.base.tally`) as a JSON blob of at most `TALLY_BYTES`, written on the same tick.
One more blob goes the other way: the operator's requests (purge the pages, drain an
upstream; nestgate/base/control.py), written by the admin process, read by every worker on
its tick. A blob is framed by a sequence number made odd while it is written and even
after, so the reader can tell a torn one and read again.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass

# pid, generation, started (wall clock), requests served, open connections: HTTP/1.1,
# HTTP/2, of those over TLS, TLS handshakes under way; updated (wall clock); HTTP bytes
# read, written
_SLOT = struct.Struct("<qqdqqqqqdqq")
SLOTS = 256                  # workers of every live generation, and room for restarts
TALLY_BYTES = 64 * 1024      # a worker's tally blob; pages are touched only when used
CONTROL_BYTES = 64 * 1024    # the admin process's requests to the workers
_FRAME = struct.Struct("<QI")                # sequence, length


def _write_frame(memory: mmap.mmap, base: int, size: int, data: bytes) -> bool:
    """`data` at `base`, framed by a sequence number that is odd while it is written;
    False (nothing written) when it does not fit in `size`."""
    if len(data) > size - _FRAME.size:
        return False
    seq = _FRAME.unpack_from(memory, base)[0]
    _FRAME.pack_into(memory, base, seq + 1, 0)
    memory[base + _FRAME.size:base + _FRAME.size + len(data)] = data
    _FRAME.pack_into(memory, base, seq + 2, len(data))
    return True


def _read_frame(memory: mmap.mmap, base: int) -> tuple[int, bytes | None]:
    """(sequence, data) of a whole frame; data None if it was being written at every
    try (sequence 0: never written)."""
    for _ in range(5):
        seq, length = _FRAME.unpack_from(memory, base)
        if seq & 1:
            continue
        data = memory[base + _FRAME.size:base + _FRAME.size + length]
        if _FRAME.unpack_from(memory, base)[0] == seq:
            return seq, data
    return 0, None


@dataclass(frozen=True)
class WorkerFigures:
    slot: int
    pid: int
    generation: int
    started: float
    requests: int
    http1: int
    http2: int
    tls: int
    handshakes: int
    updated: float
    bytes_in: int
    bytes_out: int

    @property
    def connections(self) -> int:
        return self.http1 + self.http2 + self.handshakes


class WorkerTable:
    """The shared table; made by the supervisor, inherited across fork."""

    def __init__(self, slots: int = SLOTS) -> None:
        self.slots = slots
        self.memory = mmap.mmap(-1, _SLOT.size * slots)   # MAP_SHARED | MAP_ANONYMOUS
        self.tallies = mmap.mmap(-1, TALLY_BYTES * slots)
        self.control = mmap.mmap(-1, CONTROL_BYTES)        # admin process -> workers
        self.taken: set[int] = set()                        # the supervisor's book

    # ---------------------------------------------------------- the supervisor
    def claim(self) -> int:
        """A free slot for a new worker (-1 when none: it then publishes nothing)."""
        for slot in range(self.slots):
            if slot not in self.taken:
                self.taken.add(slot)
                self.write(slot, 0, 0, 0.0, 0, 0, 0, 0, 0, 0.0, 0, 0)
                self.write_tally(slot, b"")
                return slot
        return -1

    def release(self, slot: int) -> None:
        if slot in self.taken:
            self.taken.discard(slot)
            self.write(slot, 0, 0, 0.0, 0, 0, 0, 0, 0, 0.0, 0, 0)

    # ---------------------------------------------------------- a worker
    def write(self, slot: int, pid: int, generation: int, started: float, requests: int,
              http1: int, http2: int, tls: int, handshakes: int, updated: float,
              bytes_in: int, bytes_out: int) -> None:
        if slot >= 0:
            _SLOT.pack_into(self.memory, slot * _SLOT.size, pid, generation, started,
                            requests, http1, http2, tls, handshakes, updated, bytes_in,
                            bytes_out)

    def write_tally(self, slot: int, data: bytes) -> bool:
        """The worker's tally blob; False (nothing written) when it does not fit."""
        return slot >= 0 and _write_frame(self.tallies, slot * TALLY_BYTES, TALLY_BYTES, data)

    def control_seq(self) -> int:
        """The control frame's sequence alone: what a worker's tick reads."""
        return _FRAME.unpack_from(self.control, 0)[0]

    def read_control(self) -> tuple[int, bytes | None]:
        """(sequence, the operator's requests as JSON) from the admin process."""
        return _read_frame(self.control, 0)

    # ---------------------------------------------------------- the admin process
    def read_tally(self, slot: int) -> bytes | None:
        """A slot's tally blob, whole; None if it was being written at every try."""
        return _read_frame(self.tallies, slot * TALLY_BYTES)[1]

    def write_control(self, data: bytes) -> bool:
        """The operator's requests for every worker (see nestgate/base/control.py)."""
        return _write_frame(self.control, 0, CONTROL_BYTES, data)

    def read(self) -> list[WorkerFigures]:
        figures = []
        for slot in range(self.slots):
            values = _SLOT.unpack_from(self.memory, slot * _SLOT.size)
            if values[0]:
                figures.append(WorkerFigures(slot, *values))
        return figures
