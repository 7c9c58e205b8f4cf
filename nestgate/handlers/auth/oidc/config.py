"""The OpenID provider's keys of `[auth]`: `issuer`, the lifetimes, and the
`[[auth.client]]` tables of the applications that sign their users in through nestgate."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

# What a client may ask for, and what each scope releases (nestgate.handlers.auth.oidc.claims).
SCOPES = ("openid", "profile", "email", "groups", "offline_access")
# Where the provider answers, on the issuer's site (checked against its routes at load).
AUTHORIZE_PATH = "/__auth__/oidc/authorize"
TOKEN_PATH = "/__auth__/oidc/token"
USERINFO_PATH = "/__auth__/oidc/userinfo"
REVOKE_PATH = "/__auth__/oidc/revoke"
JWKS_PATH = "/__auth__/oidc/jwks"
DISCOVERY_PATH = "/.well-known/openid-configuration"
PATHS = (AUTHORIZE_PATH, TOKEN_PATH, USERINFO_PATH, REVOKE_PATH, JWKS_PATH, DISCOVERY_PATH)
CONSENTS = ("explicit", "implicit")


@dataclass(frozen=True)
class Client:
    client_id: str
    name: str                          # shown on the consent page
    secret_hash: str                   # argon2, "" for a public client
    public: bool
    redirect_uris: tuple[str, ...]
    scopes: tuple[str, ...]
    allowed_groups: tuple[str, ...]    # empty: every configured user
    consent: str                       # "explicit" (a page asks) or "implicit"

    def admits(self, user) -> bool:
        """`user` (nestgate.handlers.auth.config.User) may sign in to this client."""
        return not self.allowed_groups or any(g in self.allowed_groups for g in user.groups)

    def listing(self) -> dict:
        """What the admin API shows: never the secret's hash."""
        return {"client_id": self.client_id, "name": self.name, "public": self.public,
                "redirect_uris": list(self.redirect_uris), "scopes": list(self.scopes),
                "allowed_groups": list(self.allowed_groups), "consent": self.consent}


@dataclass(frozen=True)
class ProviderConfig:
    issuer: str                              # "https://auth.example.com"
    clients: tuple[Client, ...] = ()
    code_ttl: float = 60.0                   # an authorization code is redeemed within this
    access_token_ttl: float = 3600.0         # access and ID tokens
    refresh_token_ttl: float = 30 * 86400.0
    key_rotation: float = 30 * 86400.0       # a signing key signs for this long

    @property
    def host(self) -> str:
        return urlsplit(self.issuer).hostname or ""

    def client(self, client_id: str) -> Client | None:
        for client in self.clients:
            if client.client_id == client_id:
                return client
        return None


def read_provider(s) -> ProviderConfig | None:
    """`issuer`, the lifetimes and `[[auth.client]]` of the [auth] table (a config
    `_Section`); None when no issuer is set (and then no client may be)."""
    issuer = s.str("issuer").rstrip("/")
    clients = [read_client(c) for c in s.tables("client")]
    d = ProviderConfig("")
    lifetimes = {key: s.positive_duration(key, getattr(d, attr)) for key, attr in (
        ("authorization_code_ttl", "code_ttl"), ("access_token_ttl", "access_token_ttl"),
        ("refresh_token_ttl", "refresh_token_ttl"), ("signing_key_rotation", "key_rotation"))}
    if not issuer:
        if clients:
            s.fail("issuer", "an issuer URL such as \"https://auth.example.com\" when "
                   "[[auth.client]] tables are given")
        return None
    parts = urlsplit(issuer)
    if parts.scheme != "https" or not parts.hostname or parts.path or parts.query \
            or parts.fragment or parts.username:
        s.fail("issuer", "an https:// URL of a host without a path, such as "
               "\"https://auth.example.com\"", issuer)
    ids = [c.client_id for c in clients]
    for client_id in sorted({i for i in ids if ids.count(i) > 1}):
        s.fail("client", "each client_id once", client_id)
    return ProviderConfig(issuer, tuple(clients), lifetimes["authorization_code_ttl"],
                          lifetimes["access_token_ttl"], lifetimes["refresh_token_ttl"],
                          lifetimes["signing_key_rotation"])


def read_client(c) -> Client:
    """One [[auth.client]] table."""
    client_id = c.str("client_id")
    if not client_id or not client_id.isascii() or not client_id.isprintable() \
            or " " in client_id or ":" in client_id or len(client_id) > 128:
        c.fail("client_id", "an id of printable ASCII without spaces or colons", client_id)
    secret_hash, public = c.str("client_secret_hash"), c.bool("public", False)
    if public == bool(secret_hash):
        c.fail("client_secret_hash", "a client_secret_hash (printed by `nestgate passwd`) "
               "or public = true, one of the two")
    elif secret_hash and not secret_hash.startswith("$argon2"):
        c.fail("client_secret_hash", "an argon2 hash (run `nestgate passwd`)")
    redirect_uris = c.strings("redirect_uris")
    if not redirect_uris:
        c.fail("redirect_uris", "at least one redirect URI")
    for uri in redirect_uris:
        parts = urlsplit(uri)
        if parts.scheme not in ("https", "http") or not parts.hostname or parts.fragment \
                or not uri.isascii() or any(ch.isspace() for ch in uri):
            c.fail("redirect_uris", "absolute http(s):// URIs without a #fragment", uri)
    scopes = c.strings("scopes", SCOPES)
    for scope in scopes:
        if scope not in SCOPES:
            c.fail("scopes", "scopes among " + ", ".join(SCOPES), scope)
    if "openid" not in scopes:
        c.fail("scopes", "a list holding \"openid\"", list(scopes))
    consent = c.choice("consent", "explicit", CONSENTS)
    client = Client(client_id, c.str("name", client_id), secret_hash, public,
                    tuple(redirect_uris), tuple(dict.fromkeys(scopes)),
                    c.strings("allowed_groups"), consent)
    c.check_unknown()
    return client


def provider_problems(provider: ProviderConfig, sites, file: str) -> list[str]:
    """The issuer must name the host of a protected site: its sign-in page is where
    the provider's users sign in."""
    host = provider.host
    site = next((s for s in sites if host in s.hosts), None)
    if site is None:
        return [f"{file}: auth.issuer: expected the host of a [[site]] (its sign-in page "
                f"is where users sign in), got {host!r}"]
    if not site.protected:
        return [f"{file}: auth.issuer: expected a site with protected = true (it serves "
                f"the sign-in), got {site.name!r} for {host!r}"]
    return [f"{file}: site {site.name!r}: expected no route on {route.path!r}, the OpenID "
            f"provider's (auth.issuer names this site)"
            for route in site.routes if route.path in PATHS]


def issuer_site(config):
    """The site that serves the provider, or None."""
    auth = config.auth
    provider = auth.provider if auth is not None else None
    if provider is None:
        return None
    return next((s for s in config.sites if provider.host in s.hosts), None)
