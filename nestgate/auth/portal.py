"""The sign-in portal: /__auth__/login and /__auth__/logout, and the session check.

A protected route's `Gate` asks `SignIn.admit` for the handler that answers: the
route's own when the session cookie is known good (the worker remembers a checked
session for `RECHECK` seconds, so a sign-out anywhere is seen within that), a
`SessionCheck` that asks the store first, or the challenge (the sign-in page for
browsers, 401 for API clients, told apart by Accept).

CSRF: the form carries HMAC(store secret, nonce) and the nonce travels in a
cookie only this site can set; an Origin header, when sent, must name this Host.
After sign-in the visitor goes back to `next`, which must be a path on this Host
(never `//elsewhere` or a scheme): no open redirect.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import html
import json
import secrets
import time
from urllib.parse import parse_qs, quote

from nestgate.auth import totp
from nestgate.auth.passwords import verify_password
from nestgate.auth.store import token_hash
from nestgate.clock import CLOCK
from nestgate.routing import host_name

LOGIN_PATH = "/__auth__/login"
LOGOUT_PATH = "/__auth__/logout"
RECHECK = 1.0                  # seconds a checked session is trusted without the store
CSRF_COOKIE = "nestgate_csrf"
MAX_FORM = 16 * 1024
_CACHE_LIMIT = 10_000

_PAGE_HEADERS = [
    (b"content-type", b"text/html; charset=utf-8"),
    (b"cache-control", b"no-store"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"content-security-policy",
     b"default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
     b"frame-ancestors 'none'"),
]


def safe_next(value: str | None) -> str:
    """A path on this Host to go back to; "/" for anything else."""
    if not value or len(value) > 2048 or not value.startswith("/") or not value.isascii():
        return "/"
    if value.startswith(("//", "/\\")) or any(c in value for c in "\\\r\n\t\0 "):
        return "/"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        return "/"
    return value


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
    """Let `handler` answer `request`, whichever kind it is."""
    if handler.is_async:
        request.handler = handler
        await handler.handle(request)
    else:
        await request.send_prebuilt(handler)


class SignIn:
    """Sign-in for the protected sites of one config."""

    def __init__(self, cfg, state) -> None:
        self.cfg = cfg
        self.state = state                  # nestgate.auth.store.SharedState
        self._sessions: dict[bytes, tuple[str, float, float]] = {}   # hash -> user, exp, checked
        self.challenge = Challenge(self)
        self.login = LoginPage(self)
        self.logout = Logout(self)

    # ------------------------------------------------------ the gate's question
    def admit(self, inner, headers, client: str):
        token = None
        marker = self.cfg.cookie_name.encode() + b"="
        for name, value in headers:
            if name == b"cookie" and marker in value:
                token = cookies([(name, value)]).get(self.cfg.cookie_name)
                if token:
                    break
        if not token:
            return self.challenge
        hashed = token_hash(token)
        hit = self._sessions.get(hashed)
        if hit is not None and hit[1] > CLOCK.wall and CLOCK.now - hit[2] < RECHECK:
            return inner
        return SessionCheck(self, inner, hashed)

    async def session_user(self, hashed: bytes) -> str | None:
        found = await self.state.run("session", hashed)
        if found is None:
            self._sessions.pop(hashed, None)
            return None
        if len(self._sessions) >= _CACHE_LIMIT:
            self._sessions.clear()
        self._sessions[hashed] = (found[0], found[1], CLOCK.now)
        return found[0]

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

    async def csrf_pair(self) -> tuple[str, str]:
        nonce = secrets.token_urlsafe(18)
        return nonce, await self.csrf_token(nonce)

    async def csrf_token(self, nonce: str) -> str:
        secret = await self.state.secret()
        return hmac.new(secret, b"csrf:" + nonce.encode(), hashlib.sha256).hexdigest()

    # ------------------------------------------------------ the page
    async def page(self, request, status: int, next_url: str, message: str = "") -> None:
        nonce, token = await self.csrf_pair()
        body = _render_page(self.cfg.title, next_url, token, message,
                            any(u.totp for u in self.cfg.users))
        headers = list(_PAGE_HEADERS)
        headers.append(self.cookie(request, CSRF_COOKIE, nonce, 3600, path="/__auth__/",
                                   samesite="Strict"))
        await request.send(status, headers, body)


class SessionCheck:
    """The store decides; then the route answers, or the challenge does."""

    is_async = True
    __slots__ = ("signin", "inner", "hashed", "upgrades")

    def __init__(self, signin: SignIn, inner, hashed: bytes) -> None:
        self.signin = signin
        self.inner = inner
        self.hashed = hashed
        self.upgrades = getattr(inner, "upgrades", False)

    async def handle(self, request) -> None:
        if await self.signin.session_user(self.hashed) is not None:
            await answer_with(self.inner, request)
        else:
            await self.signin.challenge.handle(request)


class Challenge:
    """No session: the sign-in page for browsers, 401 for API clients."""

    is_async = True

    def __init__(self, signin: SignIn) -> None:
        self.signin = signin

    async def handle(self, request) -> None:
        accept = request.header(b"accept") or b""
        if b"text/html" in accept:
            target = request.raw_target.decode("latin-1")
            await self.signin.page(request, 401, safe_next(target))
            return
        body = json.dumps({"error": "sign-in required", "login": LOGIN_PATH}).encode()
        await request.send(401, [(b"content-type", b"application/json"),
                                 (b"cache-control", b"no-store"),
                                 (b"www-authenticate", b'Cookie realm="nestgate"')], body)


class LoginPage:
    is_async = True

    def __init__(self, signin: SignIn) -> None:
        self.signin = signin

    async def handle(self, request) -> None:
        signin = self.signin
        if request.method in (b"GET", b"HEAD"):
            try:
                query = parse_qs(request.query.decode("latin-1"), max_num_fields=10)
            except ValueError:                   # more fields than that
                query = {}
            await signin.page(request, 200, safe_next(query.get("next", [""])[0]))
            return
        if request.method != b"POST":
            await request.send(405, [(b"allow", b"GET, HEAD, POST")], b"")
            return
        cfg, state, client = signin.cfg, signin.state, request.client
        form = await _read_form(request)
        if form is None:
            await request.send(413, [], b"form too large\n")
            return
        next_url = safe_next(form.get("next"))
        if not await self._csrf_ok(request, form):
            await request.send(403, [(b"content-type", b"text/plain")],
                               b"the form expired or came from another site; reload it\n")
            return
        # Counted before the password is checked: concurrent guesses cannot all pass.
        if not await state.run("take_attempt", client, cfg.failure_window, cfg.max_failures):
            await request.send(429, [(b"retry-after", b"%d" % int(cfg.failure_window)),
                                     (b"content-type", b"text/plain")],
                               b"too many failed sign-ins; try again later\n")
            return
        user_name = form.get("user", "")
        user = cfg.user(user_name)
        loop = asyncio.get_running_loop()
        ok = await loop.run_in_executor(None, verify_password,
                                        user.password if user else None,
                                        form.get("password", ""))
        if ok and user.totp:
            ok = totp.verify(user.totp, form.get("code", ""))
        if not ok:
            await signin.page(request, 401, next_url, "Wrong user, password or code.")
            return
        await self._signed_in(request, user.name, client, next_url)

    async def _csrf_ok(self, request, form) -> bool:
        origin = request.header(b"origin")
        if origin and origin != b"null":
            origin_host = origin.split(b"://", 1)[-1]
            if host_name(origin_host) != host_name(request.host):
                return False
        nonce = cookies(request.headers).get(CSRF_COOKIE, "")
        given = form.get("csrf", "")
        if not nonce or not given:
            return False
        return hmac.compare_digest(await self.signin.csrf_token(nonce), given)

    async def _signed_in(self, request, user: str, client: str, next_url: str) -> None:
        signin = self.signin
        cfg, state = signin.cfg, signin.state
        token = secrets.token_urlsafe(32)
        hashed = token_hash(token)
        expires = time.time() + cfg.session_ttl
        await state.run("create_session", hashed, user, expires, client)
        await state.run("clear_failures", client)
        signin._sessions[hashed] = (user, expires, CLOCK.now)
        if cfg.ip_grant > 0 and client:
            await state.run("add_allow", client, cfg.ip_grant, f"signed in: {user}")
            await state.refresh(force=True)
        await request.send(303, [
            (b"location", next_url.encode("latin-1")),
            (b"cache-control", b"no-store"),
            signin.cookie(request, cfg.cookie_name, token, int(cfg.session_ttl)),
            signin.cookie(request, CSRF_COOKIE, "", 0, path="/__auth__/", samesite="Strict"),
        ], b"")


class Logout:
    is_async = True

    def __init__(self, signin: SignIn) -> None:
        self.signin = signin

    async def handle(self, request) -> None:
        signin = self.signin
        token = cookies(request.headers).get(signin.cfg.cookie_name)
        if token:
            hashed = token_hash(token)
            signin._sessions.pop(hashed, None)
            await signin.state.run("delete_session", hashed)
        await request.send(303, [(b"location", LOGIN_PATH.encode()),
                                 (b"cache-control", b"no-store"),
                                 signin.cookie(request, signin.cfg.cookie_name, "", 0)], b"")


async def _read_form(request) -> dict[str, str] | None:
    parts, size = [], 0
    if request.body is not None:
        while chunk := await request.body.read():
            size += len(chunk)
            if size > MAX_FORM:
                return None
            parts.append(chunk)
    try:
        fields = parse_qs(b"".join(parts).decode("utf-8", "replace"), max_num_fields=20)
    except ValueError:                           # more fields than that: no CSRF token
        return {}
    return {k: v[0] for k, v in fields.items()}


def _render_page(title: str, next_url: str, csrf: str, message: str, with_code: bool) -> bytes:
    esc = html.escape
    code = ('<label>Code <input name="code" inputmode="numeric" autocomplete="one-time-code" '
            'pattern="[0-9 ]*"></label>') if with_code else ""
    note = f'<p class="err" role="alert">{esc(message)}</p>' if message else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">
<title>{esc(title)}</title>
<style>body{{font:16px system-ui,sans-serif;display:grid;place-items:center;min-height:90vh;
background:#f4f4f5;margin:0}}form{{background:#fff;padding:2em;border-radius:8px;
box-shadow:0 1px 4px #0002;display:grid;gap:1em;min-width:18em}}label{{display:grid;gap:.3em}}
input{{font:inherit;padding:.4em}}button{{font:inherit;padding:.5em}}.err{{color:#b00020}}</style>
</head><body><form method="post" action="{LOGIN_PATH}"><h1>{esc(title)}</h1>{note}
<input type="hidden" name="csrf" value="{esc(csrf)}">
<input type="hidden" name="next" value="{esc(next_url)}">
<label>User <input name="user" autocomplete="username" required autofocus></label>
<label>Password <input name="password" type="password" autocomplete="current-password" required>
</label>{code}<button type="submit">Sign in</button></form></body></html>
""".encode()


def login_url(next_url: str) -> str:
    return f"{LOGIN_PATH}?next={quote(next_url, safe='/')}"
