"""The workers' router built once, by the supervisor, before it forks them.

Why: a worker building its own router runs the build's code for the first time in its
process and allocates among the pages it shares with the supervisor, and so writes
(and copies) about 1 MiB of them; a router the supervisor built is shared by every
worker, as the page renderers and warm files of `build_shared` are.

What must stay each worker's own is set apart or begun in the worker:
- the answer counts and caches the build registers (`Tally.not_counted`, the
  operator's page purges `Controls.not_kept`): handed back by `take`;
- the health answers' pid and uptime: begun by the worker's clock (`Clock.begin`);
- the notes generation file's lock: taken on a descriptor the locking process opened
  (nestgate.handlers.notes.store).

A config whose router holds more of a process's own is built by each worker, as
before: connections and health checks to upstreams, a store or a Redis client,
the GeoIP reader, ban rules, ACME challenge answers, and answers that depend on
the worker's own setup (the Server header's version, HTTP/3's Alt-Svc).
"""

from __future__ import annotations

from nestgate.base.control import CONTROLS
from nestgate.base.tally import TALLY
from nestgate.pipeline.routing import Router
from nestgate.sites.build import build_router


def shareable(config) -> bool:
    """Whether every worker of `config` can take one router built before the fork."""
    from nestgate.certs.manager import managed_certificates
    sites = config.guarded_sites
    routes = [route for site in sites for route in site.routes]
    return not (
        config.server.server_tokens
        or any(listener.http3 for listener in config.listeners)
        or config.auth is not None
        or any(site.access or site.protected or site.policy is not None for site in sites)
        or config.state.backend == "redis"
        or config.geoip is not None
        or config.bans.enabled or config.bans.rules or config.crowdsec is not None
        or any(site.forward_auth is not None or site.rate_limit is not None for site in sites)
        or any(route.type == "proxy" or route.access or route.policy is not None
               or route.forward_auth is not None or route.rate_limit is not None
               for route in routes)
        or managed_certificates(config))


class SharedRouter:
    """A router built in this process for the workers of `config`, with what its build
    registered set apart for the worker that serves it."""

    def __init__(self, config) -> None:
        with TALLY.not_counted() as counted, CONTROLS.not_kept() as pages:
            self.router = build_router(config)
        self.counted = counted
        self.pages = pages

    def take(self) -> Router:
        """In the worker: the router, its counts and pages now this process's."""
        TALLY.count_in(self.counted)
        CONTROLS.pages.extend(self.pages)
        return self.router


def shared_router(config) -> SharedRouter | None:
    """The router for the workers of `config` when it can be shared, else None. One
    that cannot be built is left to the workers, which report why."""
    if not shareable(config):
        return None
    try:
        return SharedRouter(config)
    except Exception:  # noqa: BLE001 - see the docstring
        return None
