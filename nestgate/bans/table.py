"""The ban table: addresses and ranges refused at accept, shared by every process.

Theory of operation
-------------------
One anonymous shared mapping, made by the supervisor before it forks anything (like
the rate table, nestgate.pipeline.ratelimit), so a ban that one worker makes is in force in
every worker at its next accept, and the admin process reads the same entries.

An entry is a network (IPv4 or IPv6, a prefix length, the address bits under it),
when its ban ends (wall clock, which every process and instance shares), where it
came from (`origin`: a [[ban]] rule, the operator, or another source such as
CrowdSec), how a banned client is answered (closed, or the 403 page) and a short
reason. Ranges stay ranges: a lookup asks, for each prefix length that some entry of
the client's family has, whether the client's address cut to that length is there
(one hash probe sequence each). A table of 50,000 single addresses and a few dozen
ranges costs a handful of probes; an empty table costs one read. The lengths in use
are bitmaps in the header, which a process turns into tuples once per change.

Entries are placed by linear probing from the hash of the key (a tuple of ints, whose
hash is the same in every process). A lifted or ended entry keeps its key, so probing
goes on past it, and is taken again by the next ban that probes there; probing stops
at an entry never used. Writers (a ban made or lifted: rare) hold a lock the processes
share; readers take none: a new entry's key words are written before its meta word,
so a reader never matches half an entry.

Two writers, two kinds of entry. nestgate's own bans (a [[ban]] rule's, the
operator's, the store's: the workers and the admin process write them) and CrowdSec's
decisions (written only by the bouncer process, nestgate.bans.crowdsec: origin FED) are
kept apart: the kind is a bit of the meta word, so one network can hold one of each,
each writer lifts only its own, and a CrowdSec decision deleted never lifts a ban of
nestgate's on the same network (or the other way round). Both kinds share the probe
sequence of their network, so a lookup still costs one sequence per prefix length.
"""

from __future__ import annotations

import _multiprocessing
import ipaddress
import mmap
import os
import time
from typing import NamedTuple

from nestgate.base.clientip import _as_int

# What fills it: CrowdSec's decisions (50,000 is a large Local API with community
# lists; each decision is one entry, a range too) plus nestgate's own bans (a busy
# home server's rules make hundreds, `ban add` a few): ~51,000 entries, under 40 % of
# CAPACITY, where a lookup that finds nothing reads ~2 entries per prefix length in
# use (linear probing at load 0.4), and a new ban finds a free place long before
# PROBES. Lifted entries are taken again by bans that hash near them; however many
# there are, a lookup never reads more than PROBES entries per prefix length
# (tests/test_bans.py, test_fifty_thousand_decisions_keep_a_lookup_short).
CAPACITY = 1 << 17           # entries (8 MB of shared memory)
PROBES = 32                  # entries looked at from a key's place
WORDS = 8                    # 64-bit words per entry
HEADER_WORDS = 8
REASON_BYTES = 24

# Header words
_V4_LENGTHS, _V6_LOW, _V6_HIGH, _V6_TOP, _USED, _VERSION = range(6)
# Entry words
_META, _HI, _LO, _UNTIL, _INFO, _REASON = range(6)

ORIGINS = ("", "rule", "operator", "crowdsec", "store")
FED = "crowdsec"             # the origin of the entries the bouncer process writes
ANSWERS = ("close", "403")


class Ban(NamedTuple):
    network: str             # "203.0.113.7/32", "2001:db8:1:2::/64"
    until: float             # wall clock
    origin: str              # one of ORIGINS
    answer: str              # "close" or "403"
    reason: str


def network_key(network: str) -> tuple[int, int, int, str]:
    """(family bit, prefix length, the address bits under it, canonical text) of an
    address or CIDR; ValueError naming `network` when it is neither. An IPv4-mapped
    IPv6 range is its IPv4 range, as client addresses are folded."""
    try:
        net = ipaddress.ip_network(network.strip(), strict=False)
    except (ValueError, TypeError, AttributeError):
        raise ValueError(f"not an IP address or CIDR: {network!r}") from None
    if "%" in network:
        # A zone (`%eth0`) names nothing of a client (forwarded addresses lose theirs),
        # and "fe80::1%eth0" would be listed as a network no lookup ever meets: a ban,
        # a lift or a decision that names one is refused with the reason.
        raise ValueError(f"not an IP address or CIDR (a zone such as %eth0 is not one): "
                         f"{network!r}")
    if net.version == 6 and net.prefixlen >= 96 and net.network_address.ipv4_mapped:
        net = ipaddress.ip_network(f"{net.network_address.ipv4_mapped}/{net.prefixlen - 96}")
    bits = 32 if net.version == 4 else 128
    return (net.version == 6, net.prefixlen, int(net.network_address) >> (bits - net.prefixlen),
            str(net))


def client_network(client: str, ipv4_prefix: int = 32, ipv6_prefix: int = 64) -> str:
    """The network a rule bans for `client`: the address itself (IPv4), its /64 (IPv6),
    or whatever prefix the rule sets; "" for something that is not an address."""
    parsed = _as_int(client)
    if parsed is None:
        return ""
    bits, value = parsed
    prefix = ipv4_prefix if bits == 32 else ipv6_prefix
    address = ipaddress.ip_address(value) if bits == 32 else ipaddress.IPv6Address(value)
    return str(ipaddress.ip_network(f"{address}/{prefix}", strict=False))


SEMAPHORE = 1                   # _multiprocessing.SemLock's kind for a plain lock


def process_shared_lock():
    """A lock every process forked after it shares: what `multiprocessing`'s fork
    context makes (a POSIX semaphore, unlinked at once), without importing the
    `multiprocessing` package (its context, process, reduction, synchronize and util
    modules), which nothing else here uses: 0.3-0.6 MiB of the embedded default's idle
    anonymous PSS, measured."""
    while True:
        name = "/nestgate-" + os.urandom(6).hex()
        try:
            return _multiprocessing.SemLock(SEMAPHORE, 1, 1, name, True)
        except FileExistsError:
            continue


class BanTable:
    """The shared table (see the module docstring)."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        size = (HEADER_WORDS + capacity * WORDS) * 8
        self._map = mmap.mmap(-1, size, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
        self.words = memoryview(self._map).cast("Q")
        self.floats = memoryview(self._map).cast("d")
        self.raw = memoryview(self._map)
        self._lock = process_shared_lock()
        self._lengths_version = -1
        self._lengths: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())
        self.full_said = False
        self.entries_read = 0        # by this process's lookups: what a lookup costs

    # ------------------------------------------------------------ reading
    def __len__(self) -> int:
        """Entries holding a ban not lifted (some may have ended)."""
        return self.words[_USED]

    @property
    def version(self) -> int:
        """Changes whenever an entry does."""
        return self.words[_VERSION]

    def lookup(self, client: str, now: float | None = None) -> Ban | None:
        """The ban in force on `client` (an address as the engine keeps it), or None."""
        if not self.words[_USED]:
            return None
        parsed = _as_int(client)
        if parsed is None:
            return None
        bits, value = parsed
        v6 = bits == 128
        now = time.time() if now is None else now
        for prefix in self._lengths_of(v6):
            at = self._live(v6, prefix, value >> (bits - prefix), now)
            if at >= 0:
                return self._ban(at)
        return None

    def entries(self, now: float | None = None) -> list[Ban]:
        """Every ban in force, most lasting first."""
        now = time.time() if now is None else now
        if not self.words[_USED]:
            return []
        floats = self.floats
        metas = self.words[HEADER_WORDS + _META::WORDS].tolist()
        found = [self._ban(HEADER_WORDS + i * WORDS) for i, meta in enumerate(metas)
                 if meta and floats[HEADER_WORDS + i * WORDS + _UNTIL] > now]
        return sorted(found, key=lambda ban: -ban.until)

    def counts(self, now: float | None = None) -> dict[str, int]:
        """Bans in force by origin, read without decoding an entry (a scrape's)."""
        now = time.time() if now is None else now
        found: dict[str, int] = {}
        if not self.words[_USED]:
            return found
        metas = self.words[HEADER_WORDS + _META::WORDS].tolist()
        untils = self.floats[HEADER_WORDS + _UNTIL::WORDS].tolist()
        infos = self.words[HEADER_WORDS + _INFO::WORDS].tolist()
        for meta, until, info in zip(metas, untils, infos):
            if meta and until > now:
                origin = ORIGINS[info & 0xFF]
                found[origin] = found.get(origin, 0) + 1
        return found

    def _lengths_of(self, v6: bool) -> tuple[int, ...]:
        words = self.words
        if words[_VERSION] != self._lengths_version:
            self._lengths_version = words[_VERSION]
            v6_mask = words[_V6_LOW] | words[_V6_HIGH] << 64 | words[_V6_TOP] << 128
            self._lengths = (_bits(words[_V4_LENGTHS], 32), _bits(v6_mask, 128))
        return self._lengths[v6]

    def _live(self, v6: bool, prefix: int, key: int, now: float) -> int:
        """The word index of a ban in force on this key (nestgate's or CrowdSec's,
        whichever comes first), or -1."""
        meta, hi, lo = _meta(v6, prefix, False), key >> 64, key & _MASK64
        words, floats = self.words, self.floats
        start = hash((v6, prefix, key)) % self.capacity
        for probe in range(PROBES):
            at = HEADER_WORDS + (start + probe) % self.capacity * WORDS
            held = words[at + _META]
            if held == 0:
                self.entries_read += probe + 1
                return -1
            if held & ~_FED_BIT == meta and words[at + _HI] == hi and words[at + _LO] == lo \
                    and floats[at + _UNTIL] > now:
                self.entries_read += probe + 1
                return at
        self.entries_read += PROBES
        return -1

    def _find(self, v6: bool, prefix: int, key: int, fed: bool) -> int:
        """The word index of the entry with this key of this kind, or -1."""
        meta, hi, lo = _meta(v6, prefix, fed), key >> 64, key & _MASK64
        words = self.words
        start = hash((v6, prefix, key)) % self.capacity
        for probe in range(PROBES):
            at = HEADER_WORDS + (start + probe) % self.capacity * WORDS
            held = words[at + _META]
            if held == 0:
                return -1
            if held == meta and words[at + _HI] == hi and words[at + _LO] == lo:
                return at
        return -1

    def _ban(self, at: int) -> Ban:
        words = self.words
        meta = words[at + _META]
        v6, prefix = bool(meta >> 16 & 1), meta >> 8 & 0xFF
        key = words[at + _HI] << 64 | words[at + _LO]
        bits = 128 if v6 else 32
        address = (ipaddress.IPv6Address if v6 else ipaddress.IPv4Address)(
            key << (bits - prefix) if prefix else 0)
        info = words[at + _INFO]
        offset = (at + _REASON) * 8
        reason = bytes(self.raw[offset:offset + REASON_BYTES]).rstrip(b"\0")
        return Ban(f"{address}/{prefix}", self.floats[at + _UNTIL], ORIGINS[info & 0xFF],
                   ANSWERS[info >> 8 & 0xFF], reason.decode("utf-8", "replace"))

    # ------------------------------------------------------------ writing
    def add(self, network: str, until: float, origin: str = "rule", reason: str = "",
            answer: str = "close") -> None:
        """Ban an address or range (CIDR text) until `until` (wall clock); a ban of the
        same kind (CrowdSec's, `origin` FED, or nestgate's) already on that network is
        replaced. ValueError for a network, origin or answer that is not one."""
        v6, prefix, key, _text = network_key(network)
        fed = origin == FED
        info = ORIGINS.index(origin) | ANSWERS.index(answer) << 8
        encoded = reason.encode("utf-8")[:REASON_BYTES].ljust(REASON_BYTES, b"\0")
        with self._lock:
            at = self._find(v6, prefix, key, fed)
            words = self.words
            fresh = at < 0
            if fresh:
                at = self._free_place(v6, prefix, key)
            # A never used or lifted entry (its own key's too) is one more in USED.
            if words[at + _META] == 0 or self.floats[at + _UNTIL] == 0.0:
                words[_USED] += 1
            if fresh:
                words[at + _META] = 0               # unmatched while its key changes
                words[at + _HI], words[at + _LO] = key >> 64, key & _MASK64
            self.floats[at + _UNTIL] = until
            words[at + _INFO] = info
            self.raw[(at + _REASON) * 8:(at + _REASON) * 8 + REASON_BYTES] = encoded
            words[at + _META] = _meta(v6, prefix, fed)
            self._mark_length(v6, prefix)
            words[_VERSION] += 1

    def remove(self, network: str, origin: str = "") -> bool:
        """Lift nestgate's ban on exactly this network (CrowdSec's with `origin` FED);
        False when it has none in force."""
        v6, prefix, key, _text = network_key(network)
        with self._lock:
            at = self._find(v6, prefix, key, origin == FED)
            if at < 0 or self.floats[at + _UNTIL] == 0.0:
                return False
            live = self.floats[at + _UNTIL] > time.time()
            self.floats[at + _UNTIL] = 0.0           # keeps its key: probing goes past it
            self.words[_USED] -= 1
            self.words[_VERSION] += 1
            return live

    def lift_origin(self, origin: str) -> int:
        """Lift every ban of `origin` in force; how many were."""
        code = ORIGINS.index(origin)
        lifted = 0
        with self._lock:
            words, floats = self.words, self.floats
            infos = words[HEADER_WORDS + _INFO::WORDS].tolist()
            for i, info in enumerate(infos):
                at = HEADER_WORDS + i * WORDS
                if info & 0xFF == code and words[at + _META] and floats[at + _UNTIL] != 0.0:
                    floats[at + _UNTIL] = 0.0        # keeps its key, as `remove` does
                    words[_USED] -= 1
                    lifted += 1
            if lifted:
                words[_VERSION] += 1
        return lifted

    def _free_place(self, v6: bool, prefix: int, key: int) -> int:
        """Where a new key goes: the first entry along its probes that is free (never
        used, lifted or ended); when none is, the one whose ban ends first."""
        now = time.time()
        words, floats = self.words, self.floats
        start = hash((v6, prefix, key)) % self.capacity
        soonest, soonest_at = float("inf"), -1
        for probe in range(PROBES):
            at = HEADER_WORDS + (start + probe) % self.capacity * WORDS
            if words[at + _META] == 0 or floats[at + _UNTIL] <= now:
                return at
            if floats[at + _UNTIL] < soonest:
                soonest, soonest_at = floats[at + _UNTIL], at
        if not self.full_said:
            self.full_said = True
            import sys
            print("nestgate: the ban table is full where a new ban hashed; the ban that "
                  "ends first there was replaced", file=sys.stderr, flush=True)
        return soonest_at

    def _mark_length(self, v6: bool, prefix: int) -> None:
        if not v6:
            self.words[_V4_LENGTHS] |= 1 << prefix
        elif prefix < 64:
            self.words[_V6_LOW] |= 1 << prefix
        elif prefix < 128:
            self.words[_V6_HIGH] |= 1 << (prefix - 64)
        else:
            self.words[_V6_TOP] |= 1


_MASK64 = (1 << 64) - 1
_FED_BIT = 1 << 17


def _meta(v6: bool, prefix: int, fed: bool) -> int:
    return fed << 17 | v6 << 16 | prefix << 8 | 1


def _bits(mask: int, most: int) -> tuple[int, ...]:
    """The prefix lengths set in `mask`, most specific first."""
    return tuple(length for length in range(most, -1, -1) if mask >> length & 1)


_TABLE: BanTable | None = None


def ban_table() -> BanTable:
    """This process tree's table: the supervisor makes it before its first fork; a
    process without a supervisor (tests) makes its own."""
    global _TABLE
    if _TABLE is None:
        _TABLE = BanTable()
    return _TABLE
