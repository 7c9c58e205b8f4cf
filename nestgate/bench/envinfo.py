"""env.txt: what a reader needs to reproduce or distrust the figures (Arc's list and more)."""

import os
import platform
import subprocess
import sys
from pathlib import Path

from . import tools


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return "unreadable"


def _git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10, cwd=Path(__file__).resolve().parent)
        dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True,
                               timeout=10, cwd=Path(__file__).resolve().parent).stdout.strip()
        return out.stdout.strip() + (" (uncommitted changes)" if dirty else "") or "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def cpu_model() -> str:
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def collect(params: dict, peer_versions: dict[str, str]) -> dict[str, str]:
    env = {
        "run_id": params.get("stamp", ""),
        "git_commit": _git_commit(),
        "uname": " ".join(platform.uname()),
        "python": platform.python_version(),
        # Which build matters as much as the version: a distribution's optimised build
        # and a plain source build (pyenv's default) differ by about 2x on pure Python.
        "python_executable": os.path.realpath(sys.executable),
        "python_build": " ".join(platform.python_build()) + " " + platform.python_compiler(),
        "cpu_model": cpu_model(),
        "cpu_count": str(os.cpu_count()),
        "cpu_affinity": str(len(os.sched_getaffinity(0))),
        "governor": _read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"),
        "loadavg": _read("/proc/loadavg"),
        "mem_total": next((l.split(":", 1)[1].strip() for l in _read("/proc/meminfo").splitlines()
                           if l.startswith("MemTotal")), "unknown"),
        "wrk_version": tools.version("wrk"),
        "h2load_version": tools.version("h2load"),
        "nginx_version": tools.version("nginx"),
        "caddy_version": tools.version("caddy"),
    }
    env.update({f"{name}_version": v for name, v in peer_versions.items()})
    env.update({f"params.{k}": str(v) for k, v in params.items()})
    return env


def text(env: dict[str, str]) -> str:
    return "".join(f"{k}={v}\n" for k, v in env.items())
