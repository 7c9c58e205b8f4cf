"""The OpenID provider's core on Authlib's authorization server: the authorization code
grant with PKCE and the OpenID Connect extension, refresh tokens, revocation (RFC
7009), the userinfo endpoint and discovery. Synchronous, like Authlib: every call
runs on the provider's own threads (nestgate.handlers.auth.oidc.endpoints), never on the
event loop, so a client secret's argon2 check or a store round trip waits there.

What nestgate decides here, beyond the RFCs' defaults:
  - a client is one `[[auth.client]]`; a confidential one authenticates with
    client_secret_basic or client_secret_post, a public one (`public = true`) with
    none, and must then send a PKCE challenge (S256 only, for every client that
    sends one);
  - redirect URIs are compared whole, byte for byte;
  - a code lives `authorization_code_ttl`, is good once, for its client only; a code
    seen a second time ends the grant it gave;
  - a refresh token comes with `offline_access` in the granted scope, and each use
    spends it (the answer carries the next one);
  - a user gone from the config, or no longer in the client's `allowed_groups`, gets
    nothing more from a code, a refresh token or the userinfo endpoint;
  - `sub` is the user name.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import defaultdict

from authlib.common.security import generate_token
from authlib.oauth2 import AuthorizationServer, OAuth2Error, OAuth2Request
from authlib.oauth2.rfc6749 import (ClientMixin, InvalidGrantError, InvalidRequestError,
                                    OAuth2Payload, ResourceProtector, TokenMixin, grants,
                                    scope_to_list)
from authlib.oauth2.rfc6750 import BearerTokenGenerator, BearerTokenValidator
from authlib.oauth2.rfc7009 import RevocationEndpoint
from authlib.oauth2.rfc7636 import CodeChallenge
from authlib.oidc.core import AuthorizationCodeMixin
from authlib.oidc.core.grants import OpenIDCode
from authlib.oidc.discovery import OpenIDProviderMetadata

from nestgate.handlers.auth.oidc.config import (AUTHORIZE_PATH, JWKS_PATH, REVOKE_PATH,
                                                SCOPES as SCOPES_SUPPORTED, TOKEN_PATH,
                                                USERINFO_PATH)
from nestgate.handlers.auth.oidc.keys import ALG, SigningKeys
from nestgate.handlers.auth.oidc.state import new_grant_id, provider_state
from nestgate.handlers.auth.passwords import verify_password


CLIENT_AUTH_METHODS = ["client_secret_basic", "client_secret_post", "none"]
GRANT_TYPES = ("authorization_code", "refresh_token")
CLAIMS = ("sub", "preferred_username", "name", "email", "groups")


def digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).digest()


def user_claims(user, scope: str) -> dict:
    """The claims `scope` releases about `user` (nestgate.handlers.auth.config.User); empty
    values are left out rather than sent empty."""
    scopes = set(scope_to_list(scope) or ())
    claims = {"sub": user.name}
    if "profile" in scopes:
        claims["preferred_username"] = user.name
        if user.display_name:
            claims["name"] = user.display_name
    if "email" in scopes and user.email:
        claims["email"] = user.email
    if "groups" in scopes:
        claims["groups"] = list(user.groups)
    return claims


# ---------------------------------------------------------------- requests
class Headers(dict):
    """Request headers by lower-case name, looked up in any case (Authlib asks for
    "Authorization")."""

    def get(self, name, default=None):
        return super().get(name.lower(), default)


class _Payload(OAuth2Payload):
    def __init__(self, lists: dict[str, list[str]]) -> None:
        self._lists = defaultdict(list, lists)
        self._data = {k: v[0] for k, v in lists.items() if v}

    @property
    def data(self):
        return self._data

    @property
    def datalist(self):
        return self._lists


class ProviderRequest(OAuth2Request):
    """A request as the provider's threads see it: parsed off the loop, no I/O left."""

    def __init__(self, method: str, uri: str, headers: Headers,
                 query: dict[str, list[str]], form: dict[str, list[str]]) -> None:
        super().__init__(method, uri, headers=headers)
        self._args = {k: v[0] for k, v in query.items() if v}
        self._form = {k: v[0] for k, v in form.items() if v}
        merged = {k: list(v) for k, v in query.items()}
        for k, v in form.items():
            merged.setdefault(k, []).extend(v)
        self.payload = _Payload(merged)
        self.auth_time: int | None = None      # when the user's session signed in
    @property
    def args(self):
        return self._args

    @property
    def form(self):
        return self._form


# ---------------------------------------------------------------- models
class ClientModel(ClientMixin):
    def __init__(self, client) -> None:
        self.client = client
        self.client_id = client.client_id
        self.client_metadata: dict = {}

    def get_client_id(self):
        return self.client_id

    def get_default_redirect_uri(self):
        uris = self.client.redirect_uris
        return uris[0] if len(uris) == 1 else None

    def get_allowed_scope(self, scope):
        if not scope:
            return ""
        allowed = self.client.scopes
        return " ".join(s for s in dict.fromkeys(scope_to_list(scope)) if s in allowed)

    def check_redirect_uri(self, redirect_uri):
        return redirect_uri in self.client.redirect_uris

    def check_client_secret(self, client_secret):
        # argon2: tens of milliseconds, on the provider's thread.
        return bool(self.client.secret_hash) and verify_password(self.client.secret_hash,
                                                                 client_secret)

    def check_endpoint_auth_method(self, method, endpoint):
        if self.client.public:
            return method == "none"
        return method in ("client_secret_basic", "client_secret_post")

    def check_response_type(self, response_type):
        return response_type == "code"

    def check_grant_type(self, grant_type):
        return grant_type in GRANT_TYPES


class UserModel:
    def __init__(self, user) -> None:
        self.user = user

    def get_user_id(self):
        return self.user.name


class CodeModel(AuthorizationCodeMixin):
    def __init__(self, data: dict, hashed: bytes) -> None:
        self.data = data
        self.hashed = hashed
        self.code_challenge = data.get("code_challenge")
        self.code_challenge_method = data.get("code_challenge_method")

    def get_redirect_uri(self):
        return self.data["redirect_uri"]

    def get_scope(self):
        return self.data["scope"]

    def get_nonce(self):
        return self.data.get("nonce")

    def get_auth_time(self):
        return self.data.get("auth_time")

    def get_acr(self):
        return None

    def get_amr(self):
        return None


class TokenModel(TokenMixin):
    """A grant, seen through its access token or its refresh token."""

    def __init__(self, grant: dict, provider, hashed: bytes = b"") -> None:
        self.grant = grant
        self.provider = provider
        self.hashed = hashed
        self.scope = grant["scope"]

    def check_client(self, client):
        return client.get_client_id() == self.grant["client_id"]

    def get_scope(self):
        return self.grant["scope"]

    def get_expires_in(self):
        return int(self.grant["access_expires"] - time.time())

    def is_expired(self):
        return self.grant["access_expires"] <= time.time()

    def is_revoked(self):
        return False

    def get_user(self):
        return self.provider.allowed_user(self.grant["user"], self.grant["client_id"])

    def get_client(self):
        return self.provider.query_client(self.grant["client_id"])


# ---------------------------------------------------------------- grants
class S256Challenge(CodeChallenge):
    """PKCE with S256 only; a public client must use it."""

    SUPPORTED_CODE_CHALLENGE_METHOD = ["S256"]

    def validate_code_challenge(self, grant, redirect_uri):
        data = grant.request.payload.data
        if grant.request.client.client.public and not data.get("code_challenge"):
            raise InvalidRequestError("A public client must send a PKCE code_challenge.",
                                      redirect_uri=redirect_uri)
        if data.get("code_challenge") and data.get("code_challenge_method") != "S256":
            raise InvalidRequestError("code_challenge_method must be S256.",
                                      redirect_uri=redirect_uri)
        super().validate_code_challenge(grant, redirect_uri)


class CodeGrant(grants.AuthorizationCodeGrant):
    TOKEN_ENDPOINT_AUTH_METHODS = CLIENT_AUTH_METHODS
    AUTHORIZATION_CODE_LENGTH = 43

    def save_authorization_code(self, code, request):
        provider = self.server
        data = {"client_id": request.client.client_id, "user": request.user.get_user_id(),
                "redirect_uri": request.payload.redirect_uri or
                request.client.get_default_redirect_uri(),
                "scope": request.scope, "nonce": request.payload.data.get("nonce"),
                "code_challenge": request.payload.data.get("code_challenge"),
                "code_challenge_method": request.payload.data.get("code_challenge_method"),
                "auth_time": request.auth_time}
        provider.state().save_code(digest(code), data, time.time() + provider.cfg.code_ttl)

    def query_authorization_code(self, code, client):
        hashed = digest(code)
        data = self.server.state().take_code(hashed)
        if data is None or data["client_id"] != client.get_client_id():
            return None
        return CodeModel(data, hashed)

    def delete_authorization_code(self, authorization_code):
        """Nothing: the code was marked used when it was taken."""

    def authenticate_user(self, authorization_code):
        return self.server.allowed_user(authorization_code.data["user"],
                                        authorization_code.data["client_id"])


class RefreshGrant(grants.RefreshTokenGrant):
    TOKEN_ENDPOINT_AUTH_METHODS = CLIENT_AUTH_METHODS
    INCLUDE_NEW_REFRESH_TOKEN = True

    def authenticate_refresh_token(self, refresh_token):
        hashed = digest(refresh_token)
        state = self.server.state()
        grant = state.grant_by_refresh(hashed)
        if grant:
            return TokenModel(grant, self.server, hashed)
        # A token spent before, sent again by its own client: the client or someone
        # who copied the token holds the grant's newer tokens, and nobody can tell
        # which, so the grant ends (RFC 9700 4.14.2). Another client's word about a
        # token it was never given ends nothing.
        spent = state.spent_refresh(hashed)
        if spent is not None and spent[1] == self.request.client.get_client_id():
            state.delete_grant(spent[0])
        return None

    def authenticate_user(self, refresh_token):
        # Spent here, once the client is known to be the token's: a token sent twice
        # at once gives one answer.
        grant = self.server.state().take_refresh(refresh_token.hashed)
        if grant is None:
            raise InvalidGrantError("The refresh token was already used or revoked.")
        user = self.server.allowed_user(grant["user"], grant["client_id"])
        if user is None:
            self.server.state().delete_grant(grant["id"])
            raise InvalidGrantError("The user may no longer use this client.")
        return user

    def revoke_old_credential(self, refresh_token):
        """Nothing: the old token was spent when it was taken."""


class OpenIDExtension(OpenIDCode):
    def __init__(self, provider) -> None:
        super().__init__(require_nonce=False)
        self.provider = provider

    def exists_nonce(self, nonce, request):
        return False          # a replayed nonce is the relying party's to notice

    def resolve_client_private_key(self, client):
        return self.provider.keys.current(self.provider.state())

    def get_client_algorithm(self, client):
        return ALG

    def get_encode_header(self, client):
        return {"alg": ALG, "kid": self.resolve_client_private_key(client).kid}

    def get_client_claims(self, client):
        return {"iss": self.provider.cfg.issuer, "aud": [client.get_client_id()],
                "exp": int(time.time() + self.provider.cfg.access_token_ttl)}

    def generate_user_info(self, user, scope):
        return user_claims(user.user, scope)


class Revocation(RevocationEndpoint):
    CLIENT_AUTH_METHODS = CLIENT_AUTH_METHODS

    def query_token(self, token_string, token_type_hint):
        state, hashed = self.server.state(), digest(token_string)
        grant = None
        if token_type_hint != "refresh_token":
            grant = state.grant_by_access(hashed)
        if grant is None and token_type_hint != "access_token":
            grant = state.grant_by_refresh(hashed)
        return TokenModel(grant, self.server) if grant else None

    def revoke_token(self, token, request):
        """Either token ends the grant: its access and refresh tokens both."""
        self.server.state().delete_grant(token.grant["id"])


class AccessTokens(BearerTokenValidator):
    def __init__(self, provider) -> None:
        super().__init__()
        self.provider = provider

    def authenticate_token(self, token_string):
        grant = self.provider.state().grant_by_access(digest(token_string))
        return TokenModel(grant, self.provider) if grant else None

    def validate_token(self, token, scopes, request):
        super().validate_token(token, scopes, request)
        if token.get_user() is None:
            from authlib.oauth2.rfc6750 import InvalidTokenError
            raise InvalidTokenError(realm=self.realm)


# ---------------------------------------------------------------- the server
class Provider(AuthorizationServer):
    """One per worker and config. Its methods run on the provider's threads; each
    thread has its own handle on the store."""

    def __init__(self, auth, locator: str) -> None:
        super().__init__(scopes_supported=list(SCOPES_SUPPORTED))
        self.cfg = auth.provider
        self.users = {u.name: u for u in auth.users}
        self.locator = locator
        self.keys = SigningKeys(self.cfg.key_rotation)
        self._local = threading.local()
        self._clients = {c.client_id: ClientModel(c) for c in self.cfg.clients}
        self._bearer = BearerTokenGenerator(
            access_token_generator=lambda *a, **k: generate_token(43),
            refresh_token_generator=lambda *a, **k: generate_token(43),
            expires_generator=int(self.cfg.access_token_ttl))
        self.register_token_generator("default", self._generate_token)
        self.register_grant(CodeGrant, [S256Challenge(required=True), OpenIDExtension(self)])
        self.register_grant(RefreshGrant)
        self.register_endpoint(Revocation)
        self.protector = ResourceProtector()
        self.protector.register_token_validator(AccessTokens(self))
        self.metadata = self._metadata()

    # ----------------------------------------------- what Authlib asks of a server
    def state(self):
        state = getattr(self._local, "state", None)
        if state is None:
            from nestgate.handlers.auth.store import open_store
            state = self._local.state = provider_state(open_store(self.locator))
        return state

    def query_client(self, client_id):
        return self._clients.get(client_id)

    def _generate_token(self, grant_type, client, user=None, scope=None, expires_in=None,
                        include_refresh_token=True):
        offline = "offline_access" in (scope_to_list(scope) or ())
        return self._bearer(grant_type, client, user, scope, expires_in,
                            include_refresh_token and offline)

    def save_token(self, token, request):
        now = time.time()
        old = request.refresh_token.grant if request.refresh_token else None
        refresh = token.get("refresh_token")
        grant = {"id": old["id"] if old else new_grant_id(),
                 "client_id": request.client.get_client_id(),
                 "user": request.user.get_user_id(), "scope": token.get("scope", ""),
                 "created": old["created"] if old else now,
                 "auth_time": old["auth_time"] if old else
                 (request.authorization_code.get_auth_time() or now),
                 "access_expires": now + self.cfg.access_token_ttl,
                 "refresh_expires": now + self.cfg.refresh_token_ttl if refresh else 0.0}
        code = request.authorization_code
        self.state().save_grant(grant, digest(token["access_token"]),
                                digest(refresh) if refresh else None,
                                code.hashed if code is not None else None)

    def create_oauth2_request(self, request):
        return request

    def create_json_request(self, request):
        return request

    def handle_response(self, status, body, headers):
        if isinstance(body, dict):
            body = json.dumps(body)
        return status, list(headers), (body or "").encode()

    def send_signal(self, name, *args, **kwargs):
        pass

    # ----------------------------------------------- nestgate's side
    def allowed_user(self, name: str, client_id: str) -> UserModel | None:
        """The configured user `name` when the client admits them, else None."""
        user, client = self.users.get(name), self._clients.get(client_id)
        if user is None or client is None or not client.client.admits(user):
            return None
        return UserModel(user)

    def error(self, request, error: OAuth2Error):
        return self.handle_error_response(request, error)

    def userinfo(self, request):
        try:
            token = self.protector.validate_request(["openid"], request)
        except OAuth2Error as error:
            return self.error(request, error)
        user = token.get_user()
        return self.handle_response(200, user_claims(user.user, token.get_scope()),
                                    [("Content-Type", "application/json"),
                                     ("Cache-Control", "no-store")])

    def jwks(self):
        return self.handle_response(200, self.keys.jwks(self.state()),
                                    [("Content-Type", "application/json"),
                                     ("Cache-Control", "public, max-age=600")])

    def _metadata(self) -> dict:
        issuer = self.cfg.issuer
        metadata = OpenIDProviderMetadata(
            issuer=issuer, authorization_endpoint=issuer + AUTHORIZE_PATH,
            token_endpoint=issuer + TOKEN_PATH, userinfo_endpoint=issuer + USERINFO_PATH,
            jwks_uri=issuer + JWKS_PATH, revocation_endpoint=issuer + REVOKE_PATH,
            scopes_supported=list(SCOPES_SUPPORTED), response_types_supported=["code"],
            response_modes_supported=["query"], grant_types_supported=list(GRANT_TYPES),
            subject_types_supported=["public"], id_token_signing_alg_values_supported=[ALG],
            token_endpoint_auth_methods_supported=CLIENT_AUTH_METHODS,
            revocation_endpoint_auth_methods_supported=CLIENT_AUTH_METHODS,
            code_challenge_methods_supported=["S256"], claims_supported=list(CLAIMS),
            request_parameter_supported=False, request_uri_parameter_supported=False)
        metadata.validate()
        return dict(metadata)

