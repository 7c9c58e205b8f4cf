"""The `[auth]` table: users (inline or in `users_file`), sessions, cookie, back-off,
the shared store, the identity headers, the hosts guarded for another proxy."""

from __future__ import annotations

import os
from dataclasses import dataclass

from nestgate.base.configpath import resolved
from nestgate.base.tomltext import read_toml
from nestgate.handlers.auth.forwardconfig import read_forward_entry
from nestgate.handlers.auth.identity import IdentityHeaders, read_identity_headers
from nestgate.handlers.auth.oidc.config import ProviderConfig, read_provider
from nestgate.handlers.auth.providers import OidcProvider, read_providers
from nestgate.handlers.auth.totp import secret_problem

# The sign-in portal's pages on every protected site (nestgate.handlers.auth.portal); `check`
# refuses a configured route on either.
LOGIN_PATH = "/__auth__/login"
LOGOUT_PATH = "/__auth__/logout"
# The signed-in user's own page (passkeys, recovery codes) and the WebAuthn ceremony:
# its options, the sign-in with a passkey, the page's script (nestgate.handlers.auth.passkeys).
ACCOUNT_PATH = "/__auth__/account"
PASSKEY_OPTIONS = "/__auth__/passkey/options"
PASSKEY_PATH = "/__auth__/passkey"
PASSKEY_SCRIPT = "/__auth__/passkey.js"
PORTAL_PATHS = {LOGIN_PATH: "the sign-in page", LOGOUT_PATH: "the sign-out page",
                ACCOUNT_PATH: "the account page", PASSKEY_OPTIONS: "the passkey options",
                PASSKEY_PATH: "the passkey sign-in", PASSKEY_SCRIPT: "the passkey script"}
# The forward-auth endpoints another proxy asks (nestgate.handlers.auth.provider), on the same
# sites; `check` refuses a configured route on them too.
FORWARD_AUTH_PATH = "/api/authz/forward-auth"
AUTH_REQUEST_PATH = "/api/authz/auth-request"
AUTHZ_PATHS = {FORWARD_AUTH_PATH: "the forward-auth endpoint",
               AUTH_REQUEST_PATH: "the auth-request endpoint"}
# Sign-in through an OpenID provider: OIDC_PATH + <name> starts it, + "/callback" ends it.
OIDC_PATH = "/__auth__/oidc/"


def _can_hold(folder: str) -> bool:
    """`folder` is writable, or missing below a writable one: the store's set-up makes
    the missing folders (0700, nestgate.base.private)."""
    while not os.path.exists(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
    return os.path.isdir(folder) and os.access(folder, os.W_OK)


@dataclass(frozen=True)
class User:
    name: str
    password: str             # an argon2 hash from `nestgate passwd`
    totp: str = ""            # base32 secret (RFC 6238), "" for none
    groups: tuple[str, ...] = ()
    display_name: str = ""
    email: str = ""

    @property
    def second_factor(self) -> bool:
        """Sign-in asks this user for a second factor (so every session has one)."""
        return bool(self.totp)

    def listing(self) -> dict:
        """What the admin API shows of the user: never the hash or the TOTP secret."""
        return {"name": self.name, "groups": list(self.groups),
                "display_name": self.display_name, "email": self.email,
                "second_factor": self.second_factor}


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
    users_file: str = ""                    # more [[user]] tables, re-read on reload
    identity_headers: IdentityHeaders = IdentityHeaders()
    provider: ProviderConfig | None = None  # nestgate as an OpenID provider (issuer, clients)
    # [[auth.forward]]: hosts another proxy serves and asks nestgate about
    forward: tuple = ()                     # nestgate.handlers.auth.forwardconfig.ForwardEntry
    # [[auth.oidc]]: the providers users may sign in with ("Sign in with ..."); not to be
    # confused with `provider`, nestgate itself as one.
    providers: tuple[OidcProvider, ...] = ()

    @property
    def account_delays(self) -> tuple[int, float, float]:
        return self.account_failures, self.account_delay, self.account_delay_max

    def sign_in_provider(self, name: str) -> OidcProvider | None:
        return next((p for p in self.providers if p.name == name), None)

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
    users = [read_user(u) for u in s.tables("user")]
    users_file = s.path("users_file")
    if users_file:
        users += read_users_file(s, users_file)
    names = [u.name for u in users]
    for name in sorted({n for n in names if names.count(n) > 1}):
        s.fail("user", "each user name once (inline and in users_file)", name)
    store = s.path("store", d.store)
    cfg = AuthConfig(
        store=store if store == ":memory:" else
        str(resolved(s.state_base, os.path.expanduser(store))),
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
        users_file=str(resolved(s.base, users_file)) if users_file else "",
        identity_headers=read_identity_headers(s),
        provider=read_provider(s),
        forward=tuple(read_forward_entry(t, i) for i, t in enumerate(s.tables("forward"))),
        providers=read_providers(s),
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


def read_user(u) -> User:
    """One [[auth.user]] (or users_file [[user]]) table."""
    name, password, totp = u.str("name"), u.str("password"), u.str("totp")
    if not name or any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        u.fail("name", "a user name without spaces", name)
    if not password.startswith("$argon2"):
        u.fail("password", "an argon2 hash (run `nestgate passwd`)")
    problem = totp and secret_problem(totp)
    if problem:
        u.fail("totp", problem)                  # the secret itself is never shown
    groups = u.strings("groups")
    for group in groups:
        if not group or any(c in group for c in " \t\r\n,"):
            u.fail("groups", "group names without spaces or commas", group)
    display_name, email = u.str("display_name"), u.str("email")
    # They travel in request headers (Remote-Name, Remote-Email): one line of text.
    for key, value in (("display_name", display_name), ("email", email)):
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
            u.fail(key, "one line of text without control characters", value)
    if email and (email.count("@") != 1 or " " in email or not email.isascii()):
        u.fail("email", "an address such as \"ann@example.com\"", email)
    u.check_unknown()
    return User(name, password, totp.upper().replace(" ", ""), tuple(dict.fromkeys(groups)),
                display_name, email)


def read_users_file(s, value: str) -> list[User]:
    """The [[user]] tables of `users_file` (relative to the config's folder); its
    problems are named with that file."""
    path = resolved(s.base, os.path.expanduser(value))
    try:
        data = read_toml(path.read_bytes())
    except OSError as exc:
        s.fail("users_file", f"a readable TOML file of [[user]] tables ({exc.strerror})", value)
        return []
    except ValueError as exc:
        s.fail("users_file", f"a TOML file of [[user]] tables ({exc})", value)
        return []
    s.secret_file("users_file", str(path))      # password hashes, TOTP secrets
    top = s.child(data, "")
    top.file = str(path)
    users = [read_user(u) for u in top.tables("user")]
    top.check_unknown()
    return users
