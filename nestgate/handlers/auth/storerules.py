"""What every store keeps the same way, SQLite or Redis: how long it remembers
failures, known addresses and sessions' use, how many WebAuthn ceremonies it holds,
how an account's delay grows, and what a known address is remembered as.

nestgate.handlers.auth.store (SQLite, and the choice of store) and nestgate.handlers.auth.redisstore
both read these, so neither imports the other's rules.
"""

from __future__ import annotations

import ipaddress

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
