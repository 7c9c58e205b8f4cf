"""PNG plots of a scenario's summary. matplotlib is imported here only (the `bench` extra),
so the harness runs, and writes everything else, without it."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")           # no display on a server
import matplotlib.pyplot as plt  # noqa: E402

from .summary import peers_of  # noqa: E402


def write(outdir: Path, summary: dict) -> list[Path]:
    written = [_bars(outdir, summary)]
    if summary.get("sweep"):
        written.append(_curve(outdir, summary))
    return written


def _runs(summary: dict, peer: str, key: str) -> list[float]:
    return [r["metrics"][key] for r in summary["runs"]
            if r["kind"] == "run" and r["peer"] == peer and r["metrics"].get(key) is not None]


def _bars(outdir: Path, summary: dict) -> Path:
    """Requests/s and P99 per peer: bar = median, dots = every run (the spread matters)."""
    peers = peers_of(summary)
    fig, axes = plt.subplots(1, 3, figsize=(12, 4))
    for ax, (key, label) in zip(axes, (("requests_per_s", "requests/s"),
                                       ("cpu_us_per_request", "server CPU us / request"),
                                       ("latency_p99_ms", "latency P99 (ms)"))):
        medians = [(summary[p].get(key) or {}).get("median") or 0 for p in peers]
        ax.bar(peers, medians, color=["#2a7" if p == "nestgate" else "#888" for p in peers])
        for i, peer in enumerate(peers):
            values = _runs(summary, peer, key)
            ax.plot([i] * len(values), values, "k.", alpha=0.6)
        ax.set_title(label)
    fig.suptitle(f"{summary['scenario']['name']}: {summary['scenario']['title']} (median, runs)")
    fig.tight_layout()
    path = outdir / "runs.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _curve(outdir: Path, summary: dict) -> Path:
    """Throughput-latency curve of the concurrency sweep, one line per peer."""
    fig, ax = plt.subplots(figsize=(7, 5))
    for peer, points in summary["sweep"].items():
        xs = [m["requests_per_s"] for m in points.values()]
        ys = [m["latency_p99_ms"] for m in points.values()]
        ax.plot(xs, ys, marker="o", label=peer)
        for c, x, y in zip(points, xs, ys):
            ax.annotate(str(c), (x, y), fontsize=7)
    ax.set_xlabel("requests/s (median)")
    ax.set_ylabel("latency P99 (ms, median)")
    ax.set_yscale("log")
    ax.legend()
    ax.set_title(f"{summary['scenario']['name']}: connections 1..1024")
    fig.tight_layout()
    path = outdir / "sweep.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
