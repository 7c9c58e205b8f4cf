"""Compile the config's sites into the router a worker answers from.

Everything a request could need that does not depend on the request is built
here, once per load: prebuilt responses, the route tables, the 404 page.
"""

from __future__ import annotations

import os

from nestgate import PACKAGE_DIR
from nestgate.base.handler import Service
from nestgate.handlers.health import health_handler
from nestgate.handlers.redirect import HttpsRedirect, SlashRedirect
from nestgate.base.responses import SERVER
from nestgate.base.errorpages import error_pages, rebuild_defaults
from nestgate.sites.routetypes import ROUTE_TYPES, site_headers
from nestgate.sites.guard import Guards
from nestgate.pipeline.routing import Router, SiteRoutes


def name_server(config) -> None:
    """The Server header and page footers, with the version or not (server_tokens),
    set before any response of this load is built."""
    if SERVER.show_version(config.server.server_tokens):
        rebuild_defaults()


def build_handler(route, site_config, config):
    """The handler for one configured route, by its type's entry in ROUTE_TYPES."""
    return ROUTE_TYPES[route.type].build(route, site_config, config)


# The stylesheet and icons the built-in templates link, for every site with pages.
ASSETS_PREFIX = "/__nestgate__/"
ASSETS_DIR = PACKAGE_DIR / "default" / "public"


# What add_site_pages imports (see RouteType.modules).
SITE_PAGES_MODULES = ("nestgate.handlers.static", "nestgate.handlers.notes.api", "nestgate.handlers.notes.pages")


def handler_modules(config) -> set[str]:
    """The modules the workers' router for `config` imports when it is built, and the
    HTTP/2 engine when a listener speaks HTTP/2."""
    from nestgate.sites.routetypes import ROUTE_TYPES
    names = {name for site in config.sites for route in site.routes
             for name in ROUTE_TYPES[route.type].modules}
    if any(site.home or site.notes for site in config.sites):
        names.update(SITE_PAGES_MODULES)
    if any(listener.speaks_http2 for listener in config.listeners):
        names.add("nestgate.wire.h2select")      # the workers' connections (worker.py)
    if any(listener.certificates for listener in config.listeners):
        names.add("cryptography.x509")           # certificates reread when renewed
    if config.geoip is not None:
        names.add("maxminddb")                   # the workers' GeoLookup
    if any(site.forward_auth or any(r.forward_auth for r in site.routes)
           for site in config.sites):
        names.add("nestgate.handlers.auth.delegate")         # asking an auth server first
    if any(site.protected for site in config.guarded_sites):
        names.add("nestgate.handlers.auth.provider")         # the forward-auth endpoints
    if config.auth is not None and config.auth.providers:
        names.add("nestgate.handlers.auth.oidc.signin_pages")      # with Authlib, joserfc and httpx
    return names


# The config `build_shared` last built for: the next fork for it (the second worker, a
# restart) has nothing to build.
_SHARED_BUILT = [None]


def build_shared(config) -> None:
    """What every worker of `config` would build the same way, built once in the
    supervisor before it forks them (see share_before_fork): the page renderers of the
    sites with a home page or notes, and the files of static routes with `warm`. Built
    again for the same config, the warm files' handlers were made anew and the first
    ones freed, between two forks: a write to pages the first worker shares (0.2 MiB
    more anonymous PSS, measured)."""
    if _SHARED_BUILT[0] is config:
        return
    _SHARED_BUILT[0] = config
    sites = config.guarded_sites
    with_pages = [site for site in sites if site.home or site.notes]
    if with_pages:
        from nestgate.handlers.notes.render import keep_renderers
        # The notes folder as SitePages' NoteStore names it (its realpath).
        keep_renderers([(site, os.path.realpath(site.notes.dir) if site.notes else None)
                        for site in with_pages])
    if "nestgate.handlers.static" in handler_modules(config):
        from nestgate.handlers.static import keep_warm
        keep_warm(_warmed_here(config, sites))


def _warmed_here(config, sites) -> list:
    """The StaticFiles of the routes with `warm`, built (and so warmed) here. Their
    ready answers carry the Server header as this process has it, the one without the
    version, and no Alt-Svc line (a worker announcing HTTP/3 adds one, see
    nestgate.base.responses.announce_http3): with `server_tokens` or HTTP/3, none is built.
    One that cannot be built is left to the workers, which report why."""
    from nestgate.base.tally import TALLY
    if config.server.server_tokens or any(listener.http3 for listener in config.listeners):
        return []
    built = []
    with TALLY.not_counted():
        for site in sites:
            for route in site.routes:
                if route.type == "static" and route.options.warm:
                    try:
                        built.append(build_handler(route, site, config))
                    except Exception:  # noqa: BLE001 - see the docstring
                        continue
    return built


def add_site_pages(site: SiteRoutes, site_config, config, not_found, broadcast=None) -> None:
    """The home page, the notes pages and the notes API ([site.home], [site.notes]),
    and the built-in pages' assets under ASSETS_PREFIX."""
    from nestgate.handlers.static import StaticFiles
    from nestgate.handlers.notes.api import NotesApi
    from nestgate.handlers.notes.pages import SitePages
    from nestgate.sites.routetypes import StaticOptions
    headers = site_headers(site_config, config)
    assets = StaticOptions(root=str(ASSETS_DIR), cache_control="public, max-age=3600")
    site.add_prefix(ASSETS_PREFIX, StaticFiles(assets, ASSETS_PREFIX, headers, not_found,
                                               site=site_config.name),
                    "built-in-assets")
    pages = SitePages(site_config, headers, not_found)
    pages.attach(site)
    if broadcast is not None and site_config.notes:
        broadcast.watch(pages)
    if site_config.notes:
        api = site_config.notes.api_path
        site.add_exact(api, NotesApi(pages, headers, item=False), api)
        site.add_exact(api + "/{slug}", NotesApi(pages, headers, item=True), api + "/{slug}")


def build_router(config) -> Router:
    name_server(config)
    health = health_handler(config.server.health_details)
    geo = None
    if config.geoip is not None:
        from nestgate.pipeline.geoip import GeoLookup
        geo = GeoLookup(config.geoip)
    guards = Guards(config, geo)
    router = Router(guards.unclaimed(error_pages(config)))
    services = guards.services                  # started by the worker on its loop
    if geo is not None:
        services.append(geo)
    broadcast = None
    if config.state.backend == "redis" and any(s.notes for s in config.sites):
        from nestgate.handlers.notes.broadcast import NotesBroadcast
        broadcast = NotesBroadcast(config.state)
        services.append(broadcast)
    for site_config in config.guarded_sites:
        errors = error_pages(config, site_config)
        site = guards.table(site_config, errors)
        if site_config.health:
            site.add_exact(config.server.health_path, health, "health")
        for route in site_config.routes:
            handler = build_handler(route, site_config, config)
            if isinstance(handler, Service):
                services.append(handler)
            handler = guards.route_handler(handler, route)
            if route.path:
                site.add_exact(route.path, handler, route.label, access=route.access,
                               limit=route.rate_limit, policy=route.policy)
            else:
                # A proxy route on `/admin/` takes `/admin` too, as nginx's proxy_pass
                # locations do: upstreams often serve it as `/admin/`. A static route's
                # files are its own, so `/assets` stays another route's path there.
                site.add_prefix(route.prefix, handler, route.label, access=route.access,
                                limit=route.rate_limit, policy=route.policy,
                                slashless=SlashRedirect(route.prefix)
                                if route.type == "proxy" else None)
        if site_config.home or site_config.notes:
            add_site_pages(site, site_config, config, errors[404].page, broadcast)
        guards.add_portal(site, site_config)
        router.add_site(site_config.hosts, site)
    router.services = services
    router.geo = geo
    answer_challenges(router, config)
    return router


def answer_challenges(router: Router, config) -> None:
    """ACME HTTP-01 answers on every site, when this config orders certificates that
    way (nestgate.certs)."""
    from nestgate.certs.manager import challenge_types, managed_certificates, storage_of
    if "http-01" in challenge_types(config) and any(
            item.kind == "acme" for item in managed_certificates(config)):
        from nestgate.certs.challenge import PREFIX, ChallengeAnswer
        router.answer_challenges(PREFIX, ChallengeAnswer(storage_of(config)))


def https_redirect_router(listener, config) -> Router:
    """Every Host and path on a plain listener told to send visitors to HTTPS."""
    name_server(config)
    errors = error_pages(config)
    site = SiteRoutes("https-redirect", errors[404], errors=errors)
    site.add_prefix("/", HttpsRedirect(listener.https_port), "https-redirect")
    router = Router(site)
    router.add_site(["*"], site)
    answer_challenges(router, config)
    return router
