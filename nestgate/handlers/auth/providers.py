"""The `[[auth.oidc]]` tables: the OpenID providers visitors may sign in with
(nestgate.handlers.auth.oidc.client does the signing in)."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")   # travels in the portal's paths
DEFAULT_SCOPES = ("openid", "profile", "email", "groups")


@dataclass(frozen=True)
class OidcProvider:
    name: str                          # in the paths: /__auth__/oidc/<name>
    issuer: str                        # discovery: <issuer>/.well-known/openid-configuration
    client_id: str
    client_secret: str = ""            # "" for a public client (PKCE alone)
    display_name: str = ""             # the button says "Sign in with <display_name>"
    scopes: tuple[str, ...] = DEFAULT_SCOPES
    user_claim: str = "preferred_username"
    groups_claim: str = "groups"       # "" takes no groups from the provider
    allowed_users: tuple[str, ...] = ()
    allowed_groups: tuple[str, ...] = ()
    allow_unknown: bool = False        # a subject that is no configured user or group
    end_session: bool = True           # sign-out also ends the provider's session
    clock_leeway: float = 60.0         # seconds the provider's clock may be off from ours

    @property
    def label(self) -> str:
        return self.display_name or self.name

    def listing(self) -> dict:
        """What the admin API shows of the provider: never the client secret."""
        return {"name": self.name, "display_name": self.label, "issuer": self.issuer,
                "client_id": self.client_id, "confidential": bool(self.client_secret),
                "scopes": list(self.scopes), "user_claim": self.user_claim,
                "groups_claim": self.groups_claim, "allowed_users": list(self.allowed_users),
                "allowed_groups": list(self.allowed_groups),
                "allow_unknown": self.allow_unknown, "end_session": self.end_session,
                "clock_leeway": self.clock_leeway}


def read_providers(s) -> tuple[OidcProvider, ...]:
    """Every [[auth.oidc]] table of the [auth] section `s` (a config `_Section`)."""
    providers = [read_provider(p) for p in s.tables("oidc")]
    names = [p.name for p in providers]
    for name in sorted({n for n in names if names.count(n) > 1}):
        s.fail("oidc", "each provider name once", name)
    return tuple(providers)


def read_provider(p) -> OidcProvider:
    name, issuer, client_id = p.str("name"), p.str("issuer").rstrip("/"), p.str("client_id")
    if not _NAME.fullmatch(name):
        p.fail("name", "a short name of lower-case letters, digits, - and _", name)
    problem = issuer_problem(issuer)
    if problem:
        p.fail("issuer", problem, issuer)
    if not client_id:
        p.fail("client_id", "the client id the provider gave nestgate")
    secret = p.str("client_secret")
    secret_file = p.file_bytes("client_secret_file", secret=True)
    if secret and secret_file is not None:
        p.fail("client_secret_file", "either client_secret or client_secret_file, not both")
    elif secret_file:
        secret = secret_file.decode("utf-8", "replace").strip()
        if not secret:
            p.fail("client_secret_file", "a file holding the client secret (it is empty)")
    scopes = p.strings("scopes", DEFAULT_SCOPES)
    if "openid" not in scopes:
        p.fail("scopes", "a list holding \"openid\"", list(scopes))
    if any(not s or any(c.isspace() for c in s) for s in scopes):
        p.fail("scopes", "scope names without spaces", list(scopes))
    provider = OidcProvider(
        name=name, issuer=issuer, client_id=client_id, client_secret=secret,
        display_name=p.str("display_name"), scopes=scopes,
        user_claim=p.str("user_claim", OidcProvider.user_claim),
        groups_claim=p.str("groups_claim", OidcProvider.groups_claim),
        allowed_users=p.strings("allowed_users"), allowed_groups=p.strings("allowed_groups"),
        allow_unknown=p.bool("allow_unknown", False),
        end_session=p.bool("end_session", True),
        clock_leeway=p.duration("clock_leeway", OidcProvider.clock_leeway))
    if not provider.user_claim:
        p.fail("user_claim", "the name of the claim that holds the user name")
    p.check_unknown()
    return provider


def issuer_problem(issuer: str) -> str:
    """What is wrong with `issuer` as a provider's address; "" when nothing is. Plain
    http:// only to this machine: elsewhere anyone on the path could answer for it."""
    try:
        parts = urlsplit(issuer)
    except ValueError:
        return "an https:// URL"
    if parts.query or parts.fragment or not parts.hostname:
        return "an https:// URL without query or fragment"
    if parts.scheme == "https":
        return ""
    if parts.scheme == "http" and _loopback(parts.hostname):
        return ""
    return "an https:// URL (http:// only to localhost or a loopback address)"


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
