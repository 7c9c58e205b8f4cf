"""The sites' answers, added up over the workers for `/metrics`.

Each worker publishes its `nestgate.base.tally` snapshot in the shared table (see
nestgate/admin/stats.py). A worker's counts start at zero and end with it, so the
admin process keeps the last snapshot it read of every worker and, once the worker is
gone (a reload, a crash), adds its final snapshot to the counts of the departed: the
totals only ever grow, as Prometheus counters must. A worker publishes a last snapshot
as it stops; the supervisor reads it when it reaps the worker (before the slot is
reused) and passes it on in its next report, so a reload loses no answer. A worker that
crashed loses the answers since its last publish (half a second).
"""

from __future__ import annotations

import json
import time

from nestgate.base.tally import BUCKETS

LOST_REPORT_AFTER = 30.0     # seconds a worker may be missing before its last snapshot
GONE_KEPT = 4096             # counts as final (its departure report was lost)


class AnswerCounts:
    def __init__(self) -> None:
        self.latest: dict[int, dict] = {}        # pid -> its last snapshot
        self.seen: dict[int, float] = {}         # pid -> when it was last in the table
        self.gone: dict[int, None] = {}          # pids folded already (insertion order)
        self.departed_routes: dict[tuple[str, str, str], int] = {}
        self.departed_sites: dict[str, list[float]] = {}
        self.departed_upstreams: dict[tuple[str, str], list[int]] = {}
        self.departed_events: dict[str, int] = {}
        self.departed_caches: dict[tuple[str, str, str], list[int]] = {}   # hits, misses
        self.departed_log_dropped = 0
        self.departed_refused: dict[tuple[str, str], int] = {}

    def refresh(self, table) -> None:
        """Read every running worker's snapshot."""
        now = time.monotonic()
        for figures in table.read():
            pid = figures.pid
            if pid in self.gone:
                continue                    # its slot is not cleared yet
            self.seen[pid] = now
            data = table.read_tally(figures.slot)
            if data:
                try:
                    self.latest[pid] = json.loads(data)
                except ValueError:
                    pass                    # a torn read the frame did not catch: next time
        for pid, when in list(self.seen.items()):
            if now - when > LOST_REPORT_AFTER:
                self.depart(pid, None)      # gone, and its report never came

    def depart(self, pid: int, final: dict | None) -> None:
        """Worker `pid` exited; `final` is the last snapshot it published (from the
        supervisor's report), else the last one read here."""
        snapshot = self.latest.pop(pid, None) if final is None else final
        self.latest.pop(pid, None)
        self.seen.pop(pid, None)
        if pid in self.gone:
            return
        self.gone[pid] = None
        if len(self.gone) > GONE_KEPT:
            del self.gone[next(iter(self.gone))]
        if snapshot:
            _add(self.departed_routes, self.departed_sites, snapshot)
            _add_upstreams(self.departed_upstreams, snapshot)
            _add_events(self.departed_events, snapshot)
            for kind, site, route, hits, misses, _bytes in snapshot.get("caches", ()):
                have = self.departed_caches.setdefault((kind, site, route), [0, 0])
                have[0] += hits
                have[1] += misses
            self.departed_log_dropped += snapshot.get("log_dropped", 0)
            _add_refused(self.departed_refused, snapshot)

    def totals(self) -> tuple[dict, dict]:
        """({(site, route, code): answers}, {site: [buckets..., sum, count]}), with the
        untimed answers (written from the parser callback) in the first bucket."""
        routes = dict(self.departed_routes)
        sites = {site: list(values) for site, values in self.departed_sites.items()}
        for snapshot in self.latest.values():
            _add(routes, sites, snapshot)
        answered: dict[str, int] = {}
        for (site, _route, _code), count in routes.items():
            answered[site] = answered.get(site, 0) + count
        width = len(BUCKETS) + 1
        for site, total in answered.items():
            values = sites.setdefault(site, [0] * width + [0.0, 0])
            untimed = total - values[-1]
            if untimed > 0:
                values[0] += untimed
                values[-1] += untimed
        return routes, sites


    def upstreams(self) -> list[dict]:
        """Each upstream of each proxy route: its counters over every worker, and
        whether every running worker can use it (its active check passes and passive
        health has not taken it out)."""
        counters = {key: list(values) for key, values in self.departed_upstreams.items()}
        usable: dict[tuple[str, str], list[bool]] = {}
        drained: set[tuple[str, str]] = set()
        checked: dict[tuple[str, str], float] = {}
        for snapshot in self.latest.values():
            _add_upstreams(counters, snapshot)
            for route, url, healthy, taken_out, _r, _e, _t, last_check, is_drained in \
                    snapshot.get("upstreams", ()):
                usable.setdefault((route, url), []).append(healthy and not taken_out)
                checked[(route, url)] = max(checked.get((route, url), 0.0), last_check)
                if is_drained:
                    drained.add((route, url))
        shown = []
        for (route, url), views in sorted(usable.items()):
            requests, errors, retries = counters.get((route, url), (0, 0, 0))
            shown.append({"route": route, "upstream": url, "healthy": all(views),
                          "failing_in_workers": views.count(False),
                          "drained": (route, url) in drained,
                          "last_check": checked[(route, url)] or None,
                          "requests": requests, "errors": errors, "retries": retries})
        return shown


    def events(self) -> dict[str, int]:
        """Sign-in and notes events, over every worker that ever ran."""
        events = dict(self.departed_events)
        for snapshot in self.latest.values():
            _add_events(events, snapshot)
        return events

    def caches(self) -> dict[tuple[str, str, str], list[int]]:
        """(kind, site, route) -> [hits, misses (both over every worker that ran),
        bytes held now (by the running workers)]."""
        caches = {key: [hits, misses, 0]
                  for key, (hits, misses) in self.departed_caches.items()}
        for snapshot in self.latest.values():
            for kind, site, route, hits, misses, held in snapshot.get("caches", ()):
                have = caches.setdefault((kind, site, route), [0, 0, 0])
                have[0] += hits
                have[1] += misses
                have[2] += held
        return caches

    def refused(self) -> dict[tuple[str, str], int]:
        """(site, route) -> requests its rate limit refused, over every worker that ran."""
        refused = dict(self.departed_refused)
        for snapshot in self.latest.values():
            _add_refused(refused, snapshot)
        return refused

    def log_dropped(self) -> int:
        return self.departed_log_dropped + sum(s.get("log_dropped", 0)
                                               for s in self.latest.values())


def _add_refused(refused: dict, snapshot: dict) -> None:
    for site, route, count in snapshot.get("refused", ()):
        refused[(site, route)] = refused.get((site, route), 0) + count


def _add_events(events: dict, snapshot: dict) -> None:
    for name, count in snapshot.get("events", {}).items():
        events[name] = events.get(name, 0) + count


def _add_upstreams(counters: dict, snapshot: dict) -> None:
    for route, url, _healthy, _taken_out, requests, errors, retries, *_rest in \
            snapshot.get("upstreams", ()):
        have = counters.setdefault((route, url), [0, 0, 0])
        have[0] += requests
        have[1] += errors
        have[2] += retries


def _add(routes: dict, sites: dict, snapshot: dict) -> None:
    for site, label, codes in snapshot.get("routes", ()):
        for code, count in codes.items():
            key = (site, label, code)
            routes[key] = routes.get(key, 0) + count
    for site, values in snapshot.get("sites", {}).items():
        have = sites.get(site)
        if have is None:
            sites[site] = list(values)
        else:
            for i, value in enumerate(values):
                have[i] += value
