"""Per-run figures -> statistics -> summary.json, summary.md and the console report.

Pure functions of the run records, so the arithmetic is tested without running anything.
Medians are the figures to publish (Arc's rule): one disturbed run moves a mean, not a median.
"""

import json
import statistics
from pathlib import Path

from .perfprofile import per_request, table

SUBJECT = "nestgate"

# (metric key, label, unit, whether lower is better) in the order tables show them.
METRICS = (
    ("requests_per_s", "requests/s", "", False),
    ("cpu_us_per_request", "server CPU per request", "us", True),
    ("instructions_per_request", "instructions per request (callgrind)", "", True),
    ("cpu_cores", "server CPU cores used", "", True),
    ("requests_per_s_per_core", "requests/s per server core", "", False),
    ("latency_p50_ms", "latency P50", "ms", True),
    ("latency_p90_ms", "latency P90", "ms", True),
    ("latency_p99_ms", "latency P99", "ms", True),
    ("latency_p999_ms", "latency P99.9", "ms", True),
    ("bytes_per_s", "bytes/s", "", False),
    ("rss_avg_mb", "server RSS average", "MB", True),
    ("rss_peak_mb", "server RSS peak", "MB", True),
    ("errors", "socket errors", "", True),
    ("unexpected_status", "unexpected status", "", True),
)
RATIOS = ("requests_per_s", "cpu_us_per_request", "latency_p99_ms", "rss_peak_mb")


def stats(values: list[float]) -> dict:
    vals = [v for v in values if v is not None]
    if not vals:
        return {"n": 0, "mean": None, "median": None, "min": None, "max": None, "stdev": None}
    return {"n": len(vals), "mean": statistics.fmean(vals), "median": statistics.median(vals),
            "min": min(vals), "max": max(vals),
            "stdev": statistics.stdev(vals) if len(vals) > 1 else 0.0}


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def aggregate(runs: list[dict]) -> dict:
    """{peer: {metric: stats}} over the measured runs (warm-up and sweep runs excluded)."""
    peers: dict[str, dict[str, list]] = {}
    for run in runs:
        if run.get("kind", "run") != "run":
            continue
        per = peers.setdefault(run["peer"], {})
        for key, value in run["metrics"].items():
            per.setdefault(key, []).append(value)
    return {peer: {k: stats(v) for k, v in metrics.items()} for peer, metrics in peers.items()}


def compare(aggregated: dict) -> dict:
    """Median ratios nestgate/peer for each peer that ran next to nestgate."""
    subject = aggregated.get(SUBJECT)
    out = {}
    for peer, metrics in aggregated.items():
        if peer == SUBJECT or subject is None:
            continue
        block = {}
        for key in RATIOS:
            r = ratio(subject.get(key, {}).get("median"), metrics.get(key, {}).get("median"))
            block[f"{key}_ratio_median"] = r
        r = block["requests_per_s_ratio_median"]
        block["requests_per_s_gap_pct_median"] = None if r is None else (r - 1) * 100
        out[f"{SUBJECT}_vs_{peer}"] = block
    return out


def sweep_table(runs: list[dict]) -> dict:
    """{peer: {concurrency: {requests_per_s, latency_p99_ms, cpu_us_per_request, errors}}}:
    medians of the sweep runs, and their socket errors added up (a median would hide
    the one run in three where connections were refused)."""
    points: dict[str, dict[int, dict[str, list]]] = {}
    for run in runs:
        if run.get("kind") != "sweep":
            continue
        per = points.setdefault(run["peer"], {}).setdefault(run["concurrency"], {})
        for key in ("requests_per_s", "latency_p99_ms", "cpu_us_per_request", "errors"):
            per.setdefault(key, []).append(run["metrics"].get(key))
    return {peer: {c: {k: sum(filter(None, v)) if k == "errors" else stats(v)["median"]
                       for k, v in m.items()} for c, m in sorted(cs.items())}
            for peer, cs in points.items()}


def socket_errors(runs: list[dict]) -> list[str]:
    """One line per measured or sweep run that had socket errors, by kind: a run that
    could not connect measured something else than the one beside it."""
    lines = []
    for run in runs:
        counts = {k: v for k, v in (run.get("errors") or {}).items() if v}
        if run.get("kind") == "warmup" or not counts:
            continue
        where = f"c={run['concurrency']} " if "concurrency" in run else ""
        lines.append(f"{run['peer']} {run['kind']} {where}{run['run']}: "
                     + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return lines


def build(scenario: dict, params: dict, runs: list[dict], extra: dict) -> dict:
    aggregated = aggregate(runs)
    summary = {"scenario": scenario, "params": params, **aggregated,
               "compare": compare(aggregated), **extra, "runs": runs}
    sweep = sweep_table(runs)
    if sweep:
        summary["sweep"] = sweep
    profile = profile_table(runs, aggregated)
    if profile:
        summary["profile"] = profile
    return summary


def profile_table(runs: list[dict], aggregated: dict) -> dict:
    """{peer: {category: CPU us per request}}: the profile run's shares (perfprofile)
    times the median CPU per request of the measured runs, the steadier absolute."""
    out = {}
    for run in runs:
        if run.get("kind") == "profile" and run.get("profile_shares"):
            median = ((aggregated.get(run["peer"]) or {}).get("cpu_us_per_request")
                      or {}).get("median")
            out[run["peer"]] = per_request(run["profile_shares"], median)
    return out


def write(outdir: Path, summary: dict) -> None:
    (outdir / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    (outdir / "summary.md").write_text(markdown(summary))


# ---------------------------------------------------------------- text

def fmt(value, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, (int, float)) and abs(value) >= 1000:
        text = f"{value:,.0f}"
    elif isinstance(value, float):
        text = f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"
    else:
        text = str(value)
    return f"{text} {unit}".strip()


def peers_of(summary: dict) -> list[str]:
    names = [k for k, v in summary.items() if isinstance(v, dict) and "requests_per_s" in v]
    return sorted(names, key=lambda p: (p != SUBJECT, p))


def markdown(summary: dict) -> str:
    sc, params = summary["scenario"], summary["params"]
    peers = peers_of(summary)
    out = [f"# {sc['name']}: {sc['title']}", "",
           f"`{params.get('command', '')}` - {params.get('runs')} runs per peer, alternated, "
           f"after a {params.get('warmup_s')} s warm-up; medians (min-max). "
           "Absolute figures are this machine's.", ""]
    for name, block in summary.get("compare", {}).items():
        out.append(f"**{name.replace('_vs_', ' / ')}** (median ratios): "
                   + ", ".join(f"{key.replace('_ratio_median', '')} {fmt(value)}"
                               for key, value in block.items()
                               if key.endswith("ratio_median")))
        out.append("")
    out += ["| metric | " + " | ".join(peers) + " |", "|---|" + "---|" * len(peers)]
    for key, label, unit, _ in METRICS:
        cells = []
        for peer in peers:
            st = summary[peer].get(key)
            cells.append("-" if not st or st["median"] is None else
                         f"{fmt(st['median'], unit)} ({fmt(st['min'])}-{fmt(st['max'])})")
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    if summary.get("servers"):
        out.append("")
    for peer, info in summary.get("servers", {}).items():
        out.append(f"- {peer}: " + ", ".join(f"{k} {v if isinstance(v, int) else fmt(v)}"
                                              for k, v in info.items()))
    if summary.get("disk_fsync_writes_per_s"):
        out.append(f"- requests/s here are notes written; this disk's own rate for write + "
                   f"fsync + rename + fsync dir: {fmt(summary['disk_fsync_writes_per_s'])}/s")
    for peer, reason in summary.get("skipped_peers", {}).items():
        out.append(f"- {peer} not run: {reason}")
    if summary.get("sweep"):
        out += ["", "## Concurrency sweep (medians)", "",
                "| peer | connections | requests/s | P99 ms | CPU us/req | socket errors |",
                "|---|---|---|---|---|---|"]
        for peer, points in summary["sweep"].items():
            for c, m in points.items():
                out.append(f"| {peer} | {c} | {fmt(m['requests_per_s'])} | "
                           f"{fmt(m['latency_p99_ms'])} | {fmt(m['cpu_us_per_request'])} | "
                           f"{fmt(m.get('errors'))} |")
    if summary.get("profile"):
        out += ["", "## Where the CPU goes (perf samples by shared object x median CPU "
                "per request)", ""] + table(summary["profile"])
    errors = socket_errors(summary.get("runs", []))
    if errors:
        out += ["", "Socket errors (the driver's count, by kind):", ""]
        out += [f"- {line}" for line in errors]
    return "\n".join(out) + "\n"


def console(summary: dict) -> str:
    """The short report printed at the end of a scenario (what bench-quick shows)."""
    sc = summary["scenario"]
    peers = peers_of(summary)
    lines = [f"{sc['name']}: {sc['title']}",
             f"  {'peer':<10}{'req/s':>12}{'CPU us/req':>12}{'P99 ms':>10}{'RSS MB':>9}   (medians)"]
    for peer in peers:
        m = summary[peer]
        med = lambda k: (m.get(k) or {}).get("median")  # noqa: E731
        lines.append(f"  {peer:<10}{fmt(med('requests_per_s')):>12}"
                     f"{fmt(med('cpu_us_per_request')):>12}{fmt(med('latency_p99_ms')):>10}"
                     f"{fmt(med('rss_peak_mb')):>9}")
    for name, block in summary.get("compare", {}).items():
        lines.append(f"  {name.replace('_vs_', '/')}: req/s x{fmt(block['requests_per_s_ratio_median'])}"
                     f", CPU per request x{fmt(block['cpu_us_per_request_ratio_median'])}")
    if summary.get("disk_fsync_writes_per_s"):
        lines.append(f"  notes written per s: {fmt(med_of(summary, 'requests_per_s'))}; the disk's "
                     f"own write+fsync+rename rate: {fmt(summary['disk_fsync_writes_per_s'])}/s")
    if summary.get("profile"):
        lines += ["  where the CPU goes (perf, us per request):"]
        lines += [f"  {row}" for row in table(summary["profile"])]
    for line in socket_errors(summary.get("runs", [])):
        lines.append(f"  socket errors: {line}")
    for peer, reason in summary.get("skipped_peers", {}).items():
        lines.append(f"  {peer} not run: {reason}")
    info = summary.get("servers", {}).get(SUBJECT, {})
    if "worker_rss_idle_mb" in info:
        lines.append(f"  nestgate worker RSS: idle {fmt(info['worker_rss_idle_mb'])} MB, "
                     f"after the runs {fmt(info.get('worker_rss_after_mb'))} MB")
    return "\n".join(lines)


def med_of(summary: dict, key: str, peer: str = SUBJECT):
    return ((summary.get(peer) or {}).get(key) or {}).get("median")
