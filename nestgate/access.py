"""Access control: who may reach a site or route, decided once per connection.

A route with an access list or sign-in is wrapped in a `Gate` when the router is
built. The engine sees `is_async is GATED` and asks `gate.admit(conn, headers)`
for the handler that really answers: the route's own, the built-in 403, or the
sign-in check. Routes without a gate never reach this module.

The verdict for a client address is kept on the connection (`conn.decisions`),
keyed by policy, so a kept-alive connection pays for the lookup once; it is
recomputed only when the client address changes (X-Forwarded-For) or the dynamic
allow-list changes (its `version`).

Order: deny wins; then the local exemption and dynamic allow entries admit without
sign-in; then the allow list (when there is one) must hold the address.
"""

from __future__ import annotations

from dataclasses import dataclass

from nestgate.clientip import LOCAL, Networks, parse_networks
from nestgate.handlers import GATED   # a handler's `is_async` when `admit` comes first

DENY, PASS, SIGN_IN = 0, 1, 2   # PASS: no sign-in needed; SIGN_IN: allowed, sign-in if protected


@dataclass(frozen=True)
class AccessConfig:
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    exempt_local: bool = False
    allow_dynamic: bool = True


ACCESS_KEYS = ("allow", "deny", "exempt_local", "allow_dynamic")


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
                       s.bool("allow_dynamic", d.allow_dynamic))
    return cfg


def _cidr_list(value) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise ValueError("a list of IP addresses or CIDRs")
    parse_networks(value)            # raises naming each invalid entry
    return tuple(value)


class NoDynamic:
    """Stands in for the dynamic allow-list when there is no store."""
    version = 0
    networks = Networks()


class Policy:
    """The compiled form of an `AccessConfig`."""

    __slots__ = ("allow", "deny", "exempt_local", "allow_dynamic")

    def __init__(self, cfg: AccessConfig) -> None:
        self.allow = parse_networks(cfg.allow)
        self.deny = parse_networks(cfg.deny)
        self.exempt_local = cfg.exempt_local
        self.allow_dynamic = cfg.allow_dynamic

    def verdict(self, client: str, dynamic) -> int:
        if self.deny and client in self.deny:
            return DENY
        if self.exempt_local and client in LOCAL:
            return PASS
        if self.allow_dynamic and dynamic.networks and client in dynamic.networks:
            return PASS
        if self.allow and client not in self.allow:
            return DENY
        return SIGN_IN


class Gate:
    """A route (or a site's 404) behind an access policy and/or sign-in."""

    is_async = GATED
    __slots__ = ("inner", "policy", "auth", "dynamic", "forbidden", "upgrades")

    def __init__(self, inner, policy: Policy | None, auth, dynamic, forbidden) -> None:
        self.inner = inner
        self.policy = policy
        self.auth = auth              # nestgate.auth.portal.SignIn, or None
        self.dynamic = dynamic
        self.forbidden = forbidden
        self.upgrades = getattr(inner, "upgrades", False)

    def admit(self, conn, headers):
        """The handler that answers this request."""
        client = conn.client
        dynamic = self.dynamic
        cache = getattr(conn, "decisions", None)
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
            return self.forbidden
        if verdict == PASS or self.auth is None:
            return self.inner
        return self.auth.admit(self.inner, headers, client)

    def decide(self, client: str) -> int:
        if self.policy is not None:
            return self.policy.verdict(client, self.dynamic)
        # Sign-in only: dynamic entries (post-login IP grants) still skip it.
        if self.dynamic.networks and client in self.dynamic.networks:
            return PASS
        return SIGN_IN

    async def handle(self, request) -> None:
        """For a protocol that does not call `admit` first: decide per request."""
        from nestgate.auth.portal import answer_with
        verdict = self.decide(request.client)
        if verdict == DENY:
            handler = self.forbidden
        elif verdict == PASS or self.auth is None:
            handler = self.inner
        else:
            handler = self.auth.admit(self.inner, request.headers, request.client)
        await answer_with(handler, request)


def needs_gateway(config) -> bool:
    """True when some site or route has an access list or sign-in."""
    return any(site.access or site.protected or any(r.access for r in site.routes)
               for site in config.sites)


class Gateway:
    """Builds the gates of one config and owns what they share: the store (sessions,
    dynamic allow-list) and the sign-in portal. A worker `start`s it on its loop."""

    def __init__(self, config) -> None:
        from nestgate.responses import ERRORS
        self.config = config
        self.forbidden = ERRORS[403]
        self.state = None
        self.signin = None
        self.dynamic = NoDynamic()
        if config.auth is not None:
            from nestgate.auth.store import SharedState
            self.state = SharedState(config.auth.store)
            self.dynamic = self.state.dynamic
            if any(site.protected for site in config.sites):
                from nestgate.auth.portal import SignIn
                self.signin = SignIn(config.auth, self.state)
        self._policies: dict[int, Policy] = {}

    def start(self) -> None:
        if self.state is not None:
            self.state.start()

    def stop(self) -> None:
        if self.state is not None:
            self.state.stop()

    def _policy(self, cfg: AccessConfig | None) -> Policy | None:
        if cfg is None:
            return None
        policy = self._policies.get(id(cfg))
        if policy is None:
            policy = self._policies[id(cfg)] = Policy(cfg)
        return policy

    def gate(self, handler, access: AccessConfig | None, protected: bool):
        if access is None and not protected:
            return handler
        return Gate(handler, self._policy(access), self.signin if protected else None,
                    self.dynamic, self.forbidden)

    def guard(self, handler, site_config, route):
        """A configured route's handler behind its (or its site's) access and sign-in."""
        return self.gate(handler, route.access or site_config.access, site_config.protected)

    def guard_site(self, site, site_config) -> None:
        """Everything else the site answers (health, pages, its 404) behind the site's
        access and sign-in; the sign-in portal behind the access list only."""
        access, protected = site_config.access, site_config.protected
        if access is None and not protected:
            return
        wrap = lambda h: h if isinstance(h, Gate) else self.gate(h, access, protected)
        site.exact = {k: (wrap(h), p, l) for k, (h, p, l) in site.exact.items()}
        site.exact_raw = {k: (wrap(h), p, l, d) for k, (h, p, l, d) in site.exact_raw.items()}
        site.prefixes = [(pre, wrap(h), l) for pre, h, l in site.prefixes]
        site.patterns = {n: [(seg, wrap(h), l) for seg, h, l in entries]
                         for n, entries in site.patterns.items()}
        handler, params, label = site.miss
        site.miss = (wrap(handler), params, label)
        site.found.clear()
        if protected:
            from nestgate.auth.portal import LOGIN_PATH, LOGOUT_PATH
            site.add_exact(LOGIN_PATH, self.gate(self.signin.login, access, False), "auth-login")
            site.add_exact(LOGOUT_PATH, self.gate(self.signin.logout, access, False),
                           "auth-logout")
