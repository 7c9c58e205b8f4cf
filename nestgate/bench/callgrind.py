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
valgrind (`--trace-children=yes`; forked workers stay under it). Around each run the
counters of every process are zeroed (`callgrind_control -z`) and then dumped
(`callgrind_control -d`); the dumps' totals, summed and divided by the requests
answered, are the figure.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

TOOLS = ("valgrind", "callgrind_control")
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
