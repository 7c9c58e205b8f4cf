"""Host -> site -> route, compiled once per config load and owned here.

Exact hosts and exact paths are single dict lookups; `*.example.com` wildcards and
path prefixes are checked longest first; `{name}` segments are matched by segment
count. The Host header as received (with its port) is memoised, bounded, so a
busy site costs one dict lookup per request.
"""

from __future__ import annotations

import re
from typing import Any

from nestgate.base.errorpages import DEFAULT_PAGES
from nestgate.base.errors import RequestError, RouteTaken
from nestgate.base.hosts import host_name, valid_host
from nestgate.base.paths import decode_path
from nestgate.base.route import NO_PARAMS, Route
from nestgate.base.tally import TALLY

_MEMO_LIMIT = 4096
FOUND_LIMIT = 1024            # raw paths remembered per site, each at most FOUND_PATH_MAX
FOUND_PATH_MAX = 256
def unguarded(handler, access=None, sign_in: bool = True, limit=None, label: str = "",
              policy=None):
    """The guard of a site without access control or limits: every handler as it is.
    A guard is called with the route's own access list and rate limit (each None:
    the site's), whether sign-in applies, the route's label and its own user policy
    (None: the site's)."""
    return handler


def path_shape(path: str) -> str:
    """A path as the table tells routes apart: `{name}` segments are all alike, so
    `/n/{slug}` and `/n/{name}` are the same route."""
    return re.sub(r"\{[^/}]*\}", "{}", path)


class SiteRoutes:
    """One site's compiled route table, and the only writer of it.

    Every handler goes through the site's `guard` as it is added, at load or while
    serving (notes pages register themselves when first rendered), so a route cannot
    exist without the site's rate limit, access list and sign-in (Caddy compiles each
    route's chain the same way). Tables are read by the engines, never written outside here.

    An exact or `{name}` path is one route's for as long as the table lives, unless
    that route's owner removes it: adding it again raises `RouteTaken`, whoever asks
    (a configured route, the health check, a notes page registered while serving), and
    `remove_exact` takes out only the entry added with the handler it is given.
    """

    def __init__(self, name: str, not_found, guard=unguarded, errors=DEFAULT_PAGES, *,
                 note_unmatched=None) -> None:
        self.name = name
        self.guard = guard
        # (handler, site, path) -> the 404 of an unmatched path as it is answered: set
        # by the site's guard (nestgate.sites.guard) when a [[ban]] rule counts those 404s.
        self.note_unmatched = note_unmatched
        self.errors = errors          # nestgate.base.errorpages.ErrorPages
        self.exact: dict[str, Route] = {}
        # The same exact routes keyed by the raw request path: a request whose path
        # needs no decoding is routed without decoding it.
        self.exact_raw: dict[bytes, Route] = {}
        self.prefixes: list[tuple[str, Any, str, Any]] = []
        # A prefix route's path without its last "/" (`/admin` for `/admin/`) -> the
        # route that sends it there (`add_prefix`'s `slashless`), before shorter prefixes.
        self.slashless: dict[str, Route] = {}
        # path_shape(path) -> (the handler as its owner gave it, the route's label):
        # who holds each exact and {name} path.
        self.owners: dict[str, tuple[Any, str]] = {}
        self.patterns: dict[int, list[tuple[tuple[str, ...], Any, str, Any]]] = {}
        self.not_found = guard(not_found, label="-")
        self.unmatched = TALLY.route(name, "-")     # answers of paths no route matched
        # Raw paths that needed decoding or a prefix walk, with what they routed to
        # (UVHTTP's hot-route cache): a busy prefix route is then one dict lookup too.
        # Bounded, and emptied whenever the table changes.
        self.found: dict[bytes, Route] = {}

    def add_exact(self, path: str, handler, label: str | None = None, *,
                  access=None, sign_in: bool = True, limit=None, policy=None) -> None:
        """An exact path, or a pattern with `{name}` segments. `access`, `limit` and
        `policy` replace the site's list, rate limit and user policy for this route;
        `sign_in=False` leaves sign-in out (the portal). RouteTaken when the site has a
        route on that path."""
        shape = path_shape(path)
        held = self.owners.get(shape)
        if held is not None:
            raise RouteTaken(self.name, path, label or path, held[1])
        owner = handler
        handler = self.guard(handler, access, sign_in, limit, label or path, policy)
        self.owners[shape] = (owner, label or path)
        self.found.clear()
        if "{" in path:
            segments = tuple(path.strip("/").split("/"))
            self.patterns.setdefault(len(segments), []).append(
                (segments, handler, path, TALLY.route(self.name, label or path)))
        else:
            route = Route(handler, NO_PARAMS, label or path, path, self.errors,
                          TALLY.route(self.name, label or path))
            self.exact[path] = route
            self.exact_raw[path.encode()] = route

    def add_prefix(self, prefix: str, handler, label: str | None = None, *,
                   access=None, sign_in: bool = True, limit=None, policy=None,
                   slashless=None) -> None:
        """A prefix route; with `slashless`, a handler that answers the prefix without
        its last "/" (a redirect to it), behind the same guard, so that `/admin` is not
        left to a shorter prefix's access list when the route is `/admin/`."""
        label = label or prefix + "*"
        handler = self.guard(handler, access, sign_in, limit, label, policy)
        self.found.clear()
        tally = TALLY.route(self.name, label)
        self.prefixes.append((prefix, handler, label, tally))
        self.prefixes.sort(key=lambda entry: len(entry[0]), reverse=True)
        self.slashless.pop(prefix, None)         # a route of its own on that path wins
        bare = prefix[:-1]
        if slashless is not None and bare and prefix.endswith("/") \
                and not any(p == bare for p, *_ in self.prefixes):
            self.slashless[bare] = Route(self.guard(slashless, access, sign_in, limit, label,
                                                    policy),
                                         NO_PARAMS, label, bare, self.errors, tally)

    def holder(self, path: str):
        """(the handler as its owner gave it, the route's label) of the exact or
        `{name}` route that holds `path`, or None when no route does."""
        return self.owners.get(path_shape(path))

    def remove_exact(self, path: str, handler) -> bool:
        """Take out the exact route on `path` if `handler` is the one it was added
        with; a route another owner holds there stays. True when it was removed."""
        held = self.owners.get(path)
        if "{" in path or held is None or held[0] is not handler:
            return False
        del self.owners[path]
        self.exact.pop(path, None)
        self.exact_raw.pop(path.encode(), None)
        self.found.clear()
        return True

    # HTTP-01 answers, before every route: the prefix and handler the certificates'
    # side gives (nestgate.certs.challenge), unguarded, as the CA must reach them.
    challenge: Route | None = None
    challenge_prefix = ""

    def answer_challenges(self, prefix: str, handler) -> None:
        self.challenge_prefix = prefix
        self.challenge = Route(handler, NO_PARAMS, "acme-challenge", "", self.errors,
                               TALLY.route(self.name, "acme-challenge"))

    def route(self, raw_path: bytes) -> Route:
        """The route for a raw request path (without its query)."""
        return self.exact_raw.get(raw_path) or self.found.get(raw_path) \
            or self._route_decoded(raw_path)

    def _route_decoded(self, raw_path: bytes) -> Route:
        if 35 in raw_path:                      # "#"
            raise RequestError(400, "fragment in request target")
        path = decode_path(raw_path)
        challenge = self.challenge
        if challenge is not None and path.startswith(self.challenge_prefix):
            return Route(challenge.handler, NO_PARAMS, challenge.label, path, self.errors,
                         challenge.tally)
        route = self.exact.get(path) or self._walk(path)
        if route.params is NO_PARAMS and len(raw_path) <= FOUND_PATH_MAX:
            if len(self.found) >= FOUND_LIMIT:
                self.found.clear()
            self.found[raw_path] = route
        return route

    def lookup(self, path: str) -> Route:
        """The route for a decoded path; the site's 404 when nothing matches."""
        return self.exact.get(path) or self._walk(path)

    def _walk(self, path: str) -> Route:
        if self.patterns:
            segments = path.strip("/").split("/")
            for pattern, handler, label, tally in self.patterns.get(len(segments), ()):
                params = _match(pattern, segments)
                if params is not None:
                    return Route(handler, params, label, path, self.errors, tally)
        bare = self.slashless.get(path)
        if bare is not None:
            return bare
        for prefix, handler, label, tally in self.prefixes:
            if path.startswith(prefix):
                return Route(handler, NO_PARAMS, label, path, self.errors, tally)
        handler = self.not_found
        if self.note_unmatched is not None:       # a [[ban]] rule counts 404s
            handler = self.note_unmatched(handler, self.name, path)
        return Route(handler, NO_PARAMS, "", path, self.errors, self.unmatched)


def _match(pattern: tuple[str, ...], segments: list[str]) -> dict[str, str] | None:
    params = {}
    for want, got in zip(pattern, segments):
        if want.startswith("{") and want.endswith("}"):
            if not got:
                return None
            params[want[1:-1]] = got
        elif want != got:
            return None
    return params


class Router:
    """Host header -> SiteRoutes; `unclaimed` when no site claims the Host."""

    def __init__(self, unclaimed: SiteRoutes) -> None:
        self.exact: dict[bytes, SiteRoutes] = {}
        self.wildcards: list[tuple[bytes, SiteRoutes]] = []
        self.catch_all: SiteRoutes | None = None
        self.unclaimed = unclaimed              # answers Hosts no site claims
        self.services: list = []                # `Service`s the worker starts and stops
        self.geo = None                         # nestgate.pipeline.geoip.GeoLookup: the log's countries
        # Host header value as received -> site; only valid values get in.
        self.memo: dict[bytes, SiteRoutes] = {}

    def answer_challenges(self, prefix: str, handler) -> None:
        """Answer ACME HTTP-01 challenges (paths under `prefix`) on every site this
        router has."""
        sites = {id(s): s for s in [self.unclaimed, self.catch_all, *self.exact.values(),
                                    *(site for _suffix, site in self.wildcards)] if s}
        for site in sites.values():
            site.answer_challenges(prefix, handler)

    def add_site(self, hosts, site: SiteRoutes) -> None:
        for host in hosts:
            if host == "*":
                self.catch_all = self.catch_all or site
            elif host.startswith("*."):
                self.wildcards.append((host[1:].encode(), site))
                self.wildcards.sort(key=lambda entry: len(entry[0]), reverse=True)
            else:
                self.exact.setdefault(host.encode(), site)

    def route(self, raw_host: bytes, raw_path: bytes) -> Route:
        """The route for a request's Host header value and raw path."""
        return self.site_for(raw_host).route(raw_path)

    def site_for(self, raw_host: bytes) -> SiteRoutes:
        """The site for a Host header value (b"" when an HTTP/1.0 request has none).
        Raises RequestError(400) for a value that is not host[:port] (RFC 9112 3.2)."""
        site = self.memo.get(raw_host)
        if site is not None:
            return site
        if raw_host and not valid_host(raw_host):
            raise RequestError(400, "invalid Host")
        site = self._resolve(host_name(raw_host))
        if len(self.memo) < _MEMO_LIMIT:         # bounded: random Hosts cannot grow it
            self.memo[raw_host] = site
        return site

    def _resolve(self, host: bytes) -> SiteRoutes:
        site = self.exact.get(host)
        if site is not None:
            return site
        for suffix, candidate in self.wildcards:
            if host.endswith(suffix) and len(host) > len(suffix):
                return candidate
        return self.catch_all or self.unclaimed
