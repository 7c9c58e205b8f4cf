"""Route types: for each `type = "..."` of a [[site.route]], the reader of its options
(a typed, frozen object, checked at load with the file and key of any problem) and the
builder of its handler. A new route type is one entry in `ROUTE_TYPES`.

Readers take the route's config section (`config._Section`); builders take the
route, its site's config and the whole config, and import their handler module when
first used, so reading a config does not load the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from nestgate.handlers.proxy.options import proxy_options


@dataclass(frozen=True)
class RouteType:
    read: Callable[[Any], Any]                  # config section -> options
    build: Callable[[Any, Any, Any], Any]       # (route, site config, config) -> handler
    # What `build` imports: the supervisor imports it before forking the workers, so that
    # the workers share those pages instead of each importing its own copy.
    modules: tuple[str, ...] = ()


@dataclass(frozen=True)
class ReturnOptions:
    status: int
    body: bytes
    content_type: str
    compress: bool = True                       # kept in br/zstd/gzip when text


@dataclass(frozen=True)
class RedirectOptions:
    to: str
    status: int


@dataclass(frozen=True)
class StaticOptions:
    """Files from `root` (see nestgate/handlers/static.py and docs/site.md)."""
    root: str
    index: str = "index.html"
    listing: bool = False                       # directory listing when no index
    cache_bytes: int = 64 * 1024 * 1024         # LRU bound, per worker
    cache_file_max: int = 1024 * 1024           # bigger files are not kept
    sendfile_min: int = 1024 * 1024             # from this size: sendfile
    warm: bool = False                          # load small files at start
    precompressed: bool = True                  # serve .br / .gz siblings
    compress: bool = True                       # br/zstd/gzip for cached text files
    cache_control: str = ""
    recheck: float = 1.0                        # stat a cached file at most this often


def _read_return(s) -> ReturnOptions:
    body = s.str("body")
    body_file = s.file_bytes("body_file")
    if body and body_file is not None:
        s.fail("body", "only one of body or body_file")
    return ReturnOptions(status=s.int("status", 200, 100, 599),
                         body=body.encode() if body_file is None else body_file,
                         content_type=s.str("content_type", "text/plain; charset=utf-8"),
                         compress=s.bool("compress", True))


def _read_redirect(s) -> RedirectOptions:
    to = s.str("to")
    if not to:
        s.fail("to", "the address to redirect to")
    return RedirectOptions(to, s.choice("status", 308, (301, 302, 303, 307, 308)))


def _read_static(s) -> StaticOptions:
    d = StaticOptions(root="")
    options = StaticOptions(
        root=s.directory("root", required=True),
        index=s.str("index", d.index),
        listing=s.bool("listing", d.listing),
        cache_bytes=s.size("cache_bytes", d.cache_bytes),
        cache_file_max=s.size("cache_file_max", d.cache_file_max),
        sendfile_min=s.size("sendfile_min", d.sendfile_min),
        warm=s.bool("warm", d.warm),
        precompressed=s.bool("precompressed", d.precompressed),
        compress=s.bool("compress", d.compress),
        cache_control=s.str("cache_control", d.cache_control),
        recheck=s.duration("recheck", d.recheck))
    if "/" in options.index:
        s.fail("index", "a file name", options.index)
    return options


def site_headers(site_config, config) -> list[tuple[str, str]]:
    """The site's security headers, as compiled into its handlers' responses."""
    return site_config.security.headers(any(listener.tls for listener in config.listeners))


# A protected site's own answers say `private` unless the route sets its own
# Cache-Control, as its proxied answers do: a shared cache in front (a CDN, a company
# proxy) may keep a 200 it saw for a signed-in user (with Last-Modified, as static files
# have, by heuristic: RFC 9111 4.2.2) and hand it to anyone who asks, without a session.
PRIVATE = ("cache-control", "private")


def _private_headers(site_config, own_cache_control: str = "") -> list[tuple[str, str]]:
    return [PRIVATE] if site_config.protected and not own_cache_control else []


def _build_return(route, site_config, config):
    from nestgate.base.compress import Encoded
    from nestgate.base.responses import Prebuilt
    o = route.options
    headers = _private_headers(site_config)
    if not o.compress:
        return Prebuilt(o.status, o.body, o.content_type, headers)
    answer = Encoded(o.status, o.body, o.content_type, headers)
    # A body not worth compressing stays a plain ready response.
    return answer if len(answer.codings) > 1 else answer.identity


def _build_redirect(route, site_config, config):
    from nestgate.handlers.redirect import fixed_redirect
    return fixed_redirect(route.options.to, route.options.status)


def _build_static(route, site_config, config):
    from nestgate.base.errorpages import error_pages
    from nestgate.handlers.static import StaticFiles
    headers = site_headers(site_config, config)
    headers += _private_headers(site_config, route.options.cache_control)
    return StaticFiles(route.options, route.prefix or route.path, headers, error_pages(config, site_config)[404].page,
                       site=site_config.name)


def _build_proxy(route, site_config, config):
    from nestgate.handlers.auth.identity import claimed_names
    from nestgate.handlers.proxy.handler import ProxyHandler
    session_cookie = config.auth.cookie_name if config.auth is not None else ""
    return ProxyHandler(route, route.options, session_cookie, private=site_config.protected,
                        claimed=claimed_names(config), own_cookies=_own_cookies(config))


def _own_cookies(config) -> frozenset[bytes]:
    """The names of nestgate's own cookies (the session, the sign-in form's CSRF nonce,
    a passkey ceremony, an OpenID sign-in under way), which no proxied answer may set:
    an app on one site, or whoever compromises it, could otherwise put its own session
    in a visitor's browser (signing them in as someone else, on every site under
    `cookie_domain`) or end theirs. Empty without `[auth]`."""
    if config.auth is None:
        return frozenset()
    from nestgate.handlers.auth.oidc.client import FLOW_COOKIE
    from nestgate.handlers.auth.passkeys import CEREMONY_COOKIE
    from nestgate.handlers.auth.portal import CSRF_COOKIE
    return frozenset(name.encode() for name in
                     (config.auth.cookie_name, CSRF_COOKIE, CEREMONY_COOKIE, FLOW_COOKIE))


ROUTE_TYPES: dict[str, RouteType] = {
    "return": RouteType(_read_return, _build_return, ("nestgate.base.compress",)),
    "redirect": RouteType(_read_redirect, _build_redirect, ("nestgate.handlers.redirect",)),
    "static": RouteType(_read_static, _build_static, ("nestgate.handlers.static",)),
    "proxy": RouteType(proxy_options, _build_proxy,
                       ("nestgate.handlers.auth.identity", "nestgate.handlers.proxy.handler")),
}
