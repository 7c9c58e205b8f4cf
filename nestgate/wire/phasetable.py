"""A connection's phases as a table of allowed moves (as h2 keeps its stream states):
`PhaseTable` is mixed into each protocol's connection, which names its own table
(`nestgate.wire.h1phases`, `nestgate.wire.h2phases`). A move the table does not list is a bug in
the adapter, never the client's doing: it raises.
"""

from __future__ import annotations


class PhaseTable:
    """`_enter` moves the connection's `phase` (set by its `__init__`) as `NEXT` allows.
    (No class attribute `phase`: one would keep Python from specialising the reads of
    the instance's, done on every read of the client's bytes.)"""

    NEXT: dict[int, tuple[int, ...]] = {}   # a phase -> the phases it may move to
    PHASE_NAMES: tuple[str, ...] = ()
    protocol = ""

    def _enter(self, phase: int) -> None:
        """Move to `phase` (staying in the same one is no move)."""
        if phase != self.phase:
            if phase not in self.NEXT[self.phase]:
                raise RuntimeError(f"an {self.protocol} connection cannot go from "
                                   f"{self.PHASE_NAMES[self.phase]} to {self.PHASE_NAMES[phase]}")
            self.phase = phase
