"""Host -> site -> route, compiled once per config load.

Exact hosts and exact paths are single dict lookups; `*.example.com` wildcards and
path prefixes are checked longest first; `{name}` segments are matched by segment
count. The Host header as received (with its port) is memoised, bounded, so a
busy site costs one dict lookup per request.
"""

from __future__ import annotations

from typing import Any

from nestgate.errors import RequestError

NO_PARAMS: dict[str, str] = {}
_MEMO_LIMIT = 4096
FOUND_LIMIT = 1024            # raw paths remembered per site, each at most FOUND_PATH_MAX
FOUND_PATH_MAX = 256
_HOST_CHARS = (b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
               b"-._~!$&'()*+,;=%:[]")


def valid_host(value: bytes) -> bool:
    """uri-host [ ":" port ]: nothing outside the host characters, digits for a port
    (an IPv6 literal's colons are not a port)."""
    if value.translate(None, _HOST_CHARS):
        return False
    _, colon, port = value.rpartition(b":")
    return not colon or b"]" in port or port.isdigit() or port == b""


def host_name(raw: bytes) -> bytes:
    """Lower-case host without port or trailing dot, from a Host header value."""
    raw = raw.strip().lower()
    if raw.startswith(b"["):                      # [v6]:port
        end = raw.find(b"]")
        return raw[: end + 1] if end > 0 else raw
    if raw.count(b":") == 1:
        raw = raw.split(b":", 1)[0]
    return raw.rstrip(b".")


class SiteRoutes:
    """One site's compiled route table."""

    def __init__(self, name: str, not_found) -> None:
        self.name = name
        self.not_found = not_found
        self.exact: dict[str, tuple[Any, dict, str]] = {}
        # The same exact routes keyed by the raw request path: a request whose path
        # needs no decoding is routed without decoding it.
        self.exact_raw: dict[bytes, tuple[Any, dict, str, str]] = {}
        self.prefixes: list[tuple[str, Any, str]] = []
        self.patterns: dict[int, list[tuple[tuple[str, ...], Any, str]]] = {}
        self.miss = (not_found, NO_PARAMS, "")
        # Raw paths that needed decoding or a prefix walk, with what they routed to
        # (UVHTTP's hot-route cache): a busy prefix route is then one dict lookup too.
        # Bounded, and emptied whenever the table changes.
        self.found: dict[bytes, tuple[Any, dict, str, str]] = {}

    def remember(self, raw_path: bytes, route: tuple) -> None:
        if route[1] is NO_PARAMS and len(raw_path) <= FOUND_PATH_MAX:
            if len(self.found) >= FOUND_LIMIT:
                self.found.clear()
            self.found[raw_path] = route

    def remove_exact(self, path: str) -> None:
        self.exact.pop(path, None)
        self.exact_raw.pop(path.encode(), None)
        self.found.clear()

    def add_exact(self, path: str, handler, label: str | None = None) -> None:
        self.found.clear()
        if "{" in path:
            segments = tuple(path.strip("/").split("/"))
            self.patterns.setdefault(len(segments), []).append((segments, handler, path))
        else:
            self.exact[path] = (handler, NO_PARAMS, label or path)
            self.exact_raw[path.encode()] = (handler, NO_PARAMS, label or path, path)

    def add_prefix(self, prefix: str, handler, label: str | None = None) -> None:
        self.found.clear()
        self.prefixes.append((prefix, handler, label or prefix + "*"))
        self.prefixes.sort(key=lambda entry: len(entry[0]), reverse=True)

    def lookup(self, path: str) -> tuple[Any, dict, str]:
        """(handler, params, route label); the site's 404 when nothing matches."""
        hit = self.exact.get(path)
        if hit is not None:
            return hit
        if self.patterns:
            segments = path.strip("/").split("/")
            for pattern, handler, label in self.patterns.get(len(segments), ()):
                params = _match(pattern, segments)
                if params is not None:
                    return handler, params, label
        for prefix, handler, label in self.prefixes:
            if path.startswith(prefix):
                return handler, NO_PARAMS, label
        return self.miss


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
        # Host header value as received -> site; only valid values get in.
        self.memo: dict[bytes, SiteRoutes] = {}

    def add_site(self, hosts, site: SiteRoutes) -> None:
        for host in hosts:
            if host == "*":
                self.catch_all = self.catch_all or site
            elif host.startswith("*."):
                self.wildcards.append((host[1:].encode(), site))
                self.wildcards.sort(key=lambda entry: len(entry[0]), reverse=True)
            else:
                self.exact.setdefault(host.encode(), site)

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
