"""`nestgate bench --idle-memory`: what nestgate holds in memory doing nothing.

The figure is the PSS (proportional set size) of the whole process tree: the supervisor,
the workers and the admin process, on the embedded default with two workers, a few
seconds after it said it is ready. PSS, not RSS: the forked processes share most of
their pages with the supervisor, and RSS would count each shared page once per process.
A page shared with every other program using the same libraries (libpython, libssl) is
split among all of them, so the figure drops a little on a machine running more Python;
that is why each run is its own start and the median of several is reported.
"""

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from .peers import PACKAGE_ROOT, ServerProcess, wait_ready
from .ports import free_ports
from .procstat import tree

DEFAULT_DIR = PACKAGE_ROOT / "nestgate" / "default"
SETTLE_S = 3.0                  # after ready: the admin's first reports, the workers' ticks
WORKERS = 2


def pss_kib(pid: int) -> int:
    """The process's PSS in KiB (0 when it has ended)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def _default_config(workdir: Path, port: int, admin_port: int) -> Path:
    """The embedded default as it ships, on free ports and two workers. Its relative
    folders (notes, public) resolve against the config's folder, so they are linked."""
    for name in ("notes", "public"):
        (workdir / name).symlink_to(DEFAULT_DIR / name)
    text = (DEFAULT_DIR / "nestgate.toml").read_text()
    text = text.replace("127.0.0.1:8080", f"127.0.0.1:{port}")
    lines = [f"workers = {WORKERS}" if line.startswith("workers =") else line
             for line in text.splitlines()]
    config = workdir / "nestgate.toml"
    config.write_text("\n".join(lines) + f'\n\n[admin]\naddress = "127.0.0.1:{admin_port}"\n')
    return config


def measure_once() -> dict:
    """One start of the embedded default: PSS in KiB per process and in total."""
    workdir = Path(tempfile.mkdtemp(prefix="nestgate-idle-"))
    port, admin_port = free_ports(2)
    config = _default_config(workdir, port, admin_port)
    env = {**os.environ, "PYTHONPATH": str(PACKAGE_ROOT), "STATE_DIRECTORY": str(workdir)}
    server = ServerProcess("nestgate", [sys.executable, "-m", "nestgate", "serve", "--config",
                                        str(config)], workdir, env)
    try:
        server.start(workdir)
        wait_ready(server, "http", port, "/api/v1/health")
        deadline = time.monotonic() + 10
        while len(tree(server.pid)) < WORKERS + 2 and time.monotonic() < deadline:
            time.sleep(0.1)                         # the admin process may come last
        time.sleep(SETTLE_S)
        processes = {st.pid: pss_kib(st.pid) for st in tree(server.pid)}
        return {"processes": len(processes), "pss_kib": sum(processes.values()),
                "by_process_kib": sorted(processes.values(), reverse=True)}
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def measure(runs: int = 3) -> dict:
    results = [measure_once() for _ in range(runs)]
    totals = sorted(r["pss_kib"] for r in results)
    return {"runs": results, "median_pss_mib": round(totals[len(totals) // 2] / 1024, 1),
            "min_pss_mib": round(totals[0] / 1024, 1), "max_pss_mib": round(totals[-1] / 1024, 1)}


def report(result: dict) -> str:
    run = result["runs"][0]
    return (f"idle memory, embedded default ({WORKERS} workers + supervisor + admin, "
            f"{run['processes']} processes): PSS median {result['median_pss_mib']} MiB "
            f"(min {result['min_pss_mib']}, max {result['max_pss_mib']}, "
            f"{len(result['runs'])} starts)")


def main(runs: int) -> int:
    result = measure(runs)
    print(report(result))
    return 0

