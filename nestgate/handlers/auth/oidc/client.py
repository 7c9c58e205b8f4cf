"""Signing in through an OpenID provider: nestgate as a relying party.

Theory of operation. The sign-in page links to OIDC_PATH + <name> for each
[[auth.oidc]] provider. That GET makes a `state`, a `nonce` and a PKCE verifier, keeps
them in a cookie only the portal's paths see (`Flow`: HMAC-signed with the store's
secret, ten minutes long, SameSite=Lax so the provider's redirect back brings it), and
sends the browser to the provider's authorization endpoint with the S256 challenge.
The provider sends it back to OIDC_PATH + <name>/callback with `code` and `state`:
the state must be the cookie's (a sign-in this browser did not start is refused, so
nobody can sign a victim in as themselves), the code is exchanged at the token
endpoint with the verifier and the client's credentials (a code seen by anyone else
is worth nothing, and the provider takes it once), and the ID token is checked
(`Provider.id_claims`): its signature with a key of the provider's JWKS and an
asymmetric algorithm the provider announces (never `none`, never an HMAC keyed with
a public key), then `iss`, `aud`, `azp`, `exp`, `iat` and the flow's `nonce`.

The provider's documents (discovery, JWKS) are fetched with an asynchronous client
and kept for an hour; a token signed with a key id the cached JWKS lacks fetches it
again once (the provider rotated its keys). Its answers are read up to MAX_ANSWER.

Which nestgate user the claims make (`identity`): `user_claim` names the user. A
configured user of that name is that user (their groups and details, as configured),
and stays bound to the provider's account (`sub`) that first signed in as them
(`bound_subject`): a name is not unique at a provider over time (OpenID Connect Core
5.7), so an account renamed, or made anew, to a configured user's name is refused.
An `email` user claim counts only with `email_verified` true.
Anyone else enters as themselves only with `allow_unknown`, or when a group from
`groups_claim` is a group this config knows. A provider's `allowed_users` and
`allowed_groups` come first: a subject outside them is refused. Names and groups
travel in identity headers, so only ones a config could hold are taken.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import re
import time
from dataclasses import dataclass
from urllib.parse import urlencode

import httpx
from authlib.common.security import generate_token
from authlib.oauth2.rfc6749.parameters import prepare_grant_uri
from authlib.oauth2.rfc7636 import create_s256_code_challenge
from joserfc import jws, jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet

from nestgate.handlers.auth.config import OIDC_PATH, User
from nestgate.handlers.auth.policy import OIDC, session_key

FLOW_TTL = 600                 # seconds from the button to the callback
DOCUMENT_TTL = 3600.0          # seconds discovery and JWKS are kept
HTTP_TIMEOUT_S = 10.0          # each request to the provider
MAX_ANSWER = 512 * 1024        # bytes read of any answer from the provider
FLOW_COOKIE = "nestgate_oidc"
# Signature algorithms an ID token may use: public-key ones only, so a token can never
# be "signed" with the provider's public key as an HMAC secret, nor not at all.
ASYMMETRIC = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384",
              "ES512", "EdDSA")
_NAME_TEXT = re.compile(r"[^\s\x00-\x1f\x7f,]{1,128}")      # a user or group name
_LINE_TEXT = re.compile(r"[^\x00-\x1f\x7f]{0,256}")          # a display name or email


class Refused(Exception):
    """The sign-in stops here: `status` and what the page tells the visitor; the
    reason for the log stays in the exception's args."""

    def __init__(self, status: int, message: str, reason: str = "") -> None:
        super().__init__(reason or message)
        self.status = status
        self.message = message


# ------------------------------------------------------------------ the flow cookie
@dataclass(frozen=True)
class Flow:
    """One sign-in under way, as its cookie carries it."""
    provider: str
    state: str
    nonce: str
    verifier: str
    next_url: str
    redirect_uri: str
    expires: float

    @classmethod
    def begin(cls, provider: str, next_url: str, redirect_uri: str) -> Flow:
        return cls(provider, generate_token(32), generate_token(32), generate_token(64),
                   next_url, redirect_uri, time.time() + FLOW_TTL)

    def seal(self, secret: bytes) -> str:
        body = base64.urlsafe_b64encode(json.dumps(
            [self.provider, self.state, self.nonce, self.verifier, self.next_url,
             self.redirect_uri, self.expires]).encode()).decode().rstrip("=")
        return body + "." + _flow_mac(secret, body)

    @classmethod
    def open(cls, sealed: str, secret: bytes) -> Flow | None:
        """The flow a cookie value carries; None when it was not made here, was
        changed, or is over."""
        body, _, mac = sealed.partition(".")
        if not mac or not hmac.compare_digest(_flow_mac(secret, body).encode(),
                                              mac.encode("utf-8", "surrogateescape")):
            return None
        try:
            fields = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
            flow = cls(*fields)
        except (ValueError, TypeError):
            return None
        return flow if flow.expires > time.time() else None


def _flow_mac(secret: bytes, body: str) -> str:
    return hmac.new(secret, b"oidc-flow:" + body.encode(), hashlib.sha256).hexdigest()


def callback_path(name: str) -> str:
    return f"{OIDC_PATH}{name}/callback"


# ------------------------------------------------------------------ the provider
class Http:
    """The asynchronous HTTP client every provider of a worker shares. Made on first
    use, in an executor: loading the CA bundle reads files, which the loop must not."""

    def __init__(self) -> None:
        self._client = None
        self._making: asyncio.Future | None = None

    async def client(self):
        if self._client is None:
            if self._making is None:
                self._making = asyncio.get_running_loop().run_in_executor(None, _make_client)
            self._client = await self._making
        return self._client

    async def json(self, method: str, url: str, **kwargs) -> tuple[int, dict]:
        """(status, JSON object) of a request; Refused(502) when the provider cannot
        be reached or answers with something else than a JSON object."""
        client = await self.client()
        try:
            async with client.stream(method, url, **kwargs) as answer:
                body = b""
                async for chunk in answer.aiter_bytes():
                    body += chunk
                    if len(body) > MAX_ANSWER:
                        raise Refused(502, "The sign-in provider's answer was too long.",
                                      f"{url}: more than {MAX_ANSWER} bytes")
                status = answer.status_code
        except httpx.HTTPError as exc:
            raise Refused(502, "The sign-in provider could not be reached.",
                          f"{url}: {exc!r}") from None
        try:
            data = json.loads(body)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise Refused(502, "The sign-in provider gave an answer nestgate cannot read.",
                          f"{url}: {status}, not a JSON object")
        return status, data

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()


def _make_client():
    return httpx.AsyncClient(timeout=HTTP_TIMEOUT_S, follow_redirects=False,
                             headers={"accept": "application/json"})


class _Cached:
    """A document fetched at most once at a time, kept DOCUMENT_TTL."""

    def __init__(self, fetch) -> None:
        self._fetch = fetch
        self.value = None
        self.at = 0.0
        self._pending: asyncio.Future | None = None

    async def get(self, fresh: bool = False):
        if self.value is not None and not fresh and time.monotonic() - self.at < DOCUMENT_TTL:
            return self.value
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._fetch())
            self._pending.add_done_callback(self._fetched)
        return await asyncio.shield(self._pending)

    def _fetched(self, done: asyncio.Future) -> None:
        self._pending = None
        if not done.cancelled() and done.exception() is None:
            self.value, self.at = done.result(), time.monotonic()


class Provider:
    """One [[auth.oidc]] provider (nestgate.handlers.auth.providers.OidcProvider) as a worker
    talks to it."""

    def __init__(self, cfg, http: Http) -> None:
        self.cfg = cfg
        self.http = http
        self._metadata = _Cached(self._discover)
        self._keys = _Cached(self._fetch_keys)

    async def metadata(self) -> dict:
        return await self._metadata.get()

    async def _discover(self) -> dict:
        url = self.cfg.issuer + "/.well-known/openid-configuration"
        status, doc = await self.http.json("GET", url)
        if status != 200:
            raise Refused(502, "The sign-in provider could not be reached.", f"{url}: {status}")
        # OpenID Connect Discovery 4.3: the document must name the issuer asked for.
        if doc.get("issuer", "").rstrip("/") != self.cfg.issuer:
            raise Refused(502, "The sign-in provider is not the one configured.",
                          f"{url} names issuer {doc.get('issuer')!r}")
        for key in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
            if not isinstance(doc.get(key), str):
                raise Refused(502, "The sign-in provider's discovery document is incomplete.",
                              f"{url}: no {key}")
        return doc

    async def _fetch_keys(self) -> KeySet:
        url = (await self.metadata())["jwks_uri"]
        status, doc = await self.http.json("GET", url)
        try:
            if status != 200:
                raise ValueError(status)
            return KeySet.import_key_set(doc)
        except (ValueError, TypeError, JoseError) as exc:
            raise Refused(502, "The sign-in provider's keys could not be read.",
                          f"{url}: {exc!r}") from None

    # -------------------------------------------------------------- the steps
    async def authorization_url(self, flow: Flow) -> str:
        doc = await self.metadata()
        return prepare_grant_uri(
            doc["authorization_endpoint"], self.cfg.client_id, "code",
            redirect_uri=flow.redirect_uri, scope=" ".join(self.cfg.scopes),
            state=flow.state, nonce=flow.nonce,
            code_challenge=create_s256_code_challenge(flow.verifier),
            code_challenge_method="S256")

    async def redeem(self, code: str, flow: Flow) -> dict:
        """The token endpoint's answer for `code`: a refusal (a used, wrong or expired
        code, a wrong verifier or secret) is the end of this sign-in."""
        doc = await self.metadata()
        form = {"grant_type": "authorization_code", "code": code,
                "redirect_uri": flow.redirect_uri, "code_verifier": flow.verifier}
        auth = None
        methods = doc.get("token_endpoint_auth_methods_supported") or ["client_secret_basic"]
        if not self.cfg.client_secret:
            form["client_id"] = self.cfg.client_id
        elif "client_secret_basic" in methods:
            auth = (self.cfg.client_id, self.cfg.client_secret)
        else:
            form.update(client_id=self.cfg.client_id, client_secret=self.cfg.client_secret)
        status, answer = await self.http.json("POST", doc["token_endpoint"], data=form,
                                              auth=auth)
        if status != 200 or not isinstance(answer.get("id_token"), str):
            raise Refused(403, "The sign-in provider did not confirm this sign-in.",
                          f"token endpoint: {status} {str(answer.get('error', ''))[:100]}")
        return answer

    async def id_claims(self, id_token: str, nonce: str) -> dict:
        """The claims of an ID token issued to this client for this flow; Refused(403)
        for any other."""
        doc = await self.metadata()
        leeway = self.cfg.clock_leeway
        offered = doc.get("id_token_signing_alg_values_supported") or ["RS256"]
        algorithms = [a for a in offered if a in ASYMMETRIC]
        try:
            header = jws.extract_compact(id_token.encode()).headers()
            if id_token.count(".") != 2 or header.get("alg") not in algorithms:
                raise Refused(403, _BAD_TOKEN, f"ID token algorithm {header.get('alg')!r}")
            keys = await self._keys.get()
            if not _holds(keys, header.get("kid")):
                keys = await self._keys.get(fresh=True)      # the provider rotated keys
            token = jwt.decode(id_token, keys, algorithms=algorithms)
            claims = token.claims
            jwt.JWTClaimsRegistry(
                leeway=int(leeway),
                iss={"essential": True, "value": self.cfg.issuer},
                aud={"essential": True, "value": self.cfg.client_id},
                sub={"essential": True}, exp={"essential": True},
                iat={"essential": True}, nonce={"essential": True, "value": nonce},
            ).validate(claims)
        except Refused:
            raise
        except (JoseError, ValueError, TypeError, KeyError) as exc:
            raise Refused(403, _BAD_TOKEN, f"ID token: {exc!r}") from None
        now = time.time()
        # Issued for this flow: not in the future, not before the flow began.
        if not now - FLOW_TTL - leeway <= claims["iat"] <= now + leeway:
            raise Refused(403, _BAD_TOKEN, f"ID token iat {claims['iat']} is not now")
        audience = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
        azp = claims.get("azp")
        if (len(audience) > 1 or azp is not None) and azp != self.cfg.client_id:
            raise Refused(403, _BAD_TOKEN, f"ID token azp {azp!r}")
        return claims

    async def userinfo(self, access_token: str, subject: str) -> dict:
        """The userinfo endpoint's claims, for providers that keep the user's name or
        groups out of the ID token; only when they are about the same subject."""
        url = (await self.metadata()).get("userinfo_endpoint")
        if not isinstance(url, str) or not access_token:
            return {}
        status, claims = await self.http.json(
            "GET", url, headers={"authorization": f"Bearer {access_token}"})
        if status != 200 or claims.get("sub") != subject:
            return {}
        return claims

    async def claims(self, code: str, flow: Flow) -> tuple[dict, str]:
        """(the signed-in user's claims, the ID token) for the callback's `code`."""
        answer = await self.redeem(code, flow)
        claims = await self.id_claims(answer["id_token"], flow.nonce)
        wanted = [c for c in (self.cfg.user_claim, self.cfg.groups_claim) if c]
        if any(c not in claims for c in wanted):
            extra = await self.userinfo(str(answer.get("access_token", "")), claims["sub"])
            claims = {**extra, **claims}
        return claims, answer["id_token"]

    async def end_session_url(self, id_token: str, after: str) -> str | None:
        """Where sign-out sends the browser to end the provider's session too (RP-
        initiated logout), coming back to `after`; None where the provider has none."""
        if not self.cfg.end_session:
            return None
        try:
            endpoint = (await self.metadata()).get("end_session_endpoint")
        except Refused:
            return None
        if not isinstance(endpoint, str) or not endpoint.startswith(("https://", "http://")):
            return None
        query = {"client_id": self.cfg.client_id, "post_logout_redirect_uri": after}
        if id_token:
            query["id_token_hint"] = id_token
        return endpoint + ("&" if "?" in endpoint else "?") + urlencode(query)


_BAD_TOKEN = "The sign-in provider's answer did not hold up."


def _holds(keys: KeySet, kid) -> bool:
    """`keys` has the key `kid` names (a token without a kid: any key may be it)."""
    if kid is None:
        return True
    try:
        keys.get_by_kid(kid)
    except JoseError:
        return False
    return True


# ------------------------------------------------------------------ who signs in
def identity(provider, claims: dict, config_users, known_groups) -> User:
    """The nestgate user `claims` from `provider` sign in as; Refused(403) when they
    may not. `known_groups`: every group name the config holds."""
    name = claims.get(provider.user_claim)
    if not isinstance(name, str) or not _NAME_TEXT.fullmatch(name):
        raise Refused(403, "The sign-in provider did not say who you are.",
                      f"claim {provider.user_claim!r} is {name!r}")
    # An address names someone only once the provider has checked that they receive
    # its mail: anyone may type any address into a new account at most providers.
    if provider.user_claim == "email" and claims.get("email_verified") is not True:
        raise Refused(403, f"{provider.label} has not verified the address {name}, so it "
                      "cannot sign you in here.", f"{name}: email_verified is not true")
    groups = _groups(claims.get(provider.groups_claim)) if provider.groups_claim else ()
    if (provider.allowed_users or provider.allowed_groups) \
            and name not in provider.allowed_users \
            and not any(g in provider.allowed_groups for g in groups):
        raise Refused(403, f"{name} may not sign in here with {provider.label}.",
                      f"{name} is outside allowed_users and allowed_groups")
    for user in config_users:
        if user.name == name:
            return user
    if not provider.allow_unknown and not any(g in known_groups for g in groups):
        raise Refused(403, f"{name} is not a user of this server.",
                      f"{name}: no such user, and no known group among {list(groups)}")
    return User(name, "", groups=groups, display_name=_line(claims.get("name")),
                email=_line(claims.get("email")))


async def bound_subject(state, provider, user_name: str, subject: str) -> None:
    """Trust on first use: the first sign-in through `provider` as the configured user
    `user_name` binds that user to the provider's `subject` in the shared state; a
    sign-in by another subject is Refused(403). The binding is undone through the
    admin API (DELETE /v1/users/{name}/providers) when the person's account at the
    provider was made anew."""
    bound = await state.run("bind_subject", provider.issuer, user_name, subject)
    if bound != subject:
        raise Refused(403, f"This {provider.label} account is not the one that signs in "
                      f"as {user_name} here.",
                      f"{user_name} is bound to another subject of {provider.issuer}")


def _groups(value) -> tuple[str, ...]:
    """The group names of a groups claim (a list, or one string): the ones a config
    could hold, each once."""
    values = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    return tuple(dict.fromkeys(v for v in values
                               if isinstance(v, str) and _NAME_TEXT.fullmatch(v)))


def _line(value) -> str:
    return value if isinstance(value, str) and _LINE_TEXT.fullmatch(value) else ""


def known_groups(config) -> frozenset[str]:
    """Every group the config names: the users', the policies', the providers'."""
    groups = set()
    auth = config.auth
    for user in auth.users:
        groups.update(user.groups)
    for provider in auth.providers:
        groups.update(provider.allowed_groups)
    for site in config.sites:
        for policy in (site.policy, *(r.policy for r in site.routes)):
            if policy is not None:
                groups.update(policy.allow_groups)
    return frozenset(groups)


# ------------------------------------------------------------------ in the session
def session_identity(provider: str, user: User, configured: bool, id_token: str) -> str:
    """What the store keeps with a session from a provider (JSON): the provider, the
    ID token for sign-out, and the user's details when no configured user holds them."""
    data = {"provider": provider, "id_token": id_token}
    if not configured:
        data.update(groups=list(user.groups), name=user.display_name, email=user.email)
    return json.dumps(data, separators=(",", ":"))


def provider_factor(provider: str) -> str:
    """The factor a sign-in through `provider` records (nestgate.handlers.auth.policy): one word,
    so one factor, as a password alone is; the provider's own checks (its second
    factor, if it asked for one) are not nestgate's to count."""
    return f"{OIDC}:{provider}"


def session_key_of(name: str, factors: str, identity_json: str, cfg) -> User | str | None:
    """What the gate looks a session up by (nestgate.handlers.auth.policy.session_key): for a
    configured user, their name and factors; for one who signed in through a provider
    as nobody configured, a `User` of the details the provider gave (one factor; the
    gate works out its answers as they come: nestgate.sites.guard.Gateway.answer_for).
    None when the user is gone or the session's provider is no longer configured."""
    if not identity_json:
        return session_key(name, factors) if cfg.user(name) is not None else None
    try:
        data = json.loads(identity_json)
    except ValueError:
        return None
    if not isinstance(data, dict) or cfg.sign_in_provider(data.get("provider", "")) is None:
        return None
    if cfg.user(name) is not None:
        return session_key(name, factors)
    if "groups" not in data:
        return None                      # signed in as a configured user since removed
    return User(name, "", groups=tuple(_groups(data.get("groups"))),
                display_name=_line(data.get("name")), email=_line(data.get("email")))
