"""The OpenID provider's state in the shared store: signing keys, authorization codes
and grants (an access token and, with `offline_access`, a refresh token). Kept where
the sessions are (the SQLite file, 0600, or Redis under `[state]`), so every worker
and every instance signs with the same keys and redeems the same codes.

Neither codes nor tokens are stored: only their SHA-256, as with sessions.

Races that must have one winner, whichever worker or instance they reach:
  - the signing key of a period: made with INSERT OR IGNORE / SET NX, then read back,
    so two workers starting together end up signing with the same key;
  - a code's redemption: marked used in one statement (UPDATE ... RETURNING, or a Lua
    script), so a code sent to two instances at once yields one grant; a code seen
    again ends the grant it gave (RFC 6749 4.1.2);
  - a refresh token's use: taken in one statement (UPDATE ... RETURNING, GETDEL).
    A spent refresh token is remembered (its grant and client) for as long as it
    would have lived: presented again by its client, it ends the grant (RFC 9700
    4.14.2), since either the client or someone who copied the token is using a
    token the other already spent, and nobody can tell which.

Both classes answer the same calls; `provider_state(store)` picks by the store.
"""

from __future__ import annotations

import json
import secrets
import time

# A used code is remembered this long, so that a replay ends the grant it gave.
USED_CODE_MEMORY = 600.0
PURGE_EVERY = 60.0   # seconds: a handle that writes removes what expired at most this often

_SCHEMA = """
CREATE TABLE IF NOT EXISTS oidc_keys (period INTEGER PRIMARY KEY, jwk TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS oidc_codes (
    code_hash BLOB PRIMARY KEY, data TEXT NOT NULL, expires REAL NOT NULL,
    used INTEGER NOT NULL DEFAULT 0, grant_id TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS oidc_grants (
    id TEXT PRIMARY KEY, client_id TEXT NOT NULL, user TEXT NOT NULL, scope TEXT NOT NULL,
    created REAL NOT NULL, auth_time REAL NOT NULL,
    access_hash BLOB, access_expires REAL NOT NULL,
    refresh_hash BLOB, refresh_expires REAL NOT NULL);
CREATE INDEX IF NOT EXISTS oidc_grants_access ON oidc_grants (access_hash);
CREATE INDEX IF NOT EXISTS oidc_grants_refresh ON oidc_grants (refresh_hash);
CREATE TABLE IF NOT EXISTS oidc_spent_refresh (
    refresh_hash BLOB PRIMARY KEY, grant_id TEXT NOT NULL, client_id TEXT NOT NULL,
    expires REAL NOT NULL);
"""

GRANT_FIELDS = ("id", "client_id", "user", "scope", "created", "auth_time",
                "access_expires", "refresh_expires")


def provider_state(store):
    """The provider's calls on `store` (nestgate.handlers.auth.store.Store or RedisStore)."""
    from nestgate.handlers.auth.redisstore import RedisStore
    if isinstance(store, RedisStore):
        return RedisProviderState(store)
    return SQLiteProviderState(store)


GRANT_ID_HEX = 16


def new_grant_id() -> str:
    return secrets.token_hex(GRANT_ID_HEX // 2)


def is_grant_id(value: str) -> bool:
    return len(value) == GRANT_ID_HEX and all(c in "0123456789abcdef" for c in value)


class _Purging:
    """Expired codes and grants go when a handle writes, at most every PURGE_EVERY:
    no timer of its own, and a provider nobody uses keeps nothing new."""

    _purged = 0.0

    def _now_and_then(self) -> None:
        if time.monotonic() - self._purged >= PURGE_EVERY:
            self._purged = time.monotonic()
            self.purge()

    def purge(self) -> None:
        raise NotImplementedError


class SQLiteProviderState(_Purging):
    def __init__(self, store) -> None:
        self.db = store.db
        # Made here rather than by the store's migration: a store made before the
        # provider existed gains its tables when the provider first uses it (each
        # statement waits out another worker's with the store's busy timeout).
        self.db.executescript(_SCHEMA)

    # ------------------------------------------------------ signing keys
    def signing_key(self, period: int, made: str) -> str:
        """The key of `period` (a JWK as JSON): `made` unless another worker's is there."""
        self.db.execute("INSERT OR IGNORE INTO oidc_keys (period, jwk) VALUES (?, ?)",
                        (period, made))
        return self.db.execute("SELECT jwk FROM oidc_keys WHERE period = ?",
                               (period,)).fetchone()[0]

    def keys(self, periods) -> dict[int, str]:
        marks = ",".join("?" * len(periods))
        return dict(self.db.execute(f"SELECT period, jwk FROM oidc_keys WHERE period IN "
                                    f"({marks})", tuple(periods)).fetchall())

    def drop_keys_before(self, period: int) -> None:
        self.db.execute("DELETE FROM oidc_keys WHERE period < ?", (period,))

    # ------------------------------------------------------ codes
    def save_code(self, hashed: bytes, data: dict, expires: float) -> None:
        self._now_and_then()
        self.db.execute("INSERT INTO oidc_codes (code_hash, data, expires) VALUES (?, ?, ?)",
                        (hashed, json.dumps(data), expires))

    def take_code(self, hashed: bytes) -> dict | None:
        """The code's data, marking it used; None when it is unknown, expired or was
        used before (then the grant it gave ends)."""
        now = time.time()
        row = self.db.execute("UPDATE oidc_codes SET used = 1, expires = ? WHERE code_hash = ? "
                              "AND used = 0 AND expires > ? RETURNING data",
                              (now + USED_CODE_MEMORY, hashed, now)).fetchone()
        if row is not None:
            return json.loads(row[0])
        used = self.db.execute("SELECT grant_id FROM oidc_codes WHERE code_hash = ? AND used = 1",
                               (hashed,)).fetchone()
        if used is not None and used[0]:
            self.delete_grant(used[0])
        return None

    # ------------------------------------------------------ grants
    def save_grant(self, grant: dict, access_hash: bytes, refresh_hash: bytes | None,
                   code_hash: bytes | None = None) -> None:
        """A new grant, or a refreshed one (same id: its tokens replaced)."""
        with self.db:
            self.db.execute(
                "INSERT OR REPLACE INTO oidc_grants (id, client_id, user, scope, created, "
                "auth_time, access_hash, access_expires, refresh_hash, refresh_expires) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (*(grant[f] for f in GRANT_FIELDS[:6]), access_hash, grant["access_expires"],
                 refresh_hash, grant["refresh_expires"]))
            if code_hash is not None:
                self.db.execute("UPDATE oidc_codes SET grant_id = ? WHERE code_hash = ?",
                                (grant["id"], code_hash))

    def _grant(self, where: str, args) -> dict | None:
        row = self.db.execute(f"SELECT {', '.join(GRANT_FIELDS)} FROM oidc_grants WHERE "
                              + where, args).fetchone()
        return dict(zip(GRANT_FIELDS, row)) if row else None

    def grant_by_access(self, hashed: bytes) -> dict | None:
        return self._grant("access_hash = ?", (hashed,))

    def grant_by_refresh(self, hashed: bytes) -> dict | None:
        return self._grant("refresh_hash = ? AND refresh_expires > ?", (hashed, time.time()))

    def take_refresh(self, hashed: bytes) -> dict | None:
        """The grant of a live refresh token, which is now spent (refreshing issues
        the next one) and remembered as spent until it would have expired."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            row = self.db.execute(
                f"UPDATE oidc_grants SET refresh_hash = NULL, access_hash = NULL WHERE "
                f"refresh_hash = ? AND refresh_expires > ? RETURNING "
                f"{', '.join(GRANT_FIELDS)}", (hashed, time.time())).fetchone()
            if row is None:
                return None
            grant = dict(zip(GRANT_FIELDS, row))
            self.db.execute("INSERT OR REPLACE INTO oidc_spent_refresh (refresh_hash, "
                            "grant_id, client_id, expires) VALUES (?, ?, ?, ?)",
                            (hashed, grant["id"], grant["client_id"],
                             grant["refresh_expires"]))
            return grant
        finally:
            self.db.execute("COMMIT")

    def spent_refresh(self, hashed: bytes) -> tuple[str, str] | None:
        """(grant id, client id) of a refresh token spent before and not yet expired."""
        row = self.db.execute("SELECT grant_id, client_id FROM oidc_spent_refresh WHERE "
                              "refresh_hash = ? AND expires > ?",
                              (hashed, time.time())).fetchone()
        return (row[0], row[1]) if row else None

    def delete_grant(self, grant_id: str) -> bool:
        return self.db.execute("DELETE FROM oidc_grants WHERE id = ?",
                               (grant_id,)).rowcount > 0

    def live_grants(self) -> list[dict]:
        now = time.time()
        rows = self.db.execute(
            f"SELECT {', '.join(GRANT_FIELDS)} FROM oidc_grants WHERE (access_expires > ? "
            f"AND access_hash IS NOT NULL) OR (refresh_expires > ? AND refresh_hash IS NOT "
            f"NULL) ORDER BY created", (now, now)).fetchall()
        return [dict(zip(GRANT_FIELDS, row)) for row in rows]

    def purge(self) -> None:
        now = time.time()
        with self.db:
            self.db.execute("DELETE FROM oidc_codes WHERE expires <= ?", (now,))
            self.db.execute("DELETE FROM oidc_grants WHERE access_expires <= ? AND "
                            "refresh_expires <= ?", (now, now))
            self.db.execute("DELETE FROM oidc_spent_refresh WHERE expires <= ?", (now,))


# KEYS: code:<hex>; ARGV: now, used memory. The code's data when it was unused and
# live (now marked used); else "" after ending the grant a used code gave.
_TAKE_CODE = """
local data, expires, used = unpack(redis.call('HMGET', KEYS[1], 'data', 'expires', 'used'))
if not data then return '' end
if used == '0' and tonumber(expires) > tonumber(ARGV[1]) then
  redis.call('HSET', KEYS[1], 'used', '1')
  redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2])))
  return data
end
return ''
"""


class RedisProviderState(_Purging):
    """Keys under the store's prefix:

        oidc-key:<period>        a signing key (JWK JSON), SET NX
        oidc-code:<hash hex>     hash: data, expires, used, grant; expires with the code
        oidc-grant:<id>          hash: the grant's fields; expires with its last token
        oidc-access:<hash hex>   the grant id of an access token
        oidc-refresh:<hash hex>  the grant id of a refresh token
        oidc-spent:<hash hex>    "<grant id> <client id>" of a spent refresh token,
                                 expiring when the token would have
        oidc-grants              sorted set of grant ids by their last expiry
    """

    def __init__(self, store) -> None:
        self.db = store.db
        self.key = store.key
        self._take_code = self.db.register_script(_TAKE_CODE)

    def signing_key(self, period: int, made: str) -> str:
        name = self.key("oidc-key", str(period))
        self.db.set(name, made, nx=True)
        return self.db.get(name).decode()

    def keys(self, periods) -> dict[int, str]:
        values = self.db.mget([self.key("oidc-key", str(p)) for p in periods])
        return {p: v.decode() for p, v in zip(periods, values) if v is not None}

    def drop_keys_before(self, period: int) -> None:
        for name in self.db.scan_iter(self.key("oidc-key", "*")):
            if int(name.decode().rsplit(":", 1)[1]) < period:
                self.db.delete(name)

    def save_code(self, hashed: bytes, data: dict, expires: float) -> None:
        self._now_and_then()
        name = self.key("oidc-code", hashed.hex())
        with self.db.pipeline() as pipe:
            pipe.hset(name, mapping={"data": json.dumps(data), "expires": expires, "used": 0,
                                     "grant": ""})
            pipe.expireat(name, int(expires) + 1)
            pipe.execute()

    def take_code(self, hashed: bytes) -> dict | None:
        name = self.key("oidc-code", hashed.hex())
        data = self._take_code(keys=[name], args=[time.time(), USED_CODE_MEMORY])
        if data:
            return json.loads(data)
        grant = self.db.hget(name, "grant")
        if grant:
            self.delete_grant(grant.decode())
        return None

    def save_grant(self, grant: dict, access_hash: bytes, refresh_hash: bytes | None,
                   code_hash: bytes | None = None) -> None:
        name = self.key("oidc-grant", grant["id"])
        last = max(grant["access_expires"], grant["refresh_expires"])
        fields = {f: grant[f] for f in GRANT_FIELDS}
        fields["access_hash"] = access_hash.hex()
        fields["refresh_hash"] = refresh_hash.hex() if refresh_hash else ""
        with self.db.pipeline() as pipe:
            pipe.hset(name, mapping=fields)
            pipe.expireat(name, int(last) + 1)
            pipe.set(self.key("oidc-access", access_hash.hex()), grant["id"],
                     exat=int(grant["access_expires"]) + 1)
            if refresh_hash:
                pipe.set(self.key("oidc-refresh", refresh_hash.hex()), grant["id"],
                         exat=int(grant["refresh_expires"]) + 1)
            pipe.zadd(self.key("oidc-grants"), {grant["id"]: last})
            if code_hash is not None:
                pipe.hset(self.key("oidc-code", code_hash.hex()), "grant", grant["id"])
            pipe.execute()

    def _grant(self, grant_id: bytes | None) -> dict | None:
        if grant_id is None:
            return None
        raw = self.db.hgetall(self.key("oidc-grant", grant_id.decode()))
        if not raw:
            return None
        row = {k.decode(): v.decode() for k, v in raw.items()}
        out = {f: row[f] for f in GRANT_FIELDS}
        for f in ("created", "auth_time", "access_expires", "refresh_expires"):
            out[f] = float(out[f])
        out["_access"], out["_refresh"] = row.get("access_hash", ""), row.get("refresh_hash", "")
        return out

    def grant_by_access(self, hashed: bytes) -> dict | None:
        grant = self._grant(self.db.get(self.key("oidc-access", hashed.hex())))
        return grant if grant and grant.pop("_access") == hashed.hex() else None

    def grant_by_refresh(self, hashed: bytes) -> dict | None:
        grant = self._grant(self.db.get(self.key("oidc-refresh", hashed.hex())))
        return grant if grant and grant.pop("_refresh") == hashed.hex() else None

    def take_refresh(self, hashed: bytes) -> dict | None:
        grant = self._grant(self.db.getdel(self.key("oidc-refresh", hashed.hex())))
        if grant is None or grant["_refresh"] != hashed.hex():
            return None
        with self.db.pipeline() as pipe:
            pipe.delete(self.key("oidc-access", grant.pop("_access")))
            pipe.set(self.key("oidc-spent", hashed.hex()),
                     f"{grant['id']} {grant['client_id']}",
                     exat=int(grant["refresh_expires"]) + 1)
            pipe.execute()
        grant.pop("_refresh")
        return grant

    def spent_refresh(self, hashed: bytes) -> tuple[str, str] | None:
        value = self.db.get(self.key("oidc-spent", hashed.hex()))
        if value is None:
            return None
        grant_id, _, client_id = value.decode().partition(" ")
        return grant_id, client_id

    def delete_grant(self, grant_id: str) -> bool:
        name = self.key("oidc-grant", grant_id)
        access, refresh = self.db.hmget(name, "access_hash", "refresh_hash")
        with self.db.pipeline() as pipe:
            pipe.delete(name)
            for kind, hashed in (("oidc-access", access), ("oidc-refresh", refresh)):
                if hashed:
                    pipe.delete(self.key(kind, hashed.decode()))
            pipe.zrem(self.key("oidc-grants"), grant_id)
            return bool(pipe.execute()[0])

    def live_grants(self) -> list[dict]:
        ids = self.db.zrangebyscore(self.key("oidc-grants"), f"({time.time()}", "+inf")
        grants = [self._grant(i) for i in ids]
        out = []
        for grant in grants:
            if grant is not None:
                grant.pop("_access"), grant.pop("_refresh")
                out.append(grant)
        return sorted(out, key=lambda g: g["created"])

    def purge(self) -> None:
        self.db.zremrangebyscore(self.key("oidc-grants"), "-inf", time.time())
