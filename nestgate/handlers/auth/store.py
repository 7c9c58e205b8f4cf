"""The state every worker shares: sessions (with the factors they were signed in
with), failed sign-ins (per address and per account), the addresses each user signed
in from, the last TOTP step each user signed in with, dynamic allow entries, passkeys
(WebAuthn credentials), the WebAuthn ceremonies under way, hashed recovery codes, the
provider account each configured user signed in through first.

One SQLite file (WAL, so readers never wait for the writer) opened by each worker.
The supervisor creates and migrates it once (`prepare_store`) before any worker
starts: switching a new file to WAL takes a lock that SQLite does not wait for, so
workers doing it together fail with "database is locked". A worker that finds the
file ready only opens it, with a busy timeout. `Store` is the synchronous core; `SharedState` runs it on one thread of its own
so the event loop never waits on the disk, and keeps the worker's in-memory view
of the dynamic allow-list no more than `POLL_INTERVAL` behind the file.

Session tokens are never stored: only their SHA-256, so a copy of the file does
not hand out sessions. The file is created 0600, and its folder 0700 when nestgate
makes it (nestgate.base.private); `check` warns about a wider existing one.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import sqlite3
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from nestgate.handlers.auth.storerules import (ACCOUNT_MEMORY, KNOWN_FOR, MAX_CEREMONIES,
                                               SEEN_EVERY, StoredSessions, account_delay,
                                               address_key)
from nestgate.base.clientip import Networks
from nestgate.base.errors import HandlerError
from nestgate.base.handler import Periodic
from nestgate.base.private import create_private_file, make_private_folders
# token_hash is also imported from here (the admin CLI, the bench's session).
from nestgate.handlers.auth.sessiontoken import SessionTokens, token_hash  # noqa: F401

DEFAULT_TTL = "1h"           # an allow entry given no duration closes again on its own
POLL_INTERVAL = 0.5          # seconds: a change through one worker is seen by all within 1 s
PURGE_INTERVAL = 600.0       # seconds between removals of expired sessions
BUSY_TIMEOUT_S = 5.0         # how long a statement waits for another process's lock
HUNG_PAUSE = 1.0             # seconds a store that timed out is not asked (SharedState._call)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    token_hash BLOB PRIMARY KEY, user TEXT NOT NULL, created REAL NOT NULL,
    expires REAL NOT NULL, ip TEXT NOT NULL DEFAULT '', last_seen REAL NOT NULL DEFAULT 0,
    identity TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS failures (ip TEXT NOT NULL, at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS failures_ip ON failures (ip, at);
CREATE TABLE IF NOT EXISTS allow (
    id INTEGER PRIMARY KEY, cidr TEXT NOT NULL, expires REAL NOT NULL,
    comment TEXT NOT NULL DEFAULT '', created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS totp_used (user TEXT PRIMARY KEY, step INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS account_failures (
    user TEXT PRIMARY KEY, failures INTEGER NOT NULL, last REAL NOT NULL);
CREATE TABLE IF NOT EXISTS known_addresses (
    user TEXT NOT NULL, ip TEXT NOT NULL, at REAL NOT NULL, PRIMARY KEY (user, ip));
CREATE TABLE IF NOT EXISTS passkeys (
    id BLOB PRIMARY KEY, user TEXT NOT NULL, name TEXT NOT NULL, public_key BLOB NOT NULL,
    sign_count INTEGER NOT NULL, created REAL NOT NULL, last_used REAL NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS passkeys_user ON passkeys (user);
CREATE TABLE IF NOT EXISTS ceremonies (
    id BLOB PRIMARY KEY, challenge BLOB NOT NULL, purpose TEXT NOT NULL,
    user TEXT NOT NULL, bound BLOB NOT NULL, expires REAL NOT NULL);
CREATE TABLE IF NOT EXISTS recovery_codes (
    user TEXT NOT NULL, code_hash BLOB NOT NULL, PRIMARY KEY (user, code_hash));
CREATE TABLE IF NOT EXISTS bans (
    network TEXT PRIMARY KEY, until REAL NOT NULL, origin TEXT NOT NULL, rule TEXT NOT NULL,
    reason TEXT NOT NULL, answer TEXT NOT NULL, strikes INTEGER NOT NULL,
    created REAL NOT NULL, forget REAL NOT NULL);
CREATE TABLE IF NOT EXISTS provider_subjects (
    issuer TEXT NOT NULL, user TEXT NOT NULL, subject TEXT NOT NULL, created REAL NOT NULL,
    PRIMARY KEY (issuer, user));
"""
# Columns added after a table was first made: (table, column, definition). `migrate`
# adds the missing ones to a store made by an older version.
# A session of an older version counts as signed in with a password only.
_ADDED_COLUMNS = (("sessions", "last_seen", "REAL NOT NULL DEFAULT 0"),
                  ("sessions", "factors", "TEXT NOT NULL DEFAULT 'password'"),
                  ("sessions", "identity", "TEXT NOT NULL DEFAULT ''"))


SCHEMA_NAMES = frozenset(re.findall(r"CREATE (?:TABLE|INDEX) IF NOT EXISTS (\w+)", _SCHEMA))


class Store:
    """Synchronous access to the file; one instance per thread that uses it."""

    def __init__(self, path: str) -> None:
        self.path = path
        if path != ":memory:":
            # Created here 0600 (in a 0700 folder when nestgate makes it), before
            # SQLite would create it 0644: it holds the CSRF key, the allow-list and
            # who signed in from where. SQLite gives the -wal and -shm files the mode
            # of this one.
            make_private_folders(os.path.dirname(path))
            create_private_file(path)
        self.stored = StoredSessions(path)
        self.db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None,
                                  check_same_thread=False)
        self.db.execute("PRAGMA synchronous=NORMAL")
        if not self.ready():
            self.migrate()

    def ready(self) -> bool:
        """The file is in WAL mode with every table and index of this version (reading
        either waits on no lock that could fail)."""
        if self.db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            return False
        names = {row[0] for row in self.db.execute("SELECT name FROM sqlite_master")}
        return SCHEMA_NAMES <= names and not self._missing_columns()

    def _missing_columns(self) -> list[tuple[str, str, str]]:
        missing = []
        for table, column, definition in _ADDED_COLUMNS:
            have = {row[1] for row in self.db.execute(f"PRAGMA table_info({table})")}
            if have and column not in have:
                missing.append((table, column, definition))
        return missing

    def migrate(self) -> None:
        """WAL mode and the tables. Meant for one process at a time (`prepare_store`);
        a store opened without it (tests, `nestgate allow` before the first start)
        comes here on its own."""
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.executescript(_SCHEMA)
        for table, column, definition in self._missing_columns():
            self.db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")

    def close(self) -> None:
        self.db.close()

    def data_version(self) -> int:
        return self.db.execute("PRAGMA data_version").fetchone()[0]

    def secret(self) -> bytes:
        """A random key made once per store, shared by the workers (CSRF tokens)."""
        self.db.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('secret', ?)",
                        (secrets.token_bytes(32),))
        return self.db.execute("SELECT value FROM meta WHERE key = 'secret'").fetchone()[0]

    # ------------------------------------------------------ sessions
    def create_session(self, hashed: bytes, user: str, expires: float, ip: str,
                       factors: str = "password", identity: str = "") -> None:
        """`factors`: what the user signed in with, words separated by spaces
        (nestgate.handlers.auth.policy); `identity`: what a sign-in through a provider keeps
        (nestgate.handlers.auth.oidc.client)."""
        now = time.time()
        self.db.execute("INSERT INTO sessions (token_hash, user, created, expires, ip, "
                        "last_seen, factors, identity) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        (hashed, user, now, expires, ip, now, factors, identity))

    def session(self, hashed: bytes) -> tuple[str, float, str, str] | None:
        """(user, expires, factors, identity) of a live session, which is seen now: its
        `last_seen` is written when older than SEEN_EVERY (workers ask once per
        `portal.RECHECK` per session in use, so a busy session costs one write a
        minute). A row not as nestgate wrote it is none (`StoredSessions`)."""
        now = time.time()
        row = self.db.execute("SELECT user, expires, last_seen, factors, identity FROM sessions "
                              "WHERE token_hash = ? AND expires > ?", (hashed, now)).fetchone()
        found = row and self.stored.read(hashed, *row)
        if not found or found[1] <= now:
            return None
        user, expires, last_seen, factors, identity = found
        if now - last_seen >= SEEN_EVERY:
            self.db.execute("UPDATE sessions SET last_seen = ? WHERE token_hash = ?",
                            (now, hashed))
        return user, expires, factors, identity

    def session_expiries(self) -> list[tuple[bytes, float]]:
        """(token hash, expiry) of every live session (nestgate.handlers.auth.sessiontoken)."""
        # Only rows of the types nestgate writes (`StoredSessions` says about the others).
        return self.db.execute("SELECT token_hash, expires FROM sessions WHERE expires > ? "
                               "AND typeof(expires) IN ('real', 'integer') "
                               "AND typeof(token_hash) = 'blob'", (time.time(),)).fetchall()

    def delete_session(self, hashed: bytes) -> None:
        self.db.execute("DELETE FROM sessions WHERE token_hash = ?", (hashed,))

    def live_sessions(self) -> list[tuple[bytes, str, float, float, str, float, str]]:
        return self.db.execute("SELECT token_hash, user, created, expires, ip, last_seen, "
                               "factors FROM sessions WHERE expires > ? ORDER BY created",
                               (time.time(),)).fetchall()

    def delete_session_by_id(self, hex_prefix: str) -> bool:
        """Revoke the session whose token hash begins with `hex_prefix` (the id the admin
        API shows); False when none does."""
        for (hashed,) in self.db.execute("SELECT token_hash FROM sessions").fetchall():
            if hashed.hex().startswith(hex_prefix):
                self.delete_session(hashed)
                return True
        return False

    def delete_user_sessions(self, user: str) -> int:
        return self.db.execute("DELETE FROM sessions WHERE user = ?", (user,)).rowcount

    # ------------------------------------------------------ sign-in back-off
    def failures(self, ip: str, window: float) -> int:
        """Failures of `ip` (counted by `address_key`: an IPv6 client by its /64)."""
        return self.db.execute("SELECT count(*) FROM failures WHERE ip = ? AND at > ?",
                               (address_key(ip), time.time() - window)).fetchone()[0]

    def add_failure(self, ip: str) -> None:
        self.db.execute("INSERT INTO failures (ip, at) VALUES (?, ?)",
                        (address_key(ip), time.time()))

    def take_sign_in(self, ip: str, window: float, limit: int, user: str = "",
                     delays: tuple[int, float, float] = (0, 0.0, 0.0),
                     trusted: bool = False) -> float:
        """Count a sign-in attempt as a failure of `ip` and, when `user` is given, of
        that account, until it succeeds (`signed_in`). 0.0 when it may go ahead; else
        the seconds to wait, recording nothing: `ip` already has `limit` failures in
        the window, or the account is within its delay (`account_wait`) and the
        attempt is neither `trusted` (the account's own session) nor from an address
        the account signed in from. One transaction, so guesses sent together cannot
        all pass before any is counted."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            if self.failures(ip, window) >= limit:
                return window
            if user:
                now = time.time()
                if not trusted and not self.known_address(user, ip, now):
                    wait = self.account_wait(user, now, delays)
                    if wait > 0:
                        return wait
                self.db.execute(
                    "INSERT INTO account_failures (user, failures, last) VALUES (?, 1, ?) "
                    "ON CONFLICT (user) DO UPDATE SET last = excluded.last, failures = "
                    "CASE WHEN last > ? THEN failures + 1 ELSE 1 END",
                    (user, now, now - ACCOUNT_MEMORY))
            self.add_failure(ip)
            return 0.0
        finally:
            self.db.execute("COMMIT")

    def account_wait(self, user: str, now: float, delays: tuple[int, float, float]) -> float:
        row = self.db.execute("SELECT failures, last FROM account_failures WHERE user = ? "
                              "AND last > ?", (user, now - ACCOUNT_MEMORY)).fetchone()
        return 0.0 if row is None else account_delay(row[0], delays) - (now - row[1])

    def known_address(self, user: str, ip: str, now: float) -> bool:
        return ip != "" and self.db.execute(
            "SELECT 1 FROM known_addresses WHERE user = ? AND ip = ? AND at > ?",
            (user, address_key(ip), now - KNOWN_FOR)).fetchone() is not None

    def signed_in(self, user: str, ip: str) -> None:
        """A sign-in succeeded: both counts start again, and `ip` is one of the user's
        known addresses."""
        with self.db:
            self.clear_failures(ip)
            self.db.execute("DELETE FROM account_failures WHERE user = ?", (user,))
            if ip:
                self.db.execute("INSERT OR REPLACE INTO known_addresses (user, ip, at) "
                                "VALUES (?, ?, ?)", (user, address_key(ip), time.time()))

    def clear_failures(self, ip: str) -> None:
        self.db.execute("DELETE FROM failures WHERE ip = ?", (address_key(ip),))

    # ------------------------------------------------------ TOTP replay
    def use_totp_step(self, user: str, step: int) -> bool:
        """Record `step` as the last TOTP step `user` signed in with; False, recording
        nothing, unless it is later than the last one. One statement, so a code sent
        to two workers at once is accepted by one of them only."""
        return self.db.execute(
            "INSERT INTO totp_used (user, step) VALUES (?, ?) ON CONFLICT (user) "
            "DO UPDATE SET step = excluded.step WHERE excluded.step > totp_used.step",
            (user, step)).rowcount > 0

    # ------------------------------------------------------ passkeys (WebAuthn)
    def add_passkey(self, user: str, cred_id: bytes, name: str, public_key: bytes,
                    sign_count: int) -> None:
        self.db.execute("INSERT INTO passkeys (id, user, name, public_key, sign_count, "
                        "created) VALUES (?, ?, ?, ?, ?, ?)",
                        (cred_id, user, name, public_key, sign_count, time.time()))

    def passkeys(self, user: str = "") -> list[tuple[bytes, str, str, int, float, float]]:
        """(id, user, name, sign count, created, last used) of `user`'s passkeys, or of
        everyone's; never the public key (not a secret, but of no use to a listing)."""
        where, args = ("WHERE user = ?", (user,)) if user else ("", ())
        return self.db.execute("SELECT id, user, name, sign_count, created, last_used "
                               f"FROM passkeys {where} ORDER BY created", args).fetchall()

    def passkey(self, cred_id: bytes) -> tuple[str, bytes, int] | None:
        """(user, public key, sign count) of a registered credential."""
        return self.db.execute("SELECT user, public_key, sign_count FROM passkeys "
                               "WHERE id = ?", (cred_id,)).fetchone()

    def use_passkey(self, cred_id: bytes, sign_count: int) -> bool:
        """Record a verified use; False, recording nothing, when the credential is gone
        or its counter is no longer below `sign_count` (two workers given the same
        assertion, or a cloned authenticator). An authenticator without a counter
        sends 0 every time: that stays accepted while the stored count is 0."""
        return self.db.execute(
            "UPDATE passkeys SET sign_count = ?, last_used = ? WHERE id = ? AND "
            "(sign_count < ? OR (? = 0 AND sign_count = 0))",
            (sign_count, time.time(), cred_id, sign_count, sign_count)).rowcount > 0

    def rename_passkey(self, cred_id: bytes, user: str, name: str) -> bool:
        return self.db.execute("UPDATE passkeys SET name = ? WHERE id = ? AND user = ?",
                               (name, cred_id, user)).rowcount > 0

    def remove_passkey(self, cred_id: bytes, user: str = "") -> bool:
        """Revoke a passkey (only if it is `user`'s, when given)."""
        if user:
            return self.db.execute("DELETE FROM passkeys WHERE id = ? AND user = ?",
                                   (cred_id, user)).rowcount > 0
        return self.db.execute("DELETE FROM passkeys WHERE id = ?", (cred_id,)).rowcount > 0

    def start_ceremony(self, ceremony_id: bytes, challenge: bytes, purpose: str, user: str,
                       bound: bytes, ttl: float) -> bool:
        """A WebAuthn challenge handed out: good once, for `ttl` seconds, for `purpose`
        ("register" or "signin"), the `user` it is for ("" for a sign-in, where the
        credential names its user) and what it is `bound` to (the session hash that
        registers). False, storing nothing, when MAX_CEREMONIES are under way."""
        now = time.time()
        with self.db:
            self.db.execute("DELETE FROM ceremonies WHERE expires <= ?", (now,))
            live = self.db.execute("SELECT count(*) FROM ceremonies").fetchone()[0]
            if live >= MAX_CEREMONIES:
                return False
            self.db.execute("INSERT INTO ceremonies (id, challenge, purpose, user, bound, "
                            "expires) VALUES (?, ?, ?, ?, ?, ?)",
                            (ceremony_id, challenge, purpose, user, bound, now + ttl))
        return True

    def take_ceremony(self, ceremony_id: bytes) -> tuple[bytes, str, str, bytes] | None:
        """(challenge, purpose, user, bound) of a live ceremony, which is used up: a
        second answer to the same challenge finds nothing, on any worker."""
        row = self.db.execute("DELETE FROM ceremonies WHERE id = ? RETURNING challenge, "
                              "purpose, user, bound, expires", (ceremony_id,)).fetchall()
        return row[0][:4] if row and row[0][4] > time.time() else None

    # ------------------------------------------------------ recovery codes
    def set_recovery_codes(self, user: str, hashes: list[bytes]) -> None:
        """Replace `user`'s recovery codes (their hashes: nestgate.handlers.auth.recovery)."""
        with self.db:
            self.db.execute("DELETE FROM recovery_codes WHERE user = ?", (user,))
            self.db.executemany("INSERT INTO recovery_codes (user, code_hash) VALUES (?, ?)",
                                [(user, h) for h in hashes])

    def use_recovery_code(self, user: str, code_hash: bytes) -> bool:
        """Use up one of `user`'s codes: True once, on any worker."""
        return self.db.execute("DELETE FROM recovery_codes WHERE user = ? AND code_hash = ?",
                               (user, code_hash)).rowcount > 0

    def recovery_left(self, user: str) -> int:
        return self.db.execute("SELECT count(*) FROM recovery_codes WHERE user = ?",
                               (user,)).fetchone()[0]

    # ------------------------------------------------------ provider accounts
    def bind_subject(self, issuer: str, user: str, subject: str) -> str:
        """The subject of `issuer` that `user` is bound to: `subject` when none was
        (it is now), else the one bound first. One statement each way, so two first
        sign-ins at once bind one subject."""
        self.db.execute("INSERT OR IGNORE INTO provider_subjects (issuer, user, subject, "
                        "created) VALUES (?, ?, ?, ?)", (issuer, user, subject, time.time()))
        return self.db.execute("SELECT subject FROM provider_subjects WHERE issuer = ? AND "
                               "user = ?", (issuer, user)).fetchone()[0]

    def unbind_subjects(self, user: str) -> int:
        """Forget which provider accounts `user` is bound to: the next sign-in through
        each provider binds anew. How many bindings there were."""
        return self.db.execute("DELETE FROM provider_subjects WHERE user = ?",
                               (user,)).rowcount

    # ------------------------------------------------------ dynamic allow-list
    def add_allow(self, cidr: str, ttl: float, comment: str = "") -> int:
        Networks([cidr])                                   # ValueError naming a bad entry
        now = time.time()
        cur = self.db.execute("INSERT INTO allow (cidr, expires, comment, created) "
                              "VALUES (?, ?, ?, ?)", (cidr.strip(), now + ttl, comment, now))
        return cur.lastrowid

    def remove_allow(self, entry_id: int) -> bool:
        return self.db.execute("DELETE FROM allow WHERE id = ?", (entry_id,)).rowcount > 0

    def allow_entries(self) -> list[tuple[int, str, float, str]]:
        return self.db.execute("SELECT id, cidr, expires, comment FROM allow WHERE expires > ? "
                               "ORDER BY id", (time.time(),)).fetchall()

    def purge(self, keep_failures: float = 3600.0) -> None:
        now = time.time()
        with self.db:
            self.db.execute("DELETE FROM sessions WHERE expires <= ?", (now,))
            self.db.execute("DELETE FROM allow WHERE expires <= ?", (now,))
            self.db.execute("DELETE FROM failures WHERE at <= ?", (now - keep_failures,))
            self.db.execute("DELETE FROM account_failures WHERE last <= ?",
                            (now - ACCOUNT_MEMORY,))
            self.db.execute("DELETE FROM known_addresses WHERE at <= ?", (now - KNOWN_FOR,))
            self.db.execute("DELETE FROM ceremonies WHERE expires <= ?", (now,))


def open_store(locator: str):
    """The store a locator names: a SQLite file (`Store`), or Redis (`redis://`,
    `rediss://`, `unix://`: `nestgate.handlers.auth.redisstore.RedisStore`). Both answer the
    same operations."""
    from nestgate.handlers.auth.redisstore import RedisStore, is_redis
    return RedisStore(locator) if is_redis(locator) else Store(locator)


def store_errors() -> tuple[type[Exception], ...]:
    """What a store raises when it cannot be used now (a locked file, Redis down)."""
    import redis
    return (sqlite3.Error, redis.RedisError)


def store_timeouts() -> tuple[type[Exception], ...]:
    """What a store raises when it did not answer within its timeout."""
    import redis
    return (redis.TimeoutError,)


class StoreUnavailable(HandlerError):
    """The shared store cannot be asked: whoever needed it (a session check, a sign-in)
    is answered 503, and nobody is let in without the check."""

    def __init__(self, detail: str) -> None:
        super().__init__(503, f"the shared store is unavailable: {detail}")


def prepare_store(path: str) -> None:
    """Create and migrate the store file, and its secret, before workers open it.
    Redis needs no set-up; one that is down now is waited for by the workers."""
    from nestgate.handlers.auth.redisstore import is_redis
    if path == ":memory:" or is_redis(path):
        return
    store = Store(path)
    try:
        store.secret()
    finally:
        store.close()


class DynamicAllow:
    """The worker's view of the allow entries: `networks`, and a `version` that changes
    whenever they do (access decisions cached on connections compare it)."""

    def __init__(self) -> None:
        self.networks = Networks()
        self.version = 0
        self.next_expiry = float("inf")

    def load(self, rows) -> None:
        nets = Networks()
        for _id, cidr, _expires, _comment in rows:
            try:
                nets.add(cidr)
            except ValueError:
                continue                  # written by hand into the file: skip, never crash
        self.networks = nets
        self.next_expiry = min((r[2] for r in rows), default=float("inf"))
        self.changed()

    def changed(self) -> None:
        """Something access verdicts depend on changed (these entries, or a GeoIP
        database read anew): verdicts cached on connections are worked out again."""
        self.version += 1


class SharedState:
    """A worker's handle on the store: a thread for SQLite, the allow-list poller."""

    def __init__(self, path: str) -> None:
        from nestgate.handlers.auth.redisstore import shown
        self.path = path
        self._shown = shown(path)          # without a password, for messages
        self._errors = store_errors()
        self._down = False                 # the last use failed: say when it is back
        self.dynamic = DynamicAllow()
        self._executor: ThreadPoolExecutor | None = None
        self._store: Store | None = None
        self._poller: Periodic | None = None
        self._purged = 0.0                 # when expired sessions were last removed
        self._data_version = -1
        self._secret: bytes | None = None
        # The secret and the untagged sessions, to judge session cookies in memory.
        self.tokens = SessionTokens()
        self._timeouts = store_timeouts()
        self._quiet_until = 0.0            # the store hung: not asked again before then
        self._hung = ""

    async def run(self, method: str, *args):
        """`Store.<method>(*args)` on the store's thread; StoreUnavailable (503) when
        the store cannot be used now."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="nestgate-store")
        loop = asyncio.get_running_loop()
        try:
            result = await loop.run_in_executor(self._executor, self._call, method, args)
        except self._errors as exc:
            self._complain(exc)
            raise StoreUnavailable(str(exc)) from None
        if self._down:
            self._down = False
            print(f"nestgate: store {self._shown}: back", file=sys.stderr, flush=True)
        return result

    def _call(self, method: str, args):
        # On the store's one thread, where calls wait their turn: once a call has waited
        # out the store's timeout (a Redis that hangs, a network that drops packets),
        # the calls queued behind it are answered at once for HUNG_PAUSE rather than
        # each waiting the whole timeout in turn (twelve visitors: the last one's 503
        # came after 24 s). After the pause the next call asks again.
        if time.monotonic() < self._quiet_until:
            raise StoreUnavailable(self._hung)
        if self._store is None:
            self._store = open_store(self.path)
        try:
            return getattr(self._store, method)(*args)
        except self._timeouts as exc:
            self._hung = f"{exc} (not asked again for {HUNG_PAUSE:g} s)"
            self._quiet_until = time.monotonic() + HUNG_PAUSE
            raise

    def _complain(self, exc: Exception) -> None:
        """Say once per outage that the store cannot be used (and when it is back)."""
        if not self._down:
            self._down = True
            print(f"nestgate: store {self._shown}: {exc}; private sites answer 503 "
                  f"until it is back", file=sys.stderr, flush=True)

    async def secret(self) -> bytes:
        if self._secret is None:
            self._secret = self.tokens.secret
        if self._secret is None:
            self._secret = await self.run("secret")
        return self._secret

    async def refresh(self, force: bool = False) -> None:
        version = await self.run("data_version")
        if force or version != self._data_version or time.time() >= self.dynamic.next_expiry:
            self._data_version = version
            self.dynamic.load(await self.run("allow_entries"))

    async def _poll(self) -> None:
        try:
            if self.tokens.secret is None:         # the store did not answer at start
                self.tokens.load(await self.run("secret"), await self.run("session_expiries"))
            await self.refresh()
            if time.monotonic() - self._purged > PURGE_INTERVAL:
                self._purged = time.monotonic()
                await self.run("purge")
        except StoreUnavailable:
            pass                           # said once by `run`; the allow entries are kept

    def start(self) -> None:
        """Load the allow entries, and what session cookies are judged by, before the
        first request (when the store answers), then poll for changes."""
        if self._poller is None:
            try:
                if self._store is None:
                    self._store = open_store(self.path)
                self._data_version = self._store.data_version()
                self.dynamic.load(self._store.allow_entries())
                self.tokens.load(self._store.secret(), self._store.session_expiries())
            except self._errors as exc:
                self._complain(exc)        # the poller loads them once it answers
            self._poller = Periodic(POLL_INTERVAL, self._poll)    # run by `tick`

    def tick(self, now: float) -> None:
        if self._poller is not None:
            self._poller.tick(now)

    def stop(self) -> None:
        if self._poller is not None:
            self._poller.stop()
            self._poller = None
        if self._executor is not None:
            self._executor.shutdown(wait=False)
