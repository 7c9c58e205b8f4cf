"""The `[auth]` table: users, sessions, cookie, back-off, the shared store."""

from __future__ import annotations

import os
from dataclasses import dataclass

from nestgate.auth.totp import secret_problem

# The sign-in portal's pages on every protected site (nestgate.auth.portal); `check`
# refuses a configured route on either.
LOGIN_PATH = "/__auth__/login"
LOGOUT_PATH = "/__auth__/logout"


def _can_hold(folder: str) -> bool:
    """`folder` is writable, or missing below a writable one: the store's set-up makes
    the missing folders (0700, nestgate.private)."""
    while not os.path.exists(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
    return os.path.isdir(folder) and os.access(folder, os.W_OK)


@dataclass(frozen=True)
class User:
    name: str
    password: str             # an argon2 hash from `nestgate passwd`
    totp: str = ""            # base32 secret (RFC 6238), "" for none


@dataclass(frozen=True)
class AuthConfig:
    store: str = "nestgate-state.db"        # SQLite file shared by the workers
    users: tuple[User, ...] = ()
    session_ttl: float = 12 * 3600.0
    cookie_name: str = "nestgate_session"
    cookie_domain: str = ""                 # "example.com": one sign-in for every subdomain
    cookie_samesite: str = "Lax"
    cookie_secure: bool = True
    ip_grant: float = 0.0                   # after sign-in, allow the visitor's IP this long
    max_failures: int = 5                   # failed sign-ins per IP ...
    failure_window: float = 60.0            # ... within this window -> 429
    # Per account, whatever the address: after `account_failures` failures in a row,
    # each attempt waits `account_delay` after the last, doubling up to the most.
    account_failures: int = 3
    account_delay: float = 1.0
    account_delay_max: float = 900.0
    title: str = "Sign in"                  # shown on the sign-in page

    @property
    def account_delays(self) -> tuple[int, float, float]:
        return self.account_failures, self.account_delay, self.account_delay_max

    def user(self, name: str) -> User | None:
        for user in self.users:
            if user.name == name:
                return user
        return None


def read_auth(s) -> AuthConfig | None:
    """Reader for the top-level [auth] table (a config `_Section`); None when absent."""
    if not s.data:
        return None
    d = AuthConfig()
    users = []
    for u in s.tables("user"):
        name, password, totp = u.str("name"), u.str("password"), u.str("totp")
        if not name or any(c in name for c in " \t\r\n"):
            u.fail("name", "a user name without spaces", name)
        if not password.startswith("$argon2"):
            u.fail("password", "an argon2 hash (run `nestgate passwd`)")
        problem = totp and secret_problem(totp)
        if problem:
            u.fail("totp", problem)                  # the secret itself is never shown
        u.check_unknown()
        users.append(User(name, password, totp.upper().replace(" ", "")))
    names = [u.name for u in users]
    if len(set(names)) != len(names):
        s.fail("user", "each user name once")
    store = s.str("store", d.store)
    cfg = AuthConfig(
        store=store if store == ":memory:" else
        str((s.state_base / os.path.expanduser(store)).resolve()),
        users=tuple(users),
        session_ttl=s.duration("session_ttl", d.session_ttl),
        cookie_name=s.str("cookie_name", d.cookie_name),
        cookie_domain=s.str("cookie_domain", d.cookie_domain).lstrip("."),
        cookie_samesite=s.choice("cookie_samesite", d.cookie_samesite, ("Strict", "Lax", "None")),
        cookie_secure=s.bool("cookie_secure", d.cookie_secure),
        ip_grant=s.duration("ip_grant", d.ip_grant),
        max_failures=s.int("max_failures", d.max_failures, 1, 10_000),
        failure_window=s.duration("failure_window", d.failure_window),
        account_failures=s.int("account_failures", d.account_failures, 0, 10_000),
        account_delay=s.positive_duration("account_delay", d.account_delay),
        account_delay_max=s.positive_duration("account_delay_max", d.account_delay_max),
        title=s.str("title", d.title),
    )
    if not cfg.cookie_name or not all(c.isalnum() or c in "_-" for c in cfg.cookie_name):
        s.fail("cookie_name", "letters, digits, _ and -", cfg.cookie_name)
    if cfg.cookie_samesite == "None" and not cfg.cookie_secure:
        s.fail("cookie_samesite", "\"Lax\" or \"Strict\" when cookie_secure is false")
    if cfg.store != ":memory:" and not _can_hold(os.path.dirname(cfg.store)):
        s.fail("store", "a file in a writable directory (or one nestgate can make)", store)
    if cfg.account_delay_max < cfg.account_delay:
        s.fail("account_delay_max", "a duration at least account_delay")
    if cfg.session_ttl <= 0:
        s.fail("session_ttl", "a duration above zero")
    s.check_unknown()
    return cfg
