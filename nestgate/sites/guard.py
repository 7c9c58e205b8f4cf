"""A site's guard, compiled in one place and handed to its route table.

The guard is what every handler a site's `SiteRoutes` is given passes through, at
load and while serving (notes pages), so no route exists without it. From the outside
in: the site's (or route's) rate limit (nestgate.pipeline.ratelimit), the network rules and
sign-in with its user policy (`Gateway`: the `Gate`s of nestgate.pipeline.access, the portal
of nestgate.handlers.auth), asking another auth server first (`forward_auth`,
nestgate.handlers.auth.delegate), and the [[ban]] rules that watch the route's answers or the
site's 404s (nestgate.bans.watch). A site that needs none of these gets its handlers
as they are.

`Guards` is one config load's: it owns what the sites' guards share (the store and
portal, the rate sync, the forward-auth servers) and builds each site's table.
"""

from __future__ import annotations

from nestgate.pipeline.access import (MAX_KEPT_ANSWERS, OPEN, AccessConfig, Forbidden, Gate,
                                      NoDynamic, Policy)
from nestgate.bans.watch import BANS, NotedNotFound
from nestgate.base.handler import Service, TellsIdentity
from nestgate.pipeline.ratelimit import limiting, rate_sync
from nestgate.pipeline.routing import SiteRoutes, unguarded


class Guards:
    """The guards of one config's sites, and the services they share (started by the
    worker with the router's)."""

    def __init__(self, config, geo=None) -> None:
        self.gateway = Gateway(config, geo) if needs_gateway(config) else None
        self.sync = rate_sync(config)           # limits shared through Redis, or None
        self.auth_servers: dict = {}            # forward_auth table -> its auth server
        self.services = [s for s in (self.gateway, self.sync) if s is not None]
        # The 404 of a path no route matches, told to the [[ban]] rules that count it.
        self.note_unmatched = NotedNotFound if BANS.unmatched_404 else None

    def table(self, site_config, errors) -> SiteRoutes:
        """The site's empty route table, with its guard: every route added to it, now
        or while serving, is compiled with the site's rules."""
        return SiteRoutes(site_config.name, errors[404], self.guard(site_config, errors),
                          errors, note_unmatched=self.note_unmatched)

    def unclaimed(self, errors) -> SiteRoutes:
        """The table of Hosts no site claims: no routes, only its 404."""
        return SiteRoutes("", errors[404], errors=errors, note_unmatched=self.note_unmatched)

    def guard(self, site_config, errors):
        gateway = self.gateway
        guard = gateway.site_guard(site_config, errors) if gateway else unguarded
        guard = limiting(guard, site_config, errors, gateway.signin if gateway else None,
                         self.sync)
        if site_config.forward_auth is not None:
            from nestgate.handlers.auth.delegate import delegating
            guard = delegating(guard, site_config, self.auth_servers)
        return watched(guard, site_config.name)

    def route_handler(self, handler, route):
        """A configured route's handler, asking the route's own auth server first
        (its `forward_auth`) when it has one; the site's guard is added with it."""
        if route.forward_auth is None:
            return handler
        from nestgate.handlers.auth.delegate import delegated
        return delegated(handler, route, self.auth_servers)

    def add_portal(self, site: SiteRoutes, site_config) -> None:
        """The sign-in pages and forward-auth endpoints of a protected site."""
        if self.gateway is not None:
            self.gateway.add_portal(site, site_config)


def watched(guard, site: str):
    """`guard` with the [[ban]] rules that watch a route's answers outside it: what
    the rules count is the answer the client gets, the guard's refusals included.
    The site's own 404 (label "-") is told per unmatched path instead (`Guards.table`)."""
    def watched_guard(handler, access=None, sign_in=True, limit=None, label="", policy=None):
        handler = guard(handler, access, sign_in, limit, label, policy)
        return handler if label == "-" else BANS.watching(site, label, handler)
    return watched_guard


def needs_gateway(config) -> bool:
    """True when some site or route has an access list or sign-in, or [[auth.forward]]
    guards hosts for another proxy."""
    return any(
        site.access or site.protected or any(r.access for r in site.routes)
        for site in config.sites) or bool(config.auth and config.auth.forward)


class Gateway(Service):
    """Builds the gates of one config and owns what they share: the store (sessions,
    dynamic allow-list) and the sign-in portal. A worker `start`s it on its loop."""

    def __init__(self, config, geo=None) -> None:
        self.config = config
        self.state = None
        self.signin = None
        self.provider = None                    # nestgate.handlers.auth.oidc.endpoints.OpenIDProvider
        self.passkeys = None                    # nestgate.handlers.auth.passkeys, with the sign-in
        self.geo = geo                          # nestgate.pipeline.geoip.GeoLookup, or None
        self.dynamic = NoDynamic()
        if config.auth is not None:
            from nestgate.handlers.auth.store import SharedState
            self.state = SharedState(config.auth.store)
            self.dynamic = self.state.dynamic
            if any(site.protected for site in config.sites) or config.auth.forward:
                from nestgate.handlers.auth.oidc.client import known_groups
                from nestgate.handlers.auth.passkeys import Passkeys
                from nestgate.handlers.auth.portal import SignIn
                self.signin = SignIn(config.auth, self.state, self.answer_for,
                                     known_groups(config))
                if config.auth.provider is not None:
                    from nestgate.handlers.auth.oidc.endpoints import OpenIDProvider
                    self.provider = OpenIDProvider(config.auth, self.signin)
                self.passkeys = Passkeys(self.signin)
        if geo is not None:
            # A database read anew changes verdicts: the connections' cached ones are
            # dropped as when the allow-list changes.
            geo.on_change = self.dynamic.changed
        self.authz = None                       # forward-auth answers (nestgate.handlers.auth.provider)
        self._policies: dict[int, Policy] = {}
        self.to_https = https_redirect(config)
        self._verdicts_of: dict = {}            # UserPolicy -> user name -> verdict
        self._lines: dict[str, bytes] | None = None   # user name -> identity header lines
        if self.state is not None:
            from nestgate.handlers.auth.store import POLL_INTERVAL
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
        if self.signin is not None:
            self.signin.tunnels.sweep()

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
        sign-in and user `policy` (nestgate.handlers.auth.policy.UserPolicy; None: the default)."""
        from nestgate.handlers.auth.policy import DEFAULT_POLICY
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
        from nestgate.handlers.auth.policy import ALLOWED, session_user
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
        from nestgate.handlers.auth.policy import ALLOWED
        if verdict != ALLOWED:
            return self.signin.refusal(user, verdict)
        return handler.with_identity(lines) \
            if lines and isinstance(handler, TellsIdentity) else handler

    def answer_for(self, gate: Gate, user):
        """The handler `gate`'s route gives a user no configured name stands for (one
        who signed in through a provider: nestgate.handlers.auth.config.User), worked out on
        their first request and kept with the route's answers while there are fewer
        than MAX_KEPT_ANSWERS of them."""
        from nestgate.handlers.auth.identity import identity_lines
        from nestgate.handlers.auth.policy import decide
        # A provider's sign-in is one factor (nestgate.handlers.auth.policy).
        handler = self._answer(gate.inner, user.name, decide(gate.user_policy, user, False),
                               identity_lines(self.config.auth.identity_headers, user))
        if len(gate.answers) < MAX_KEPT_ANSWERS:
            gate.answers[user] = handler
        return handler

    def _verdicts(self, policy) -> dict[str, str]:
        from nestgate.handlers.auth.policy import verdicts
        found = self._verdicts_of.get(policy)
        if found is None:
            found = self._verdicts_of[policy] = verdicts(policy, self.config.auth.users)
        return found

    def _identity_lines(self) -> dict[str, bytes]:
        if self._lines is None:
            from nestgate.handlers.auth.identity import identity_lines
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
            from nestgate.handlers.auth.config import (AUTH_REQUEST_PATH, FORWARD_AUTH_PATH,
                                                       LOGIN_PATH, LOGOUT_PATH)
            site.add_exact(LOGIN_PATH, self.signin.login, "auth-login", sign_in=False)
            site.add_exact(LOGOUT_PATH, self.signin.logout, "auth-logout", sign_in=False)
            if self.provider is not None and self.provider.server.cfg.host in site_config.hosts:
                self.provider.add_routes(site)
            for path, handler, label in self.passkeys.routes():
                site.add_exact(path, handler, label, sign_in=False)
            if self.signin.providers:            # Authlib and httpx only then
                from nestgate.handlers.auth.oidc.signin_pages import provider_pages
                for path, handler in provider_pages(self.signin):
                    site.add_exact(path, handler, "auth-oidc", sign_in=False)
            authz = self._authz()
            authz.questions.add_site(site_config, self.question)
            site.add_exact(FORWARD_AUTH_PATH, authz.forward_auth, "forward-auth",
                           access=OPEN, sign_in=False)
            site.add_exact(AUTH_REQUEST_PATH, authz.auth_request, "auth-request",
                           access=OPEN, sign_in=False)

    def _authz(self):
        if self.authz is None:
            from nestgate.handlers.auth.identity import identity_pairs
            from nestgate.handlers.auth.provider import Provider, Questions
            auth = self.config.auth
            pairs = {u.name: identity_pairs(auth.identity_headers, u) for u in auth.users}
            self.authz = Provider(self.signin, Questions(), pairs,
                                  auth.identity_headers.names())
        return self.authz

    def question(self, access: AccessConfig | None, policy):
        """The forward-auth question of a route under `access` and user `policy`
        (None: the default), from the parts its gate is compiled from."""
        from nestgate.handlers.auth.policy import DEFAULT_POLICY
        from nestgate.handlers.auth.provider import Question
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
