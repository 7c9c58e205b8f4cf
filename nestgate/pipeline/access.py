"""Access control: who may reach a site or route, decided once per connection.

A site with an access list or sign-in has a guard (nestgate.sites.guard, which compiles
the `Gate`s from these rules) that wraps every handler its table is given in a
`Gate`, at load and while serving, so no route of the site escapes it. The engine sees `is_async is GATED` and asks `gate.admit(conn, headers)`
for the handler that really answers: the route's own, the built-in 403, or the
sign-in check. Routes without a gate never reach this module.

The verdict for a client address is kept on the connection (`conn.decisions`),
keyed by policy, so a kept-alive connection pays for the lookup once; it is
recomputed only when the client address changes (X-Forwarded-For) or the dynamic
allow-list changes (its `version`).

Order (an address CrowdSec's Local API decided on never gets this far: it is refused
at accept, in the ban table, nestgate.bans.crowdsec): deny wins (the CIDRs, then `deny_countries` and `deny_asn`, looked up in the [geoip]
databases, nestgate.pipeline.geoip); then the local exemption and dynamic allow entries admit
without sign-in; then, when there are allow lists, one of them must hold the address
(`allow`, `allow_countries`, `allow_asn`: any one admits). An address the databases
do not place (a private one) is in no country and no AS. A GeoIP database read anew
changes verdicts as the allow-list does (`dynamic.changed`).

Then, on a protected site, who signed in: the route's (or site's) user policy
(nestgate.handlers.auth.policy) is compiled with the route into `Gate.answers`, the handler
each configured user gets: the route itself (a proxy route bound to the user's identity
headers) or the page saying why not. A request costs one lookup on its session's user.
A plain-HTTP request that needs sign-in, where the config has an HTTPS listener and
Secure cookies, is sent there (308) instead of a sign-in form that could not work:
one that came to a plain listener directly, or through a trusted proxy that says
`X-Forwarded-Proto: http` (nestgate.pipeline.dispatch.take_peer, `known_plain`).
"""

from __future__ import annotations

from dataclasses import dataclass

from nestgate.base.clientip import LOCAL, Networks, parse_networks
from nestgate.base.handler import GATED

DENY, PASS, SIGN_IN = 0, 1, 2   # PASS: no sign-in needed; SIGN_IN: allowed, sign-in if protected
# Users from a provider whose answers a route keeps (each route's answers are a dict
# of every configured user's; those from providers are added as they come).
MAX_KEPT_ANSWERS = 10_000


@dataclass(frozen=True)
class AccessConfig:
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    exempt_local: bool = False
    allow_dynamic: bool = True
    allow_countries: frozenset[str] = frozenset()    # ISO 3166-1 alpha-2, upper case
    deny_countries: frozenset[str] = frozenset()
    allow_asn: frozenset[int] = frozenset()          # autonomous system numbers
    deny_asn: frozenset[int] = frozenset()

    @property
    def by_place(self) -> tuple[str, ...]:
        """The keys set that need the [geoip] databases."""
        return tuple(k for k in PLACE_KEYS if getattr(self, k))


PLACE_KEYS = ("allow_countries", "deny_countries", "allow_asn", "deny_asn")
ACCESS_KEYS = ("allow", "deny", "exempt_local", "allow_dynamic", *PLACE_KEYS)


def read_access(s) -> AccessConfig | None:
    """The access keys of a [[site]] or [[site.route]] table (config `_Section`);
    None when the table sets none of them."""
    if not any(k in s.data for k in ACCESS_KEYS):
        for k in ACCESS_KEYS:
            s.seen.add(k)
        return None
    d = AccessConfig()
    cfg = AccessConfig(s.get("allow", (), _cidr_list, ""), s.get("deny", (), _cidr_list, ""),
                       s.bool("exempt_local", d.exempt_local),
                       s.bool("allow_dynamic", d.allow_dynamic),
                       s.get("allow_countries", frozenset(), _countries, ""),
                       s.get("deny_countries", frozenset(), _countries, ""),
                       s.get("allow_asn", frozenset(), _asns, ""),
                       s.get("deny_asn", frozenset(), _asns, ""))
    return cfg


def _countries(value) -> frozenset[str]:
    if not isinstance(value, list) or not all(
            isinstance(x, str) and len(x) == 2 and x.isascii() and x.isalpha() for x in value):
        raise ValueError("a list of two-letter ISO 3166 country codes, like [\"DE\", \"FR\"]")
    return frozenset(x.upper() for x in value)


def _asns(value) -> frozenset[int]:
    """AS numbers as integers or "AS64500" strings."""
    out = set()
    for x in value if isinstance(value, list) else [None]:
        if isinstance(x, str) and x[:2].upper() == "AS" and x[2:].isdigit():
            x = int(x[2:])
        if type(x) is not int or not 0 < x < 2**32:
            raise ValueError("a list of autonomous system numbers, like [64500, \"AS64501\"]")
        out.add(x)
    return frozenset(out)


def _cidr_list(value) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise ValueError("a list of IP addresses or CIDRs")
    parse_networks(value)            # raises naming each invalid entry
    return tuple(value)


class NoDynamic:
    """Stands in for the dynamic allow-list when there is no store."""
    version = 0
    networks = Networks()

    def changed(self) -> None:
        self.version += 1


class Policy:
    """The compiled form of an `AccessConfig`."""

    __slots__ = ("allow", "deny", "exempt_local", "allow_dynamic", "geo", "allowing",
                 "allow_countries", "deny_countries", "allow_asn", "deny_asn")

    def __init__(self, cfg: AccessConfig, geo=None) -> None:
        self.allow = parse_networks(cfg.allow)
        self.deny = parse_networks(cfg.deny)
        self.exempt_local = cfg.exempt_local
        self.allow_dynamic = cfg.allow_dynamic
        # The databases only when this policy names countries or AS numbers, so a
        # CIDR-only policy never looks an address up.
        self.geo = geo if cfg.by_place else None
        self.allow_countries, self.deny_countries = cfg.allow_countries, cfg.deny_countries
        self.allow_asn, self.deny_asn = cfg.allow_asn, cfg.deny_asn
        self.allowing = bool(cfg.allow or cfg.allow_countries or cfg.allow_asn)

    def verdict(self, client: str, dynamic) -> int:
        if self.deny and client in self.deny:
            return DENY
        country, asn = self.geo.place(client) if self.geo is not None else ("", 0)
        if country in self.deny_countries or asn in self.deny_asn:
            return DENY
        if self.exempt_local and client in LOCAL:
            return PASS
        if self.allow_dynamic and dynamic.networks and client in dynamic.networks:
            return PASS
        if self.allowing and not (client in self.allow or country in self.allow_countries
                                  or asn in self.allow_asn):
            return DENY
        return SIGN_IN


class Gate:
    """A route (or a site's 404) behind an access policy and/or sign-in."""

    is_async = GATED
    __slots__ = ("inner", "policy", "auth", "answers", "dynamic", "errors", "to_https",
                 "upgrades", "geo", "user_policy", "plain")

    def __init__(self, inner, policy: Policy | None, auth, dynamic, errors,
                 answers: dict | None = None, to_https=None, geo=None,
                 user_policy=None) -> None:
        self.inner = inner
        self.policy = policy
        self.auth = auth              # nestgate.handlers.auth.portal.SignIn, or None
        # session key (policy.session_key: user and factors; the `User` of one who
        # signed in through a provider as nobody configured) -> the handler answering it
        self.answers = answers
        self.user_policy = user_policy   # the nestgate.handlers.auth.policy.UserPolicy compiled in
        self.dynamic = dynamic
        self.errors = errors          # the site's ErrorPages: its 403
        self.to_https = to_https      # the redirect of plain-HTTP requests, or None
        self.upgrades = getattr(inner, "upgrades", False)
        self.geo = geo                # nestgate.pipeline.geoip.GeoLookup: the 403 names the country
        # No sign-in and no redirect to HTTPS: whoever the network rules let in (PASS or
        # SIGN_IN) gets the route itself.
        self.plain = auth is None and to_https is None

    def admit(self, conn, headers):
        """The handler that answers this request."""
        client = conn.client
        dynamic = self.dynamic
        cache = conn.decisions
        if cache is None:
            cache = conn.decisions = {}
        # Keyed by policy: every gate of a site shares one decision per connection.
        hit = cache.get(self.policy)
        if hit is not None and hit[0] == client and hit[1] == dynamic.version:
            verdict = hit[2]
        else:
            verdict = self.decide(client)
            cache[self.policy] = (client, dynamic.version, verdict)
        if verdict and self.plain:           # (DENY is 0)
            return self.inner
        if verdict == DENY:
            return self.errors.forbidden(client, headers,
                                         self.geo.country(client) if self.geo else "")
        if verdict == PASS:
            return self.inner
        if self.to_https is not None and conn.known_plain:
            return self.to_https
        if self.auth is None:
            return self.inner
        return self.auth.admit(self, headers, client, conn)

    def decide(self, client: str) -> int:
        return network_verdict(self.policy, self.dynamic, client)


def network_verdict(policy: Policy | None, dynamic, client: str) -> int:
    """DENY, PASS or SIGN_IN for `client` under a compiled network `policy` (None: the
    site has none) and the dynamic allow-list: what a gate decides, and what a
    forward-auth question about the route is decided by (nestgate.handlers.auth.provider)."""
    if policy is not None:
        return policy.verdict(client, dynamic)
    # Sign-in only: dynamic entries (post-login IP grants) still skip it.
    if dynamic.networks and client in dynamic.networks:
        return PASS
    return SIGN_IN


class Forbidden:
    """`policy = "deny"`: the site's 403 for everyone the network rules let this far."""

    is_async = GATED
    __slots__ = ("errors",)

    def __init__(self, errors) -> None:
        self.errors = errors

    def admit(self, conn, headers):
        return self.errors.forbidden(conn.client, headers)


# The network keys of a route that asks no network question of its own: the
# forward-auth endpoints, which decide with the rules of the site asked about.
OPEN = AccessConfig(allow_dynamic=False)
