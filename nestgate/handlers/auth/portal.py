"""The sign-in portal: /__auth__/login and /__auth__/logout, and the session check.

A protected route's `Gate` asks `SignIn.admit` for the handler that answers: the one
its compiled policy gives the session's user (`Gate.answers`: the route, or a
`Refusal` page) when the session cookie is known good (the worker remembers a checked
session for `RECHECK` seconds, so a sign-out anywhere is seen within that, and asks
the store again in the background before then while the session is in use), a
`SessionCheck` that asks the store first, or the challenge (the sign-in page for
browsers, 401 for API clients, told apart by Accept). A session whose user is no
longer configured (gone from the users file at a reload) is no session.

A signed-in user the policy refuses gets a 403 page that names the user and says why,
with "sign in as someone else": the sign-out form, going on to the sign-in page and
back to the refused address. No redirect, so no loop.

CSRF: every form carries an HMAC under the store's secret (one for all workers and,
through Redis, all instances). A browser with a session cookie gets one of that
session's token hash, so the forms that act on a session (sign out, account, passkey
registration, an OpenID client's consent) take no token but one its own pages were
given: a cookie and token planted by a page that can set cookies for this host (its
http:// origin, another port, a sibling under `cookie_domain`) are refused. Without a
session (the sign-in form) it is a double submit: HMAC(secret, nonce), the nonce in a
cookie, so a token is worth nothing without the cookie it was made for and no token
can be made up. An Origin header, when sent, must name this Host. A GET of either
path changes nothing: sign-out is a POST, so another
site cannot end a session with an <img>. After sign-in the visitor goes back to
`next`, which must be a path on this Host (never `//elsewhere` or a scheme): no
open redirect.

Guessing: every attempt counts as a failure of its client address and of the account
named (a configured one) until it succeeds, checked and recorded in one transaction of
the shared store. An address gets `max_failures` per `failure_window`; an account,
whatever the addresses, `account_failures` in a row, then waits `account_delay` after
each, doubling up to `account_delay_max`. The account's delay does not hold back an
address it signed in from before, nor a request carrying its own live session: an
outsider can slow the owner down only where the owner has never signed in.

Factors: a session records what it was signed in with (nestgate.handlers.auth.policy), and the
gate looks its answers up by user and factors, so `two_factor` admits a password with
a TOTP code, a passkey or a recovery code, or a passkey that verified the user, and
never a password alone. The code field takes a TOTP code or a recovery code
(nestgate.handlers.auth.recovery); a passkey (nestgate.handlers.auth.passkeys) signs in alone or stands
in for the code after the password.

TOTP: a code is accepted once. The step it belongs to must be later than the last
step the user signed in with, checked and recorded in one statement of the shared
store, so a code seen over a shoulder or in a proxy log is worth nothing, on any
worker; a refused replay is a failed sign-in like a wrong code.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import html
import json
import math
import re
import secrets
import time
from urllib.parse import parse_qs, quote, urlsplit

from nestgate.bans.watch import BANS
from nestgate.handlers.auth import recovery, totp
from nestgate.handlers.auth.config import LOGIN_PATH, LOGOUT_PATH, OIDC_PATH, PASSKEY_SCRIPT, User
from nestgate.handlers.auth.oidc.client import Http, Provider, session_key_of
from nestgate.handlers.auth.passwords import verify_password
from nestgate.handlers.auth.policy import (NO_SECOND_FACTOR, NOT_ALLOWED, PASSWORD,
                                           RECOVERY, TOTP, session_user)
from nestgate.handlers.auth.sessiontoken import new_token, token_hash
from nestgate.handlers.auth.tunnels import SessionTunnels
from nestgate.base.clock import CLOCK
from nestgate.pipeline.dispatch import resolve
from nestgate.base.hosts import host_name, plain_host_name
from nestgate.base.tally import TALLY

RECHECK = 1.0                  # seconds a checked session is trusted without the store
# A session in use is asked about again in the background once its check is this old,
# so the answer is in before RECHECK runs out and no request waits for the store.
REFRESH_AFTER = 0.75 * RECHECK
CSRF_COOKIE = "nestgate_csrf"
MAX_FORM = 16 * 1024
_CACHE_LIMIT = 10_000
_HOST_PORT = re.compile(r"[a-z0-9][a-z0-9.-]*(:[0-9]{1,5})?")

_PAGE_HEADERS = [
    (b"content-type", b"text/html; charset=utf-8"),
    (b"cache-control", b"no-store"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"content-security-policy",
     b"default-src 'none'; style-src 'unsafe-inline'; script-src 'self'; "
     b"connect-src 'self'; form-action 'self'; frame-ancestors 'none'"),
]


def origin(url: str) -> str:
    """scheme://host[:port] of `url`, as CSP names a site."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def safe_next(value: str | None) -> str:
    """A path on this Host to go back to; "/" for anything else."""
    if not value or len(value) > 2048 or not value.startswith("/") or not value.isascii():
        return "/"
    if value.startswith(("//", "/\\")) or any(c in value for c in "\\\r\n\t\0 "):
        return "/"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        return "/"
    return value


_DEFAULT_PORTS = {b"http": b"80", b"https": b"443"}


def _origin_is_the_sites(origin: bytes, request) -> bool:
    """A form's `Origin` names the request's own host and, for a browser's own
    connection, its port: a page on another port of the same host is another origin
    (RFC 6454) that can plant the CSRF cookie (cookies do not tell ports apart) and post
    a token it fetched itself. A trusted proxy in front may have rewritten Host without
    the port (nginx's `$host`), so through one the host name alone is compared."""
    scheme, sep, authority = origin.partition(b"://")
    if not sep:
        scheme, authority = b"", origin
    if host_name(authority) != host_name(request.host):
        return False
    if request.connection.xff_trusted:
        return True
    # A browser leaves the scheme's default port out of both; the Origin's scheme
    # says which default a bare Host stands for.
    default = _DEFAULT_PORTS.get(scheme.lower(), b"")
    return _port(authority, default) == _port(request.host, default)


def _port(authority: bytes, default: bytes) -> bytes:
    """The port of host[:port] (an IPv6 literal's colons are not one), else `default`."""
    _, bracket, after = authority.rpartition(b"]")
    rest = after if bracket else authority
    _, colon, port = rest.rpartition(b":")
    return port.strip() if colon and port.strip() else default


def cookies(headers) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in headers:
        if name == b"cookie":
            for part in value.decode("latin-1").split(";"):
                key, sep, val = part.strip().partition("=")
                if sep and key not in out:
                    out[key] = val
    return out


async def answer_with(handler, request) -> None:
    """Let `handler` answer `request`, whichever kind it is: a route that chooses by
    the client (GATED) or may have a ready answer (PEEK) is settled first, as the
    engine settles it when no session check stands in between. The request stands
    in for its connection: after an await the connection's client may be another
    request's (pipelining or HTTP/2 streams behind a trusted proxy)."""
    handler = resolve(handler, request, request.path, request.method, request.headers)
    if handler.is_async:
        request.handler = handler
        await handler.handle(request)
    else:
        await request.send_prebuilt(handler)


class SignIn:
    """Sign-in for the protected sites of one config."""

    def __init__(self, cfg, state, answer_for=None, known_groups=frozenset()) -> None:
        self.cfg = cfg
        self.state = state                  # nestgate.handlers.auth.store.SharedState
        # hash -> session key (policy.session_key: user and factors; the `User` of one
        # who signed in through a provider as nobody configured), expires, checked
        self._sessions: dict[bytes, tuple[str | User, float, float]] = {}
        # Cookie header values as received -> the session token's hash (b"" for none):
        # a browser sends the same value on every request, so the usual request costs
        # one lookup instead of splitting the header and hashing the token.
        self._hashed_by_cookie: dict[bytes, bytes] = {}
        self._marker = cfg.cookie_name.encode() + b"="
        self._asking: dict[bytes, asyncio.Future] = {}   # hash -> the store check under way
        # The handler a route gives a user its answers were not compiled for
        # (nestgate.sites.guard.Gateway.answer_for), and the groups the config names.
        self._answer_for = answer_for
        self.known_groups = known_groups
        self.http = Http()
        self.providers = {p.name: Provider(p, self.http) for p in cfg.providers}
        self._refusals: dict[tuple[str, str], Refusal] = {}
        self.page_headers = _PAGE_HEADERS
        self._form_origins: set[str] = set()
        # Signing out may go on to a provider's end-session endpoint.
        self.allow_form_redirects(origin(p.issuer) for p in cfg.providers if p.end_session)
        self.challenge = Challenge(self)
        self.tunnels = SessionTunnels(self)     # cut when their session ends
        self.login = LoginPage(self)
        self.logout = Logout(self)

    # ------------------------------------------------------ the gate's question
    def admit(self, gate, headers, client: str, conn):
        """The handler for a request to `gate`'s route, which answers each user with
        `gate.answers` (user name -> handler, compiled with the route's policy), on
        the connection `conn`."""
        hashed = self._session_hash(headers)
        if not hashed:
            return self.challenge
        user = self._checked_user(hashed)
        if user is None:
            return SessionCheck(self, gate, hashed)
        if gate.upgrades:
            self.tunnels.note(hashed, conn)
        # The usual request: a configured user the route's answers were compiled for.
        return gate.answers.get(user) or self.answer(gate, user) or self.challenge

    def still_live(self, hashed: bytes) -> bool:
        """The store said the session was live less than RECHECK ago."""
        return self._checked_user(hashed) is not None

    def ask_store(self, hashed: bytes) -> asyncio.Future:
        """The store's answer about a session: its key, or None when it is not live."""
        return self._asking_store(hashed)

    def answer(self, gate, key):
        """The handler `gate`'s route gives a session's `key` (policy.session_key, or
        the `User` of one from a provider); None when there is none."""
        handler = gate.answers.get(key)
        if handler is None and isinstance(key, User) and self._answer_for is not None:
            handler = self._answer_for(gate, key)
        return handler

    # ------------------------------------------------- counting attempts
    async def attempt(self, request, account: str = "", trusted: bool = False,
                      answer: bool = True) -> bool:
        """Counts a sign-in attempt as a failure of the client (and of `account`, a
        configured user) before the credentials are checked, so concurrent guesses
        cannot all pass; the store forgets it when the attempt succeeds. False when the
        client or the account must wait: tallied, counted by [[ban]] rules on =
        "signin", and answered 429 here (Retry-After) unless `answer` is False (forward
        auth's Basic answers 401 itself: the proxy asking it has no use for a 429)."""
        cfg = self.cfg
        wait = await self.state.run("take_sign_in", request.client, cfg.failure_window,
                                    cfg.max_failures, account, cfg.account_delays, trusted)
        if wait <= 0:
            return True
        TALLY.event("signin_refused")
        BANS.note("signin", request.client, request.connection)
        if answer:
            await request.send(429, [(b"retry-after", b"%d" % math.ceil(wait)),
                                     (b"content-type", b"text/plain")],
                               b"too many failed sign-ins; try again later\n")
        return False

    @staticmethod
    def failed(request) -> None:
        """A sign-in of any kind (password, code, passkey, Basic, a provider's answer)
        was refused: tallied, and counted by [[ban]] rules on = "signin"."""
        TALLY.event("signin_failure")
        BANS.note("signin", request.client, request.connection)

    async def session_of(self, headers) -> str | None:
        """The key (policy.session_key: user and factors) of the live session the
        request's cookie carries, if any: the worker's recent check when it has one,
        else the store's answer. Looked up in the verdicts a gate's answers are
        compiled from, so a question about a route is decided by the same factors."""
        hashed = self._session_hash(headers)
        if not hashed:
            return None
        key = self._checked_user(hashed)
        return key if key is not None else await self.session_user(hashed)

    def refusal(self, user: str, reason: str) -> Refusal:
        """The page a signed-in `user` gets where a policy refuses them for `reason`
        (one per user and reason, shared by the routes)."""
        key = (user, reason)
        page = self._refusals.get(key)
        if page is None:
            page = self._refusals[key] = Refusal(self, user, reason)
        return page

    def _session_hash(self, headers) -> bytes:
        """The hash of the request's session token; b"" when it has none."""
        marker = self._marker
        for name, value in headers:
            if name == b"cookie" and value.find(marker) >= 0:   # see base/paths.py
                hashed = self._hashed_by_cookie.get(value)
                if hashed is None:
                    token = cookies([(name, value)]).get(self.cfg.cookie_name)
                    hashed = self.session_hash(token) if token else b""
                    if len(self._hashed_by_cookie) >= _CACHE_LIMIT:
                        self._hashed_by_cookie.clear()
                    self._hashed_by_cookie[value] = hashed
                if hashed:
                    return hashed
        return b""

    def session_hash(self, token: str) -> bytes:
        """The hash of the session `token` to ask the store about; b"" (counted) when
        the token cannot be a session: its tag is wrong, or it is of the untagged form
        and was not live when this worker started (nestgate.handlers.auth.sessiontoken).
        Such a cookie is no session without a store call."""
        hashed = self.state.tokens.hash_of(token)
        if not hashed:
            TALLY.event("session_forged")
        return hashed

    def known_user(self, headers) -> str | None:
        """The user of the request's session when the store has vouched for it to this
        worker (at sign-in or a check) and it has not expired; None otherwise. No store
        is asked: this keys a rate limit, where a made-up cookie must not buy a fresh
        allowance, and the gate behind the limit still checks the session itself."""
        hashed = self._session_hash(headers)
        hit = self._sessions.get(hashed) if hashed else None
        return session_user(hit[0]) if hit is not None and hit[1] > CLOCK.wall else None

    def _checked_user(self, hashed: bytes) -> str | None:
        """The session's key (user and factors) when the store said the session was live less than
        RECHECK ago, else None. Once that was REFRESH_AFTER ago, the store is asked
        again without anyone waiting."""
        hit = self._sessions.get(hashed)
        if hit is None or hit[1] <= CLOCK.wall:
            return None
        # The precise clock, not the worker's ticking one (which may be a second behind):
        # RECHECK is how long a sign-out or a store outage can go unnoticed.
        age = time.monotonic() - hit[2]
        if REFRESH_AFTER <= age < RECHECK and hashed not in self._asking:
            self._asking_store(hashed)
        return hit[0] if age < RECHECK else None

    async def cookie_user(self, request) -> str | None:
        """The name of the user whose live session the request's cookie carries, if any."""
        token = self.session_token(request)
        hashed = self.session_hash(token) if token else b""
        key = await self.session_user(hashed) if hashed else None
        return None if key is None else session_user(key)

    async def cookie_session(self, request) -> tuple[bytes, str, str] | None:
        """(token hash, user, factors) of the live session the request's cookie
        carries, asked of the store (for the pages that change a user's factors)."""
        token = self.session_token(request)
        hashed = self.session_hash(token) if token else b""
        if not hashed:
            return None
        found = await self.state.run("session", hashed)
        if found is None or self.cfg.user(found[0]) is None:
            return None
        return hashed, found[0], found[2]

    async def session_user(self, hashed: bytes) -> str | User | None:
        """The session's key (policy.session_key, or the `User` of one who signed in
        through a provider as nobody configured), None when it is not live."""
        # One store question per session at a time: the requests of a session that
        # arrive while it is being checked wait for that answer (a page's many
        # connections find the check due together after a pause of RECHECK or more).
        return await asyncio.shield(self._asking_store(hashed))

    def _asking_store(self, hashed: bytes) -> asyncio.Future:
        """The store check of a session under way, begun now if none is."""
        asking = self._asking.get(hashed)
        if asking is None:
            asking = self._asking[hashed] = asyncio.ensure_future(self._ask(hashed))
            asking.add_done_callback(lambda done: self._asked(hashed, done))
        return asking

    def _asked(self, hashed: bytes, done: asyncio.Future) -> None:
        self._asking.pop(hashed, None)
        if not done.cancelled():
            # A check begun ahead of time may have nobody waiting for it: its failure
            # (the store is down, said once by SharedState) is taken here, not logged.
            done.exception()

    async def _ask(self, hashed: bytes) -> str | User | None:
        found = await self.state.run("session", hashed)
        key = found and session_key_of(found[0], found[2], found[3], self.cfg)
        if key is None:
            self._sessions.pop(hashed, None)
            return None
        if len(self._sessions) >= _CACHE_LIMIT:
            self._sessions.clear()
        self._sessions[hashed] = (key, found[1], time.monotonic())
        return key

    # ------------------------------------------------------ cookies and tokens
    def cookie(self, request, name: str, value: str, max_age: int, path: str = "/",
               samesite: str | None = None) -> tuple[bytes, bytes]:
        parts = [f"{name}={value}", f"Path={path}", f"Max-Age={max_age}", "HttpOnly",
                 f"SameSite={samesite or self.cfg.cookie_samesite}"]
        if self.cfg.cookie_secure:
            parts.append("Secure")
        domain = self.cfg.cookie_domain
        if domain and path == "/":
            host = host_name(request.host).decode("latin-1")
            if host == domain or host.endswith("." + domain):
                parts.append(f"Domain={domain}")
        return b"set-cookie", "; ".join(parts).encode("latin-1")

    async def csrf_for(self, request) -> tuple[str, list[tuple[bytes, bytes]]]:
        """The CSRF token of a form shown to `request`, and the cookie to set with it.
        Bound to the session cookie the request carries when it carries one (no cookie
        to set), else to a fresh nonce that goes in a cookie of its own."""
        session = self.session_token(request)
        if session:
            return await self._csrf_mac(b"csrf-session:" + token_hash(session)), []
        nonce = secrets.token_urlsafe(18)
        return (await self._csrf_mac(b"csrf:" + nonce.encode()),
                [self._csrf_cookie(request, nonce, 3600)])

    async def _csrf_mac(self, bound_to: bytes) -> str:
        # The store's secret, one for every worker and, through Redis, every instance.
        secret = await self.state.secret()
        return hmac.new(secret, bound_to, hashlib.sha256).hexdigest()

    def session_token(self, request) -> str:
        """The session cookie's value as every form that acts on a session reads it
        (the first of that name); "" without one."""
        return cookies(request.headers).get(self.cfg.cookie_name, "")

    async def csrf_ok(self, request, form) -> bool:
        """The form's token is the one `csrf_for` gave this browser. With a session
        cookie it must be that session's: a nonce cookie and token planted by a page
        that can set cookies for this host (its http:// origin, another port, a sibling
        under `cookie_domain`) pass for no session's form. Without one, the form acts on
        no session (sign-in) and the signed nonce of the double submit is checked."""
        origin = request.header(b"origin")
        if origin and origin != b"null" and not _origin_is_the_sites(origin, request):
            return False
        given = form.get("csrf", "")
        if not given:
            return False
        session = self.session_token(request)
        if session:
            expected = await self._csrf_mac(b"csrf-session:" + token_hash(session))
        else:
            nonce = cookies(request.headers).get(CSRF_COOKIE, "")
            if not nonce:
                return False
            expected = await self._csrf_mac(b"csrf:" + nonce.encode("latin-1"))
        # As bytes: compare_digest refuses str with non-ASCII characters (a TypeError,
        # so a 500) and a form can carry any.
        return hmac.compare_digest(expected.encode(), given.encode("utf-8", "surrogateescape"))

    def _csrf_cookie(self, request, nonce: str, max_age: int) -> tuple[bytes, bytes]:
        return self.cookie(request, CSRF_COOKIE, nonce, max_age, path="/__auth__/",
                           samesite="Strict")

    def allow_form_redirects(self, origins) -> None:
        """Let the forms' answers redirect to `origins` too: browsers hold a form's
        redirects to its page's CSP form-action. Signing in to an OpenID client
        (nestgate.handlers.auth.oidc.endpoints) ends at the client's redirect URI; signing out
        of a session from a provider goes on to the provider's end-session endpoint
        (nestgate.handlers.auth.oidc.client). Each caller adds its origins to the others'."""
        self._form_origins.update(origins)
        extra = " ".join(sorted(self._form_origins)).encode()
        self.page_headers = [
            (name, value.replace(b"form-action 'self'", b"form-action 'self' " + extra)
             if name == b"content-security-policy" else value)
            for name, value in _PAGE_HEADERS]

    # ------------------------------------------------------ the pages
    async def page(self, request, status: int, next_url: str, message: str = "") -> None:
        """The sign-in form, naming the site being entered (the Host asked for)."""
        with_password = bool(self.cfg.users)
        fields = (_entering(request) + _provider_links(self.cfg.providers, next_url)
                  + _login_fields(next_url, message, with_password))
        await self._form_page(request, status, LOGIN_PATH, self.cfg.title, fields,
                              "Sign in" if with_password else "",
                              _PASSKEY_BUTTON if with_password else "")

    async def refusal_page(self, request, user: str, reason: str,
                           next_url: str | None = None) -> None:
        """403: who is signed in, why they may not enter, and the sign-out form that
        goes on to the sign-in page and back here (or to `next_url`, the path a
        forward-auth question was about)."""
        site = _site_name(request)
        back = next_url or safe_next(request.raw_target.decode("latin-1"))
        fields = (f"<p>You are signed in as <b>{html.escape(user)}</b>. "
                  + _REASONS[reason].format(site=html.escape(site)) + "</p>"
                  + f'<input type="hidden" name="next" value="{html.escape(back)}">')
        await self._form_page(request, 403, LOGOUT_PATH, "No entry", fields,
                              "Sign in as someone else")

    async def logout_page(self, request) -> None:
        """A button that signs out: following a link changes nothing."""
        await self._form_page(request, 200, LOGOUT_PATH, "Sign out", _LOGOUT_FIELDS,
                              "Sign out")

    async def _form_page(self, request, status: int, action: str, heading: str,
                         fields: str, button: str, after: str = "") -> None:
        """A page of one form; `after` (HTML) follows its submit button."""
        token, cookie = await self.csrf_for(request)
        body = _render_page(self.cfg.title, heading, action, token, fields, button, after)
        await request.send(status, [*self.page_headers, *cookie], body)

    async def notice_page(self, request, status: int, heading: str, message: str,
                          next_url: str = "/", headers=()) -> None:
        """A page that says why something stopped, with a way back to signing in."""
        esc = html.escape
        body = _page_html(self.cfg.title, f"<main><h1>{esc(heading)}</h1><p>{esc(message)}"
                          f'</p><p><a href="{esc(login_url(next_url))}">Sign in again</a>'
                          "</p></main>")
        await request.send(status, [*_PAGE_HEADERS, *headers], body)

    async def start_session(self, request, user: str, next_url: str, factors: str,
                            identity: str = "", headers=()) -> None:
        """A new session of `user` (signed in from the request's client with `factors`,
        nestgate.handlers.auth.policy): stored for every worker, its cookie set, and the browser
        sent on to `next_url`. `identity`: what a sign-in through a provider keeps with
        it (nestgate.handlers.auth.oidc.client)."""
        cfg, state, client = self.cfg, self.state, request.client
        token = new_token(await state.secret())
        hashed = token_hash(token)
        expires = time.time() + cfg.session_ttl
        await state.run("create_session", hashed, user, expires, client, factors, identity)
        await state.run("signed_in", user, client)
        key = session_key_of(user, factors, identity, cfg)
        if key is not None:
            self._sessions[hashed] = (key, expires, time.monotonic())
        if cfg.ip_grant > 0 and client:
            await state.run("add_allow", client, cfg.ip_grant, f"signed in: {user}")
            await state.refresh(force=True)
        await self.leave(request, next_url, token, int(cfg.session_ttl), headers)

    def absolute(self, request, path: str) -> str | None:
        """`path` on this site as a full URL, for a provider to send the browser back
        to; None when the Host is not a plain name (and port)."""
        raw = request.host.decode("latin-1").strip().lower()
        if plain_host_name(request.host) is None or not _HOST_PORT.fullmatch(raw):
            return None
        return f"{request.scheme}://{raw}{path}"

    async def provider_sign_out(self, request, identity: str, after: str) -> str | None:
        """Where sign-out sends a browser that signed in through a provider: the
        provider's end-session endpoint, coming back to `after` here (None: the
        provider has none, or the session says no provider)."""
        try:
            data = json.loads(identity)
        except ValueError:
            return None
        provider = self.providers.get(data.get("provider")) if isinstance(data, dict) else None
        back = self.absolute(request, after)
        if provider is None or back is None:
            return None
        return await provider.end_session_url(str(data.get("id_token", "")), back)

    async def leave(self, request, location: str, session: str, max_age: int,
                    headers=()) -> None:
        """303 to `location`, setting the session cookie (or clearing it: `max_age` 0)
        and dropping the CSRF nonce the form just used. Signing out also asks the
        browser to forget the protected pages it cached (Clear-Site-Data), so the back
        button does not show them after the session ended."""
        headers = [
            (b"location", location.encode("latin-1")),
            (b"cache-control", b"no-store"),
            self.cookie(request, self.cfg.cookie_name, session, max_age),
            self._csrf_cookie(request, "", 0),
            *headers,
        ]
        if not max_age:
            headers.append((b"clear-site-data", b'"cache"'))
        await request.send(303, headers, b"")


class SessionCheck:
    """The store decides; then what the route gives the session's user answers, or
    the challenge does."""

    is_async = True
    __slots__ = ("signin", "gate", "hashed", "upgrades")

    def __init__(self, signin: SignIn, gate, hashed: bytes) -> None:
        self.signin = signin
        self.gate = gate
        self.hashed = hashed
        self.upgrades = gate.upgrades

    async def handle(self, request) -> None:
        user = await self.signin.session_user(self.hashed)
        handler = self.signin.answer(self.gate, user) if user is not None else None
        if handler is not None:
            if self.upgrades:
                self.signin.tunnels.note(self.hashed, request.connection)
            await answer_with(handler, request)
        else:
            await self.signin.challenge.handle(request)


class Refusal:
    """A signed-in user the route's policy refuses: the 403 page for browsers, JSON
    for API clients (the same status: signing in again as them changes nothing)."""

    is_async = True
    __slots__ = ("signin", "user", "reason", "upgrades")

    def __init__(self, signin: SignIn, user: str, reason: str) -> None:
        self.signin = signin
        self.user = user
        self.reason = reason
        self.upgrades = False

    async def handle(self, request) -> None:
        if b"text/html" in (request.header(b"accept") or b""):
            await self.signin.refusal_page(request, self.user, self.reason)
            return
        body = json.dumps({"error": "forbidden", "reason": self.reason,
                           "user": self.user, "logout": LOGOUT_PATH}).encode()
        await request.send(403, [(b"content-type", b"application/json"),
                                 (b"cache-control", b"no-store")], body)


class Challenge:
    """No session: the sign-in page for browsers, 401 for API clients."""

    is_async = True

    def __init__(self, signin: SignIn) -> None:
        self.signin = signin

    async def handle(self, request) -> None:
        accept = request.header(b"accept") or b""
        if accept.find(b"text/html") >= 0:
            target = request.raw_target.decode("latin-1")
            await self.signin.page(request, 401, safe_next(target))
            return
        body = json.dumps({"error": "sign-in required", "login": LOGIN_PATH}).encode()
        await request.send(401, [(b"content-type", b"application/json"),
                                 (b"cache-control", b"no-store"),
                                 (b"www-authenticate", b'Cookie realm="nestgate"')], body)


async def page_or_form(request, show) -> bool:
    """A page at GET and HEAD (answered here by `show(request)`), its form at POST: True
    for a POST, whose form the caller reads; any other method is answered 405."""
    if request.method in (b"GET", b"HEAD"):
        await show(request)
        return False
    if request.method != b"POST":
        await request.send(405, [(b"allow", b"GET, HEAD, POST")], b"")
        return False
    return True


class _FormPath:
    """A page at GET and HEAD, its form at POST; a POST passes the CSRF check first."""

    is_async = True

    def __init__(self, signin: SignIn) -> None:
        self.signin = signin

    async def handle(self, request) -> None:
        if not await page_or_form(request, self.show):
            return
        form = await _read_form(request)
        if form is None:
            await request.send(413, [], b"form too large\n")
            return
        if not await self.signin.csrf_ok(request, form):
            await _refuse_form(self.signin.cfg, request)
            return
        await self.submit(request, form)

    async def show(self, request) -> None:
        raise NotImplementedError

    async def submit(self, request, form: dict[str, str]) -> None:
        raise NotImplementedError


class LoginPage(_FormPath):
    """GET: the sign-in form, going back to `next` after. POST: sign in."""

    async def show(self, request) -> None:
        try:
            query = parse_qs(request.query.decode("latin-1"), max_num_fields=10)
        except ValueError:                       # more fields than that
            query = {}
        await self.signin.page(request, 200, safe_next(query.get("next", [""])[0]))

    async def submit(self, request, form: dict[str, str]) -> None:
        signin = self.signin
        next_url = safe_next(form.get("next"))
        user = signin.cfg.user(form.get("user", ""))
        # Only the configured accounts are counted: a made-up name signs in nowhere,
        # and counting it would let guessed names grow the store.
        account = user.name if user else ""
        trusted = bool(account) and await signin.cookie_user(request) == account
        if not await signin.attempt(request, account, trusted):
            return
        loop = asyncio.get_running_loop()
        ok = await loop.run_in_executor(None, verify_password,
                                        user.password if user else None,
                                        form.get("password", ""))
        factors = PASSWORD
        code = form.get("code", "").strip()
        if ok and (user.totp or code):
            second = await self._second_factor(user, code)
            ok = second is not None
            factors = f"{PASSWORD} {second}"
        if not ok:
            signin.failed(request)
            await signin.page(request, 401, next_url, "Wrong user, password or code.")
            return
        TALLY.event("signin_success")
        await signin.start_session(request, user.name, next_url, factors)

    async def _second_factor(self, user, code: str) -> str | None:
        """TOTP or RECOVERY when `code` is a fresh TOTP code or one of the user's
        unused recovery codes (used up now), else None. A replay is told apart from a
        wrong code nowhere: same answer, same count."""
        state = self.signin.state
        if user.totp:
            step = totp.matching_step(user.totp, code)
            if step is not None:
                return TOTP if await state.run("use_totp_step", user.name, step) else None
        typed = recovery.normal(code)
        if typed and await state.run("use_recovery_code", user.name,
                                     recovery.code_hash(user.name, typed)):
            return RECOVERY
        return None



class Logout(_FormPath):
    """GET: a sign-out button. POST with the form's CSRF token: the session ends for
    every worker, and the visitor goes to the sign-in page (which goes on to the
    form's `next`, a path on this Host, when it has one: "sign in as someone else")."""

    async def show(self, request) -> None:
        await self.signin.logout_page(request)

    async def submit(self, request, form: dict[str, str]) -> None:
        signin = self.signin
        token = signin.session_token(request)
        next_url = form.get("next")
        after = login_url(safe_next(next_url)) if next_url else LOGIN_PATH
        hashed = signin.session_hash(token) if token else b""
        if hashed:
            signin._sessions.pop(hashed, None)
            found = await signin.state.run("session", hashed)
            await signin.state.run("delete_session", hashed)
            # Signed in through a provider: its session ends too, where it offers that,
            # and it sends the browser back to the sign-in page here.
            if found and found[3]:
                after = await signin.provider_sign_out(request, found[3], after) or after
        await signin.leave(request, after, "", 0)


_SECURE_OVER_HTTP = (
    "<p>Sign-in needs HTTPS here: your browser did not send back this form's cookie, "
    "because the server marks its cookies Secure (<code>[auth] cookie_secure = true</code>) "
    "and this page came over plain http://.</p>"
    '<p><a href="{url}">Open it with https://</a> (or, on this machine only, through a '
    "*.localhost name).</p>")


async def _refuse_form(cfg, request) -> None:
    """Why a form failed its CSRF check. Without the nonce cookie over plain HTTP, the
    likely reason is the Secure flag: browsers drop such cookies there, silently, and
    the page says so, with the https:// address of the same page."""
    if cfg.cookie_secure and request.scheme == "http" \
            and CSRF_COOKIE not in cookies(request.headers):
        url = f"https://{_site_name(request)}{LOGIN_PATH}"
        body = _page_html(cfg.title, "<main><h1>Sign-in needs HTTPS</h1>"
                          + _SECURE_OVER_HTTP.format(url=html.escape(url)) + "</main>")
        await request.send(403, _PAGE_HEADERS, body)
        return
    await request.send(403, [(b"content-type", b"text/plain")],
                       b"the form expired or came from another site; reload it\n")


def _site_name(request) -> str:
    """The site being entered, as the browser names it (the Host, checked)."""
    host = plain_host_name(request.host)
    return host.decode("ascii") if host else "this site"


def _entering(request) -> str:
    return f'<p class="to">to <b>{html.escape(_site_name(request))}</b></p>'


_REASONS = {
    NOT_ALLOWED: "This account may not enter <b>{site}</b>.",
    NO_SECOND_FACTOR: "<b>{site}</b> needs a second factor and this session was signed in "
                      "with a password only: sign in with a passkey (or a password and a "
                      "one-time or recovery code). A passkey can be added on the "
                      "<a href=\"/__auth__/account\">account page</a>; without one, ask "
                      "whoever runs this server to add a second factor.",
}


async def read_small_body(request, limit: int = MAX_FORM) -> bytes | None:
    """The request's body, read whole; None once it passes `limit` bytes."""
    parts, size = [], 0
    if request.body is not None:
        while chunk := await request.body.read():
            size += len(chunk)
            if size > limit:
                return None
            parts.append(chunk)
    return b"".join(parts)


async def _read_form(request) -> dict[str, str] | None:
    body = await read_small_body(request)
    if body is None:
        return None
    try:
        fields = parse_qs(body.decode("utf-8", "replace"), max_num_fields=20)
    except ValueError:                           # more fields than that: no CSRF token
        return {}
    return {k: v[0] for k, v in fields.items()}


_LOGOUT_FIELDS = "<p>End the session of this browser.</p>"


# After the sign-in form's button: a passkey signs in alone (the fields left empty) or,
# with the user and password filled in, stands in for the code (nestgate.handlers.auth.passkeys).
_PASSKEY_BUTTON = (
    '<p class="or"><button type="button" id="passkey-signin" hidden>Sign in with a passkey'
    '</button><small id="passkey-note" class="err" role="alert"></small></p>'
    f'<script src="{PASSKEY_SCRIPT}" defer></script>')


def _provider_links(providers, next_url: str) -> str:
    """A button (a link: the provider is another site, which the page's form-action
    would not let a form go on to) for each provider."""
    esc = html.escape
    return "".join(
        f'<a class="sso" href="{esc(OIDC_PATH + p.name)}?next={esc(quote(next_url, safe="/"))}">'
        f"Sign in with {esc(p.label)}</a>" for p in providers)


def _login_fields(next_url: str, message: str, with_password: bool = True) -> str:
    esc = html.escape
    code = ('<label>Code <small>(one-time or recovery code, when the account has them)'
            '</small><input name="code" autocomplete="one-time-code"></label>')
    note = f'<p class="err" role="alert">{esc(message)}</p>' if message else ""
    if not with_password:
        return note
    return f"""{note}<input type="hidden" name="next" value="{esc(next_url)}">
<label>User <input name="user" autocomplete="username" required autofocus></label>
<label>Password <input name="password" type="password" autocomplete="current-password" required>
</label>{code}"""


def _render_page(title: str, heading: str, action: str, csrf: str, fields: str,
                 button: str, after: str = "") -> bytes:
    """A page holding one form; `fields` and `after` are HTML, already escaped."""
    esc = html.escape
    return _page_html(title, f"""<form method="post" action="{action}"><h1>{esc(heading)}</h1>
<input type="hidden" name="csrf" value="{esc(csrf)}">
{fields}{f'<button type="submit">{esc(button)}</button>' if button else ""}{after}</form>""")


def _page_html(title: str, card: str) -> bytes:
    """The portal's pages: one card (`card`, HTML already escaped) in the middle."""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">
<title>{html.escape(title)}</title>
<style>body{{font:16px system-ui,sans-serif;display:grid;place-items:center;min-height:90vh;
background:#f4f4f5;margin:0}}form,main{{background:#fff;padding:2em;border-radius:8px;
box-shadow:0 1px 4px #0002;display:grid;gap:1em;min-width:18em;max-width:30em}}
label{{display:grid;gap:.3em}}h1{{margin:0}}.to{{margin:0;color:#555}}
input{{font:inherit;padding:.4em}}button{{font:inherit;padding:.5em}}.err{{color:#b00020}}
a.sso{{display:block;text-align:center;padding:.5em;border:1px solid #888;border-radius:4px;
color:inherit;text-decoration:none}}</style>
</head><body>{card}</body></html>
""".encode()


def login_url(next_url: str) -> str:
    return f"{LOGIN_PATH}?next={quote(next_url, safe='/')}"
