"""`nestgate bench`: argument parsing, the scenario loop, the final report.

`nestgate.cli` hands over the arguments after `bench`; this module returns the exit status:
0 when every scenario ran (or was skipped with a reason), 1 when one failed, 2 for a
usage error or a missing tool.
"""

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

from . import (BenchError, SkipScenario, callgrind, envinfo, perfprofile, scenarios,
               summary, tools)
from .peers import PEERS, Nestgate
from .runner import Options, ScenarioFailed, run_scenario

QUICK = {"runs": 3, "duration_s": 5, "warmup_s": 2}
STANDARD = {"runs": 5, "duration_s": 5, "warmup_s": 2}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nestgate bench",
        description="Benchmark nestgate against nginx (and Caddy when installed) on this machine.")
    p.add_argument("--quick", action="store_true",
                   help="health over HTTP and HTTPS, 3 runs of 5 s per server after a 2 s "
                        "warm-up: about two minutes")
    p.add_argument("--scenario", action="append", metavar="NAME",
                   help="run this scenario (repeatable); see --list")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    p.add_argument("--runs", type=int, help="measured runs per peer (default 5, quick 3)")
    p.add_argument("--duration", type=int, metavar="S", help="seconds per run (default 5)")
    p.add_argument("--warmup", type=int, metavar="S", help="seconds of warm-up (default 2)")
    p.add_argument("--peers", default="nginx,caddy",
                   help="comma-separated peers; missing ones are reported and left out "
                        "(default nginx,caddy)")
    p.add_argument("--output", type=Path, default=Path("results"), metavar="DIR",
                   help="results folder (default results/)")
    p.add_argument("--workers", type=int, default=1,
                   help="worker processes of every server (default 1)")
    p.add_argument("--connections", type=int, default=0, metavar="N",
                   help="open connections (default: the scenario's, 64 for most)")
    p.add_argument("--threads", type=int, default=1, help="load generator threads (default 1)")
    p.add_argument("--sweep", action="store_true",
                   help="also sweep concurrency 1..1024 on the health scenario")
    p.add_argument("--count-status", action="store_true",
                   help="count every status class in wrk (exact split; slows the client ~10%%)")
    p.add_argument("--allow-non2xx", action="store_true",
                   help="do not fail on unexpected statuses (REQUIRE_ZERO_NON2XX=0 does the same)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--instructions", action="store_true",
                   help="run nestgate alone under valgrind's callgrind and report the "
                        "instructions each request costs (steady on a busy machine; about "
                        "50x slower, so use a few short runs)")
    p.add_argument("--profile", action="store_true",
                   help="after the runs, one more run per server under perf: where its "
                        "CPU per request goes (kernel, OpenSSL, httptools, the event loop, "
                        "the Python interpreter, the server's binary)")
    p.add_argument("--idle-memory", action="store_true",
                   help="only measure nestgate's idle memory (PSS of the embedded default's "
                        "process tree, --runs starts, default 3) and exit")
    return p


def options(args: argparse.Namespace, argv: list[str]) -> Options:
    base = QUICK if args.quick else STANDARD
    # Under callgrind nestgate alone: the count compares nestgate with itself.
    peers = () if args.instructions else \
        tuple(p.strip() for p in args.peers.split(",") if p.strip())
    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        raise ValueError(f"unknown peer {', '.join(unknown)}; known: {', '.join(PEERS)}")
    require = os.environ.get("REQUIRE_ZERO_NON2XX", "1") != "0" and not args.allow_non2xx
    # Absolute: the servers it starts run from other directories and read files there.
    return Options(output=args.output.resolve(), runs=args.runs or base["runs"],
                   duration_s=args.duration or base["duration_s"],
                   warmup_s=args.warmup or base["warmup_s"], threads=args.threads,
                   workers=args.workers, connections=args.connections, peers=peers,
                   require_zero_non2xx=require, count_status=args.count_status,
                   sweep=args.sweep, progress=not args.quiet, instructions=args.instructions,
                   profile=args.profile,
                   command="nestgate bench " + shlex.join(argv))


def preflight(chosen: list[scenarios.Scenario], opts: Options) -> None:
    """Name every missing tool at once, with its Debian package, before anything starts."""
    needed = {s.driver for s in chosen} & {"wrk", "h2load"}
    if "nginx" in opts.peers or any(s.route.kind == "proxy" for s in chosen):
        needed.add("nginx")
    missing = [t for t in sorted(needed) if not tools.which(t)]
    if opts.instructions and callgrind.missing():
        raise BenchError(f"--instructions: {callgrind.missing()}")
    if opts.profile and perfprofile.missing():
        raise BenchError(f"--profile: {perfprofile.missing()}")
    if opts.profile and opts.instructions:
        raise BenchError("--profile and --instructions: one at a time (valgrind would be "
                         "what perf sees)")
    if missing:
        raise BenchError("missing tools: " + ", ".join(
            f"{t} (Debian package {tools.DEBIAN_PACKAGES[t]})" for t in missing)
            + "; `make bench` installs them when run as root")


def main(argv: list[str]) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.idle_memory:
        from . import idlemem
        return idlemem.main(args.runs or 3)
    if args.list:
        width = max(len(s.name) for s in scenarios.SCENARIOS) + 2
        for s in scenarios.SCENARIOS:
            print(f"{s.name:<{width}}{s.title}{'  [quick]' if s.name in scenarios.QUICK else ''}")
        return 0
    try:
        chosen = scenarios.select(args.scenario, args.quick)
        opts = options(args, argv)
        preflight(chosen, opts)
    except (ValueError, BenchError) as exc:
        print(f"nestgate bench: {exc}", file=sys.stderr)
        return 2
    for name, reason in missing_peers(opts).items():
        print(f"nestgate bench: {name} left out: {reason}", file=sys.stderr, flush=True)
    return run_all(chosen, opts)


def missing_peers(opts: Options) -> dict[str, str]:
    """{peer: why it cannot run here}, said on the console before the runs and not only
    in the summaries written after them."""
    found = {name: PEERS[name](Path("."), Path(".")).available() for name in opts.peers}
    return {name: reason for name, reason in found.items() if reason}


def run_all(chosen: list[scenarios.Scenario], opts: Options) -> int:
    versions = {"nestgate": Nestgate(Path("."), Path(".")).version()}
    params = {**_plain(opts), "scenarios": ",".join(s.name for s in chosen)}
    env_text = envinfo.text(envinfo.collect(params, versions))
    results, skipped, failed = [], {}, {}
    started = time.monotonic()
    for scenario in chosen:
        try:
            result = run_scenario(scenario, opts, env_text)
        except SkipScenario as exc:
            skipped[scenario.name] = str(exc)
            print(f"[{scenario.name}] skipped: {exc}", file=sys.stderr)
            continue
        except ScenarioFailed as exc:
            failed[scenario.name] = str(exc)
            print(f"[{scenario.name}] FAILED: {exc}", file=sys.stderr)
            continue
        except BenchError as exc:
            failed[scenario.name] = str(exc)
            print(f"[{scenario.name}] error: {exc}", file=sys.stderr)
            continue
        results.append(result)
        print(summary.console(result) + f"\n  -> {result['outdir']}\n", flush=True)
    report = overview(results, skipped, failed, opts, time.monotonic() - started)
    opts.output.mkdir(parents=True, exist_ok=True)
    path = opts.output / f"bench_{opts.stamp}.md"
    path.write_text(report)
    print(report + f"\n(written to {path})")
    return 1 if failed else 0


def overview(results: list[dict], skipped: dict, failed: dict, opts: Options,
             elapsed_s: float) -> str:
    """All scenarios in one table, ratios first (for the README's Performance section)."""
    lines = [f"# nestgate bench {opts.stamp}", "",
             f"`{opts.command}`: {opts.runs} runs x {opts.duration_s} s per peer, "
             f"{opts.workers} worker(s) each, medians; took {elapsed_s:.0f} s. "
             "Absolute figures are this machine's.", "",
             "| scenario | peer | req/s ratio | CPU/req ratio | nestgate req/s | peer req/s "
             "| nestgate CPU us/req | peer CPU us/req | nestgate P99 ms | peer P99 ms |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for res in results:
        sub = res.get("nestgate", {})
        med = lambda m, k: (m.get(k) or {}).get("median")  # noqa: E731
        peers = [p for p in summary.peers_of(res) if p != "nestgate"] or ["-"]
        for peer in peers:
            other = res.get(peer, {})
            block = res["compare"].get(f"nestgate_vs_{peer}", {})
            lines.append("| " + " | ".join(summary.fmt(v) if not isinstance(v, str) else v for v in (
                res["scenario"]["name"], peer, block.get("requests_per_s_ratio_median"),
                block.get("cpu_us_per_request_ratio_median"), med(sub, "requests_per_s"),
                med(other, "requests_per_s"), med(sub, "cpu_us_per_request"),
                med(other, "cpu_us_per_request"), med(sub, "latency_p99_ms"),
                med(other, "latency_p99_ms"))) + " |")
    for name, why in skipped.items():
        lines.append(f"\n- skipped {name}: {why}")
    for name, why in failed.items():
        lines.append(f"\n- FAILED {name}: {why}")
    return "\n".join(lines) + "\n"


def _plain(opts: Options) -> dict:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(opts).items()}
