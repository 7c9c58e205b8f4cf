"""What every store keeps the same way, SQLite or Redis: how long it remembers
failures, known addresses and sessions' use, how many WebAuthn ceremonies it holds,
how an account's delay grows, what a known address is remembered as, and how a
stored session's fields are read.

nestgate.handlers.auth.store (SQLite, and the choice of store) and nestgate.handlers.auth.redisstore
both read these, so neither imports the other's rules.
"""

from __future__ import annotations

import ipaddress
import math
import sys

SEEN_EVERY = 60.0            # seconds: a session's last_seen is written at most this often
ACCOUNT_MEMORY = 24 * 3600.0   # an account's failures are forgotten after a day of none
KNOWN_FOR = 90 * 24 * 3600.0   # an address a user signed in from stays known this long
# WebAuthn challenges under way at once: anyone may ask for one (a passkey sign-in
# begins before anyone is known), so their number is bounded, not only their life.
MAX_CEREMONIES = 10_000


def account_delay(failures: int, delays: tuple[int, float, float]) -> float:
    """Seconds an account waits after its last failure, with `failures` in a row:
    none for the first `free`, then `base`, doubling up to `most`."""
    free, base, most = delays
    if failures < free or base <= 0:
        return 0.0
    return min(most, base * 2.0 ** min(failures - free, 64))


def address_key(ip: str) -> str:
    """What a known address is remembered, and failed sign-ins are counted, as: an IPv4
    address, or the /64 of an IPv6 one (privacy addresses change within it every day,
    and one host often holds all of it: a limit per address would be none)."""
    try:
        parsed = ipaddress.ip_address(ip)
    except ValueError:
        return ip
    if parsed.version == 6:
        return str(ipaddress.ip_network(f"{parsed}/64", strict=False))
    return str(parsed)


class StoredSessions:
    """Reads a stored session's fields as nestgate wrote them. A record someone else
    wrote or changed (a hand-edited row, a Redis hash whose `expires` is not a number,
    a key of another type) is no session: never a 500, never a way in, and said once
    per session (up to SAID_MAX of them) with the store's name."""

    SAID_MAX = 1000

    def __init__(self, store_name: str) -> None:
        self.store_name = store_name
        self._said: set[str] = set()

    def read(self, hashed: bytes, user, expires, last_seen, factors, identity
             ) -> tuple[str, float, float, str, str] | None:
        """(user, expires, last_seen, factors, identity); None, said once, when a
        field is not what nestgate writes (text, or a finite number)."""
        try:
            return (_text(user), finite_number(expires), finite_number(last_seen or 0),
                    _text(factors or "password"), _text(identity or ""))
        except (TypeError, ValueError) as exc:    # UnicodeDecodeError is a ValueError
            self.malformed(hashed.hex(), str(exc))
            return None

    def malformed(self, session_id: str, what: str) -> None:
        """Say that the session `session_id` (its token hash in hex) was not readable."""
        if session_id in self._said or len(self._said) >= self.SAID_MAX:
            return
        self._said.add(session_id)
        print(f"nestgate: store {self.store_name}: session {session_id[:16]} is not as "
              f"nestgate wrote it ({what[:120]}); it is taken as no session",
              file=sys.stderr, flush=True)


def _text(value) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if not isinstance(value, str):
        raise TypeError(f"text expected, found {type(value).__name__}")
    return value


def finite_number(value) -> float:
    """A number nestgate wrote (a float, or its text in Redis); ValueError otherwise."""
    if isinstance(value, (bytes, str)):
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value):
        raise ValueError(f"a finite number expected, found {value!r:.40}")
    return float(value)
