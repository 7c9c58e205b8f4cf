"""Instructions per request, counted by valgrind's callgrind: the bench's steady figure.

CPU time per request moves with everything else the machine does (another process on
the other core, the frequency, the caches): on a shared two-core machine the same build
measures 10-20 % apart from one run to the next. The number of instructions nestgate's
processes execute to answer a request does not: callgrind counts them in user space,
the same for the same code and the same requests whatever runs beside it. It does not
see the kernel (syscalls, TCP, the copies), so it compares one nestgate with another
(a change against the code before it, a route with a policy against one without), not
nestgate with nginx.

Under callgrind a program runs some 50 times slower, so `nestgate bench --instructions`
runs nestgate alone, with every process of its tree (supervisor, workers, admin) under
valgrind (`--trace-children=yes`; forked workers stay under it), and the workers are
counted. Not the supervisor and the admin process: they do the same work whatever the
load, and under valgrind so slowly that their ticks outweighed a request. A worker has
timers of its own (the clock, the heap check, reports to the admin), which cost the
same instructions per second idle or busy; as the request rate varies from run to run,
so would their share of a request. So before each run the workers' counters are zeroed
(`callgrind_control -z`), `IDLE_S` pass without load, and their dump (`-d`) gives the
idle instructions per second; then they are zeroed again, the run goes, and the figure
is (the run's instructions - idle rate x the run's seconds) / requests answered.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

TOOLS = ("valgrind", "callgrind_control")
IDLE_S = 3.0
ADMIN_NAME = "nestgate-admin"
READY_TIMEOUT_S = 300.0         # a Python start under valgrind takes tens of seconds
_TOTALS = re.compile(rb"^(?:summary|totals):\s*(\d+)", re.M)


def missing() -> str:
    """'' when callgrind can run here, else what is missing."""
    absent = [tool for tool in TOOLS if shutil.which(tool) is None]
    return f"{', '.join(absent)} not installed (Debian package: valgrind)" if absent else ""


def wrapper(outdir: Path) -> list[str]:
    """The command line that goes before the server's own."""
    return ["valgrind", "--tool=callgrind", "--trace-children=yes",
            f"--callgrind-out-file={outdir}/callgrind.%p"]


def workers(tree: list) -> list[int]:
    """The worker pids of a nestgate process tree (procstat.tree: the supervisor first)."""
    pids = []
    for st in tree[1:]:
        try:
            with open(f"/proc/{st.pid}/comm") as f:
                if f.read().strip() != ADMIN_NAME:
                    pids.append(st.pid)
        except OSError:
            pass                                # ended since the tree was read
    return pids


def idle_rate(pids: list[int], folder: Path) -> float:
    """Instructions per second the processes execute with no request to answer."""
    zero(pids)
    started = time.monotonic()
    time.sleep(IDLE_S)
    return dumped(pids, folder) / (time.monotonic() - started)


def dump_folder(wrapper) -> Path | None:
    """Where a server started under `wrapper` writes its dumps; None without one."""
    for arg in wrapper:
        if arg.startswith("--callgrind-out-file="):
            return Path(arg.partition("=")[2]).parent
    return None


def _control(option: str, pid: int) -> None:
    subprocess.run(["callgrind_control", option, str(pid)], capture_output=True, timeout=120)


def zero(pids: list[int]) -> None:
    for pid in pids:
        _control("-z", pid)


def dumped(pids: list[int], outdir: Path) -> int:
    """Dump every process's counters and return the instructions counted since `zero`."""
    total = 0
    for pid in pids:
        before = set(outdir.glob(f"callgrind.{pid}.*"))
        _control("-d", pid)
        for dump in set(outdir.glob(f"callgrind.{pid}.*")) - before:
            found = _TOTALS.search(dump.read_bytes())
            total += int(found.group(1)) if found else 0
            dump.unlink()                       # tens of MB each; the figure is kept
    return total
