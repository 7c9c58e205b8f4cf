"""Server-side cost from /proc: CPU time and RSS of a process and all its descendants.

A server is a tree (nginx master + workers, nestgate supervisor + workers), so every figure
is summed over the tree. CPU includes cutime/cstime: a worker that exits during a run and is
reaped by its parent moves its time there, and would otherwise vanish from the delta.
Linux only.
"""

import os
import threading
from dataclasses import dataclass

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class ProcStat:
    pid: int
    ppid: int
    cpu_ticks: int      # utime + stime + cutime + cstime
    rss_bytes: int


def parse_stat(text: str, pid: int) -> ProcStat:
    # The command name is in parentheses and may hold spaces or ')': split after the last one.
    fields = text[text.rindex(")") + 2:].split()
    ppid = int(fields[1])
    ticks = sum(int(f) for f in fields[11:15])
    return ProcStat(pid, ppid, ticks, int(fields[21]) * PAGE_BYTES)


def read_stat(pid: int) -> ProcStat | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return parse_stat(f.read(), pid)
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return None     # the process ended between listing and reading


def tree(root: int) -> list[ProcStat]:
    """`root` and every descendant alive now, root first."""
    parents: dict[int, list[ProcStat]] = {}
    stats: dict[int, ProcStat] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = read_stat(int(name))
            if st is not None:
                stats[st.pid] = st
                parents.setdefault(st.ppid, []).append(st)
    if root not in stats:
        return []
    found, queue = [], [stats[root]]
    while queue:
        st = queue.pop(0)
        found.append(st)
        queue.extend(parents.get(st.pid, []))
    return found


def cpu_seconds(root: int) -> float:
    return sum(st.cpu_ticks for st in tree(root)) / CLOCK_TICKS


def rss_bytes(root: int) -> int:
    return sum(st.rss_bytes for st in tree(root))


def child_rss_bytes(root: int) -> list[int]:
    """RSS of each descendant (the workers), without the root (the supervisor or master)."""
    return [st.rss_bytes for st in tree(root)[1:]]


class RssSampler:
    """Samples the tree's summed RSS in a thread during a run: average and peak.

    The pid list is taken once at start so each sample reads a few files instead of
    scanning /proc: the sampler must cost the machine almost nothing.
    """

    def __init__(self, root: int, interval_s: float = 0.25):
        self._pids = [st.pid for st in tree(root)]
        self._interval_s = interval_s
        self._samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> "RssSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while True:
            total = sum(st.rss_bytes for st in map(read_stat, self._pids) if st)
            if total:
                self._samples.append(total)
            if self._stop.wait(self._interval_s):
                return

    @property
    def average_bytes(self) -> float:
        return sum(self._samples) / len(self._samples) if self._samples else 0.0

    @property
    def peak_bytes(self) -> int:
        return max(self._samples, default=0)

