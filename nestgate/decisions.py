"""Decision tables: addresses and ranges to refuse, shared by every worker through a file.

Theory of operation
-------------------
A `DecisionTable` holds what an outside source decided (the CrowdSec bouncer,
nestgate.crowdsec): single addresses and CIDR ranges, tens of thousands of them. Each
family is a sorted list of disjoint [first, last] integer intervals (overlapping and
adjoining entries merged as the table is built), so a range stays one entry however
wide it is, and "is this address refused" is one C-level bisect on a list, the same
cost for five entries as for fifty thousand; the guard then keeps the verdict on the
connection (nestgate.access), so a kept-alive client pays for it once.

One process writes the table (`write_table`: temp file, fsync, rename, so a reader sees
the old table or the new one, never half of one) and every worker reads it
(`SharedDecisions`, a worker `Service`): every `CHECK_EVERY` seconds it stats the file
off its loop and, when it changed, reads and decodes it off the loop and swaps it in,
then tells the guards (`on_change`). The file outlives restarts: a worker that starts
while the source is unreachable enforces the last table written.

The file: a magic line, then for IPv4 and IPv6 a count and that many (first, last)
pairs as big-endian integers (4 and 16 bytes), already sorted and merged.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import struct
import sys
from array import array
from bisect import bisect_right

from nestgate.clientip import _as_int
from nestgate.filewatch import file_stamp
from nestgate.handlers import Periodic, Service

MAGIC = b"nestgate decisions 1\n"
CHECK_EVERY = 1.0            # seconds between a worker's looks at the file
_FAMILIES = ((32, 4), (128, 16))     # (bits, bytes per address)


def interval(entry: str) -> tuple[int, int, int]:
    """(bits, first, last) of an address or CIDR; ValueError if it is neither. An
    IPv4-mapped IPv6 entry is IPv4, as clients are."""
    if "/" not in entry:
        parsed = _as_int(entry.strip())        # the common case, without ipaddress's cost
        if parsed is not None:
            return parsed[0], parsed[1], parsed[1]
    net = ipaddress.ip_network(entry.strip(), strict=False)
    if net.version == 6 and net.prefixlen >= 96 and \
            net.network_address.ipv4_mapped is not None:
        net = ipaddress.ip_network(f"{net.network_address.ipv4_mapped}/{net.prefixlen - 96}")
    bits = 32 if net.version == 4 else 128
    return bits, int(net.network_address), int(net.broadcast_address)


def _merged(pairs: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    firsts: list[int] = []
    lasts: list[int] = []
    for first, last in sorted(pairs):
        if lasts and first <= lasts[-1] + 1:
            lasts[-1] = max(lasts[-1], last)
        else:
            firsts.append(first)
            lasts.append(last)
    return firsts, lasts


class DecisionTable:
    """Addresses and ranges; `address in table` for an address in canonical text."""

    __slots__ = ("_firsts", "_lasts", "entries")

    def __init__(self, entries=()) -> None:
        pairs: dict[int, list[tuple[int, int]]] = {32: [], 128: []}
        count = 0
        for entry in entries:
            bits, first, last = interval(entry)
            pairs[bits].append((first, last))
            count += 1
        self._firsts: dict[int, list[int]] = {}
        self._lasts: dict[int, list[int]] = {}
        for bits, found in pairs.items():
            self._firsts[bits], self._lasts[bits] = _merged(found)
        self.entries = count           # as given, before merging

    def __len__(self) -> int:
        return sum(len(firsts) for firsts in self._firsts.values())

    def __contains__(self, address: str) -> bool:
        parsed = _as_int(address)
        if parsed is None:
            return False
        bits, value = parsed
        firsts = self._firsts[bits]
        at = bisect_right(firsts, value) - 1
        return at >= 0 and value <= self._lasts[bits][at]

    # ------------------------------------------------------------ the file
    def encode(self) -> bytes:
        out = [MAGIC]
        for bits, size in _FAMILIES:
            firsts, lasts = self._firsts[bits], self._lasts[bits]
            out.append(struct.pack("!I", len(firsts)))
            out.extend(first.to_bytes(size, "big") + last.to_bytes(size, "big")
                       for first, last in zip(firsts, lasts))
        return b"".join(out)

    @classmethod
    def decode(cls, data: bytes) -> DecisionTable:
        """The table `encode` wrote; ValueError for anything else."""
        if not data.startswith(MAGIC):
            raise ValueError("not a decisions file")
        table = cls()
        at = len(MAGIC)
        for bits, size in _FAMILIES:
            if len(data) < at + 4:
                raise ValueError("decisions file cut short")
            (count,) = struct.unpack_from("!I", data, at)
            at += 4
            end = at + count * 2 * size
            if len(data) < end:
                raise ValueError("decisions file cut short")
            values = _unpack(data[at:end], size)
            table._firsts[bits], table._lasts[bits] = values[0::2], values[1::2]
            table.entries += count
            at = end
        return table


def _unpack(data: bytes, size: int) -> list[int]:
    """Big-endian integers of `size` bytes (4 or 16), unpacked in C, not one by one."""
    words = array("I" if size == 4 else "Q")
    words.frombytes(data)
    if sys.byteorder == "little":
        words.byteswap()
    if size == 4:
        return words.tolist()
    return [(high << 64) | low for high, low in zip(words[0::2], words[1::2])]


def write_table(path: str, table: DecisionTable) -> None:
    """Replace the file at `path` whole (temp file, fsync, rename, fsync the folder)."""
    folder = os.path.dirname(path) or "."
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(table.encode())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)



def read_table(path: str) -> DecisionTable | None:
    """The table in `path`; None when there is none yet (or it cannot be read)."""
    try:
        with open(path, "rb") as f:
            return DecisionTable.decode(f.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        print(f"nestgate: decisions {path}: {exc}; the last table stays in force",
              file=sys.stderr, flush=True)
        return None


class SharedDecisions(Service):
    """A worker's copy of the table in `path`: `address in shared`."""

    tick_every = CHECK_EVERY

    def __init__(self, path: str) -> None:
        self.path = path
        self.on_change = None          # called after a new table is in (the guards')
        self._stamp = file_stamp(path)
        self.table = read_table(path) or DecisionTable()
        self._watch = Periodic(CHECK_EVERY, self._look)

    def __contains__(self, address: str) -> bool:
        return address in self.table

    def tick(self, now: float) -> None:
        self._watch.tick(now)

    def stop(self) -> None:
        self._watch.stop()

    async def _look(self) -> None:
        loop = asyncio.get_running_loop()
        stamp = await loop.run_in_executor(None, file_stamp, self.path)
        if stamp is None or stamp == self._stamp:
            return
        self._stamp = stamp
        table = await loop.run_in_executor(None, read_table, self.path)
        if table is not None:
            self.table = table
            if self.on_change is not None:
                self.on_change()
