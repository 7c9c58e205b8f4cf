"""Bans kept in the state store, so they survive a restart and are shared by every
instance of a gateway (`[state] backend = "redis"`): the same operations on the SQLite
file (`auth.store.Store`, whose schema has the `bans` table) and on Redis.

A row is a network (canonical CIDR text) with when its ban ends, where it came from,
the rule, the reason, how it is answered, and its strikes: how many bans in a row the
network has had. A network banned again before its row is forgotten (`remember` after
its last ban ends) gets the rule's next, longer duration. Every change bumps a
version, which workers poll to bring their table in step (nestgate.bans.watch).

Redis keys (under the prefix): `ban:<network>` (a hash, expiring when forgotten),
`bans` (networks by end of ban), `bans-version`.
"""

from __future__ import annotations

import sys
import time
from typing import NamedTuple

from nestgate.bans.table import ANSWERS, ORIGINS, network_key


class BanRow(NamedTuple):
    network: str
    until: float
    origin: str
    rule: str
    reason: str
    answer: str
    strikes: int


def open_bans(locator: str):
    """The bans of the store a locator names (SQLite file or Redis URL)."""
    from nestgate.handlers.auth.redisstore import is_redis
    from nestgate.handlers.auth.store import open_store
    store = open_store(locator)
    return RedisBans(store) if is_redis(locator) else SqliteBans(store)


def canonical(network: str) -> str:
    """The text a network is kept under; ValueError naming it when it is not one."""
    return network_key(network)[3]


class SqliteBans:
    def __init__(self, store) -> None:
        self.store = store
        self.db = store.db

    def close(self) -> None:
        self.store.close()

    def version(self) -> int:
        row = self.db.execute("SELECT value FROM meta WHERE key = 'bans-version'").fetchone()
        return int(row[0]) if row else 0

    def _bump(self) -> None:
        self.db.execute("INSERT INTO meta (key, value) VALUES ('bans-version', 1) ON CONFLICT "
                        "(key) DO UPDATE SET value = value + 1")

    def ban(self, network: str, durations: tuple[float, ...], remember: float, origin: str,
            rule: str, reason: str, answer: str, replace: bool = False) -> tuple[float, int]:
        """Ban `network` for the duration its strikes call for; (until, strikes). A ban
        in force is kept as it is (another worker or instance made it first) unless
        `replace` (the operator's)."""
        network = canonical(network)
        now = time.time()
        self.db.execute("BEGIN IMMEDIATE")
        try:
            row = self.db.execute("SELECT until, strikes, forget FROM bans WHERE network = ?",
                                  (network,)).fetchone()
            if row is not None and row[0] > now and not replace:
                return row[0], row[1]
            strikes = (row[1] if row is not None and row[2] > now else 0) + 1
            until = now + durations[min(strikes, len(durations)) - 1]
            self.db.execute("INSERT OR REPLACE INTO bans (network, until, origin, rule, reason, "
                            "answer, strikes, created, forget) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                            (network, until, origin, rule, reason, answer, strikes, now,
                             until + remember))
            self._bump()
            return until, strikes
        finally:
            self.db.execute("COMMIT")

    def unban(self, network: str) -> bool:
        """Lift and forget the ban on exactly `network`; False when it has none in force."""
        network = canonical(network)
        with self.db:
            removed = self.db.execute("DELETE FROM bans WHERE network = ? AND until > ?",
                                      (network, time.time())).rowcount
            if removed:
                self._bump()
        return removed > 0

    def live(self) -> list[BanRow]:
        rows = self.db.execute("SELECT network, until, origin, rule, reason, answer, strikes "
                               "FROM bans WHERE until > ? ORDER BY until DESC", (time.time(),))
        return [BanRow(*row) for row in rows.fetchall()]

    def purge(self) -> None:
        with self.db:
            self.db.execute("DELETE FROM bans WHERE forget <= ?", (time.time(),))


# KEYS: ban:<network>, bans, bans-version
# ARGV: now, network, remember, origin, rule, reason, answer, replace (0/1), durations...
_BAN = """
local now = tonumber(ARGV[1])
local held = redis.call('HMGET', KEYS[1], 'until', 'strikes', 'forget')
local until_, strikes = tonumber(held[1] or '0'), tonumber(held[2] or '0')
if ARGV[8] ~= '1' and until_ > now then return {tostring(until_), strikes} end
if tonumber(held[3] or '0') <= now then strikes = 0 end
strikes = strikes + 1
local u = now + tonumber(ARGV[8 + math.min(strikes, #ARGV - 8)])
local forget = u + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'until', tostring(u), 'origin', ARGV[4], 'rule', ARGV[5],
           'reason', ARGV[6], 'answer', ARGV[7], 'strikes', strikes, 'created', ARGV[1],
           'forget', tostring(forget))
redis.call('EXPIREAT', KEYS[1], math.ceil(forget) + 1)
redis.call('ZADD', KEYS[2], u, ARGV[2])
redis.call('INCR', KEYS[3])
return {tostring(u), strikes}
"""


class RedisBans:
    def __init__(self, store) -> None:
        self.store = store
        self.db = store.db
        self.key = store.key
        self._ban = self.db.register_script(_BAN)

    def close(self) -> None:
        self.store.close()

    def version(self) -> int:
        return int(self.db.get(self.key("bans-version")) or 0)

    def ban(self, network: str, durations: tuple[float, ...], remember: float, origin: str,
            rule: str, reason: str, answer: str, replace: bool = False) -> tuple[float, int]:
        network = canonical(network)
        until, strikes = self._ban(
            keys=[self.key("ban", network), self.key("bans"), self.key("bans-version")],
            args=[time.time(), network, remember, origin, rule, reason, answer,
                  int(replace), *durations])
        return float(until), int(strikes)

    def unban(self, network: str) -> bool:
        network = canonical(network)
        until = self.db.hget(self.key("ban", network), "until")
        if until is None or float(until) <= time.time():
            return False
        with self.db.pipeline() as pipe:
            pipe.delete(self.key("ban", network))
            pipe.zrem(self.key("bans"), network)
            pipe.incr(self.key("bans-version"))
            pipe.execute()
        return True

    def live(self) -> list[BanRow]:
        networks = self.db.zrangebyscore(self.key("bans"), f"({time.time()}", "+inf")
        with self.db.pipeline() as pipe:
            for network in networks:
                pipe.hmget(self.key("ban", network.decode()), "until", "origin", "rule",
                           "reason", "answer", "strikes")
            rows = pipe.execute()
        found, unreadable = [], []
        for network, row in zip(networks, rows):
            if row[0] is None:
                continue                                   # expired meanwhile
            ban = _redis_row(network, row)
            if ban is None:
                unreadable.append(network.decode("utf-8", "replace"))
            else:
                found.append(ban)
        if unreadable:
            said_unreadable(unreadable)
        return sorted(found, key=lambda row: -row.until)

    def purge(self) -> None:
        self.db.zremrangebyscore(self.key("bans"), "-inf", time.time())


def _redis_row(network: bytes, row: list) -> BanRow | None:
    """A ban read from Redis; None when its fields are missing or not what nestgate
    writes (a hand edit, another program's key under the prefix)."""
    try:
        text = network.decode()
        canonical(text)                                  # ValueError: not a network
        ban = BanRow(text, float(row[0]), row[1].decode(), row[2].decode(),
                     row[3].decode(), row[4].decode(), int(row[5]))
    except (AttributeError, TypeError, ValueError):     # a field missing, or not a number
        return None
    return ban if ban.origin in ORIGINS and ban.answer in ANSWERS else None


def said_unreadable(networks: list[str]) -> None:
    """One line for the bans a read left out. They are skipped rather than stop the
    read: one bad row would keep every worker from taking any change, lifts included."""
    shown = ", ".join(repr(n[:60]) for n in networks[:3])
    more = f" and {len(networks) - 3} more" if len(networks) > 3 else ""
    print(f"nestgate: bans: {len(networks)} ban(s) in the store cannot be read and are "
          f"left out ({shown}{more}); the others are in force", file=sys.stderr, flush=True)


def lift(bans, text: str) -> str | None:
    """Lift the ban on `text`: exactly that network, or (for an address without a
    prefix) the ban in force that covers it, as an IPv6 client's /64. The network
    lifted, or None when no ban was in force there. ValueError for text that is not an
    address or CIDR."""
    network = canonical(text)
    if bans.unban(network):
        return network
    if "/" in text:
        return None
    from nestgate.base.clientip import Networks
    for row in bans.live():
        if text.strip() in Networks([row.network]) and bans.unban(row.network):
            return row.network
    return None
