"""Rate and connection limits per client, for the whole server rather than per worker.

Theory of operation
-------------------
`rate_limit = { rate = "10/s", burst = 20 }` on a site or a route is GCRA (the
generic cell rate algorithm, as nginx's `limit_req ... nodelay` behaves): each client
has a theoretical arrival time (TAT); a request at `now` passes when
`TAT - now <= (burst - 1) / rate`, and then moves TAT on by `1 / rate` from
`max(TAT, now)`. So `burst` requests pass at once, then `rate` per second, and one
number per client is all the state.

That number lives in `RateTable`, one shared, anonymous memory table that the
supervisor maps before it forks any worker, so every worker of every generation reads
and writes the same TATs: a client that spreads its connections over the workers gets
the configured total, not one per worker. An entry is a 64-bit tag (the hash of the
limit and the client key; workers are forked from the supervisor and share its hash
seed) and the TAT, found by linear probing over PROBES entries. An entry whose TAT has
passed carries no state and is reused; when all probes are live, the one nearest to
expiring is replaced. Two workers may read the same TAT at the same instant and both
let a request through: a limit can be overrun by one request in such a race, never
more, and no lock or syscall is taken. The time is CLOCK_MONOTONIC (a vDSO read, the
same clock in every process).

A request that no `rate_limit` covers never reaches this module: the limit is a
GATED wrapper put around a route's handler when the route is compiled
(`SiteRoutes.add_exact`/`add_prefix` call the site's guard, which adds it), ahead of
the access list and sign-in, as nginx's `limit_req` runs before `allow`/`deny`.
The client key is worked out once per connection and client address (kept on the
connection, like access decisions): the address after trusted proxies and PROXY
protocol, its /64 for IPv6 (`ipv6_prefix`), or with `key = "user"` the signed-in
user of a live session the worker already knows (else the address).

`max_connections_per_client` on a listener (nginx's `limit_conn`) counts open HTTP
connections per client address in `ConnectionCounts`: each worker writes only its
own region of another shared table (so there is nothing to race on; the region is
the worker's slot in the admin's worker table), and a new connection is checked
against the sum over the regions in use. The supervisor empties a region when its
worker exits, so a dead worker's connections stop counting at once.
"""

from __future__ import annotations

import ipaddress
import mmap
import sys
import time
from dataclasses import dataclass

from nestgate.bans.watch import BANS
from nestgate.base.clientip import parse_networks
from nestgate.base.handler import GATED, Periodic, Service
from nestgate.base.tally import TALLY

RATE_ENTRIES = 1 << 17          # clients tracked at once, over every limit (2 MiB)
PROBES = 8
CONNECTION_ENTRIES = 4096       # client addresses per worker region (64 KiB each)
SPAN_MIN = 16                   # worker regions a connection check reads at least
_TAG_MASK = (1 << 64) - 1
SYNC_INTERVAL = 0.1             # seconds between a worker's sends of what its limits used
_SLACK = 1e-6                   # TATs are sums of floats: a microsecond of rounding is no excess
_UNITS = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0}


# ---------------------------------------------------------------- configuration
@dataclass(frozen=True)
class RateLimit:
    rate: float                   # requests per second
    burst: int                    # requests that may pass at once
    key: str = "ip"               # "ip" or "user"
    ipv6_prefix: int = 64         # IPv6 clients share a limit per this prefix
    exempt: tuple[str, ...] = ()  # CIDRs never limited (none by default: loopback too)
    text: str = ""                # the rate as written, for messages

    @property
    def interval(self) -> float:
        return 1.0 / self.rate

    @property
    def tolerance(self) -> float:
        return (self.burst - 1) / self.rate


def parse_rate(value) -> float:
    """"10/s", "600/m" (or /min, /minute) -> requests per second."""
    if not isinstance(value, str) or "/" not in value:
        raise ValueError('a rate such as "10/s" or "300/m"')
    count, _, unit = value.partition("/")
    try:
        number = float(count.strip())
    except ValueError:
        raise ValueError('a rate such as "10/s" or "300/m"') from None
    seconds = _UNITS.get(unit.strip().lower())
    if seconds is None or not number > 0 or number == float("inf"):
        raise ValueError('a rate above 0 per "s" or "m", such as "10/s" or "300/m"')
    return number / seconds


def rate_limit_from(value) -> RateLimit:
    """A `rate_limit` inline table, checked; ValueError names what is wrong."""
    if not isinstance(value, dict):
        raise ValueError('a table such as { rate = "10/s", burst = 20 }')
    unknown = set(value) - {"rate", "burst", "key", "ipv6_prefix", "exempt"}
    if unknown:
        raise ValueError(f"keys rate, burst, key, ipv6_prefix, exempt (unknown: "
                         f"{', '.join(sorted(unknown))})")
    if "rate" not in value:
        raise ValueError('a rate, such as { rate = "10/s", burst = 20 }')
    rate = parse_rate(value["rate"])
    # Default burst: a second's worth of the rate (a page and its assets arrive together).
    burst = value.get("burst", max(1, round(rate)))
    if not isinstance(burst, int) or isinstance(burst, bool) or not 1 <= burst <= 1_000_000:
        raise ValueError("burst: an integer 1..1000000")
    key = value.get("key", "ip")
    if key not in ("ip", "user"):
        raise ValueError("key: \"ip\" or \"user\"")
    prefix = value.get("ipv6_prefix", 64)
    if not isinstance(prefix, int) or isinstance(prefix, bool) or not 1 <= prefix <= 128:
        raise ValueError("ipv6_prefix: an integer 1..128")
    exempt = value.get("exempt", [])
    if not isinstance(exempt, list) or not all(isinstance(x, str) for x in exempt):
        raise ValueError("exempt: a list of IP addresses or CIDRs")
    parse_networks(exempt)
    return RateLimit(rate, burst, key, prefix, tuple(exempt), value["rate"])


def read_rate_limit(s) -> RateLimit | None:
    """The `rate_limit` key of a [[site]] or [[site.route]] table (config `_Section`)."""
    return s.get("rate_limit", None, rate_limit_from, "")


# ---------------------------------------------------------------- shared state
class RateTable:
    """The TAT of every limited client, shared by all workers (see the module doc)."""

    def __init__(self, entries: int = RATE_ENTRIES) -> None:
        self.memory = mmap.mmap(-1, entries * 16)          # MAP_SHARED | MAP_ANONYMOUS
        self.tags = memoryview(self.memory).cast("Q")      # entry i: tags[2i]
        self.tats = memoryview(self.memory).cast("d")      # entry i: tats[2i + 1]
        self.mask = entries - 1

    def place(self, key_hash: int) -> tuple[int, int]:
        """(tag, 2 x first probe) of a key: what `take` needs, worked out once per key."""
        return (key_hash & _TAG_MASK) | 1, 2 * (key_hash & self.mask)

    def locate(self, tag: int, at: int, now: float) -> int:
        """Where the entry of a key (`place`) is now: at its first probe, further along
        its probes, or a new one (see `_find`)."""
        return at if self.tags[at] == tag else self._find(tag, at // 2, now)

    def take(self, tag: int, at: int, now: float, interval: float, tolerance: float) -> float:
        """0.0 when a request under this key (`place`) may pass now (it is counted);
        else the seconds until one may."""
        if self.tags[at] != tag:
            at = self._find(tag, at // 2, now)
        # (The usual case, a client found at its first probe, costs two reads and a
        # write of shared memory: this path is on every limited request.)
        tats = self.tats
        tat = tats[at + 1]
        if tat < now:                  # not max(): a call costs more on this path
            tat = now
        wait = tat - now - tolerance
        if wait > _SLACK:
            return wait
        tats[at + 1] = tat + interval
        return 0.0

    def raise_to(self, tag: int, at: int, tat: float) -> None:
        """Move a client's TAT up to `tat` (what other instances used), never down."""
        if self.tags[at] != tag:
            at = self._find(tag, at // 2, time.monotonic())
        self.tats[at + 1] = max(self.tats[at + 1], tat)

    def _find(self, tag: int, first: int, now: float) -> int:
        """The entry for `tag` (2 x its index) among the probes from `first`, else a
        new one: the first never used or expired, else the one nearest to expiring."""
        tags, tats, mask = self.tags, self.tats, self.mask
        spare = -1
        for probe in range(1, PROBES):
            at = 2 * ((first + probe) & mask)
            if tags[at] == tag:
                return at
        for probe in range(PROBES):
            at = 2 * ((first + probe) & mask)
            if tags[at] == 0 or tats[at + 1] <= now:
                spare = at
                break
        if spare < 0:
            spare = min((2 * ((first + p) & mask) for p in range(PROBES)),
                        key=lambda i: tats[i + 1])
        tats[spare + 1] = now
        tags[spare] = tag
        return spare


class ConnectionCounts:
    """Open connections per client address: one region per worker slot, written only
    by its worker; a check adds up the live workers' regions."""

    def __init__(self, slots: int, entries: int = CONNECTION_ENTRIES) -> None:
        self.entries = entries
        self.memory = mmap.mmap(-1, slots * entries * 16)   # pages touched only when used
        self.tags = memoryview(self.memory).cast("Q")
        self.counts = memoryview(self.memory).cast("q")
        self.slots = slots
        self.mine = -1                    # this worker's region (-1: not counting)
        # Regions a check reads: 0 .. span-1. Slots are claimed lowest first, so this
        # covers every worker of the live generations; the worker's tick widens it.
        self.span = min(slots, SPAN_MIN)

    def adopt(self, slot: int) -> None:
        """A worker takes its region."""
        if 0 <= slot < self.slots:
            self.mine = slot
            self.clear(slot)
            self.span = max(self.span, slot + 1)

    def clear(self, slot: int) -> None:
        """Empty a region: its worker has exited (the supervisor) or starts (itself)."""
        if 0 <= slot < self.slots:
            size = self.entries * 16
            self.memory[slot * size:(slot + 1) * size] = bytes(size)

    def _entry(self, region: int, tag: int, insert: bool) -> int:
        """The index of `tag`'s entry in `region`; when it has none, -1, or with
        `insert` the entry it may take (one never used, or one whose count fell to 0;
        -1 when there is no room). Tags are never cleared, so probing stops at the
        first entry never used."""
        tags, counts = self.tags, self.counts
        first = region * self.entries
        base = tag % self.entries
        spare = -1
        for probe in range(PROBES):
            at = first + (base + probe) % self.entries
            held = tags[2 * at]
            if held == tag:
                return at
            if held == 0:
                if spare < 0:
                    spare = at
                break
            if spare < 0 and counts[2 * at + 1] == 0:
                spare = at
        return spare if insert else -1

    def total(self, tag: int) -> int:
        count = 0
        for region in range(self.span):
            at = self._entry(region, tag, False)
            if at >= 0:
                count += self.counts[2 * at + 1]
        return count

    def opened(self, tag: int) -> bool:
        """Count a connection in this worker's region; False when there is no room
        (the connection is then not limited)."""
        if self.mine < 0:
            return False
        at = self._entry(self.mine, tag, True)
        if at < 0:
            return False
        self.tags[2 * at] = tag
        self.counts[2 * at + 1] += 1
        return True

    def closed(self, tag: int) -> None:
        at = self._entry(self.mine, tag, False)
        if at >= 0 and self.counts[2 * at + 1] > 0:
            self.counts[2 * at + 1] -= 1


class SharedLimits:
    """The tables every worker shares; made once, by the supervisor, before forking."""

    def __init__(self, slots: int) -> None:
        self.rates = RateTable()
        self.connections = ConnectionCounts(slots)


_SHARED: SharedLimits | None = None


def shared_limits(slots: int = 1) -> SharedLimits:
    """This process tree's tables: the supervisor makes them before its first fork
    (`Supervisor.__init__`), with a column of connection counts for each slot of its
    worker table (nestgate.admin.stats); a process without a supervisor (tests) makes
    its own, for the one worker it is."""
    global _SHARED
    if _SHARED is None:
        _SHARED = SharedLimits(slots)
    return _SHARED


# ---------------------------------------------------------------- connections
def count_connection(conn) -> bool:
    """Count `conn` against its listener's `max_connections_per_client` under its
    client's address (an IPv6 one's /64; again, under the new address, when a PROXY
    header changed it); False when the client already has that many open."""
    counts = shared_limits().connections
    if conn.client_tag:
        counts.closed(conn.client_tag)
        conn.client_tag = 0
    # An IPv6 client by its /64, as rate limits count it: one host often holds all of
    # it, and a limit per address would let it open as many connections as it likes.
    tag = (hash(("connections", client_key(conn.client, 64))) & _TAG_MASK) | 1
    if counts.total(tag) >= conn.ctx.max_per_client:
        return False
    if counts.opened(tag):
        conn.client_tag = tag
    return True


def uncount_connection(conn) -> None:
    if conn.client_tag:
        shared_limits().connections.closed(conn.client_tag)
        conn.client_tag = 0


# ---------------------------------------------------------------- the request path
def client_key(client: str, ipv6_prefix: int) -> str:
    """The address a limit counts by: IPv6 clients by their prefix (one host often
    holds a whole /64, so a limit per address would be no limit)."""
    if ":" not in client or ipv6_prefix >= 128:
        return client
    try:
        network = ipaddress.IPv6Network((client, ipv6_prefix), strict=False)
    except ValueError:
        return client
    return str(network)


def limiting(guard, site_config, errors, signin=None, sync=None):
    """The site's guard with its rate limits in front: a route's own `rate_limit`,
    else the site's. The guard as it was when neither the site nor a route has one.
    `sync` (a RateSync) shares the limits with other instances through Redis."""
    site_limit = site_config.rate_limit
    if site_limit is None and not any(r.rate_limit for r in site_config.routes):
        return guard
    table = shared_limits().rates
    site = site_config.name

    def limited_guard(handler, access=None, sign_in=True, limit=None, label="", policy=None):
        handler = guard(handler, access, sign_in, limit, label, policy)
        if limit is not None:
            identity = f"route:{site}:{label}"          # its own bucket per client
        elif site_limit is not None:
            limit, identity = site_limit, f"site:{site}"   # one for the whole site
        else:
            return handler
        refused = TALLY.refused_counter(site, label)
        if limit.key == "user" and signin is not None:
            return LimitedByUser(handler, limit, identity, table, errors, signin, refused, sync)
        return Limited(handler, limit, identity, table, errors, refused, sync)
    return limited_guard


class Limited:
    """A route behind a rate limit: `admit` answers 429 or hands on to what it wraps
    (the route's handler, or the access gate in front of it)."""

    is_async = GATED
    __slots__ = (
        "allowance",
        "errors",
        "exempt",
        "identity",
        "inner",
        "interval",
        "limit",
        "refused",
        "sync",
        "table",
        "tags",
        "tats",
        "tolerance",
        "upgrades",
    )

    def __init__(self, inner, limit: RateLimit, identity: str, table: RateTable, errors,
                 refused: list | None = None, sync=None) -> None:
        self.inner = inner
        self.limit = limit
        self.identity = identity          # which limit, the same in every worker and instance
        self.sync = sync                  # RateSync: other instances' use, through Redis
        self.table = table
        self.tags = table.tags            # the table's views, one attribute away on every request
        self.tats = table.tats
        self.errors = errors              # the site's ErrorPages: its 429
        self.exempt = parse_networks(limit.exempt) if limit.exempt else None
        self.interval = limit.interval
        self.tolerance = limit.tolerance
        self.allowance = limit.tolerance + _SLACK      # how far ahead a TAT may be and pass
        self.upgrades = getattr(inner, "upgrades", False)
        # Requests answered 429, shared by the route's Limited objects over reloads of
        # its pages (a one-item list: `nestgate.base.tally`'s refused counts).
        self.refused = refused if refused is not None else [0]

    def admit(self, conn, headers, _now=time.monotonic):
        decisions = conn.decisions
        hit = decisions.get(self) if decisions is not None else None
        if hit is None or hit[0] != conn.client:
            hit = self._hit(conn)
        _client, tag, at, key = hit
        if self.tags[at] != tag:
            return self._admit_elsewhere(conn, hit, headers)
        # The usual request: `RateTable.take` inline, on the entry where the connection
        # found its client's (on this path a call costs as much as the arithmetic).
        tats = self.tats
        now = _now()
        tat = tats[at + 1]
        if tat < now:
            tat = now
        if tat - now > self.allowance:
            return self._refuse(tat - now - self.tolerance, headers, conn)
        tats[at + 1] = tat + self.interval
        if self.sync is not None:
            self.sync.used(key, tag, at, self.interval)
        return self.inner

    def _hit(self, conn) -> tuple:
        """What `admit` needs of the connection's client, worked out once per
        connection and client address and kept on the connection."""
        if conn.decisions is None:
            conn.decisions = {}
        hit = conn.decisions[self] = self.place(conn.client)
        return hit

    def _admit_elsewhere(self, conn, hit: tuple, headers):
        """`admit` for an exempt client, or one whose entry moved along its probes or
        was taken by another key: the entry is looked up again, and kept."""
        client, tag, at, key = hit
        if tag is None:
            return self.inner                               # exempt
        now = time.monotonic()
        at = self.table.locate(tag, at, now)
        conn.decisions[self] = (client, tag, at, key)
        return self._take(tag, at, key, now, headers, conn)

    def _take(self, tag: int, at: int, key: str, now: float, headers, conn):
        wait = self.table.take(tag, at, now, self.interval, self.tolerance)
        if wait:
            return self._refuse(wait, headers, conn)
        if self.sync is not None:
            self.sync.used(key, tag, at, self.interval)
        return self.inner

    def _refuse(self, wait: float, headers, conn):
        self.refused[0] += 1
        BANS.note("ratelimit", conn.client, conn)   # [[ban]] rules on = "ratelimit"
        return self.errors.too_many(int(wait) + 1, headers)

    def place(self, client: str) -> tuple:
        """(client, tag, table place, key as other instances know it); tag None: exempt."""
        if self.exempt is not None and client in self.exempt:
            return client, None, 0, ""
        key = f"{self.identity}|{client_key(client, self.limit.ipv6_prefix)}"
        return (client, *self.table.place(hash(key)), key)


class LimitedByUser(Limited):
    """A limit with `key = "user"`: a request whose session the worker knows is
    counted under its user, any other under its address."""

    __slots__ = ("signin",)

    def __init__(self, inner, limit: RateLimit, identity: str, table: RateTable, errors,
                 signin, refused: list | None = None, sync=None) -> None:
        super().__init__(inner, limit, identity, table, errors, refused, sync)
        self.signin = signin

    def admit(self, conn, headers, _now=time.monotonic):
        user = self.signin.known_user(headers)
        if user is None:
            return Limited.admit(self, conn, headers)
        decisions = conn.decisions
        hit = decisions.get(self) if decisions is not None else None
        if hit is None or hit[0] != conn.client:
            hit = self._hit(conn)
        if hit[1] is None:
            return self.inner                               # exempt (by address)
        key = f"{self.identity}|user|{user}"
        tag, at = self.table.place(hash(key))
        return self._take(tag, at, key, _now(), headers, conn)


def rate_sync(config):
    """The RateSync of a config whose limits are shared through Redis, else None."""
    if config.state.backend != "redis" or not any(
            site.rate_limit or any(r.rate_limit for r in site.routes) for site in config.sites):
        return None
    return RateSync(config.state, shared_limits().rates)


class RateSync(Service):
    """Rate limits shared with the other instances of a gateway through Redis
    (`[state] backend = "redis"`), without a round trip per request.

    Each worker notes the requests its limits let through (a dict increment); every
    SYNC_INTERVAL it sends them to Redis in one pipeline, where a script moves each
    client's shared TAT on by what was used (on the wall clock, which the machines
    share) and returns it. The worker then moves its own table's TAT up to that, so
    what the other instances let through counts here too. Between two syncs an
    instance judges by itself: all the instances together can let through one sync
    interval's worth more than the limit, which the shared TAT then takes back from
    the following requests. Redis not answering: each instance limits alone (fail
    open to the per-instance limit), said once, until it answers again."""

    tick_every = SYNC_INTERVAL

    def __init__(self, state, table: RateTable) -> None:
        self.state = state                  # config.StateConfig
        self.table = table
        self.pending: dict[str, list] = {}  # key -> [count, tag, place, interval]
        self.down = False
        self._sender = None
        self._executor = None
        self._client = None
        self._script = None

    def used(self, key: str, tag: int, at: int, interval: float) -> None:
        found = self.pending.get(key)
        if found is None:
            self.pending[key] = [1, tag, at, interval]
        else:
            found[0] += 1

    def start(self) -> None:
        from concurrent.futures import ThreadPoolExecutor
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="nestgate-ratesync")
        self._sender = Periodic(SYNC_INTERVAL, self._send_pending)

    def stop(self) -> None:
        if self._sender is not None:
            self._sender.stop()
        if self._executor is not None:
            self._executor.shutdown(wait=False)

    def tick(self, now: float) -> None:
        if self.pending and self._sender is not None:
            self._sender.tick(now)

    async def _send_pending(self) -> None:
        import asyncio
        loop = asyncio.get_running_loop()
        batch, self.pending = self.pending, {}
        try:
            shared = await loop.run_in_executor(self._executor, self._send, batch)
        except Exception as exc:  # noqa: BLE001 - any Redis failure: limit alone
            if not self.down:
                self.down = True
                print(f"nestgate: rate limits: Redis does not answer ({exc}); each "
                      f"instance limits alone until it does", file=sys.stderr, flush=True)
            return
        if self.down:
            self.down = False
            print("nestgate: rate limits: shared through Redis again", file=sys.stderr,
                  flush=True)
        # The shared TATs are on the wall clock; the table is on the monotonic one.
        offset = time.monotonic() - time.time()
        for (count, tag, at, interval), tat in zip(batch.values(), shared):
            self.table.raise_to(tag, at, float(tat) + offset)

    def _send(self, batch: dict) -> list:
        if self._client is None:
            from urllib.parse import urlsplit, urlunsplit

            import redis
            url = urlunsplit(urlsplit(self.state.url)._replace(fragment=""))
            self._client = redis.Redis.from_url(url, socket_timeout=2.0,
                                                socket_connect_timeout=2.0)
            self._script = self._client.register_script(_SHARED_TAT)
        now = time.time()
        with self._client.pipeline(transaction=False) as pipe:
            for key, (count, _tag, _at, interval) in batch.items():
                self._script(keys=[f"{self.state.prefix}rate:{key}"],
                             args=[now, count * interval], client=pipe)
            return pipe.execute()


# KEYS: the client's shared TAT; ARGV: now (wall clock), seconds used. The new TAT,
# kept until it has passed.
_SHARED_TAT = """
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
local now = tonumber(ARGV[1])
if tat < now then tat = now end
tat = tat + tonumber(ARGV[2])
redis.call('SET', KEYS[1], tostring(tat), 'PX', math.ceil((tat - now) * 1000) + 1000)
return tostring(tat)
"""
