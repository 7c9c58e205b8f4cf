"""`GET /` on the admin listener: a status page an operator reads at a glance, made on
the server with no outside asset: workers, requests per second over the last minutes
(an inline SVG), listeners, recent reloads, allow-list entries and live sessions.

Who may see it is decided as for the API: a browser signs in at `/login` with the token
and gets an HttpOnly, SameSite=Strict cookie (an HMAC of the token: it changes when the
token does); with `loopback_without_token`, loopback clients need no token. The sign-in
form carries a CSRF nonce in a Strict cookie of its own, and is behind the listener's
Host and Origin checks (nestgate.admin.origin) like every other route.
"""

from __future__ import annotations

import hashlib
import hmac
import html
import secrets
import asyncio
import time
from urllib.parse import parse_qs

from nestgate.admin.guessing import given_token
from nestgate.admin.origin import ip_loopback

COOKIE = "nestgate_admin"
CSRF_COOKIE = "nestgate_admin_csrf"
HISTORY_SECONDS = 600
_HEADERS = [("content-type", "text/html; charset=utf-8"), ("cache-control", "no-store"),
            # same-origin, not no-referrer: under no-referrer the sign-in form is sent
            # with `Origin: null`, which nestgate.admin.origin refuses.
            ("x-frame-options", "DENY"), ("referrer-policy", "same-origin"),
            ("content-security-policy", "default-src 'none'; style-src 'unsafe-inline'; "
                                        "form-action 'self'; frame-ancestors 'none'")]
_STYLE = ("body{font:15px/1.4 system-ui,sans-serif;margin:2em auto;max-width:60em;"
          "padding:0 1em;color:#222}table{border-collapse:collapse;margin:.5em 0 1.5em}"
          "td,th{padding:.2em .8em;border-bottom:1px solid #ddd;text-align:left}"
          "h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.5em}.bad{color:#a00}")


def cookie_value(token: bytes) -> str:
    return hmac.new(token, b"nestgate admin page", hashlib.sha256).hexdigest()


def _cookies(headers) -> dict[str, str]:
    found = {}
    for name, value in headers:
        if name == b"cookie":
            for pair in value.decode("latin-1").split(";"):
                key, _, val = pair.strip().partition("=")
                found.setdefault(key, val)
    return found


class History:
    """Requests served by all workers, sampled as reports arrive (about once a second)."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, int]] = []

    def add(self, total: int) -> None:
        now = time.monotonic()
        self.samples.append((now, total))
        while self.samples and now - self.samples[0][0] > HISTORY_SECONDS:
            self.samples.pop(0)

    def rates(self, bucket: float = 10.0) -> list[float]:
        """Requests per second in buckets of `bucket` seconds, oldest first."""
        out, start = [], None
        for when, total in self.samples:
            if start is None:
                start = (when, total)
            elif when - start[0] >= bucket:
                out.append(max(0, total - start[1]) / (when - start[0]))
                start = (when, total)
        return out


def chart(rates: list[float]) -> str:
    if len(rates) < 2:
        return "<p>(collecting: a point every 10 s)</p>"
    top = max(rates) or 1.0
    width, height = 600, 120
    step = width / (len(rates) - 1)
    points = " ".join(f"{i * step:.1f},{height - r / top * (height - 10):.1f}"
                      for i, r in enumerate(rates))
    return (f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
            f'role="img" aria-label="requests per second"><polyline fill="none" '
            f'stroke="#36c" stroke-width="2" points="{points}"/></svg>'
            f"<p>peak {top:,.0f} requests/s, now {rates[-1]:,.0f}</p>")


class StatusPage:
    """`/` and `/login`: open routes that decide access themselves (a browser is sent
    to the sign-in form rather than answered 401)."""

    is_async = True
    __slots__ = ("state", "token", "expected", "guesses", "store_counts", "loopback_free")

    def __init__(self, state, admin, guesses, store_counts) -> None:
        self.state = state
        self.token = admin.token.encode()
        self.expected = cookie_value(self.token) if admin.token else ""
        self.loopback_free = admin.loopback_without_token
        self.guesses = guesses              # shared with the API's token gate
        self.store_counts = store_counts    # () -> (allow entries, sessions) or None

    async def handle(self, request) -> None:
        if request.path == "/login":
            await self._login(request)
            return
        if request.method not in (b"GET", b"HEAD"):
            await self._send(request, 405, "<p>GET only.</p>",
                             extra=[(b"allow", b"GET, HEAD")])
            return
        if not self._allowed(request):
            if not self.token:
                await self._send(request, 403, "<p>No admin token is set: only loopback "
                                 "clients may see this page.</p>")
            else:
                await request.send(303, [(b"location", b"/login"),
                                         (b"cache-control", b"no-store")], b"")
            return
        await self._send(request, 200, self._body())

    def _allowed(self, request) -> bool:
        if self.loopback_free and ip_loopback(request.client):
            return True
        if not self.token:
            return False
        given = _cookies(request.headers).get(COOKIE, "")
        if given and hmac.compare_digest(given, self.expected):
            return True
        return hmac.compare_digest(given_token(request.headers), self.token)

    async def _login(self, request) -> None:
        if not self.token:
            await request.send(303, [(b"location", b"/")], b"")
            return
        if request.method in (b"GET", b"HEAD"):
            nonce = secrets.token_hex(16)
            await self._send(request, 200, (
                '<form method="post" action="/login"><p><label>Admin token '
                '<input type="password" name="token" autocomplete="current-password" '
                'autofocus></label> <input type="hidden" name="csrf" '
                f'value="{nonce}"><button>Sign in</button></p></form>'),
                extra=[(b"set-cookie", f"{CSRF_COOKIE}={nonce}; Path=/login; HttpOnly; "
                        "SameSite=Strict; Max-Age=600".encode())])
            return
        if request.method != b"POST":
            await self._send(request, 405, "<p>GET or POST.</p>",
                             extra=[(b"allow", b"GET, HEAD, POST")])
            return
        raw = await request.body.read_all() if request.body is not None else b""
        try:
            fields = parse_qs(raw.decode("latin-1"), max_num_fields=8, encoding="latin-1")
        except ValueError:                       # more fields than the form has
            fields = {}
        # Compared as bytes: compare_digest refuses str with non-ASCII characters.
        form = {k: v[0].encode("latin-1") for k, v in fields.items()}
        nonce = _cookies(request.headers).get(CSRF_COOKIE, "").encode("latin-1")
        if not nonce or not hmac.compare_digest(nonce, form.get("csrf", b"")):
            await self._send(request, 403, "<p>The form expired or came from another "
                             'site; <a href="/login">reload it</a>.</p>')
            return
        if not hmac.compare_digest(form.get("token", b""), self.token):
            # Counted and slowed with the API's wrong tokens; a right one always signs in.
            hold, over = self.guesses.failed(request.client)
            await asyncio.sleep(hold)
            if over:
                await self._send(request, 429, "<p>Too many failed attempts: each is "
                                 'answered slowly. <a href="/login">Again</a></p>')
            else:
                await self._send(request, 401, '<p>Wrong token. <a href="/login">Again</a></p>')
            return
        await request.send(303, [
            (b"location", b"/"), (b"cache-control", b"no-store"),
            (b"set-cookie", f"{COOKIE}={self.expected}; Path=/; HttpOnly; "
                            "SameSite=Strict".encode()),
            (b"set-cookie", f"{CSRF_COOKIE}=; Path=/login; Max-Age=0".encode())], b"")

    def _body(self) -> str:
        _status_code, status = self.state.status()
        esc = html.escape
        rows = []
        for gen in status["generations"]:
            for w in gen["workers"]:
                conns = w.get("connections", {})
                rows.append(f"<tr><td>{gen['number']}</td><td>{w['pid'] or '-'}</td>"
                            f"<td>{'ready' if w['ready'] else 'not ready'}</td>"
                            f"<td>{w.get('uptime_s', 0):.0f} s</td>"
                            f"<td>{w.get('requests', 0):,}</td>"
                            f"<td>{sum(conns.values())}</td><td>{w['restarts']}</td></tr>")
        listeners = "".join(f"<li>{esc(l['address'])}</li>" for l in status["listeners"])
        reloads = "".join(
            f"<tr><td>{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(r['at']))}</td>"
            f"<td class=\"{'' if r['ok'] else 'bad'}\">{'ok' if r['ok'] else 'refused'}</td>"
            f"<td>{esc(r['message'])}</td></tr>" for r in reversed(status["reloads"]))
        upstreams = "".join(
            f"<tr><td>{esc(u['route'])}</td><td>{esc(u['upstream'])}</td>"
            f"<td class=\"{'' if u['healthy'] else 'bad'}\">"
            f"{'healthy' if u['healthy'] else 'failing in %d workers' % u['failing_in_workers']}"
            f"</td><td>{u['requests']:,}</td><td>{u['errors']:,}</td></tr>"
            for u in self.state.answers.upstreams())
        now = time.time()
        certificates = "".join(
            f"<tr><td>{esc(c['listener'])}</td><td>{esc(', '.join(c['names']))}</td>"
            + (f"<td class=\"bad\">{esc(c['error'])}</td>" if "error" in c else
               f"<td class=\"{'bad' if c['not_after'] - now < 14 * 86400 else ''}\">"
               f"{time.strftime('%Y-%m-%d', time.gmtime(c['not_after']))} "
               f"({(c['not_after'] - now) / 86400:.0f} days)</td>") + "</tr>"
            for c in self.state.report.get("certificates", ()))
        counts = None
        if self.store_counts is not None:
            from nestgate.handlers.auth.store import store_errors
            try:
                counts = self.store_counts()
            except store_errors() as exc:
                counts = exc
        state = ("<p>No [auth] store: no allow-list or sessions.</p>" if counts is None else
                 f"<p>The store cannot be read now: {esc(str(counts))}</p>"
                 if isinstance(counts, Exception) else
                 f"<p>{counts[0]} allow-list entries, {counts[1]} live sessions.</p>")
        return (f"<h1>nestgate {esc(status['version'])}</h1>"
                f"<p>up {status['uptime_s']:.0f} s, generation {status['generation']}, "
                f"config {esc(str(status['config'].get('file')))}</p>"
                f"<h2>Requests per second</h2>{chart(self.state.history.rates())}"
                "<h2>Workers</h2><table><tr><th>generation</th><th>pid</th><th>state</th>"
                "<th>uptime</th><th>requests</th><th>connections</th><th>restarts</th></tr>"
                f"{''.join(rows)}</table><h2>Listeners</h2><ul>{listeners}</ul>"
                "<h2>Upstreams</h2><table><tr><th>route</th><th>upstream</th><th>health</th>"
                f"<th>requests</th><th>errors</th></tr>"
                f"{upstreams or '<tr><td>no proxy routes</td></tr>'}</table>"
                "<h2>Certificates</h2><table><tr><th>listener</th><th>names</th>"
                f"<th>expires</th></tr>{certificates or '<tr><td>no TLS listener</td></tr>'}"
                "</table>"
                f"<h2>Gateway state</h2>{state}"
                f"<h2>Reloads</h2><table>{reloads or '<tr><td>none yet</td></tr>'}</table>")

    async def _send(self, request, status: int, body: str, extra=()) -> None:
        page = (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>nestgate "
                f"admin</title><style>{_STYLE}</style></head><body>{body}</body></html>\n")
        await request.send(status, [(n.encode(), v.encode()) for n, v in _HEADERS] +
                           list(extra), page.encode())
