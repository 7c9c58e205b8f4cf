"""nestgate as an OpenID provider, driven as relying parties drive it (httpx, Authlib's
helpers, joserfc to check what it signs): the code flow with PKCE, ID tokens checked
against the JWKS, userinfo, refresh, revocation, consent, and every refusal as an
RFC 6749 error; the state shared by two instances through Redis."""

from __future__ import annotations

import base64
import re
import time
from urllib.parse import parse_qs, urlsplit

import pytest
from joserfc import jwt
from joserfc.jwk import KeySet

from conftest import HASH, Server, free_port
from oidcprovider import (APP_CALLBACK, CLIENT_SECRET, CLIENTS, RelyingParty, provider_toml,
                          start_provider)
from redisserver import RedisServer

TTL_S = 3.0          # the access tokens' and codes' lifetime on this provider


@pytest.fixture(scope="module")
def provider(tmp_path_factory, certs):
    folder = tmp_path_factory.mktemp("oidc")
    server = start_provider(folder, certs, f'store = "{folder}/state.db"',
                            extra_auth=f'access_token_ttl = "{TTL_S}s"\n'
                                       f'authorization_code_ttl = "{TTL_S}s"')
    yield server, f"https://localhost:{server.port('https')}"
    server.stop()


@pytest.fixture
def rp(provider, certs):
    party = RelyingParty(provider[1], certs["ca"])
    yield party
    party.close()


def _error(resp, status: int, error: str) -> dict:
    assert resp.status_code == status, (resp.status_code, resp.text)
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert body["error"] == error, body
    return body


def _redirect_error(resp, error: str, to: str = APP_CALLBACK) -> None:
    assert resp.status_code == 302, (resp.status_code, resp.text)
    location = resp.headers["location"]
    assert location.startswith(to + "?")
    query = parse_qs(urlsplit(location).query)
    assert query["error"] == [error] and query["state"] == ["st-123"]
    assert "code" not in query


def test_discovery_jwks_and_a_signed_in_user_s_tokens_and_claims(rp, provider):
    issuer = provider[1]
    meta = rp.metadata
    assert meta["issuer"] == issuer
    assert meta["authorization_endpoint"].startswith(issuer + "/")
    assert meta["code_challenge_methods_supported"] == ["S256"]
    assert set(meta["token_endpoint_auth_methods_supported"]) >= {
        "client_secret_basic", "client_secret_post"}
    jwks = rp.backend.get(meta["jwks_uri"]).json()
    # The keys of the previous (when made), current and next periods: public parts only.
    assert 2 <= len(jwks["keys"]) <= 3
    assert all("d" not in key and key["alg"] == "RS256" for key in jwks["keys"])

    rp.sign_in("ann")
    code, verifier = rp.code(scope="openid profile email groups")
    resp = rp.redeem(code, verifier, how="post")            # client_secret_post
    assert resp.status_code == 200, resp.text
    assert resp.headers["cache-control"] == "no-store"
    tokens = resp.json()
    assert "refresh_token" not in tokens                     # no offline_access asked
    claims = jwt.decode(tokens["id_token"], KeySet.import_key_set(jwks)).claims
    assert claims["iss"] == issuer and claims["aud"] == ["app"] and claims["nonce"] == "n-456"
    assert claims["exp"] > time.time() and abs(claims["iat"] - time.time()) < 30
    assert claims["sub"] == "ann" and claims["preferred_username"] == "ann"
    assert claims["name"] == "Ann Example" and claims["email"] == "ann@example.com"
    assert claims["groups"] == ["family"]
    info = rp.backend.get(meta["userinfo_endpoint"],
                          headers={"Authorization": f"Bearer {tokens['access_token']}"})
    assert info.status_code == 200
    assert info.json() == {"sub": "ann", "preferred_username": "ann", "name": "Ann Example",
                           "email": "ann@example.com", "groups": ["family"]}
    # A narrower scope releases less.
    code, verifier = rp.code(scope="openid")
    narrow = rp.redeem(code, verifier).json()
    info = rp.backend.get(meta["userinfo_endpoint"],
                          headers={"Authorization": f"Bearer {narrow['access_token']}"})
    assert info.json() == {"sub": "ann"}


def test_without_a_session_authorize_goes_through_the_sign_in_and_back(rp):
    # prompt=none without a session: login_required, told to the client.
    resp, _ = rp.authorize(prompt="none")
    _redirect_error(resp, "login_required")
    resp, verifier = rp.authorize()
    assert resp.status_code == 303
    login = resp.headers["location"]
    assert login.startswith("/__auth__/login?next=/__auth__/oidc/authorize")
    page = rp.browser.get(login, headers={"Accept": "text/html"}).text
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page).group(1)
    next_url = re.search(r'name="next" value="([^"]+)"', page).group(1).replace("&amp;", "&")
    signed = rp.browser.post("/__auth__/login", data={"user": "ann", "password": "demo-password",
                                                       "csrf": csrf, "next": next_url})
    assert signed.status_code == 303 and signed.headers["location"] == next_url
    back = rp.browser.get(next_url)
    assert back.status_code == 302 and back.headers["location"].startswith(APP_CALLBACK + "?code=")
    code = parse_qs(urlsplit(back.headers["location"]).query)["code"][0]
    assert rp.redeem(code, verifier).status_code == 200


def test_refusals_are_rfc_6749_errors(rp):
    rp.sign_in("ann")
    # A wrong client secret, by either method: 401 (basic) / 401, invalid_client.
    code, verifier = rp.code()
    _error(rp.redeem(code, verifier, secret="wrong"), 401, "invalid_client")
    code, verifier = rp.code()
    _error(rp.redeem(code, verifier, secret="wrong", how="post"), 401, "invalid_client")
    # A redirect URI not registered exactly: never redirected to.
    for wrong in (APP_CALLBACK + "/", APP_CALLBACK + "?x=1", "https://app.test/callbacK",
                  "https://evil.test/callback"):
        resp, _ = rp.authorize(redirect_uri=wrong)
        _error(resp, 400, "invalid_request")
        assert "location" not in resp.headers
    # An unknown client: no redirect either.
    resp, _ = rp.authorize(client_id="nobody")
    _error(resp, 400, "invalid_client")
    # The token request's redirect URI must be the authorization request's.
    code, verifier = rp.code()
    _error(rp.redeem(code, verifier, redirect_uri="https://app.test/other"), 400,
           "invalid_grant")
    # PKCE: the wrong verifier, or none when a challenge was sent.
    code, verifier = rp.code()
    _error(rp.redeem(code, "x" * 43), 400, "invalid_grant")
    code, verifier = rp.code()
    _error(rp.redeem(code, None), 400, "invalid_request")
    # A code is its client's: "other" cannot redeem "app"'s.
    code, verifier = rp.code()
    _error(rp.redeem(code, verifier, client_id="other",
                     redirect_uri="https://other.test/cb"), 400, "invalid_grant")
    # A code is good once; seen again, it also ends the grant it gave.
    code, verifier = rp.code()
    first = rp.redeem(code, verifier)
    assert first.status_code == 200
    _error(rp.redeem(code, verifier), 400, "invalid_grant")
    userinfo = rp.metadata["userinfo_endpoint"]
    gone = rp.backend.get(userinfo, headers={
        "Authorization": f"Bearer {first.json()['access_token']}"})
    _error(gone, 401, "invalid_token")
    # A public client must send a PKCE challenge (S256 only, for everyone).
    resp, _ = rp.authorize(client_id="spa", redirect_uri="https://spa.test/cb", pkce=False)
    _redirect_error(resp, "invalid_request", "https://spa.test/cb")
    resp, _ = rp.authorize(pkce=False, code_challenge="a" * 43,
                           code_challenge_method="plain")
    _redirect_error(resp, "invalid_request")
    # Unsupported response types and scopes.
    resp, _ = rp.authorize(response_type="token")
    _redirect_error(resp, "unsupported_response_type")
    resp, _ = rp.authorize(scope="openid admin")
    _redirect_error(resp, "invalid_scope")
    # The token endpoint takes POST only, and no token without a grant type it knows.
    _error(rp.backend.get(rp.metadata["token_endpoint"]), 405, "invalid_request")
    _error(rp.token({"grant_type": "password", "username": "ann", "password": "x"}), 400,
           "unsupported_grant_type")
    # No bearer token, or a made-up one, at userinfo.
    assert rp.backend.get(userinfo).status_code == 401
    _error(rp.backend.get(userinfo, headers={"Authorization": "Bearer made-up"}), 401,
           "invalid_token")


def test_a_user_outside_the_client_s_groups_is_denied(rp):
    rp.sign_in("bob")                           # no groups; "app" admits "family"
    resp, _ = rp.authorize()
    _redirect_error(resp, "access_denied")
    # "other" admits everyone: bob gets a code there.
    code, verifier = rp.code(client_id="other", redirect_uri="https://other.test/cb")
    assert rp.redeem(code, verifier, client_id="other",
                     redirect_uri="https://other.test/cb").status_code == 200


def test_codes_and_access_tokens_expire(rp):
    rp.sign_in("ann")
    code, verifier = rp.code()
    tokens = rp.redeem(code, verifier).json()
    late_code, late_verifier = rp.code()
    time.sleep(TTL_S + 0.5)
    _error(rp.redeem(late_code, late_verifier), 400, "invalid_grant")
    _error(rp.backend.get(rp.metadata["userinfo_endpoint"], headers={
        "Authorization": f"Bearer {tokens['access_token']}"}), 401, "invalid_token")


def test_refresh_tokens_rotate_and_revocation_ends_the_grant(rp):
    rp.sign_in("ann")
    code, verifier = rp.code(scope="openid profile offline_access")
    first = rp.redeem(code, verifier).json()
    assert first["refresh_token"]
    refreshed = rp.token({"grant_type": "refresh_token", "refresh_token": first["refresh_token"]})
    assert refreshed.status_code == 200, refreshed.text
    second = refreshed.json()
    userinfo = rp.metadata["userinfo_endpoint"]
    assert rp.backend.get(userinfo, headers={
        "Authorization": f"Bearer {second['access_token']}"}).json()["sub"] == "ann"
    assert second["refresh_token"] != first["refresh_token"]
    assert second["scope"] == "openid profile offline_access"
    # A refresh token sent by another client (a spent one sent again by its own client
    # ends the grant: tests/attack/test_oidc_refresh_replay.py).
    _error(rp.token({"grant_type": "refresh_token", "refresh_token": second["refresh_token"]},
                    client_id="other"), 400, "invalid_grant")
    # A scope wider than the grant's.
    _error(rp.token({"grant_type": "refresh_token", "refresh_token": second["refresh_token"],
                     "scope": "openid email"}), 400, "invalid_scope")
    second = rp.token({"grant_type": "refresh_token",
                       "refresh_token": second["refresh_token"]}).json()
    bearer = {"Authorization": f"Bearer {second['access_token']}"}
    assert rp.backend.get(userinfo, headers=bearer).status_code == 200
    # Revocation: another client's revocation changes nothing (RFC 7009 answers 200 for
    # an unknown token, an error for another client's); the owner's ends both tokens.
    revoke = rp.metadata["revocation_endpoint"]
    other = rp.backend.post(revoke, data={"token": second["refresh_token"]},
                            auth=("other", CLIENT_SECRET))
    _error(other, 400, "invalid_grant")
    assert rp.backend.get(userinfo, headers=bearer).status_code == 200
    _error(rp.backend.post(revoke, data={"token": second["refresh_token"]},
                           auth=("app", "wrong")), 401, "invalid_client")
    done = rp.backend.post(revoke, data={"token": second["refresh_token"],
                                         "token_type_hint": "refresh_token"},
                           auth=("app", CLIENT_SECRET))
    assert done.status_code == 200
    _error(rp.backend.get(userinfo, headers=bearer), 401, "invalid_token")
    _error(rp.token({"grant_type": "refresh_token", "refresh_token": second["refresh_token"]}),
           400, "invalid_grant")


def test_explicit_consent_asks_and_a_public_client_redeems_with_pkce(rp):
    rp.sign_in("ann")
    resp, _ = rp.authorize(client_id="spa", redirect_uri="https://spa.test/cb")
    assert resp.status_code == 200
    page = resp.text
    assert "asks to sign you in as <b>ann</b>" in page and "spa.test" in page
    assert "your email address" in page and "the groups you are in" in page
    assert 'name="decision" value="deny"' in page
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page).group(1)
    request = re.search(r'name="request" value="([^"]+)"', page).group(1).replace("&amp;", "&")
    path = urlsplit(rp.metadata["authorization_endpoint"]).path
    # A form without this site's CSRF token is refused.
    forged = rp.browser.post(path, data={"csrf": "0" * 64, "request": request})
    assert forged.status_code == 403
    denied = rp.browser.post(path, data={"csrf": csrf, "request": request, "decision": "deny"})
    _redirect_error(denied, "access_denied", "https://spa.test/cb")
    resp, verifier = rp.authorize(client_id="spa", redirect_uri="https://spa.test/cb")
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', resp.text).group(1)
    request = re.search(r'name="request" value="([^"]+)"', resp.text).group(1)
    allowed = rp.browser.post(path, data={"csrf": csrf, "request": request.replace("&amp;", "&")})
    assert allowed.status_code == 302
    location = allowed.headers["location"]
    assert location.startswith("https://spa.test/cb?code=")
    code = parse_qs(urlsplit(location).query)["code"][0]
    # No secret: the PKCE verifier is what proves the client.
    _error(rp.redeem(code, "y" * 43, client_id="spa", secret=None,
                     redirect_uri="https://spa.test/cb"), 400, "invalid_grant")
    resp, verifier = rp.authorize(client_id="spa", redirect_uri="https://spa.test/cb",
                                  prompt="consent")
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', resp.text).group(1)
    request = re.search(r'name="request" value="([^"]+)"', resp.text).group(1)
    allowed = rp.browser.post(path, data={"csrf": csrf, "request": request.replace("&amp;", "&")})
    code = parse_qs(urlsplit(allowed.headers["location"]).query)["code"][0]
    resp = rp.redeem(code, verifier, client_id="spa", secret=None,
                     redirect_uri="https://spa.test/cb")
    assert resp.status_code == 200, resp.text
    # prompt=none shows no page: consent_required, for a client that asks silently
    # (before: the consent page, which a hidden frame never shows).
    resp, _ = rp.authorize(client_id="spa", redirect_uri="https://spa.test/cb", prompt="none")
    _redirect_error(resp, "consent_required", "https://spa.test/cb")


def test_two_instances_share_codes_grants_and_keys_through_redis(tmp_path, certs):
    redis = RedisServer(tmp_path)
    port_a, port_b = free_port(), free_port()
    state = f'[state]\nbackend = "redis"\nurl = "{redis.url}"\n'
    servers: list[Server] = []
    try:
        for port in (port_a, port_b):
            path = tmp_path / f"instance-{port}.toml"
            # Both name the same issuer (behind one address in a real setup).
            path.write_text(provider_toml(port_a, certs, "", CLIENTS, workers=1, extra=state)
                            .replace(f'address = "127.0.0.1:{port_a}"',
                                     f'address = "127.0.0.1:{port}"'))
            servers.append(Server(path))
        a = RelyingParty(f"https://localhost:{port_a}", certs["ca"])
        b_token = f"https://localhost:{port_b}/__auth__/oidc/token"
        b_jwks = f"https://localhost:{port_b}/__auth__/oidc/jwks"
        assert a.backend.get(a.metadata["jwks_uri"]).json() == a.backend.get(b_jwks).json()
        a.sign_in("ann")
        code, verifier = a.code(scope="openid profile offline_access")
        # Issued by one instance, redeemed at the other; then good at neither again.
        resp = a.redeem(code, verifier, token_endpoint=b_token)
        assert resp.status_code == 200, resp.text
        tokens = resp.json()
        jwks = KeySet.import_key_set(a.backend.get(a.metadata["jwks_uri"]).json())
        assert jwt.decode(tokens["id_token"], jwks).claims["sub"] == "ann"
        refreshed = a.token({"grant_type": "refresh_token",
                             "refresh_token": tokens["refresh_token"]})
        assert refreshed.status_code == 200
        bearer = {"Authorization": f"Bearer {refreshed.json()['access_token']}"}
        assert a.backend.get(a.metadata["userinfo_endpoint"], headers=bearer).status_code == 200
        # The spent refresh token again, at the other instance: refused, and the grant
        # ends on both (its refreshed tokens too).
        _error(a.token({"grant_type": "refresh_token", "refresh_token": tokens["refresh_token"]},
                       endpoint=b_token), 400, "invalid_grant")
        assert a.backend.get(a.metadata["userinfo_endpoint"], headers=bearer).status_code == 401
        # The code again, at the instance that did not redeem it: refused, and the grant
        # it gave ends on both (its refreshed tokens too).
        _error(a.redeem(code, verifier), 400, "invalid_grant")
        _error(a.token({"grant_type": "refresh_token",
                        "refresh_token": refreshed.json()["refresh_token"]}, endpoint=b_token),
               400, "invalid_grant")
        # Nothing of it is in either instance's SQLite file: the store is Redis.
        import redis as redis_client
        keys = redis_client.Redis.from_url(redis.url).keys("nestgate:oidc-*")
        assert any(k.startswith(b"nestgate:oidc-key:") for k in keys)
        assert any(k.startswith(b"nestgate:oidc-code:") for k in keys)
        a.close()
    finally:
        for server in servers:
            server.stop()
        redis.stop()


def _problems(auth: dict, site: dict | None = None) -> list[str]:
    from nestgate.config import ConfigError, parse_config
    data = {"listen": [{"address": "127.0.0.1:0"}],
            "site": [site or {"hosts": ["auth.example.com"], "protected": True}],
            "auth": {"store": ":memory:", "user": [{"name": "ann", "password": HASH}], **auth}}
    try:
        parse_config(data, "nestgate.toml")
    except ConfigError as exc:
        return exc.problems
    return []


def test_provider_config_problems_name_file_key_and_expectation():
    good = {"client_id": "grafana", "client_secret_hash": HASH,
            "redirect_uris": ["https://grafana.example.com/login/generic_oauth"]}
    assert _problems({"issuer": "https://auth.example.com", "client": [good]}) == []
    cases = [
        ({"client": [good]}, "auth.issuer: expected an issuer URL"),
        ({"issuer": "http://auth.example.com"}, "auth.issuer: expected an https:// URL"),
        ({"issuer": "https://auth.example.com/sso"}, "auth.issuer: expected an https:// URL"),
        ({"issuer": "https://nowhere.example.com"}, "auth.issuer: expected the host of a"),
        ({"issuer": "https://auth.example.com",
          "client": [{**good, "client_secret_hash": ""}]},
         "auth.client[0].client_secret_hash: expected a client_secret_hash"),
        ({"issuer": "https://auth.example.com", "client": [{**good, "public": True}]},
         "auth.client[0].client_secret_hash: expected a client_secret_hash"),
        ({"issuer": "https://auth.example.com",
          "client": [{**good, "client_secret_hash": "plain"}]}, "expected an argon2 hash"),
        ({"issuer": "https://auth.example.com",
          "client": [{**good, "redirect_uris": ["https://x.example/cb#frag"]}]},
         "auth.client[0].redirect_uris: expected absolute http(s):// URIs"),
        ({"issuer": "https://auth.example.com", "client": [{**good, "redirect_uris": []}]},
         "auth.client[0].redirect_uris: expected at least one"),
        ({"issuer": "https://auth.example.com", "client": [{**good, "scopes": ["email"]}]},
         "auth.client[0].scopes: expected a list holding \"openid\""),
        ({"issuer": "https://auth.example.com", "client": [{**good, "scopes": ["openid", "x"]}]},
         "auth.client[0].scopes: expected scopes among"),
        ({"issuer": "https://auth.example.com", "client": [{**good, "consent": "never"}]},
         "auth.client[0].consent: expected one of 'explicit', 'implicit'"),
        ({"issuer": "https://auth.example.com", "client": [good, good]},
         "auth.client: expected each client_id once"),
        ({"issuer": "https://auth.example.com", "client": [{**good, "secret": "x"}]},
         "auth.client[0].secret: unknown key"),
    ]
    for auth, expected in cases:
        problems = _problems(auth)
        assert any(expected in p and p.startswith("nestgate.toml: ") for p in problems), \
            (auth, problems)
    unprotected = _problems({"issuer": "https://auth.example.com"},
                            {"hosts": ["auth.example.com"]})
    assert any("expected a site with protected = true" in p for p in unprotected)
    taken = _problems({"issuer": "https://auth.example.com"},
                      {"hosts": ["auth.example.com"], "protected": True,
                       "route": [{"path": "/.well-known/openid-configuration",
                                  "type": "return", "body": "x"}]})
    assert any("the OpenID provider's" in p for p in taken), taken


def test_expired_codes_and_grants_leave_the_store(tmp_path):
    from nestgate.handlers.auth.oidc import state as provider_state_module
    from nestgate.handlers.auth.store import Store
    state = provider_state_module.provider_state(Store(str(tmp_path / "state.db")))
    now = time.time()
    state.save_code(b"a" * 32, {"client_id": "app"}, now - 1)     # already expired
    grant = {"id": "g1", "client_id": "app", "user": "ann", "scope": "openid",
             "created": now - 10, "auth_time": now - 10, "access_expires": now - 1,
             "refresh_expires": 0.0}
    state.save_grant(grant, b"b" * 32, None)
    assert state.take_code(b"a" * 32) is None and state.live_grants() == []
    rows = lambda table: state.db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    assert rows("oidc_codes") == 1 and rows("oidc_grants") == 1
    state._purged = time.monotonic() - provider_state_module.PURGE_EVERY
    state.save_code(b"c" * 32, {"client_id": "app"}, now + 60)    # a write purges
    assert rows("oidc_codes") == 1 and rows("oidc_grants") == 0
    assert state.take_code(b"c" * 32) == {"client_id": "app"}


def test_malformed_requests_are_rfc_6749_errors_not_failures(rp, provider):
    server = provider[0]
    rp.sign_in("ann")
    path = urlsplit(rp.metadata["authorization_endpoint"]).path
    many = "&".join(f"f{i}=x" for i in range(60))
    _error(rp.browser.get(f"{path}?{many}"), 400, "invalid_request")
    odd = rp.browser.get(f"{path}?response_type=code&client_id=app&state=%ff%fe"
                         f"&redirect_uri={APP_CALLBACK}&scope=openid")
    assert odd.status_code in (302, 400)                 # answered, whatever the bytes
    token = rp.metadata["token_endpoint"]
    _error(rp.backend.post(token, content=b"grant_type=authorization_code&code=%ff" + b"&x=1" * 60,
                           headers={"Content-Type": "application/x-www-form-urlencoded"},
                           auth=("app", CLIENT_SECRET)), 400, "invalid_request")
    _error(rp.backend.post(token, content=b"x" * 20_000, auth=("app", CLIENT_SECRET)), 400,
           "invalid_request")
    # The same client, authorizing twice with one parameter given twice.
    _error(rp.browser.get(f"{path}?response_type=code&client_id=app&client_id=other"
                          f"&redirect_uri={APP_CALLBACK}&scope=openid&state=st-123"), 400,
           "invalid_request")
    assert not any("Traceback" in line for line in server.lines)


def test_parameters_and_credentials_authlib_cannot_quote_are_refused_not_failures(rp, provider):
    """A redirect URI, response type or grant type holding a control character, a quote
    or a non-ASCII letter (Authlib quotes them in error descriptions, which must be
    printable ASCII), and Basic credentials that are not UTF-8: each was a 500."""
    server = provider[0]
    rp.sign_in("ann")
    for field, value in (("redirect_uri", APP_CALLBACK + "\n"), ("redirect_uri", APP_CALLBACK + '"'),
                         ("redirect_uri", "https://app.test/callbäck"),
                         ("response_type", 'code"'), ("response_type", "cöde")):
        resp, _ = rp.authorize(**{field: value})
        _error(resp, 400, "invalid_request")
        assert "location" not in resp.headers
    code, verifier = rp.code()
    _error(rp.token({"grant_type": "authorization_code\t"}), 400, "invalid_request")
    odd = base64.b64encode("app:\xff\xfe".encode("latin-1")).decode()
    _error(rp.backend.post(rp.metadata["token_endpoint"], headers={"Authorization": "Basic " + odd},
                           data={"grant_type": "authorization_code", "code": code,
                                 "redirect_uri": APP_CALLBACK, "code_verifier": verifier}),
           401, "invalid_client")
    # The code was not spent by the refusals: the client redeems it.
    assert rp.redeem(code, verifier).status_code == 200
    assert not any("Traceback" in line for line in server.lines)


def test_prompt_login_and_an_exceeded_max_age_ask_for_a_fresh_sign_in(rp, provider):
    """OpenID Connect Core 3.1.2.1: the user signs in again (the ID token's auth_time
    says when), and comes back once; with prompt=none, login_required."""
    rp.sign_in("ann")
    time.sleep(1.1)                        # the session is older than max_age=0
    for asked in ({"prompt": "login"}, {"max_age": "0"}, {"max_age": "x"},
                  {"prompt": "login", "max_age": "3600"}):
        resp, verifier = rp.authorize(**asked)
        assert resp.status_code == 303, (asked, resp.status_code, resp.text)
        login = resp.headers["location"]
        assert login.startswith("/__auth__/login?next=/__auth__/oidc/authorize"), login
        page = rp.browser.get(login, headers={"Accept": "text/html"}).text
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page).group(1)
        back = re.search(r'name="next" value="([^"]+)"', page).group(1).replace("&amp;", "&")
        query = parse_qs(urlsplit(back).query)
        assert "max_age" not in query and "login" not in query.get("prompt", [""])[0]
        assert query["state"] == ["st-123"] and query["nonce"] == ["n-456"]
        signed_at = time.time()
        signed = rp.browser.post("/__auth__/login", data={
            "user": "ann", "password": "demo-password", "csrf": csrf, "next": back})
        assert signed.status_code == 303 and signed.headers["location"] == back
        answer = rp.browser.get(back)
        assert answer.status_code == 302, answer.text
        code = parse_qs(urlsplit(answer.headers["location"]).query)["code"][0]
        tokens = rp.redeem(code, verifier).json()
        jwks = KeySet.import_key_set(rp.backend.get(rp.metadata["jwks_uri"]).json())
        claims = jwt.decode(tokens["id_token"], jwks).claims
        assert claims["auth_time"] >= int(signed_at) - 1, (asked, claims)
    # A session younger than max_age: no sign-in.
    code, verifier = rp.code(max_age="3600")
    # prompt=none cannot sign in again: the client is told.
    time.sleep(1.1)
    resp, _ = rp.authorize(prompt="none", max_age="0")
    _redirect_error(resp, "login_required")
    assert not any("Traceback" in line for line in provider[0].lines)
