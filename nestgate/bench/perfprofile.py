"""Where a server's CPU goes per request: `perf` samples split by shared object.

`nestgate bench --profile` adds, after a scenario's measured runs, one more run per
peer with `perf record` sampling every process of the server's tree (the same
processes whose CPU time the bench counts). `perf report --sort dso` gives the share
of samples in each shared object (the kernel, libssl and libcrypto, httptools' parser,
uvloop with its libuv, libpython, nginx's or Caddy's own binary, libc...); each share
times that run's CPU microseconds per request is what that part costs a request.

The shares are proportions of one server's own samples, so they hold up on a busy
machine better than the absolute times they multiply: the other processes on the core
slow a request down, they do not move it from OpenSSL to the kernel. libpython is the
interpreter running Python code: nestgate's own and the standard library's (asyncio
beside uvloop, ssl's wrappers), told apart by nothing here; `py-spy` can split it.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
from pathlib import Path

FREQUENCY_HZ = 499                 # samples per second per CPU: ~1 % of a core to take

# (category, pattern on the shared object's name), first match wins.
CATEGORIES = (
    ("kernel", re.compile(r"^\[kernel|^\[vdso\]|^\[vsyscall\]")),
    ("OpenSSL", re.compile(r"^lib(ssl|crypto)\.so")),
    ("httptools", re.compile(r"^(parser|url_parser)\.cpython")),
    ("event loop (uvloop, libuv)", re.compile(r"^loop\.cpython|^libuv")),
    ("Python interpreter", re.compile(r"^libpython|^python3")),
    ("server binary", re.compile(r"^(nginx|caddy)$")),
    ("libc", re.compile(r"^(libc|ld-linux|libm|libpthread)[.-]")),
)
OTHER = "other"
ORDER = tuple(name for name, _ in CATEGORIES) + (OTHER,)
_LINE = re.compile(r"^\s*([\d.]+)%\s+(.+?)\s*$")


def missing() -> str:
    """Why profiles cannot be taken here; '' when they can."""
    if not shutil.which("perf"):
        return "perf is not installed (Debian package linux-perf)"
    return ""


def category(dso: str) -> str:
    for name, pattern in CATEGORIES:
        if pattern.search(dso):
            return name
    return OTHER


def shares(report: str) -> dict[str, float]:
    """{category: fraction of the samples} from `perf report --sort dso --stdio`."""
    out: dict[str, float] = {}
    for line in report.splitlines():
        if line.startswith("#"):
            continue
        found = _LINE.match(line)
        if found:
            name = category(Path(found.group(2)).name)
            out[name] = out.get(name, 0.0) + float(found.group(1)) / 100
    return out


def per_request(split: dict[str, float], cpu_us_per_request: float | None) -> dict[str, float]:
    """Each category's CPU microseconds per request."""
    if not cpu_us_per_request:
        return {}
    return {name: share * cpu_us_per_request for name, share in split.items()}


class Recorder:
    """`perf record` on `pids` while the block runs; `.split` the shares after it."""

    def __init__(self, pids: list[int], data: Path) -> None:
        self.pids, self.data = pids, data
        self.split: dict[str, float] = {}
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Recorder:
        self.proc = subprocess.Popen(
            ["perf", "record", "-q", "-F", str(FREQUENCY_HZ), "-o", str(self.data),
             "-p", ",".join(map(str, self.pids))],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        return self

    def __exit__(self, *exc) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            return
        if exc[0] is not None or not self.data.exists():
            if err:
                print(f"perf record: {err.decode(errors='replace')[-300:]}")
            return
        report = subprocess.run(
            ["perf", "report", "-i", str(self.data), "--sort", "dso", "--stdio",
             "--percent-limit", "0"], capture_output=True, text=True, timeout=120)
        self.split = shares(report.stdout)


def table(profiles: dict[str, dict[str, float]]) -> list[str]:
    """Markdown rows: each category's microseconds per request for each peer."""
    peers = list(profiles)
    if not peers:
        return []
    lines = ["| CPU us per request | " + " | ".join(peers) + " |",
             "|---|" + "---|" * len(peers)]
    for name in ORDER:
        values = [profiles[p].get(name) for p in peers]
        if any(values):
            lines.append(f"| {name} | " + " | ".join(
                f"{v:.2f}" if v else "-" for v in values) + " |")
    totals = [sum(profiles[p].values()) for p in peers]
    lines.append("| total | " + " | ".join(f"{t:.2f}" for t in totals) + " |")
    return lines
