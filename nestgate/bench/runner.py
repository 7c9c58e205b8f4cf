"""One scenario from start to finish: content, servers, checks, warm-up, alternated runs.

Order of work, and why:
1. nestgate starts first: the bytes it answers (health JSON length, rendered notes) are
   captured so every peer is configured to serve the same bytes.
2. Each server answers the scenario's request once before any load: a wrong status from
   a peer is a harness bug (fail), from nestgate a missing feature (skip, with the reason).
3. One warm-up run per server (not counted), then RUNS rounds of A B A B ...: drift of a
   shared, noisy machine hits every server alike.
4. Around each run the server's whole process tree is read from /proc: CPU time before and
   after (divided by the requests served) and RSS sampled during the run.
"""

import shutil
import ssl
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import (BenchError, SkipScenario, callgrind, content, drivers, perfprofile, procstat,
               pyclient, summary)
from .peers import PEERS, NOTES_TOKEN, Nestgate, NginxBackend, Peer, Site, fetch
from .scenarios import Route, Scenario

MB = 1024 * 1024
SWEEP_LEVELS = (1, 8, 64, 256, 512, 1024)
NOTES_PAGES = ("/notes", "/notes/medium-note", "/notes/long-note")


class ScenarioFailed(BenchError):
    """Runs finished but broke a rule (REQUIRE_ZERO_NON2XX): the summary is still written."""


@dataclass
class Options:
    output: Path = Path("results")
    runs: int = 5
    duration_s: int = 5
    warmup_s: int = 2
    threads: int = 1
    workers: int = 1
    connections: int = 0                # 0: the scenario's own
    peers: tuple[str, ...] = ("nginx",)
    require_zero_non2xx: bool = True
    count_status: bool = False
    sweep: bool = False
    sweep_runs: int = 3
    instructions: bool = False          # nestgate under callgrind (see callgrind.py)
    profile: bool = False               # one more run per peer under perf (perfprofile.py)
    progress: bool = True
    command: str = ""
    stamp: str = field(default_factory=lambda: time.strftime("%Y%m%d_%H%M%S"))


class Progress:
    """One line per step on stderr, with an estimate of the time left for the scenario."""

    def __init__(self, scenario: str, slots: int, slot_s: float, enabled: bool):
        self.scenario, self.left, self.slot_s, self.enabled = scenario, slots, slot_s, enabled

    def step(self, what: str) -> None:
        self.left = max(self.left - 1, 0)
        self.say(f"{what} (~{self.left * self.slot_s:.0f}s left)")

    def say(self, what: str) -> None:
        if self.enabled:
            print(f"[{self.scenario}] {what}", file=sys.stderr, flush=True)


def run_scenario(scenario: Scenario, opts: Options, env_text: str) -> dict:
    """Run one scenario; returns its summary (also written to its output folder)."""
    outdir = opts.output / f"{scenario.name}_{opts.stamp}"
    outdir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=f"nestgate-bench-{scenario.name}-"))
    started: list[Peer] = []
    try:
        peers, skipped = _choose_peers(scenario, opts, workdir, outdir)
        state_url = _start_redis(workdir, outdir, started) if scenario.state == "redis" else ""
        sites = _sites(scenario, opts, workdir, [p.name for p in peers], state_url)
        backend = _start_backend(scenario, sites, workdir, outdir, started)
        checks = _start_servers(scenario, peers, sites, started)
        (outdir / "env.txt").write_text(env_text + _ports_text(sites, backend))
        runs, servers = _drive(scenario, opts, peers, sites, outdir)
        extra = {"servers": servers, "checks": checks, "skipped_peers": skipped}
        if scenario.driver == "write":
            extra["disk_fsync_writes_per_s"] = pyclient.fsync_rate(workdir / "fsync")
        result = summary.build(_scenario_dict(scenario), _params(scenario, opts), runs, extra)
        summary.write(outdir, result)
        _plot(outdir, result)
        result["outdir"] = str(outdir)
        _enforce(scenario, opts, runs, outdir)
        return result
    finally:
        for peer in reversed(started):
            peer.stop()
        shutil.rmtree(workdir, ignore_errors=True)


# ---------------------------------------------------------------- set-up

def _choose_peers(scenario: Scenario, opts: Options, workdir: Path, outdir: Path):
    peers: list[Peer] = [Nestgate(workdir, outdir)]
    skipped = {}
    for name in ([] if scenario.nestgate_only else opts.peers):
        peer = PEERS[name](workdir, outdir)
        reason = peer.available()
        if not reason and scenario.rate_limit and not peer.limits_rates:
            reason = "no per-client rate limit in its stock build"
        if reason:
            skipped[name] = reason
        else:
            peers.append(peer)
    if scenario.nestgate_only:
        skipped["others"] = "nestgate only: no peer does this work"
    return peers, skipped


def _sites(scenario: Scenario, opts: Options, workdir: Path, names: list[str],
           state_url: str = "") -> dict[str, Site]:
    from .ports import free_port
    root = workdir / "content"
    content.write_all(root)
    cert = content.certificate(workdir / "tls") if scenario.tls else None
    backend_port = free_port() if scenario.route.kind == "proxy" else 0
    captured: dict = {}         # shared: what nestgate answered, replayed by the peers
    sites = {}
    for name in names:
        sites[name] = Site(root, free_port(), opts.workers, scenario.route, cert,
                           site_host="known.example" if scenario.host else "",
                           cidrs=tuple(content.cidr_list()) if scenario.host else (),
                           backend_port=backend_port, captured=captured,
                           rate_limit=scenario.rate_limit, state=scenario.state,
                           policy=scenario.policy, bans=scenario.bans,
                           state_url=state_url, http3=scenario.driver == "h3py",
                           wrapper=tuple(callgrind.wrapper(workdir))
                           if opts.instructions and name == "nestgate" else ())
    if backend_port:
        sites["backend"] = Site(root, backend_port, 1, Route("static", "/"), captured=captured)
    return sites


def _start_redis(workdir: Path, outdir: Path, started: list) -> str:
    """A redis-server of the run's own on a free port (no persistence): the state of
    the Redis scenarios. Its URL."""
    import redis

    from .peers import ServerProcess
    from .ports import free_port
    binary = shutil.which("redis-server")
    if binary is None:
        raise SkipScenario("redis-server is not installed (Debian: redis-server)")
    port = free_port()
    server = ServerProcess("redis", [binary, "--port", str(port), "--bind", "127.0.0.1",
                                     "--save", "", "--appendonly", "no"], outdir)
    server.start(workdir)
    started.append(server)
    client = redis.Redis(port=port)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            return f"redis://127.0.0.1:{port}/0"
        except redis.ConnectionError:
            if time.monotonic() > deadline or server.exited() is not None:
                raise BenchError(f"redis-server did not start:\n{server.stderr_tail()}")
            time.sleep(0.05)
        finally:
            client.close()


def _start_backend(scenario, sites, workdir, outdir, started) -> Peer | None:
    if "backend" not in sites:
        return None
    backend = NginxBackend(workdir, outdir)
    reason = backend.available()
    if reason:
        raise BenchError(f"the proxy scenarios need an nginx backend: {reason}")
    backend.start(sites["backend"], "/2b")
    started.append(backend)
    return backend


def _start_servers(scenario: Scenario, peers: list[Peer], sites: dict[str, Site],
                   started: list[Peer]) -> dict:
    """Start nestgate, capture its bytes, start the peers, then check each answers right."""
    checks = {}
    for peer in peers:
        site = sites[peer.name]
        peer.start(site, scenario.request if scenario.driver in ("wrk", "h2load", "h3py") else "/",
                   scenario.host)
        started.append(peer)
        if peer.name == "nestgate":
            _capture(scenario, site)
        checks[peer.name] = _check(scenario, peer.name, site)
    return checks


def _capture(scenario: Scenario, site: Site) -> None:
    paths = NOTES_PAGES if scenario.route.kind == "notes" else (scenario.route.path,)
    if scenario.route.kind not in ("health", "notes") or scenario.host:
        return
    for path in paths:
        status, body, headers = fetch(site.scheme, site.port, path)
        if status != 200:
            raise SkipScenario(f"nestgate answered {status} for {path}: "
                               f"{scenario.needs or 'this feature'} not available yet")
        site.captured[path] = (body, headers.get("content-type", ""))


def _check(scenario: Scenario, name: str, site: Site) -> dict:
    if scenario.driver in ("cold", "write"):
        return {}
    status, body, headers = fetch(site.scheme, site.port, scenario.request, scenario.host,
                                  headers=dict(h.split(": ", 1) for h in scenario.headers))
    check = {"status": status, "body_bytes": len(body),
             "content_type": headers.get("content-type", ""), "tls": headers.get(":tls", "")}
    if scenario.headers:
        check["content_encoding"] = headers.get("content-encoding", "")
    if status // 100 != scenario.expect_status // 100:
        message = (f"{name} answered {status} for {scenario.request} "
                   f"(expected {scenario.expect_status})")
        if name == "nestgate":
            raise SkipScenario(f"{message}: {scenario.needs or 'feature'} not available yet?")
        raise BenchError(message)
    if scenario.driver == "h2load":
        check["alpn"] = _alpn(site.port)
        if check["alpn"] != "h2":
            if name == "nestgate":
                raise SkipScenario("nestgate does not offer h2 in ALPN (HTTP/2 not available yet)")
            raise BenchError(f"{name} does not offer h2")
    return check


def _alpn(port: int) -> str:
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    with socket.create_connection(("127.0.0.1", port), timeout=2) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
            return tls.selected_alpn_protocol() or ""


def _ports_text(sites: dict[str, Site], backend) -> str:
    return "".join(f"ports.{name}={site.port}\n" for name, site in sites.items())


# ---------------------------------------------------------------- runs

def _load(scenario: Scenario, opts: Options, site: Site, duration_s: int, connections: int = 0):
    return drivers.Load(url=f"{site.scheme}://127.0.0.1:{site.port}{scenario.request}",
                        connections=connections or opts.connections or scenario.connections,
                        threads=opts.threads, duration_s=duration_s, streams=scenario.streams,
                        host=scenario.host, headers=scenario.headers,
                        count_status=opts.count_status)


def _drive_once(scenario: Scenario, opts: Options, site: Site, duration_s: int, raw: Path,
                connections: int = 0) -> drivers.RunResult:
    if scenario.driver == "cold":
        return pyclient.cold(site.scheme, site.port, scenario.request,
                             "/api/v1/notes/long-note", NOTES_TOKEN, duration_s, raw)
    if scenario.driver == "write":
        return pyclient.writes(site.scheme, site.port, scenario.request, NOTES_TOKEN,
                               duration_s, raw)
    if scenario.driver == "h3py":
        from . import h3load                       # aioquic: the http3 extra
        return h3load.run(site.port, scenario.request,
                          connections or opts.connections or scenario.connections,
                          scenario.streams, duration_s, raw)
    return drivers.run(scenario.driver, _load(scenario, opts, site, duration_s, connections), raw)


def measure(peer: Peer, run_fn, counted: Path | None = None) -> tuple[drivers.RunResult, dict]:
    """Run `run_fn` and read the server's process tree around it; with `counted` (the
    folder of its callgrind dumps), the instructions it executed as well."""
    _alive(peer)
    pids = callgrind.workers(procstat.tree(peer.pid)) if counted else []
    idle = callgrind.idle_rate(pids, counted) if pids else 0.0
    callgrind.zero(pids)
    started = time.monotonic()
    cpu_before = procstat.cpu_seconds(peer.pid)
    with procstat.RssSampler(peer.pid) as rss:
        try:
            result = run_fn()
        except BenchError:
            _alive(peer)    # a server that died explains the driver's error better
            raise
    cpu_s = procstat.cpu_seconds(peer.pid) - cpu_before
    values = metrics(result, cpu_s, rss.average_bytes, rss.peak_bytes)
    if pids and result.requests:
        spent = callgrind.dumped(pids, counted) - idle * (time.monotonic() - started)
        values["instructions_per_request"] = spent / result.requests
        values["instructions_idle_per_s"] = idle
    return result, values


def _alive(peer: Peer) -> None:
    assert peer.server is not None
    if peer.server.exited() is not None:
        raise BenchError(f"{peer.name} stopped during the scenario (exit status "
                         f"{peer.server.exited()}); its stderr ends with:\n"
                         f"{peer.server.stderr_tail()}")


def metrics(result: drivers.RunResult, cpu_s: float, rss_avg: float, rss_peak: float) -> dict:
    lat = result.latency_ms
    return {
        "requests_per_s": result.rps,
        "bytes_per_s": result.bytes_per_s,
        "latency_p50_ms": lat["p50"], "latency_p90_ms": lat["p90"],
        "latency_p99_ms": lat["p99"], "latency_p999_ms": lat["p99.9"],
        "latency_mean_ms": lat["mean"],
        "cpu_us_per_request": cpu_s * 1e6 / result.requests if result.requests else None,
        "cpu_cores": cpu_s / result.duration_s if result.duration_s else None,
        "requests_per_s_per_core": result.requests / cpu_s if cpu_s else None,
        "rss_avg_mb": rss_avg / MB, "rss_peak_mb": rss_peak / MB,
        "errors": sum(result.errors.values()),
    }


def _record(kind: str, peer: str, number: int, raw: Path, result, values: dict,
            scenario: Scenario, **extra) -> dict:
    values["unexpected_status"] = result.unexpected(scenario.expect_status)
    return {"kind": kind, "peer": peer, "run": number, "raw": raw.name, **extra,
            "metrics": values, "errors": result.errors, "status": result.status,
            "requests": result.requests, "duration_s": result.duration_s,
            "protocol": result.protocol, **result.extra}


def _drive(scenario: Scenario, opts: Options, peers: list[Peer], sites: dict[str, Site],
           outdir: Path) -> tuple[list[dict], dict]:
    sweep = opts.sweep and scenario.sweep and scenario.driver == "wrk"
    slots = len(peers) * (1 + opts.runs + opts.profile
                          + (len(SWEEP_LEVELS) * opts.sweep_runs if sweep else 0))
    progress = Progress(scenario.name, slots, opts.duration_s + 1, opts.progress)
    servers = {p.name: _idle(p) for p in peers}
    runs: list[dict] = []
    for peer in peers:
        raw = outdir / f"{peer.name}_warmup.txt"
        progress.step(f"{peer.name} warm-up {opts.warmup_s}s")
        result, values = measure(peer, lambda: _drive_once(scenario, opts, sites[peer.name],
                                                           opts.warmup_s, raw),
                                 callgrind.dump_folder(sites[peer.name].wrapper))
        runs.append(_record("warmup", peer.name, 0, raw, result, values, scenario))
    for n in range(1, opts.runs + 1):
        for peer in peers:
            raw = outdir / f"{peer.name}_run{n}.txt"
            progress.step(f"{peer.name} run {n}/{opts.runs}")
            result, values = measure(peer, lambda: _drive_once(scenario, opts, sites[peer.name],
                                                               opts.duration_s, raw),
                                     callgrind.dump_folder(sites[peer.name].wrapper))
            runs.append(_record("run", peer.name, n, raw, result, values, scenario))
            progress.say(f"  {peer.name}: {result.rps:,.0f} req/s, "
                         f"{_f(values['cpu_us_per_request'])} us CPU/request, "
                         f"P99 {_f(values['latency_p99_ms'])} ms"
                         + (f", {values['instructions_per_request']:,.0f} instructions/request"
                            if values.get("instructions_per_request") else ""))
    if opts.profile:
        runs += _profile(scenario, opts, peers, sites, outdir, progress)
    if sweep:
        runs += _sweep(scenario, opts, peers, sites, outdir, progress)
    for peer in peers:
        servers[peer.name].update(_after(peer))
    return runs, servers


def _profile(scenario, opts, peers, sites, outdir, progress) -> list[dict]:
    """One more run per peer with perf sampling its process tree: the shares of its
    CPU by shared object (perfprofile), kept out of the medians."""
    runs = []
    for peer in peers:
        raw = outdir / f"{peer.name}_profile.txt"
        progress.step(f"{peer.name} profile run under perf")
        pids = [st.pid for st in procstat.tree(peer.pid)]
        with perfprofile.Recorder(pids, outdir / f"{peer.name}_perf.data") as recorder:
            result, values = measure(peer, lambda: _drive_once(
                scenario, opts, sites[peer.name], opts.duration_s, raw))
        runs.append(_record("profile", peer.name, 0, raw, result, values, scenario,
                            profile_shares=recorder.split))
        progress.say(f"  {peer.name}: " + ", ".join(
            f"{name} {share:.0%}" for name, share in sorted(
                recorder.split.items(), key=lambda item: -item[1])))
    return runs


def _sweep(scenario, opts, peers, sites, outdir, progress) -> list[dict]:
    runs = []
    for connections in SWEEP_LEVELS:
        for n in range(1, opts.sweep_runs + 1):
            for peer in peers:
                raw = outdir / f"{peer.name}_c{connections}_run{n}.txt"
                progress.step(f"{peer.name} sweep c={connections} run {n}/{opts.sweep_runs}")
                result, values = measure(peer, lambda: _drive_once(
                    scenario, opts, sites[peer.name], opts.duration_s, raw, connections))
                runs.append(_record("sweep", peer.name, n, raw, result, values, scenario,
                                    concurrency=connections))
                if values["errors"]:
                    progress.say(f"  {peer.name}: {values['errors']} socket errors ("
                                 + ", ".join(f"{k} {v}" for k, v in result.errors.items() if v)
                                 + f"), see {raw.name}")
    return runs


def _idle(peer: Peer) -> dict:
    info = {"pid": peer.pid, "processes": len(procstat.tree(peer.pid)),
            "rss_idle_mb": procstat.rss_bytes(peer.pid) / MB}
    workers = procstat.child_rss_bytes(peer.pid)
    if workers:
        info["worker_rss_idle_mb"] = max(workers) / MB
    return info


def _after(peer: Peer) -> dict:
    info = {"rss_after_mb": procstat.rss_bytes(peer.pid) / MB}
    workers = procstat.child_rss_bytes(peer.pid)
    if workers:
        info["worker_rss_after_mb"] = max(workers) / MB
    return info


def _f(value) -> str:
    return "-" if value is None else f"{value:.3g}"


# ---------------------------------------------------------------- after

def _enforce(scenario: Scenario, opts: Options, runs: list[dict], outdir: Path) -> None:
    """REQUIRE_ZERO_NON2XX: any response of another class than expected fails the scenario."""
    bad = [r for r in runs if r["kind"] != "warmup" and r["metrics"]["unexpected_status"]]
    if bad and opts.require_zero_non2xx:
        lines = [f"{r['peer']} {r['kind']} {r['run']}: {r['metrics']['unexpected_status']} "
                 f"responses not {scenario.expect_status // 100}xx ({r['status']})" for r in bad]
        raise ScenarioFailed(f"{scenario.name}: REQUIRE_ZERO_NON2XX check failed "
                             f"(see {outdir}):\n  " + "\n  ".join(lines))


def _scenario_dict(scenario: Scenario) -> dict:
    return {"name": scenario.name, "title": scenario.title, "request": scenario.request,
            "driver": scenario.driver, "tls": scenario.tls, "host": scenario.host,
            "expect_status": scenario.expect_status}


def _params(scenario: Scenario, opts: Options) -> dict:
    return {"runs": opts.runs, "duration_s": opts.duration_s, "warmup_s": opts.warmup_s,
            "threads": opts.threads, "workers": opts.workers,
            "connections": opts.connections or scenario.connections, "streams": scenario.streams,
            "peers": list(opts.peers), "require_zero_non2xx": opts.require_zero_non2xx,
            "count_status": opts.count_status, "sweep": opts.sweep, "command": opts.command}


def _plot(outdir: Path, result: dict) -> None:
    try:
        from . import plots
        plots.write(outdir, result)
    except ImportError as exc:
        print(f"plots skipped: {exc} (install the bench extra: pip install -e '.[bench]')",
              file=sys.stderr)
