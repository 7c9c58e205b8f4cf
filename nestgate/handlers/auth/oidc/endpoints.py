"""The OpenID provider's routes on the issuer's site: discovery, JWKS, authorize (with
the consent page), token, userinfo, revocation.

A handler reads what it needs on the loop (the query, a form of at most MAX_FORM
bytes, the session of the sign-in cookie) and hands a parsed request to the
provider's threads (nestgate.handlers.auth.oidc.server), where Authlib and the store work and
a client secret's argon2 check takes its tens of milliseconds: the loop waits for none
of it. Each refusal is Authlib's RFC 6749 error: a JSON body (400, or 401 for a
client that failed to authenticate) or, once the client and redirect URI are known
good, a redirect carrying `error` and `state`.

/authorize without a session goes to the site's sign-in page and comes back
(`next`): sign-in is the portal's, with its back-off and second factor. So does a
request with `prompt=login`, or whose session is older than its `max_age`. With a
session, a client with `consent = "explicit"` (the default) gets a page that names
it, the user and what it will receive, with Allow and Deny; the form is the portal's
(CSRF token bound to the session, Origin checked), posted to the same path.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import html
import json
import math
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import parse_qs, urlencode, urlsplit

from authlib.oauth2 import OAuth2Error
from authlib.oauth2.base import invalid_error_characters
from authlib.oauth2.rfc6749 import scope_to_list
from authlib.oidc.core.errors import ConsentRequiredError, LoginRequiredError

from nestgate.handlers.auth.oidc.config import (AUTHORIZE_PATH, DISCOVERY_PATH, JWKS_PATH,
                                                REVOKE_PATH, TOKEN_PATH, USERINFO_PATH)
from nestgate.handlers.auth.oidc.server import Headers, Provider, ProviderRequest, UserModel
from nestgate.handlers.auth.portal import (login_url, origin, page_or_form,
                                           read_small_body)
from nestgate.handlers.auth.store import StoreUnavailable, store_errors
from nestgate.handlers.auth.storerules import address_key

MAX_FORM = 16 * 1024
MAX_FIELDS = 50
# Parameters Authlib quotes in an error's description, which RFC 6749 (Appendix A) makes
# printable ASCII; Authlib raises ValueError (a 500) when a description holds anything
# else, so a value with such a character is refused as malformed first.
QUOTED_IN_ERRORS = ("redirect_uri", "response_type", "grant_type")
SECRET_THREADS = 2    # argon2 checks of client secrets at once, per worker
OTHER_THREADS = 1     # authorize, userinfo, keys: never queued behind those checks

_WHAT_SCOPES_GIVE = (("profile", "your user name and display name"),
                     ("email", "your email address"), ("groups", "the groups you are in"),
                     ("offline_access", "access that lasts while you are away "
                                        "(a refresh token)"))


class OpenIDProvider:
    """A worker's provider: the Authlib server, its threads, the routes."""

    def __init__(self, auth, signin) -> None:
        self.auth = auth
        self.server = Provider(auth, auth.store)
        self.signin = signin                   # nestgate.handlers.auth.portal.SignIn
        signin.allow_form_redirects(origin(uri) for client in auth.provider.clients
                                    for uri in client.redirect_uris)
        self._pools: dict[bool, ThreadPoolExecutor] = {}
        self._checks = ChecksUnderWay()
        self._errors = store_errors()
        self.discovery = json.dumps(self.server.metadata).encode()

    def add_routes(self, site) -> None:
        """The endpoints, on the issuer's site, outside its sign-in (each checks what
        it needs: a session, a client, a token)."""
        for path, handler in ((DISCOVERY_PATH, Discovery(self)), (JWKS_PATH, Jwks(self)),
                              (AUTHORIZE_PATH, Authorize(self)), (TOKEN_PATH, Token(self)),
                              (USERINFO_PATH, UserInfo(self)), (REVOKE_PATH, Revoke(self))):
            site.add_exact(path, handler, "oidc-" + path.rsplit("/", 1)[1], sign_in=False)

    async def call(self, fn, *args, secrets: bool = False):
        """`fn(*args)` on the provider's threads (those that check client secrets when
        `secrets`); 503 when the store cannot be used."""
        pool = self._pools.get(secrets)
        if pool is None:
            pool = self._pools[secrets] = ThreadPoolExecutor(
                SECRET_THREADS if secrets else OTHER_THREADS,
                thread_name_prefix="nestgate-oidc")
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)
        except self._errors as exc:
            raise StoreUnavailable(str(exc)) from None

    async def authenticated(self, request, fn, req):
        """`fn(req)` for an endpoint where the client authenticates. A client address
        gets `[auth] max_failures` failed authentications per `failure_window` (the
        sign-in's numbers, counted apart from sign-in failures), then 429: each guess
        at a secret costs an argon2 check. Guesses sent together all found the count
        under the limit before any was counted (40 at once: 40 secrets checked), so
        an address has at most as many checks under way in this worker as it has
        failures left; the others wait their turn, and get 429 once the limit is
        reached (an app's own requests at once only wait for one another)."""
        key, auth = "oidc-client:" + address_key(request.client), self.auth
        state = self.signin.state
        checks = self._checks
        while True:
            left = auth.max_failures - await state.run("failures", key, auth.failure_window)
            if left <= 0:
                return _too_many(auth.failure_window)
            if checks.under_way(key) < left:
                break
            await checks.one_ends(key)
        checks.begin(key)
        try:
            result = await self.call(fn, req, secrets=True)
            if result[0] == 401:
                await state.run("add_failure", key)
        finally:
            checks.end(key)
        return result

    def stop(self) -> None:
        for pool in self._pools.values():
            pool.shutdown(wait=False)

    async def session(self, request) -> tuple | None:
        """(user, when they signed in) of the request's live session, for a user the
        config still has; None otherwise."""
        token = self.signin.session_token(request)
        hashed = self.signin.session_hash(token) if token else b""
        if not hashed:
            return None
        found = await self.signin.state.run("session", hashed)
        if found is None or found[0] not in self.server.users:
            return None
        return self.server.users[found[0]], int(found[1] - self.auth.session_ttl)

    def provider_request(self, request, query: dict, form: dict) -> ProviderRequest:
        headers = Headers((n.decode("latin-1"), v.decode("latin-1"))
                          for n, v in request.headers)
        if not _basic_credentials_readable(headers.get("authorization")):
            # Authlib decodes them as UTF-8 and fails with a 500: such credentials are
            # none, and the client is refused as any client without them (401).
            del headers["authorization"]
        uri = self.server.cfg.issuer + request.raw_target.decode("latin-1")
        return ProviderRequest(request.method.decode("latin-1"), uri, headers, query, form)


async def _answer(request, result) -> None:
    status, headers, body = result
    await request.send(status, [(n.lower().encode("latin-1"), v.encode("latin-1"))
                                for n, v in headers], body)


def _parse(text: str) -> dict[str, list[str]] | None:
    """The parameters; None when there are too many, or one that Authlib would quote in
    an error holds what RFC 6749 does not allow there."""
    try:
        params = parse_qs(text, max_num_fields=MAX_FIELDS)
    except ValueError:
        return None
    if any(invalid_error_characters(value) for name in QUOTED_IN_ERRORS
           for value in params.get(name, ())):
        return None
    return params


def _basic_credentials_readable(authorization: str | None) -> bool:
    """False for `Basic` credentials that decode from base64 but not from UTF-8 (what
    is not base64 Authlib itself takes for no credentials)."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    if scheme.lower() != "basic":
        return True
    try:
        decoded = base64.b64decode(token.strip())
    except (binascii.Error, ValueError):
        return True
    try:
        decoded.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


async def _read_form(request) -> dict[str, list[str]] | None:
    """The urlencoded body; None when it is too long or has too many fields."""
    body = await read_small_body(request, MAX_FORM)
    return None if body is None else _parse(body.decode("utf-8", "replace"))


_BAD_REQUEST = (400, [("Content-Type", "application/json"), ("Cache-Control", "no-store")],
                json.dumps({"error": "invalid_request",
                            "error_description": "A malformed or oversized request."}).encode())


class ChecksUnderWay:
    """Client-secret checks under way in this worker, per client address, and a way to
    wait for one of them to end."""

    def __init__(self) -> None:
        self._count: dict[str, int] = {}
        self._ended: dict[str, asyncio.Future] = {}

    def under_way(self, key: str) -> int:
        return self._count.get(key, 0)

    def begin(self, key: str) -> None:
        self._count[key] = self._count.get(key, 0) + 1

    def end(self, key: str) -> None:
        left = self._count[key] - 1
        if left:
            self._count[key] = left
        else:
            del self._count[key]
        ended = self._ended.pop(key, None)
        if ended is not None and not ended.done():
            ended.set_result(None)

    async def one_ends(self, key: str) -> None:
        ended = self._ended.get(key)
        if ended is None:
            ended = self._ended[key] = asyncio.get_running_loop().create_future()
        await asyncio.shield(ended)


def _too_many(window: float):
    return (429, [("Content-Type", "application/json"), ("Cache-Control", "no-store"),
                  ("Retry-After", "%d" % math.ceil(window))],
            json.dumps({"error": "invalid_client", "error_description":
                        "Too many failed client authentications; try again later."}).encode())


_NOT_ALLOWED = (405, [("Allow", "POST"), ("Content-Type", "application/json")],
                json.dumps({"error": "invalid_request",
                            "error_description": "Use POST."}).encode())


class _Endpoint:
    is_async = True
    upgrades = False

    def __init__(self, provider: OpenIDProvider) -> None:
        self.provider = provider


class Discovery(_Endpoint):
    async def handle(self, request) -> None:
        await request.send(200, [(b"content-type", b"application/json"),
                                 (b"access-control-allow-origin", b"*"),
                                 (b"cache-control", b"public, max-age=600")],
                           self.provider.discovery)


class Jwks(_Endpoint):
    """The keys of this period are the worker's own copy: the store is asked when the
    period turns."""

    async def handle(self, request) -> None:
        server = self.provider.server
        body = server.keys.published()
        if body is None:
            body = (await self.provider.call(server.jwks))[2]
        await request.send(200, [(b"content-type", b"application/json"),
                                 (b"access-control-allow-origin", b"*"),
                                 (b"cache-control", b"public, max-age=600")], body)


class _FormEndpoint(_Endpoint):
    """A POST of a urlencoded form, answered by the provider's threads."""

    async def handle(self, request) -> None:
        if request.method != b"POST":
            await _answer(request, _NOT_ALLOWED)
            return
        form = await _read_form(request)
        if form is None:
            await _answer(request, _BAD_REQUEST)
            return
        provider = self.provider
        req = provider.provider_request(request, {}, form)
        await _answer(request, await provider.authenticated(request, self.respond, req))

    def respond(self, req):
        raise NotImplementedError


class Token(_FormEndpoint):
    def respond(self, req):
        return self.provider.server.create_token_response(req)


class Revoke(_FormEndpoint):
    def respond(self, req):
        return self.provider.server.create_endpoint_response("revocation", req)


class UserInfo(_Endpoint):
    """GET or POST with the access token in Authorization: Bearer."""

    async def handle(self, request) -> None:
        provider = self.provider
        req = provider.provider_request(request, {}, {})
        await _answer(request, await provider.call(provider.server.userinfo, req))


class Authorize(_Endpoint):
    """GET: the authorization request. POST: the consent form's answer."""

    async def ask(self, request) -> None:
        """The authorization request in the query (GET, HEAD)."""
        await self.authorize(request, _parse(request.query.decode("utf-8", "replace")), None)

    async def handle(self, request) -> None:
        if not await page_or_form(request, self.ask):
            return
        form = await _read_form(request)
        if form is None:
            await _answer(request, _BAD_REQUEST)
            return
        flat = {k: v[0] for k, v in form.items()}
        if not await self.provider.signin.csrf_ok(request, flat):
            await request.send(403, [(b"content-type", b"text/plain")],
                               b"the form expired or came from another site; reload it\n")
            return
        await self.authorize(request, _parse(flat.get("request", "")),
                             flat.get("decision", "allow") == "allow")

    async def authorize(self, request, query, decision: bool | None) -> None:
        """`decision`: None for the request itself, else the consent form's answer."""
        if query is None:
            await _answer(request, _BAD_REQUEST)
            return
        provider = self.provider
        req = provider.provider_request(request, query, {})
        session = await provider.session(request)
        user = None
        if session is not None:
            user, req.auth_time = session
        grant, client, refusal = await provider.call(_consent_grant, provider.server, req, user)
        if refusal is not None:
            await _answer(request, refusal)
            return
        if user is None:
            # Sign in on this site, then back to this very request.
            target = AUTHORIZE_PATH + "?" + request.query.decode("latin-1") \
                if decision is None else AUTHORIZE_PATH + "?" + _query_text(query)
            await request.send(303, [(b"location", login_url(target).encode("latin-1")),
                                     (b"cache-control", b"no-store")], b"")
            return
        if decision is None and await self.sign_in_again(request, req, query, grant):
            return
        if decision is None and client.client.admits(user) and (
                client.client.consent == "explicit" or getattr(grant, "prompt", "") == "consent"):
            if "none" in _prompts(query):
                # OpenID Connect Core 3.1.2.1: with prompt=none no page is shown; the
                # client learns that the user must be asked (a silent check in a frame
                # would otherwise wait for a page its frame may not show).
                refusal = ConsentRequiredError(state=req.payload.state,
                                               redirect_uri=grant.redirect_uri)
                await _answer(request, provider.server.error(req, refusal))
                return
            await self.consent_page(request, client.client, user, req)
            return
        granted = UserModel(user) if decision is not False and client.client.admits(user) \
            else None
        await _answer(request, await provider.call(
            provider.server.create_authorization_response, req, granted, grant))

    async def sign_in_again(self, request, req, query, grant) -> bool:
        """OpenID Connect Core 3.1.2.1: `prompt=login`, or a session older than
        `max_age` seconds, asks for a fresh sign-in. The browser goes to the sign-in page
        and comes back to the request without them (asked again, they would send it
        round for ever); the ID token's `auth_time` then tells the client when the user
        signed in. With `prompt=none` that cannot be: login_required. True when
        answered here."""
        prompts = _prompts(query)
        max_age = query.get("max_age", [None])[0]
        stale = max_age is not None and (
            not max_age.isdigit() or time.time() - req.auth_time > int(max_age))
        if "login" not in prompts and not stale:
            return False
        if "none" in prompts:
            refusal = LoginRequiredError(state=req.payload.state,
                                         redirect_uri=grant.redirect_uri)
            await _answer(request, self.provider.server.error(req, refusal))
            return True
        back = {k: v for k, v in query.items() if k != "max_age"}
        rest = " ".join(p for p in query.get("prompt", [""])[0].split() if p != "login")
        back.pop("prompt", None)
        if rest:
            back["prompt"] = [rest]
        target = AUTHORIZE_PATH + "?" + _query_text(back)
        await request.send(303, [(b"location", login_url(target).encode("latin-1")),
                                 (b"cache-control", b"no-store")], b"")
        return True

    async def consent_page(self, request, client, user, req) -> None:
        scopes = scope_to_list(req.scope) or []
        gives = [what for scope, what in _WHAT_SCOPES_GIVE if scope in scopes]
        esc = html.escape
        back = urlsplit(req.payload.redirect_uri or client.redirect_uris[0]).netloc
        listing = "".join(f"<li>{esc(g)}</li>" for g in ["who you are (your user name)"] + gives)
        fields = (f"<p><b>{esc(client.name)}</b> asks to sign you in as "
                  f"<b>{esc(user.name)}</b>. It will receive:</p><ul>{listing}</ul>"
                  f"<p>You go back to <b>{esc(back)}</b> after.</p>"
                  f'<input type="hidden" name="request" value="{esc(request.query.decode("latin-1"))}">'
                  '<button type="submit" name="decision" value="deny">Deny</button>')
        await self.provider.signin._form_page(request, 200, AUTHORIZE_PATH,
                                              f"Sign in to {client.name}", fields, "Allow")


def _prompts(query: dict[str, list[str]]) -> set[str]:
    return set(query.get("prompt", [""])[0].split())


def _query_text(query: dict[str, list[str]]) -> str:
    return urlencode([(k, v) for k, vs in query.items() for v in vs])


def _consent_grant(server: Provider, req, user):
    """(grant, client, None) for a valid request, else (None, None, the refusal as
    (status, headers, body))."""
    try:
        grant = server.get_consent_grant(req, end_user=UserModel(user) if user else None)
    except OAuth2Error as error:
        return None, None, server.error(req, error)
    return grant, req.client, None
