"""nestgate as the forward-auth provider of another proxy (nginx, Caddy, Traefik, HAProxy).

The other proxy serves a request itself but first asks nestgate whether to let it
through, as it would ask Authelia:

  GET /api/authz/forward-auth   (Traefik's ForwardAuth, Caddy's forward_auth, HAProxy)
      the request named by X-Forwarded-Method, -Proto, -Host and -Uri;
  GET /api/authz/auth-request   (nginx's auth_request)
      the request named by X-Original-Method and X-Original-URL.

Both paths are answered on the hosts of every protected site, [[auth.forward]]
entries included, so the other proxy may ask under the site's own name. The client
is the request's client as nestgate's listener knows it: X-Forwarded-For counts only
from [client_ip] trusted_proxies, like everywhere else.

The question is decided with the policy of the nestgate site (or [[auth.forward]]
entry) the forwarded host names, and of its route the forwarded path names: the same
network rules and the same per-user verdicts the site's own gates are compiled from
(`Gateway.question`), looked up by the session's user and the factors it was signed
in with (nestgate.handlers.auth.policy.session_key), so a `two_factor` route refuses a
session of one factor here exactly as its gate does. A host that no protected site or entry names (and "*" names
none) is not asked about: 401, no redirect, as Authelia answers a host outside its
cookie domains.

Who asks: the session cookie, else `Authorization: Basic` with a configured user's
password. Basic counts against the same guessing limits as the sign-in form, counts
as one factor (a password: `two_factor` refuses it), and is accepted only for users
without a TOTP secret (the sign-in form asks those for a code with the password, so a
password alone lets them in nowhere). The answers:

  200  let in, with the user's identity headers (Remote-User and the rest, as
       [auth] identity_headers names them) for the proxy to copy upstream; let in
       without a user (bypass, exempt_local...), the same headers, empty;
  302  a browser, not signed in (303 when the forwarded method is not GET): to the
       sign-in page on the forwarded host, going back to the forwarded path after;
  401  not signed in, from a script or XHR (with the sign-in address in Location),
       and always from auth-request, which never redirects (nginx treats anything
       but 2xx, 401 and 403 as an error; its `error_page 401` sends browsers on);
       with WWW-Authenticate Basic when a Basic credential was refused;
  403  signed in but refused (the same page or JSON as a nestgate route's), or the
       network rules refuse the client.

The way back is never an open redirect: the sign-in page is on the forwarded host,
which must be one the config names, and the path to return to is checked as the
sign-in form checks `next` (a path on that host).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json

from nestgate.pipeline.access import DENY, PASS, network_verdict
from nestgate.handlers.auth.config import PORTAL_PATHS
from nestgate.handlers.auth.identity import identity_pairs
from nestgate.handlers.auth.passwords import verify_password
from nestgate.handlers.auth.portal import login_url, safe_next
from nestgate.handlers.auth.policy import ALLOWED, PASSWORD, decide, session_key, session_user
from nestgate.base.errors import RequestError
from nestgate.base.grammar import METHODS
from nestgate.base.hosts import plain_host_name, valid_host
from nestgate.base.paths import has_dot_segments
from nestgate.pipeline.routing import Router, SiteRoutes
from nestgate.base.tally import TALLY

MAX_URI = 8192
_SCHEMES = (b"http", b"https")
_JSON = (b"content-type", b"application/json")
_NO_STORE = (b"cache-control", b"no-store")


class Question:
    """What a forwarded request to one route (or site) is asked: its network rules
    (a compiled nestgate.pipeline.access.Policy, or None) and its user policy with every
    configured user's verdict, shared with the route's own gate."""

    __slots__ = ("network", "dynamic", "policy", "verdicts")

    def __init__(self, network, dynamic, policy, verdicts: dict[str, str]) -> None:
        self.network = network
        self.dynamic = dynamic
        self.policy = policy                # nestgate.handlers.auth.policy.UserPolicy
        # policy.session_key (user and factors) -> verdict, for signing-in policies:
        # the route's gate answers by the same table
        self.verdicts = verdicts


class Questions:
    """Forwarded host and path -> the Question of the route or site they name, in
    tables shaped like the sites' own (exact hosts, *.wildcards; exact paths,
    {name} patterns, prefixes)."""

    def __init__(self) -> None:
        self.unknown = SiteRoutes("forward-auth", None)
        self.router = Router(self.unknown)

    def add_site(self, site_config, ask) -> None:
        """A protected site's questions; `ask(access, policy)` makes one."""
        table = SiteRoutes(site_config.name, ask(site_config.access, site_config.policy))
        # The sign-in pages are never behind the sign-in (a proxy that asks about them
        # would send browsers round in a loop).
        from nestgate.handlers.auth.policy import UserPolicy
        portal = ask(None, UserPolicy("bypass"))
        for path in PORTAL_PATHS:
            table.add_exact(path, portal)
        for route in site_config.routes:
            question = ask(route.access or site_config.access,
                           route.policy or site_config.policy)
            if route.path:
                table.add_exact(route.path, question, route.label)
            else:
                # `/admin` is asked about as `/admin/`, as nestgate's own proxy routes
                # take it: the asking proxy's upstream may serve it as `/admin/`, and a
                # shorter prefix's policy would let it in there.
                table.add_prefix(route.prefix, question, route.label, slashless=question)
        self.router.add_site([h for h in site_config.hosts if h != "*"], table)

    def find(self, host: bytes, raw_path: bytes) -> Question | None:
        site = self.router.site_for(host)
        return None if site is self.unknown else site.route(raw_path).handler


class Asked:
    """The request another proxy asks about, as its headers name it."""

    __slots__ = ("method", "scheme", "host", "uri")

    def __init__(self, method: bytes, scheme: bytes, host: bytes, uri: bytes) -> None:
        self.method, self.scheme, self.host, self.uri = method, scheme, host, uri

    def sign_in_url(self) -> bytes:
        """The sign-in page on the asked host, going back to the asked path after."""
        back = safe_next(self.uri.decode("latin-1"))
        return self.scheme + b"://" + self.host + login_url(back).encode("latin-1")


def _one(request, name: bytes) -> bytes | None:
    """The value of a header sent once; None when absent; RequestError when repeated
    (two hosts or paths: which one would the other proxy serve?)."""
    found = None
    for key, value in request.headers:
        if key == name:
            if found is not None:
                raise RequestError(400, f"{name.decode()} sent more than once")
            found = value
    return found


def asked_request(request, original: bool) -> Asked:
    """The request named by X-Original-Method and -URL (`original`: nginx) or by
    X-Forwarded-Method, -Proto, -Host and -Uri. RequestError(400) naming what is
    missing or malformed."""
    if original:
        method = _one(request, b"x-original-method") or b"GET"
        url = _one(request, b"x-original-url")
        if url is None:
            raise RequestError(400, "X-Original-URL is missing")
        scheme, sep, rest = url.partition(b"://")
        cut = min((i for i in (rest.find(b"/"), rest.find(b"?")) if i >= 0), default=len(rest))
        host, uri = rest[:cut], rest[cut:]
        if not sep:
            raise RequestError(400, "X-Original-URL is not an absolute http(s) address")
        if not uri.startswith(b"/"):
            uri = b"/" + uri
    else:
        method = _one(request, b"x-forwarded-method") or b"GET"
        # Here X-Forwarded-Proto names the request asked about, as -Host and -Uri do,
        # from whoever asks (Traefik and Caddy set it themselves): it only picks the
        # scheme of the sign-in address handed back to the asker, never a verdict. Its
        # absence leaves this request's own scheme (a trusted proxy's word already).
        scheme = _one(request, b"x-forwarded-proto") or request.scheme.encode()
        host = _one(request, b"x-forwarded-host")
        uri = _one(request, b"x-forwarded-uri")
        if host is None or uri is None:
            raise RequestError(400, "X-Forwarded-Host and X-Forwarded-Uri name the request "
                               "asked about; one is missing")
    scheme = scheme.lower()
    if scheme not in _SCHEMES:
        raise RequestError(400, "the scheme asked about is not http or https")
    if method not in METHODS:
        # Only a method nestgate would take itself, as it came (`get` is no method
        # here): whatever else the asker passes on is no request nestgate answers for.
        raise RequestError(400, "the method asked about is not one nestgate takes")
    # The host the sign-in redirect goes to: a plain host[:port], nothing else.
    if not host or not valid_host(host) or plain_host_name(host) is None or 64 in host:
        raise RequestError(400, "the host asked about is not a host name")
    if len(uri) > MAX_URI or not uri.startswith(b"/") or not uri.isascii() \
            or any(c <= 0x20 or c == 0x7F for c in uri):
        raise RequestError(400, "the path asked about is not a request target")
    if has_dot_segments(uri):
        # The answer is given for the path with its dot segments removed (as routes
        # match), while the proxy asking forwards the path as it came (nginx's
        # proxy_pass without a URI, Caddy): `/admin/../open/x` would be let in as
        # `/open/x` and reach an upstream that routes it under /admin/.
        raise RequestError(400, "the path asked about holds dot segments")
    return Asked(method, scheme, host.lower(), uri)


class ForwardAuthEndpoint:
    """/api/authz/forward-auth (redirects browsers) or /api/authz/auth-request
    (`original`: nginx's names, never redirects)."""

    is_async = True
    upgrades = False
    __slots__ = ("provider", "original")

    def __init__(self, provider: Provider, original: bool) -> None:
        self.provider = provider
        self.original = original

    async def handle(self, request) -> None:
        await self.provider.answer(request, self.original)


class Provider:
    """Answers forward-auth questions for one config's protected sites."""

    def __init__(self, signin, questions: Questions, pairs: dict[str, list],
                 names: tuple[str, ...]) -> None:
        self.signin = signin                # nestgate.handlers.auth.portal.SignIn
        self.questions = questions
        self.pairs = pairs                  # user name -> identity header pairs
        # A yes without a user (bypass, exempt_local, a dynamic allow entry) names the
        # identity headers with empty values: a proxy that copies a header the answer
        # lacks may send something else (Caddy 2.6 sends its placeholder's own text,
        # "{http.reverse_proxy.header.Remote-User}"), an empty one every app reads as
        # no user.
        self.nobody = [(name.lower().encode(), b"") for name in names]
        self.forward_auth = ForwardAuthEndpoint(self, original=False)
        self.auth_request = ForwardAuthEndpoint(self, original=True)

    async def answer(self, request, original: bool) -> None:
        asked = asked_request(request, original)
        question = self.questions.find(asked.host, asked.uri.partition(b"?")[0])
        if question is None:
            await _send_json(request, 401, {"error": "not a host nestgate guards",
                                            "host": asked.host.decode("latin-1")})
            return
        verdict = network_verdict(question.network, question.dynamic, request.client)
        policy = question.policy
        if verdict == DENY or policy.policy == "deny":
            await _send_json(request, 403, {"error": "forbidden"})
            return
        if verdict == PASS or not policy.signs_in:
            await request.send(200, [*self.nobody, _NO_STORE], b"")
            return
        key = await self.signin.session_of(request.headers)
        if key is None or self.reason(question, key) is None:
            basic = _basic(request)
            if basic is not None:
                name = await self.basic_user(request, *basic)
                if name is None:
                    await _send_json(request, 401, {"error": "wrong user or password"},
                                     [(b"www-authenticate", b'Basic realm="nestgate"')])
                    return
                key = session_key(name, PASSWORD)   # a password alone: one factor
        reason = self.reason(question, key) if key is not None else None
        if reason is None:
            await self.sign_in_first(request, asked, original)
            return
        user = session_user(key)
        if reason == ALLOWED:
            await request.send(200, [*self.identity(key), _NO_STORE], b"")
        elif not original and _browser(request):
            await self.signin.refusal_page(request, user, reason,
                                           safe_next(asked.uri.decode("latin-1")))
        else:
            await _send_json(request, 403, {"error": "forbidden", "reason": reason,
                                            "user": user})

    @staticmethod
    def reason(question: Question, key) -> str | None:
        """The verdict for a session's key: compiled with the question for configured
        users; worked out for the `User` of one who signed in through an OpenID
        provider as nobody configured, as the gate does (nestgate.sites.guard.Gateway.
        answer_for): one factor. None: no verdict, so no session."""
        if isinstance(key, str):
            return question.verdicts.get(key)
        return decide(question.policy, key, False)

    def identity(self, key) -> list:
        """The identity header pairs a yes names for a session's key."""
        if isinstance(key, str):
            return self.pairs.get(session_user(key), [])
        return identity_pairs(self.signin.cfg.identity_headers, key)

    async def sign_in_first(self, request, asked: Asked, original: bool) -> None:
        location = (b"location", asked.sign_in_url())
        if not original and _browser(request):
            await request.send(302 if asked.method == b"GET" else 303,
                               [location, _NO_STORE], b"")
            return
        await _send_json(request, 401, {"error": "sign-in required",
                                        "login": location[1].decode("latin-1")},
                         [location, (b"www-authenticate", b'Cookie realm="nestgate"')])

    async def basic_user(self, request, name: str, password: str) -> str | None:
        """The configured user whose password this is, counted like a sign-in on the
        form (the client's and the account's failures, one transaction); None when
        refused. A user with a TOTP secret is refused: the sign-in form never takes
        their password alone, and Basic carries nothing more."""
        signin = self.signin
        user = signin.cfg.user(name)
        if not await signin.attempt(request, user.name if user else "", answer=False):
            return None
        ok = await asyncio.get_running_loop().run_in_executor(
            None, verify_password, user.password if user else None, password)
        if not ok or user.second_factor:
            signin.failed(request)
            return None
        TALLY.event("signin_success")
        await signin.state.run("signed_in", user.name, request.client)
        return user.name


def _basic(request) -> tuple[str, str] | None:
    """(user, password) of an `Authorization: Basic` header; None without one. A
    malformed one is a wrong password (never "no credential": that would redirect)."""
    value = request.header(b"authorization")
    if value is None or value[:6].lower() != b"basic ":
        return None
    try:
        decoded = base64.b64decode(value[6:].strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return "", ""
    name, _, password = decoded.partition(":")
    return name, password


def _browser(request) -> bool:
    """A browser navigating (it takes HTML), not a script or an XHR."""
    return b"text/html" in (request.header(b"accept") or b"") and \
        (request.header(b"x-requested-with") or b"").lower() != b"xmlhttprequest"


async def _send_json(request, status: int, body: dict, headers=()) -> None:
    await request.send(status, [_JSON, _NO_STORE, *headers], json.dumps(body).encode())
