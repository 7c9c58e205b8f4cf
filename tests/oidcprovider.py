"""What the OpenID provider's tests share: a nestgate that is the provider on
https://localhost:PORT (trustme's certificate), its users and clients, and a relying
party's moves (sign in, authorize, redeem the code) made with httpx and Authlib."""

from __future__ import annotations

import re
import ssl
import textwrap
from urllib.parse import parse_qs, urlsplit

import httpx
from authlib.common.security import generate_token
from authlib.oauth2.rfc7636 import create_s256_code_challenge

from conftest import PASSWORD_HASH, Server, free_port
from nestgate.handlers.auth.passwords import hash_password

CLIENT_SECRET = "the-client-secret-of-the-tests"
CLIENT_SECRET_HASH = hash_password(CLIENT_SECRET)
APP_CALLBACK = "https://app.test/callback"


def provider_toml(port: int, certs, store_lines: str, clients: str = "", workers: int = 2,
                  extra_auth: str = "", extra: str = "") -> str:
    """A provider on https://localhost:`port`; users ann (family, display name and
    email) and bob (no groups); `clients` are [[auth.client]] tables."""
    chain, key = certs["local"]
    return textwrap.dedent(f"""
    [server]
    workers = {workers}

    [[listen]]
    address = "127.0.0.1:{port}"
    [[listen.certificate]]
    cert = "{chain}"
    key = "{key}"
    names = ["localhost", "127.0.0.1"]

    [[site]]
    hosts = ["localhost"]
    protected = true

    [[site.route]]
    path = "/"
    type = "return"
    body = "the provider's own page\\n"

    [auth]
    {store_lines}
    issuer = "https://localhost:{port}"
    {extra_auth}

    [[auth.user]]
    name = "ann"
    password = "{PASSWORD_HASH}"
    groups = ["family"]
    display_name = "Ann Example"
    email = "ann@example.com"

    [[auth.user]]
    name = "bob"
    password = "{PASSWORD_HASH}"
    """) + textwrap.dedent(clients) + textwrap.dedent(extra)


CLIENTS = f"""
[[auth.client]]
client_id = "app"
name = "The App"
client_secret_hash = "{CLIENT_SECRET_HASH}"
redirect_uris = ["{APP_CALLBACK}"]
allowed_groups = ["family"]
consent = "implicit"

[[auth.client]]
client_id = "spa"
public = true
redirect_uris = ["https://spa.test/cb"]

[[auth.client]]
client_id = "other"
client_secret_hash = "{CLIENT_SECRET_HASH}"
redirect_uris = ["https://other.test/cb"]
consent = "implicit"
"""


def start_provider(folder, certs, store_lines: str, clients: str = CLIENTS,
                   port: int | None = None, **kw) -> Server:
    port = port or free_port()
    path = folder / f"provider-{port}.toml"
    path.write_text(provider_toml(port, certs, store_lines, clients, **kw))
    return Server(path)


class RelyingParty:
    """A browser's cookie jar and a relying party's client, both against one provider."""

    def __init__(self, issuer: str, ca_file: str) -> None:
        self.issuer = issuer
        trust = ssl.create_default_context(cafile=ca_file)
        self.browser = httpx.Client(base_url=issuer, verify=trust, timeout=10)
        self.backend = httpx.Client(verify=trust, timeout=10)
        self.metadata = self.backend.get(issuer + "/.well-known/openid-configuration").json()

    def close(self) -> None:
        self.browser.close()
        self.backend.close()

    def sign_in(self, user: str = "ann", password: str = "demo-password") -> None:
        page = self.browser.get("/__auth__/login", headers={"Accept": "text/html"}).text
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page).group(1)
        resp = self.browser.post("/__auth__/login", data={"user": user, "password": password,
                                                           "csrf": csrf, "next": "/"})
        assert resp.status_code == 303, resp.text

    def authorize(self, client_id: str = "app", redirect_uri: str = APP_CALLBACK,
                  scope: str = "openid profile email groups", pkce: bool = True, **extra):
        """The provider's answer to an authorization request (not followed), and the
        PKCE verifier sent with it."""
        verifier = generate_token(48)
        params = {"response_type": "code", "client_id": client_id,
                  "redirect_uri": redirect_uri, "scope": scope, "state": "st-123",
                  "nonce": "n-456", **extra}
        if pkce:
            params.update(code_challenge=create_s256_code_challenge(verifier),
                          code_challenge_method="S256")
        resp = self.browser.get(urlsplit(self.metadata["authorization_endpoint"]).path,
                                params=params)
        return resp, verifier

    def code(self, **kw) -> tuple[str, str]:
        resp, verifier = self.authorize(**kw)
        assert resp.status_code == 302, (resp.status_code, resp.text)
        query = parse_qs(urlsplit(resp.headers["location"]).query)
        assert query["state"] == ["st-123"]
        return query["code"][0], verifier

    def redeem(self, code: str, verifier: str | None, client_id: str = "app",
               secret: str | None = CLIENT_SECRET, redirect_uri: str = APP_CALLBACK,
               how: str = "basic", token_endpoint: str | None = None) -> httpx.Response:
        data = {"grant_type": "authorization_code", "code": code, "redirect_uri": redirect_uri}
        if verifier:
            data["code_verifier"] = verifier
        return self.token(data, client_id, secret, how, token_endpoint)

    def token(self, data: dict, client_id: str = "app", secret: str | None = CLIENT_SECRET,
              how: str = "basic", endpoint: str | None = None) -> httpx.Response:
        auth = None
        if secret is not None and how == "basic":
            auth = (client_id, secret)
        elif secret is not None:
            data = {**data, "client_id": client_id, "client_secret": secret}
        else:
            data = {**data, "client_id": client_id}
        return self.backend.post(endpoint or self.metadata["token_endpoint"], data=data,
                                 auth=auth)
