"""Access control: who may reach a site or route, decided once per connection.

A site with an access list or sign-in hands its `SiteRoutes` a guard
(`Gateway.site_guard`) that wraps every handler the table is given in a `Gate`, at load
and while serving, so no route of the site escapes it. The engine sees `is_async is GATED` and asks `gate.admit(conn, headers)`
for the handler that really answers: the route's own, the built-in 403, or the
sign-in check. Routes without a gate never reach this module.

The verdict for a client address is kept on the connection (`conn.decisions`),
keyed by policy, so a kept-alive connection pays for the lookup once; it is
recomputed only when the client address changes (X-Forwarded-For) or the dynamic
allow-list changes (its `version`).

Order (an address CrowdSec's Local API decided on never gets this far: it is refused
at accept, in the ban table, nestgate.crowdsec): deny wins (the CIDRs, then `deny_countries` and `deny_asn`, looked up in the [geoip]
databases, nestgate.geoip); then the local exemption and dynamic allow entries admit
without sign-in; then, when there are allow lists, one of them must hold the address
(`allow`, `allow_countries`, `allow_asn`: any one admits). An address the databases
do not place (a private one) is in no country and no AS. A GeoIP database read anew
changes verdicts as the allow-list does (`dynamic.changed`).

Then, on a protected site, who signed in: the route's (or site's) user policy
(nestgate.auth.policy) is compiled with the route into `Gate.answers`, the handler
each configured user gets: the route itself (a proxy route bound to the user's identity
headers) or the page saying why not. A request costs one lookup on its session's user.
A plain-HTTP request that needs sign-in, where the config has an HTTPS listener and
Secure cookies, is sent there (308) instead of a sign-in form that could not work.
"""

from __future__ import annotations

from dataclasses import dataclass

from nestgate.clientip import LOCAL, Networks, parse_networks
from nestgate.handlers import GATED, Service, TellsIdentity
from nestgate.routing import unguarded

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
                 "upgrades", "geo", "user_policy")

    def __init__(self, inner, policy: Policy | None, auth, dynamic, errors,
                 answers: dict | None = None, to_https=None, geo=None,
                 user_policy=None) -> None:
        self.inner = inner
        self.policy = policy
        self.auth = auth              # nestgate.auth.portal.SignIn, or None
        # session key (policy.session_key: user and factors; the `User` of one who
        # signed in through a provider as nobody configured) -> the handler answering it
        self.answers = answers
        self.user_policy = user_policy   # the nestgate.auth.policy.UserPolicy compiled in
        self.dynamic = dynamic
        self.errors = errors          # the site's ErrorPages: its 403
        self.to_https = to_https      # the redirect of plain-HTTP requests, or None
        self.upgrades = getattr(inner, "upgrades", False)
        self.geo = geo                # nestgate.geoip.GeoLookup: the 403 names the country

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
        if verdict == DENY:
            return self.errors.forbidden(client, headers,
                                         self.geo.country(client) if self.geo else "")
        if verdict == PASS:
            return self.inner
        if self.to_https is not None and conn.ctx.scheme == "http" and not conn.xff_trusted \
                and not conn.ctx.proxy_protocol_from:
            return self.to_https
        if self.auth is None:
            return self.inner
        return self.auth.admit(self, headers, client)

    def decide(self, client: str) -> int:
        return network_verdict(self.policy, self.dynamic, client)


def network_verdict(policy: Policy | None, dynamic, client: str) -> int:
    """DENY, PASS or SIGN_IN for `client` under a compiled network `policy` (None: the
    site has none) and the dynamic allow-list: what a gate decides, and what a
    forward-auth question about the route is decided by (nestgate.auth.provider)."""
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


def needs_gateway(config) -> bool:
    """True when some site or route has an access list or sign-in, or [[auth.forward]]
    guards hosts for another proxy."""
    return any(
        site.access or site.protected or any(r.access for r in site.routes)
        for site in config.sites) or bool(config.auth and config.auth.forward)


# The network keys of a route that asks no network question of its own: the
# forward-auth endpoints, which decide with the rules of the site asked about.
OPEN = AccessConfig(allow_dynamic=False)


class Gateway(Service):
    """Builds the gates of one config and owns what they share: the store (sessions,
    dynamic allow-list) and the sign-in portal. A worker `start`s it on its loop."""

    def __init__(self, config, geo=None) -> None:
        self.config = config
        self.state = None
        self.signin = None
        self.provider = None                    # nestgate.auth.oidc.endpoints.OpenIDProvider
        self.passkeys = None                    # nestgate.auth.passkeys, with the sign-in
        self.geo = geo                          # nestgate.geoip.GeoLookup, or None
        self.dynamic = NoDynamic()
        if config.auth is not None:
            from nestgate.auth.store import SharedState
            self.state = SharedState(config.auth.store)
            self.dynamic = self.state.dynamic
            if any(site.protected for site in config.sites) or config.auth.forward:
                from nestgate.auth.oidc.client import known_groups
                from nestgate.auth.passkeys import Passkeys
                from nestgate.auth.portal import SignIn
                self.signin = SignIn(config.auth, self.state, self.answer_for,
                                     known_groups(config))
                if config.auth.provider is not None:
                    from nestgate.auth.oidc.endpoints import OpenIDProvider
                    self.provider = OpenIDProvider(config.auth, self.signin)
                self.passkeys = Passkeys(self.signin)
        if geo is not None:
            # A database read anew changes verdicts: the connections' cached ones are
            # dropped as when the allow-list changes.
            geo.on_change = self.dynamic.changed
        self.authz = None                       # forward-auth answers (nestgate.auth.provider)
        self._policies: dict[int, Policy] = {}
        self.to_https = https_redirect(config)
        self._verdicts_of: dict = {}            # UserPolicy -> user name -> verdict
        self._lines: dict[str, bytes] | None = None   # user name -> identity header lines
        if self.state is not None:
            from nestgate.auth.store import POLL_INTERVAL
            self.tick_every = POLL_INTERVAL     # the store's allow-list poll

    def start(self) -> None:
        if self.state is not None:
            self.state.start()

    def stop(self) -> None:
        if self.state is not None:
            self.state.stop()
        if self.provider is not None:
            self.provider.stop()

    def tick(self, now: float) -> None:
        self.state.tick(now)                 # (ticked only when it has a state)

    def _policy(self, cfg: AccessConfig | None) -> Policy | None:
        if cfg is None:
            return None
        policy = self._policies.get(id(cfg))
        if policy is None:
            policy = self._policies[id(cfg)] = Policy(cfg, self.geo)
        return policy

    def gate(self, handler, access: AccessConfig | None, protected: bool, errors,
             policy=None):
        """`handler` behind the network rules of `access` and, on a protected site, the
        sign-in and user `policy` (nestgate.auth.policy.UserPolicy; None: the default)."""
        from nestgate.auth.policy import DEFAULT_POLICY
        policy = policy or DEFAULT_POLICY
        if protected and policy.policy == "deny":
            handler, protected = Forbidden(errors), False
        elif protected and policy.policy == "bypass":
            return self.gate(handler, access, False, errors)
        if access is None and not protected:
            return handler
        answers = self.answers(handler, policy) if protected else None
        return Gate(handler, self._policy(access), self.signin if protected else None,
                    self.dynamic, errors, answers, self.to_https if protected else None,
                    self.geo, policy)

    def answers(self, handler, policy) -> dict:
        """The handler each configured user gets at a route under `policy`: the route
        (told who the user is, where it forwards) or the page saying why not. Routes
        added while serving (notes pages) pay for this too, so the users' verdicts
        and header lines are worked out once per policy and user."""
        from nestgate.auth.policy import ALLOWED, session_user
        out = {}
        lines_of = self._identity_lines()
        told: dict[str, object] = {}            # user -> the route told who they are
        for key, verdict in self._verdicts(policy).items():
            user = session_user(key)            # keys: a user's sessions of 2 and 1 factors
            if verdict == ALLOWED and user in told:
                out[key] = told[user]
                continue
            out[key] = self._answer(handler, user, verdict, lines_of[user])
            if verdict == ALLOWED:
                told[user] = out[key]
        return out

    def _answer(self, handler, user: str, verdict: str, lines: bytes):
        from nestgate.auth.policy import ALLOWED
        if verdict != ALLOWED:
            return self.signin.refusal(user, verdict)
        return handler.with_identity(lines) \
            if lines and isinstance(handler, TellsIdentity) else handler

    def answer_for(self, gate: Gate, user):
        """The handler `gate`'s route gives a user no configured name stands for (one
        who signed in through a provider: nestgate.auth.config.User), worked out on
        their first request and kept with the route's answers while there are fewer
        than MAX_KEPT_ANSWERS of them."""
        from nestgate.auth.identity import identity_lines
        from nestgate.auth.policy import decide
        # A provider's sign-in is one factor (nestgate.auth.policy).
        handler = self._answer(gate.inner, user.name, decide(gate.user_policy, user, False),
                               identity_lines(self.config.auth.identity_headers, user))
        if len(gate.answers) < MAX_KEPT_ANSWERS:
            gate.answers[user] = handler
        return handler

    def _verdicts(self, policy) -> dict[str, str]:
        from nestgate.auth.policy import verdicts
        found = self._verdicts_of.get(policy)
        if found is None:
            found = self._verdicts_of[policy] = verdicts(policy, self.config.auth.users)
        return found

    def _identity_lines(self) -> dict[str, bytes]:
        if self._lines is None:
            from nestgate.auth.identity import identity_lines
            auth = self.config.auth
            self._lines = {u.name: identity_lines(auth.identity_headers, u) for u in auth.users}
        return self._lines

    def site_guard(self, site_config, errors):
        """The guard a site's `SiteRoutes` applies to every handler it is given: the
        route's own access list or else the site's, the route's own user policy or else
        the site's, and the site's sign-in unless the route is the sign-in portal."""
        site_access, protected = site_config.access, site_config.protected
        if site_access is None and not protected \
                and not any(r.access for r in site_config.routes):
            return unguarded

        def guard(handler, access=None, sign_in=True, limit=None, label="", policy=None):
            if isinstance(handler, Gate):
                raise ValueError("a handler is guarded once, by its site")
            if protected and not sign_in:       # the portal: only the HTTPS redirect
                return self.portal_gate(handler, access or site_access, errors)
            return self.gate(handler, access or site_access, protected and sign_in, errors,
                             policy or site_config.policy)
        return guard

    def portal_gate(self, handler, access, errors):
        if self.to_https is None:
            return self.gate(handler, access, False, errors)
        return Gate(handler, self._policy(access), None, self.dynamic, errors, None,
                    self.to_https, self.geo)

    def add_portal(self, site, site_config) -> None:
        """The sign-in, sign-out and account pages of a protected site (and the passkey
        ceremony's), behind its access list, and the forward-auth endpoints, which decide
        with the rules of the site asked about (so this site's own network rules do not
        stand before them). The account page checks the session itself: a user whom the
        site's policy refuses (one factor where two are needed) must still reach it to
        add a passkey."""
        if site_config.protected:
            from nestgate.auth.config import (AUTH_REQUEST_PATH, FORWARD_AUTH_PATH,
                                              LOGIN_PATH, LOGOUT_PATH)
            site.add_exact(LOGIN_PATH, self.signin.login, "auth-login", sign_in=False)
            site.add_exact(LOGOUT_PATH, self.signin.logout, "auth-logout", sign_in=False)
            if self.provider is not None and self.provider.server.cfg.host in site_config.hosts:
                self.provider.add_routes(site)
            for path, handler, label in self.passkeys.routes():
                site.add_exact(path, handler, label, sign_in=False)
            for path, handler in self.signin.provider_pages():
                site.add_exact(path, handler, "auth-oidc", sign_in=False)
            authz = self._authz()
            authz.questions.add_site(site_config, self.question)
            site.add_exact(FORWARD_AUTH_PATH, authz.forward_auth, "forward-auth",
                           access=OPEN, sign_in=False)
            site.add_exact(AUTH_REQUEST_PATH, authz.auth_request, "auth-request",
                           access=OPEN, sign_in=False)

    def _authz(self):
        if self.authz is None:
            from nestgate.auth.identity import identity_pairs
            from nestgate.auth.provider import Provider, Questions
            auth = self.config.auth
            pairs = {u.name: identity_pairs(auth.identity_headers, u) for u in auth.users}
            self.authz = Provider(self.signin, Questions(), pairs,
                                  auth.identity_headers.names())
        return self.authz

    def question(self, access: AccessConfig | None, policy):
        """The forward-auth question of a route under `access` and user `policy`
        (None: the default), from the parts its gate is compiled from."""
        from nestgate.auth.policy import DEFAULT_POLICY
        from nestgate.auth.provider import Question
        policy = policy or DEFAULT_POLICY
        return Question(self._policy(access), self.dynamic, policy,
                        self._verdicts(policy) if policy.signs_in else {})


def https_redirect(config):
    """Where plain-HTTP requests to a protected site go: the first HTTPS listener, when
    sign-in needs one (Secure cookies); None when there is none."""
    auth = config.auth
    listener = next((l for l in config.listeners if l.tls), None)
    if auth is None or not auth.cookie_secure or listener is None or listener.port == 0:
        return None                 # (port 0: the kernel's choice, not known here)
    from nestgate.handlers.redirect import HttpsRedirect
    return HttpsRedirect(listener.port)
