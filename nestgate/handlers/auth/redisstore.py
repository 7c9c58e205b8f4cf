"""The shared store in Redis, for several nestgate instances that must be one gateway:
the same operations as `nestgate.handlers.auth.store.Store` (sessions, sign-in back-off, the
TOTP replay guard, the dynamic allow-list), so `SharedState`, the admin API and
`nestgate allow` use either without knowing which.

Keys (all under the configured prefix, `nestgate:` by default):

    secret                  the CSRF key, made once (SET NX)
    session:<hash hex>      hash: user, created, expires, ip, last_seen, factors,
                            identity; expires with it
    sessions                sorted set of session hashes by expiry (listing, purging)
    user-sessions:<user>    set of a user's session hashes (revoke all of a user)
    failures:<address>      sorted set of failed sign-ins by time (an IPv6 client's /64);
                            expires after the window
    account:<user>          hash: failures, last; expires after ACCOUNT_MEMORY
    known:<user>            sorted set of the addresses a user signed in from, by time
    totp:<user>             the last TOTP step used
    allow:<id>              hash: cidr, expires, comment, created; expires with the entry
    allow                   sorted set of entry ids by expiry
    allow-id                the last entry id given
    allow-version           bumped on every change to the allow entries (workers poll it)
    passkey:<id hex>        hash: user, name, public_key, sign_count, created, last_used
    passkeys                set of every passkey's id hex (the admin listing)
    user-passkeys:<user>    set of a user's passkey ids
    ceremony:<id hex>       hash: challenge, purpose, user, bound; expires with the ceremony
    ceremonies              sorted set of ceremony ids by expiry (how many are under way)
    recovery:<user>         set of the hashes of a user's unused recovery codes
    subjects:<user>         hash: provider issuer -> the subject the user is bound to

The checks that must not race between instances (a sign-in attempt counted before the
next is judged, a TOTP step used once, a passkey's counter only going up) are Lua
scripts, which Redis runs atomically.
Session tokens are never stored, only their SHA-256, as in the SQLite store.
"""

from __future__ import annotations

import secrets
import time
from urllib.parse import urlsplit, urlunsplit

import redis

from nestgate.handlers.auth.storerules import (ACCOUNT_MEMORY, KNOWN_FOR, MAX_CEREMONIES,
                                               SEEN_EVERY, StoredSessions, account_delay,
                                               address_key, finite_number)
from nestgate.base.clientip import Networks

DEFAULT_PREFIX = "nestgate:"
SOCKET_TIMEOUT_S = 2.0       # a Redis that does not answer is down: fail within this

# KEYS: failures:<address>, account:<user>, known:<user>
# ARGV: now, window, limit, user ("" for none), trusted (0/1), free, base, most,
#       account memory, known for, address key, a unique member for the failure
_TAKE_SIGN_IN = """
local now, window, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if redis.call('ZCOUNT', KEYS[1], '(' .. (now - window), '+inf') >= limit then
  return tostring(window)
end
if ARGV[4] ~= '' then
  local known = redis.call('ZSCORE', KEYS[3], ARGV[11])
  local is_known = ARGV[11] ~= '' and known and tonumber(known) > now - tonumber(ARGV[10])
  local failures = tonumber(redis.call('HGET', KEYS[2], 'failures') or '0')
  local last = tonumber(redis.call('HGET', KEYS[2], 'last') or '0')
  if last <= now - tonumber(ARGV[9]) then failures = 0 end
  if ARGV[5] ~= '1' and not is_known and failures > 0 then
    local free, base, most = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
    local delay = 0
    if failures >= free and base > 0 then
      delay = math.min(most, base * 2 ^ math.min(failures - free, 64))
    end
    local wait = delay - (now - last)
    if wait > 0 then return tostring(wait) end
  end
  redis.call('HSET', KEYS[2], 'failures', failures + 1, 'last', ARGV[1])
  redis.call('EXPIRE', KEYS[2], math.ceil(tonumber(ARGV[9])))
end
redis.call('ZADD', KEYS[1], now, ARGV[12])
redis.call('EXPIRE', KEYS[1], math.ceil(window) + 1)
return '0'
"""

# KEYS: totp:<user>; ARGV: step. 1 when the step is later than the last one (and is
# now the last one), else 0.
_USE_TOTP_STEP = """
local last = redis.call('GET', KEYS[1])
if last and tonumber(last) >= tonumber(ARGV[1]) then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
return 1
"""


# KEYS: passkey:<id hex>; ARGV: new sign count, now. 1 when the passkey exists and the
# count went up (or stays 0 on an authenticator without a counter), else 0.
_USE_PASSKEY = """
local count = redis.call('HGET', KEYS[1], 'sign_count')
if not count then return 0 end
local new = tonumber(ARGV[1])
if not (tonumber(count) < new or (new == 0 and tonumber(count) == 0)) then return 0 end
redis.call('HSET', KEYS[1], 'sign_count', ARGV[1], 'last_used', ARGV[2])
return 1
"""


def is_redis(locator: str) -> bool:
    return locator.startswith(("redis://", "rediss://", "unix://"))


def redis_locator(url: str, prefix: str) -> str:
    """The store locator for `[state] backend = "redis"`: the URL with the key prefix
    as its fragment (a fragment is never sent to the server)."""
    return urlunsplit(urlsplit(url)._replace(fragment=prefix))


def shown(locator: str) -> str:
    """The locator as it may be printed: without a password."""
    if not is_redis(locator):
        return locator
    parts = urlsplit(locator)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    user = f"{parts.username or ''}:***@" if parts.password else ""
    return urlunsplit((parts.scheme, f"{user}{host}{port}", parts.path, "", ""))


class RedisStore:
    """Synchronous access to the Redis store; one per thread that uses it."""

    def __init__(self, locator: str) -> None:
        parts = urlsplit(locator)
        self.prefix = parts.fragment or DEFAULT_PREFIX
        self.path = shown(locator)
        url = urlunsplit(parts._replace(fragment=""))
        self.stored = StoredSessions(self.path)
        self.db = redis.Redis.from_url(url, socket_timeout=SOCKET_TIMEOUT_S,
                                       socket_connect_timeout=SOCKET_TIMEOUT_S,
                                       health_check_interval=30)
        self._take_sign_in = self.db.register_script(_TAKE_SIGN_IN)
        self._use_totp_step = self.db.register_script(_USE_TOTP_STEP)
        self._use_passkey = self.db.register_script(_USE_PASSKEY)

    def key(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    def close(self) -> None:
        self.db.close()

    def ping(self) -> bool:
        return bool(self.db.ping())

    def data_version(self) -> int:
        """Changes whenever the allow entries change (what workers poll for)."""
        return int(self.db.get(self.key("allow-version")) or 0)

    def secret(self) -> bytes:
        self.db.set(self.key("secret"), secrets.token_bytes(32), nx=True)
        return self.db.get(self.key("secret"))

    # ------------------------------------------------------ sessions
    def create_session(self, hashed: bytes, user: str, expires: float, ip: str,
                       factors: str = "password", identity: str = "") -> None:
        now = time.time()
        name = self.key("session", hashed.hex())
        with self.db.pipeline() as pipe:
            pipe.hset(name, mapping={"user": user, "created": now, "expires": expires,
                                     "ip": ip, "last_seen": now, "factors": factors,
                                     "identity": identity})
            pipe.expireat(name, int(expires) + 1)
            pipe.zadd(self.key("sessions"), {hashed.hex(): expires})
            pipe.sadd(self.key("user-sessions", user), hashed.hex())
            pipe.execute()

    def session(self, hashed: bytes) -> tuple[str, float, str, str] | None:
        """(user, expires, factors, identity) of a live session, seen now (its
        last_seen is written when older than SEEN_EVERY). A record not as nestgate
        wrote it is none (`StoredSessions`)."""
        now = time.time()
        name = self.key("session", hashed.hex())
        try:
            fields = self.db.hmget(name, "user", "expires", "last_seen", "factors", "identity")
        except redis.ResponseError as exc:       # WRONGTYPE: the key is not a hash
            self.stored.malformed(hashed.hex(), str(exc))
            return None
        found = fields[0] is not None and self.stored.read(hashed, *fields)
        if not found or found[1] <= now:
            return None
        user, expires, last_seen, factors, identity = found
        if now - last_seen >= SEEN_EVERY:
            self.db.hset(name, "last_seen", now)
        return user, expires, factors, identity

    def session_expiries(self) -> list[tuple[bytes, float]]:
        """(token hash, expiry) of every live session (nestgate.handlers.auth.sessiontoken)."""
        found = []
        for hex_id, expires in self.db.zrangebyscore(self.key("sessions"), f"({time.time()}",
                                                     "+inf", withscores=True):
            try:
                found.append((bytes.fromhex(hex_id.decode()), float(expires)))
            except ValueError:
                continue                 # not a member nestgate wrote: no session of its
        return found

    def delete_session(self, hashed: bytes) -> None:
        name = self.key("session", hashed.hex())
        user = self.db.hget(name, "user")
        with self.db.pipeline() as pipe:
            pipe.delete(name)
            pipe.zrem(self.key("sessions"), hashed.hex())
            if user is not None:
                pipe.srem(self.key("user-sessions", user.decode()), hashed.hex())
            pipe.execute()

    def live_sessions(self) -> list[tuple[bytes, str, float, float, str, float, str]]:
        ids = self.db.zrangebyscore(self.key("sessions"), f"({time.time()}", "+inf")
        with self.db.pipeline() as pipe:
            for hex_id in ids:
                pipe.hmget(self.key("session", hex_id.decode()),
                           "user", "created", "expires", "ip", "last_seen", "factors")
            rows = pipe.execute(raise_on_error=False)     # a key of another type: skipped
        found = []
        for hex_id, row in zip(ids, rows):
            hashed = hex_id.decode()
            try:
                user, created, expires, ip, last_seen, factors = row
                if user is None:
                    continue                         # expired since the listing
                fields = self.stored.read(bytes.fromhex(hashed), user, expires, last_seen,
                                          factors, ip or b"")
                if fields is not None:
                    user, expires, last_seen, factors, ip = fields
                    found.append((bytes.fromhex(hashed), user, finite_number(created),
                                  expires, ip, last_seen, factors))
            except (TypeError, ValueError, AttributeError) as exc:
                self.stored.malformed(hashed, str(exc))
        return sorted(found, key=lambda r: r[2])

    def delete_session_by_id(self, hex_prefix: str) -> bool:
        for hex_id in self.db.zrange(self.key("sessions"), 0, -1):
            if hex_id.decode().startswith(hex_prefix):
                self.delete_session(bytes.fromhex(hex_id.decode()))
                return True
        return False

    def delete_user_sessions(self, user: str) -> int:
        """Revoke every session of `user`; how many were live."""
        ids = [i.decode() for i in self.db.smembers(self.key("user-sessions", user))]
        with self.db.pipeline() as pipe:
            for hex_id in ids:
                pipe.delete(self.key("session", hex_id))
            if ids:
                pipe.zrem(self.key("sessions"), *ids)
            pipe.delete(self.key("user-sessions", user))
            removed = pipe.execute()
        return sum(removed[:len(ids)])

    # ------------------------------------------------------ sign-in back-off
    def failures(self, ip: str, window: float) -> int:
        """Failures of `ip` (counted by `address_key`: an IPv6 client by its /64)."""
        return self.db.zcount(self.key("failures", address_key(ip)),
                              f"({time.time() - window}", "+inf")

    def add_failure(self, ip: str) -> None:
        name = self.key("failures", address_key(ip))
        self.db.zadd(name, {secrets.token_hex(8): time.time()})
        self.db.expire(name, 3600)

    def take_sign_in(self, ip: str, window: float, limit: int, user: str = "",
                     delays: tuple[int, float, float] = (0, 0.0, 0.0),
                     trusted: bool = False) -> float:
        """As `Store.take_sign_in`, in one script so that guesses sent to several
        instances at once cannot all pass before any is counted."""
        free, base, most = delays
        wait = self._take_sign_in(
            keys=[self.key("failures", address_key(ip)), self.key("account", user),
                  self.key("known", user)],
            args=[time.time(), window, limit, user, int(trusted), free, base, most,
                  ACCOUNT_MEMORY, KNOWN_FOR, address_key(ip) if ip else "",
                  secrets.token_hex(8)])
        return float(wait)

    def account_wait(self, user: str, now: float, delays: tuple[int, float, float]) -> float:
        failures, last = self.db.hmget(self.key("account", user), "failures", "last")
        if failures is None or float(last) <= now - ACCOUNT_MEMORY:
            return 0.0
        return account_delay(int(failures), delays) - (now - float(last))

    def known_address(self, user: str, ip: str, now: float) -> bool:
        if not ip:
            return False
        at = self.db.zscore(self.key("known", user), address_key(ip))
        return at is not None and at > now - KNOWN_FOR

    def signed_in(self, user: str, ip: str) -> None:
        with self.db.pipeline() as pipe:
            pipe.delete(self.key("failures", address_key(ip)), self.key("account", user))
            if ip:
                known = self.key("known", user)
                pipe.zadd(known, {address_key(ip): time.time()})
                pipe.zremrangebyscore(known, "-inf", time.time() - KNOWN_FOR)
                pipe.expire(known, int(KNOWN_FOR))
            pipe.execute()

    def clear_failures(self, ip: str) -> None:
        self.db.delete(self.key("failures", address_key(ip)))

    # ------------------------------------------------------ TOTP replay
    def use_totp_step(self, user: str, step: int) -> bool:
        return bool(self._use_totp_step(keys=[self.key("totp", user)], args=[step]))

    # ------------------------------------------------------ passkeys (WebAuthn)
    def add_passkey(self, user: str, cred_id: bytes, name: str, public_key: bytes,
                    sign_count: int) -> None:
        with self.db.pipeline() as pipe:
            pipe.hset(self.key("passkey", cred_id.hex()), mapping={
                "user": user, "name": name, "public_key": public_key,
                "sign_count": sign_count, "created": time.time(), "last_used": 0})
            pipe.sadd(self.key("passkeys"), cred_id.hex())
            pipe.sadd(self.key("user-passkeys", user), cred_id.hex())
            pipe.execute()

    def passkeys(self, user: str = "") -> list[tuple[bytes, str, str, int, float, float]]:
        ids = self.db.smembers(self.key("user-passkeys", user) if user else self.key("passkeys"))
        with self.db.pipeline() as pipe:
            for hex_id in ids:
                pipe.hmget(self.key("passkey", hex_id.decode()),
                           "user", "name", "sign_count", "created", "last_used")
            rows = pipe.execute()
        found = [(bytes.fromhex(hex_id.decode()), row[0].decode(), row[1].decode(),
                  int(row[2]), float(row[3]), float(row[4]))
                 for hex_id, row in zip(ids, rows) if row[0] is not None]
        return sorted(found, key=lambda r: r[4])

    def passkey(self, cred_id: bytes) -> tuple[str, bytes, int] | None:
        user, public_key, count = self.db.hmget(self.key("passkey", cred_id.hex()),
                                                "user", "public_key", "sign_count")
        return None if user is None else (user.decode(), public_key, int(count))

    def use_passkey(self, cred_id: bytes, sign_count: int) -> bool:
        return bool(self._use_passkey(keys=[self.key("passkey", cred_id.hex())],
                                      args=[sign_count, time.time()]))

    def rename_passkey(self, cred_id: bytes, user: str, name: str) -> bool:
        key = self.key("passkey", cred_id.hex())
        if self.db.hget(key, "user") != user.encode():
            return False
        self.db.hset(key, "name", name)
        return True

    def remove_passkey(self, cred_id: bytes, user: str = "") -> bool:
        key = self.key("passkey", cred_id.hex())
        owner = self.db.hget(key, "user")
        if owner is None or (user and owner != user.encode()):
            return False
        with self.db.pipeline() as pipe:
            pipe.delete(key)
            pipe.srem(self.key("passkeys"), cred_id.hex())
            pipe.srem(self.key("user-passkeys", owner.decode()), cred_id.hex())
            removed = pipe.execute()[0]
        return removed > 0

    def start_ceremony(self, ceremony_id: bytes, challenge: bytes, purpose: str, user: str,
                       bound: bytes, ttl: float) -> bool:
        """As `Store.start_ceremony` (the count bounded loosely: two instances may
        both pass at the bound)."""
        key, under_way, now = self.key("ceremony", ceremony_id.hex()), self.key("ceremonies"), \
            time.time()
        self.db.zremrangebyscore(under_way, "-inf", now)
        if self.db.zcard(under_way) >= MAX_CEREMONIES:
            return False
        with self.db.pipeline() as pipe:
            pipe.hset(key, mapping={"challenge": challenge, "purpose": purpose,
                                    "user": user, "bound": bound})
            pipe.pexpire(key, max(1, int(ttl * 1000)))
            pipe.zadd(under_way, {ceremony_id.hex(): now + ttl})
            pipe.expire(under_way, int(ttl) + 1)
            pipe.execute()
        return True

    def take_ceremony(self, ceremony_id: bytes) -> tuple[bytes, str, str, bytes] | None:
        """As `Store.take_ceremony`: read and deleted in one transaction (MULTI), so
        two instances given the same answer cannot both find it."""
        key = self.key("ceremony", ceremony_id.hex())
        with self.db.pipeline() as pipe:            # transactional by default
            pipe.hmget(key, "challenge", "purpose", "user", "bound")
            pipe.delete(key)
            pipe.zrem(self.key("ceremonies"), ceremony_id.hex())
            (challenge, purpose, user, bound), deleted, _ = pipe.execute()
        if not deleted or challenge is None:
            return None
        return challenge, purpose.decode(), user.decode(), bound

    # ------------------------------------------------------ recovery codes
    def set_recovery_codes(self, user: str, hashes: list[bytes]) -> None:
        key = self.key("recovery", user)
        with self.db.pipeline() as pipe:
            pipe.delete(key)
            if hashes:
                pipe.sadd(key, *hashes)
            pipe.execute()

    def use_recovery_code(self, user: str, code_hash: bytes) -> bool:
        return self.db.srem(self.key("recovery", user), code_hash) > 0

    def recovery_left(self, user: str) -> int:
        return self.db.scard(self.key("recovery", user))

    # ------------------------------------------------------ provider accounts
    def bind_subject(self, issuer: str, user: str, subject: str) -> str:
        key = self.key("subjects", user)
        with self.db.pipeline() as pipe:       # MULTI: HSETNX then the field, at once
            pipe.hsetnx(key, issuer, subject)
            pipe.hget(key, issuer)
            return pipe.execute()[1].decode()

    def unbind_subjects(self, user: str) -> int:
        key = self.key("subjects", user)
        with self.db.pipeline() as pipe:
            pipe.hlen(key)
            pipe.delete(key)
            return pipe.execute()[0]

    # ------------------------------------------------------ dynamic allow-list
    def add_allow(self, cidr: str, ttl: float, comment: str = "") -> int:
        Networks([cidr])                                   # ValueError naming a bad entry
        now = time.time()
        entry_id = int(self.db.incr(self.key("allow-id")))
        name = self.key("allow", str(entry_id))
        with self.db.pipeline() as pipe:
            pipe.hset(name, mapping={"cidr": cidr.strip(), "expires": now + ttl,
                                     "comment": comment, "created": now})
            pipe.expireat(name, int(now + ttl) + 1)
            pipe.zadd(self.key("allow"), {str(entry_id): now + ttl})
            pipe.incr(self.key("allow-version"))
            pipe.execute()
        return entry_id

    def remove_allow(self, entry_id: int) -> bool:
        with self.db.pipeline() as pipe:
            pipe.delete(self.key("allow", str(entry_id)))
            pipe.zrem(self.key("allow"), str(entry_id))
            pipe.incr(self.key("allow-version"))
            removed, _, _ = pipe.execute()
        return removed > 0

    def allow_entries(self) -> list[tuple[int, str, float, str]]:
        ids = self.db.zrangebyscore(self.key("allow"), f"({time.time()}", "+inf")
        with self.db.pipeline() as pipe:
            for entry_id in ids:
                pipe.hmget(self.key("allow", entry_id.decode()), "cidr", "expires", "comment")
            rows = pipe.execute()
        return sorted((int(entry_id), row[0].decode(), float(row[1]), row[2].decode())
                      for entry_id, row in zip(ids, rows) if row[0] is not None)

    def purge(self, keep_failures: float = 3600.0) -> None:
        """Index entries of what has expired (the entries themselves expire in Redis)."""
        now = time.time()
        self.db.zremrangebyscore(self.key("sessions"), "-inf", now)
        self.db.zremrangebyscore(self.key("allow"), "-inf", now)
