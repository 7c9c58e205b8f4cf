"""Counts of the answers a worker gave, by site, route and status, and how long the
timed ones took: the figures behind `nestgate_requests_total` and
`nestgate_request_duration_seconds` (nestgate/admin/metrics.py).

Theory of operation
-------------------
Each route of a `SiteRoutes` table has a `RouteTally` (routes with the same label in a
site share it: every note page is "/notes/{slug}"), and the `Route` the router returns
carries it, so counting an answer is one dict increment on an object the engine
already holds: no lock, no syscall, no key built per request.

Answers written from the parser callback (a ready response: health, a cached file or
page) take microseconds and are not timed, which would cost two clock reads each;
answers that ran a handler task are timed from the request object's creation to the
end of the answer and go into their site's histogram. When the histogram is written,
the untimed answers are counted in its first bucket: they did finish within it.

Once per publish tick the worker writes `snapshot()` into its slot of the shared table
(nestgate/admin/stats.py); the admin process adds the workers' snapshots up when
scraped. A client that went away before any answer is counted as 499, as nginx logs it.
"""

from __future__ import annotations

import contextlib
import json
from bisect import bisect_left
from collections import defaultdict
from dataclasses import dataclass, field

from nestgate.base.clock import CLOCK

# Upper bounds in seconds (Prometheus' default buckets); the last bucket is +Inf.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
CLIENT_GONE = 499
# Events counted beside the answers, away from the hot path (sign-in, notes writes).
# Every key exists from the start: a thread (the notes API writes in the executor) may
# count while the loop writes the snapshot, and a dict that never grows can be read so.
# The HTTP/2 protections that end a connection or reset a stream (nestgate.wire.http2
# says what each is), counted as events "h2_<reason>".
H2_PROTECTIONS = ("control_flood", "window_update_flood", "priority_flood", "empty_frames",
                  "small_data_frames", "header_block", "header_timeout", "rapid_reset",
                  "protocol_error", "send_timeout")
# The HTTP/3 ones (nestgate.wire.http3), as "h3_<reason>".
H3_PROTECTIONS = ("header_block", "header_timeout", "rapid_reset", "small_data_frames")
EVENTS = ("signin_success", "signin_failure", "signin_refused", "session_forged",
          "notes_written",
          "notes_deleted", *(f"h2_{reason}" for reason in H2_PROTECTIONS),
          *(f"h3_{reason}" for reason in H3_PROTECTIONS))


class SiteTimes:
    """One site's duration histogram: counts per bucket (the last is +Inf), sum, count
    (`RouteTally.timed` adds to them)."""

    __slots__ = ("buckets", "sum", "count")

    def __init__(self) -> None:
        self.buckets = [0] * (len(BUCKETS) + 1)
        self.sum = 0.0
        self.count = 0


class RouteTally:
    """One route's answers by status (`codes`, which the engine's fast path increments
    inline), and its site's histogram for the timed ones."""

    __slots__ = ("site", "label", "codes", "times")

    def __init__(self, site: str, label: str, times: SiteTimes) -> None:
        self.site = site
        self.label = label
        # A defaultdict: `codes[status] += 1` stays in C (about half the cost of
        # `codes.get(status, 0) + 1` on this path).
        self.codes: defaultdict[int, int] = defaultdict(int)
        self.times = times

    def count(self, status: int) -> None:
        self.codes[status] += 1

    def timed(self, status: int, seconds: float) -> None:
        self.codes[status or CLIENT_GONE] += 1
        # The site's histogram, added to here rather than through a method of its
        # own: every request that is not a ready answer comes here.
        times = self.times
        times.buckets[bisect_left(BUCKETS, seconds)] += 1
        times.sum += seconds
        times.count += 1


@dataclass
class Counted:
    """What registers with a Tally as it is built: caches, proxies, routes' and sites'
    counts, rate limits' refusals."""
    caches: list = field(default_factory=list)
    proxies: list = field(default_factory=list)
    routes: dict = field(default_factory=dict)
    sites: dict = field(default_factory=dict)
    refused: dict = field(default_factory=dict)


class Tally:
    """Every RouteTally of this process, by (site, label)."""

    def __init__(self) -> None:
        self.routes: dict[tuple[str, str], RouteTally] = {}
        self.sites: dict[str, SiteTimes] = {}
        self.proxies: list = []          # ProxyHandlers: their targets' figures
        self.caches: list = []           # StaticFiles and SitePages: hits, misses, bytes
        self.events = dict.fromkeys(EVENTS, 0)
        self.log_dropped = 0             # request-log records lost (the worker sets it)
        self.control = 0                 # the operator's requests applied (control.py)
        # Requests a rate limit refused (429), by (site, route): one-item lists the
        # routes' `Limited` wrappers increment (nestgate.pipeline.ratelimit).
        self.refused: dict[tuple[str, str], list[int]] = {}
        self.bans: dict[str, int] = {}   # bans this worker made, by [[ban]] rule
        # Connections (and proxied requests) of banned clients, by the ban's origin.
        self.ban_refused: dict[str, int] = {}

    def event(self, name: str) -> None:
        self.events[name] += 1

    @contextlib.contextmanager
    def not_counted(self):
        """Caches and routes built inside are not this process's: the supervisor builds
        some to hand to the processes it forks (the workers' warm files and router, the
        admin process's router), and answers nothing itself. Yields a `Counted` that
        holds them once the block ends, for the process that serves them (`count_in`)."""
        kept = Counted(list(self.caches), list(self.proxies), dict(self.routes),
                       dict(self.sites), dict(self.refused))
        built = Counted()
        try:
            yield built
        finally:
            for name in ("caches", "proxies"):
                now, before = getattr(self, name), getattr(kept, name)
                getattr(built, name).extend(item for item in now if item not in before)
                now[:] = before
            for name in ("routes", "sites", "refused"):
                now, before = getattr(self, name), getattr(kept, name)
                getattr(built, name).update((key, value) for key, value in now.items()
                                            if key not in before)
                now.clear()
                now.update(before)

    def count_in(self, built: Counted) -> None:
        """Count what `not_counted` set apart as this process's own."""
        self.caches.extend(built.caches)
        self.proxies.extend(built.proxies)
        self.routes.update(built.routes)
        self.sites.update(built.sites)
        self.refused.update(built.refused)

    def banned(self, rule: str) -> None:
        self.bans[rule] = self.bans.get(rule, 0) + 1

    def ban_refusal(self, origin: str) -> None:
        self.ban_refused[origin] = self.ban_refused.get(origin, 0) + 1

    def route(self, site: str, label: str) -> RouteTally:
        found = self.routes.get((site, label))
        if found is None:
            times = self.sites.get(site)
            if times is None:
                times = self.sites[site] = SiteTimes()
            found = self.routes[(site, label)] = RouteTally(site, label, times)
        return found

    def refused_counter(self, site: str, label: str) -> list[int]:
        found = self.refused.get((site, label))
        if found is None:
            found = self.refused[(site, label)] = [0]
        return found

    def snapshot(self) -> bytes:
        """What the worker publishes: compact JSON, routes that answered anything."""
        now = CLOCK.now
        return json.dumps({
            "routes": [[t.site, t.label, t.codes] for t in self.routes.values() if t.codes],
            "sites": {site: [*times.buckets, times.sum, times.count]
                      for site, times in self.sites.items() if times.count},
            # route, upstream, healthy (active check, not drained), taken out (passive),
            # requests, errors, retries, last check (wall clock, 0: none), drained
            "upstreams": [[proxy.label, t.name, t.healthy, now < t.down_until, t.requests,
                           t.errors, t.retries, t.checked, t.drained]
                          for proxy in self.proxies for t in proxy.targets],
            "control": self.control,
            # Bans made by each rule ("ban:<rule>") and refusals of banned clients by
            # origin ("ban_refused:<origin>") are added up with the events.
            "events": {**self.events, **{f"ban:{rule}": n for rule, n in self.bans.items()},
                       **{f"ban_refused:{origin}": n
                          for origin, n in self.ban_refused.items()}},
            "log_dropped": self.log_dropped,
            # kind ("static" or "pages"), site, route, hits, misses, bytes held
            "caches": [cache.cache_figures() for cache in self.caches],
            "refused": [[site, label, count[0]]
                        for (site, label), count in self.refused.items() if count[0]],
        }, separators=(",", ":")).encode()


TALLY = Tally()                      # this process's; the admin process publishes none
# Answers the protocol layer gave itself (a malformed request, a limit, an overload 503).
UNROUTED = TALLY.route("-", "-")
