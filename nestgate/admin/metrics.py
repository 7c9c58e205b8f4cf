"""`GET /metrics`: the Prometheus text exposition (format 0.0.4), every name prefixed
`nestgate_`. Made when scraped from what the admin process already has (the supervisor's
report, the workers' shared table) and from /proc for each process's CPU and memory:
nothing is counted on the request path for it."""

from __future__ import annotations

import os

from nestgate import __version__
from nestgate.base.tally import BUCKETS, H2_PROTECTIONS, H3_PROTECTIONS

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


class Exposition:
    """Families written in order, each with its HELP and TYPE once."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str, samples) -> None:
        # Format 0.0.4 names a counter's HELP and TYPE by its samples' name, `_total`
        # included (OpenMetrics would leave it out; promtool checks the former).
        suffix = "_total" if kind == "counter" else ""
        self.lines.append(f"# HELP nestgate_{name}{suffix} {help_text}")
        self.lines.append(f"# TYPE nestgate_{name}{suffix} {kind}")
        for labels, value in samples:
            shown = ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items())
            self.lines.append(f"nestgate_{name}{suffix}{{{shown}}} {_number(value)}"
                              if shown else f"nestgate_{name}{suffix} {_number(value)}")

    def histogram(self, name: str, help_text: str, series) -> None:
        """`series`: (labels, [per-bucket counts..., +Inf count, sum, count]) with the
        bucket bounds of nestgate.base.tally.BUCKETS; written cumulative, as the format asks."""
        self.lines.append(f"# HELP nestgate_{name} {help_text}")
        self.lines.append(f"# TYPE nestgate_{name} histogram")
        for labels, values in series:
            shown = ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items())
            running = 0
            for bound, count in zip((*BUCKETS, "+Inf"), values[:len(BUCKETS) + 1]):
                running += count
                self.lines.append(f'nestgate_{name}_bucket{{{shown},le="{bound}"}} {running}')
            self.lines.append(f"nestgate_{name}_sum{{{shown}}} {_number(float(values[-2]))}")
            self.lines.append(f"nestgate_{name}_count{{{shown}}} {_number(values[-1])}")

    def text(self) -> bytes:
        return ("\n".join(self.lines) + "\n").encode()


def render(state) -> bytes:
    report = state.report
    out = Exposition()
    out.family("build_info", "gauge", "The running version; always 1.",
               [({"version": __version__}, 1)])
    out.family("start_time_seconds", "gauge", "When the supervisor started (Unix time).",
               [({}, report.get("started", 0))])
    out.family("generation", "gauge", "The number of the generation of workers serving.",
               [({}, report.get("generation") or 0)])
    current = [g for g in report.get("generations", ()) if g["number"] == report.get("generation")]
    workers = [w for g in current for w in g["workers"]]
    out.family("workers", "gauge", "Workers of the serving generation, by state.",
               [({"state": "ready"}, sum(1 for w in workers if w["ready"])),
                ({"state": "starting"}, sum(1 for w in workers if w["pid"] and not w["ready"])),
                ({"state": "restarting"}, sum(1 for w in workers if not w["pid"]))])
    out.family("worker_restarts", "counter", "Workers started again after they exited.",
               [({}, report.get("restarts", 0))])
    reloads = report.get("reload_counts", {})
    out.family("reloads", "counter", "Reloads (SIGHUP), by result.",
               [({"result": "ok"}, reloads.get("ok", 0)),
                ({"result": "refused"}, reloads.get("refused", 0))])

    figures = state.table.read()
    out.family("requests_served", "counter",
               "Requests (HTTP/1.1) and streams (HTTP/2) read by each running worker.",
               [({"pid": f.pid, "generation": f.generation}, f.requests) for f in figures])
    out.family("received_bytes", "counter",
               "HTTP bytes read from clients by each running worker (after TLS; HTTP/2 "
               "frames whole).",
               [({"pid": f.pid, "generation": f.generation}, f.bytes_in) for f in figures])
    out.family("sent_bytes", "counter",
               "HTTP bytes written to clients by each running worker (after TLS; HTTP/2 "
               "frames whole).",
               [({"pid": f.pid, "generation": f.generation}, f.bytes_out) for f in figures])
    out.family("open_connections", "gauge",
               "Open client connections of every running worker, by protocol.",
               [({"protocol": "http1"}, sum(f.http1 for f in figures)),
                ({"protocol": "http2"}, sum(f.http2 for f in figures)),
                ({"protocol": "tls"}, sum(f.tls for f in figures)),
                ({"protocol": "tls_handshake"}, sum(f.handshakes for f in figures))])

    routes, sites = state.answers.totals()
    out.family("requests", "counter",
               "Answers the sites gave, by site, route (as configured; '-' when no route "
               "matched) and status; site '-' is a request the protocol layer refused. "
               "499: the client left before the answer.",
               [({"site": site, "route": route, "code": code}, count)
                for (site, route, code), count in sorted(routes.items())])
    out.histogram("request_duration_seconds",
                  "Time from the request to the end of its answer, by site. Answers "
                  "written from the parser callback (ready responses) are not timed and "
                  "are counted in the first bucket.",
                  [({"site": site}, values) for site, values in sorted(sites.items())])

    out.family("certificate_expiry_seconds", "gauge",
               "When each configured certificate expires (Unix time; alert when it comes "
               "near).",
               [({"listener": c["listener"], "file": c["file"]}, c["not_after"])
                for c in report.get("certificates", ()) if "not_after" in c])
    out.family("certificate_renewal_failures", "gauge",
               "Failed attempts in a row to obtain or renew a certificate nestgate manages "
               "(0 once one succeeds; the reason is in /v1/ready and `nestgate cert list`).",
               [({"listener": c["listener"], "name": c["names"][0]}, c["failures"])
                for c in report.get("certificates", ()) if "failures" in c])
    events = state.answers.events()
    out.family("signins", "counter", "Sign-in attempts by result: success, failure (wrong "
               "user, password or code), refused (back-off, 429).",
               [({"result": result}, events.get(f"signin_{result}", 0))
                for result in ("success", "failure", "refused")])
    out.family("forged_sessions", "counter", "Session cookies no server issued, refused "
               "without asking the store (a wrong tag, or an untagged token that was not "
               "live when the worker started); each value counted once per worker while "
               "it remembers it.",
               [({}, events.get("session_forged", 0))])
    out.family("notes_written", "counter", "Notes created or replaced through the API.",
               [({}, events.get("notes_written", 0))])
    out.family("notes_deleted", "counter", "Notes deleted through the API.",
               [({}, events.get("notes_deleted", 0))])
    out.family("http2_protections", "counter", "HTTP/2 connections ended (GOAWAY) or "
               "streams reset (send_timeout) by a protection, by reason.",
               [({"reason": reason}, events.get(f"h2_{reason}", 0))
                for reason in H2_PROTECTIONS])
    out.family("http3_protections", "counter", "HTTP/3 connections ended "
               "(H3_EXCESSIVE_LOAD) by a protection, by reason.",
               [({"reason": reason}, events.get(f"h3_{reason}", 0))
                for reason in H3_PROTECTIONS])
    out.family("bans", "counter", "Clients banned by a [[ban]] rule (each ban counted once, "
               "by the worker that made it), by rule.",
               [({"rule": name[4:]}, count) for name, count in sorted(events.items())
                if name.startswith("ban:")])
    out.family("ban_refused", "counter", "Connections of banned clients refused at accept "
               "(or answered the ban page), and requests a trusted proxy forwarded for them, "
               "by the ban's origin (rule, operator, crowdsec).",
               [({"origin": name[12:]}, count) for name, count in sorted(events.items())
                if name.startswith("ban_refused:")])
    bans = state.bans_active() if state.bans_active else None
    if bans is not None:
        out.family("bans_active", "gauge", "Bans in force now, by origin (rule, operator, "
                   "or another source).",
                   [({"origin": origin}, count) for origin, count in sorted(bans.items())])
    caches = sorted(state.answers.caches().items())
    for name, index, kind, help_text in (
            ("cache_hits", 0, "counter", "Answers from memory: static files and pages."),
            ("cache_misses", 1, "counter", "Files loaded and pages rendered for an answer."),
            ("cache_bytes", 2, "gauge", "Bytes held by the running workers' caches.")):
        out.family(name, kind, help_text,
                   [({"cache": kind_, "site": site, "route": route}, values[index])
                    for (kind_, site, route), values in caches])
    out.family("rate_limited", "counter",
               "Requests a rate limit refused (429), by site and route.",
               [({"site": site, "route": route}, count)
                for (site, route), count in sorted(state.answers.refused().items())])
    out.family("request_log_dropped", "counter",
               "Request-log records lost to write errors (a full disk, a closed pipe).",
               [({}, state.answers.log_dropped())])
    counts = None
    if state.store_counts:
        from nestgate.handlers.auth.store import store_errors
        try:
            counts = state.store_counts()
        except store_errors():
            counts = None                  # the store cannot be read now: left out
    if counts is not None:
        out.family("allow_entries", "gauge", "Dynamic allow-list entries in force.",
                   [({}, counts[0])])
        out.family("sessions_active", "gauge", "Live sign-in sessions.", [({}, counts[1])])
    upstreams = state.answers.upstreams()
    out.family("upstream_healthy", "gauge",
               "1 when every running worker can use the upstream (its active check passes "
               "and passive health has not taken it out), else 0.",
               [({"route": u["route"], "upstream": u["upstream"]}, int(u["healthy"]))
                for u in upstreams])
    for name, key, help_text in (
            ("upstream_requests", "requests", "Exchanges begun with the upstream."),
            ("upstream_errors", "errors", "Failures passive health counted: refused, reset, "
                                          "invalid or timed-out exchanges and connects."),
            ("upstream_retries", "retries", "Attempts sent to the upstream after another "
                                            "target of the route failed the request.")):
        out.family(name, "counter", help_text,
                   [({"route": u["route"], "upstream": u["upstream"]}, u[key])
                    for u in upstreams])

    processes = [("supervisor", report.get("pid")), ("admin", os.getpid())] + \
        [("worker", f.pid) for f in figures]
    usage = [(role, pid, _usage(pid)) for role, pid in processes if pid]
    out.family("process_cpu_seconds", "counter", "CPU time (user and system) by process.",
               [({"process": role, "pid": pid}, cpu) for role, pid, (cpu, _rss) in usage
                if cpu is not None])
    out.family("process_resident_memory_bytes", "gauge", "Resident memory by process.",
               [({"process": role, "pid": pid}, rss) for role, pid, (_cpu, rss) in usage
                if rss is not None])
    return out.text()


def _usage(pid: int) -> tuple[float | None, int | None]:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
        with open(f"/proc/{pid}/statm", "rb") as f:
            resident = int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return None, None
    # After the command name: state is field 3, utime 14 and stime 15 (1-based).
    return (int(fields[11]) + int(fields[12])) / _TICKS, resident * _PAGE


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value) -> str:
    if isinstance(value, float):
        return repr(value)
    return str(int(value))
