"""Reading a server's process tree from /proc."""

import os
import subprocess
import sys
import time

import pytest

from nestgate.bench import procstat

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs Linux /proc")

# Field layout of /proc/<pid>/stat (proc(5)); the name holds ") (" to test the split.
STAT = ("4242 (we) ird (name) S 4200 4242 4242 0 -1 4194560 1000 0 0 0 "
        "150 50 7 3 20 0 1 0 12345 100000000 2560 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 "
        "1 0 0 0 0 0 0 0 0 0 0 0 0 0\n")


def test_parse_stat():
    st = procstat.parse_stat(STAT, 4242)
    assert st.ppid == 4200
    assert st.cpu_ticks == 150 + 50 + 7 + 3        # utime stime cutime cstime
    assert st.rss_bytes == 2560 * procstat.PAGE_BYTES


def test_tree_cpu_and_rss_of_a_real_process_tree(tmp_path):
    # A parent with two children that each burn 0.3 s of CPU time (not wall time, so a
    # loaded machine only makes it slower) and say so: the tree must hold all three
    # and their CPU time.
    child = tmp_path / "child.py"
    child.write_text("import os, time\n"
                     "while time.process_time() < 0.3:\n    pass\n"
                     "os.write(1, b'spun\\n')\n"          # one write: the two lines stay whole

                     "time.sleep(30)\n")
    parent_code = tmp_path / "parent.py"
    parent_code.write_text("import subprocess, sys, time\n"
                           f"kids = [subprocess.Popen([sys.executable, {str(child)!r}]) "
                           "for _ in range(2)]\n"
                           "print('up', flush=True)\n"
                           "time.sleep(30)\n")
    parent = subprocess.Popen([sys.executable, str(parent_code)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert parent.stdout.readline().strip() == "up"
        assert [parent.stdout.readline().strip() for _ in range(2)] == ["spun", "spun"]
        tree = procstat.tree(parent.pid)
        assert [st.pid for st in tree][0] == parent.pid
        assert len(tree) == 3
        assert procstat.cpu_seconds(parent.pid) >= 0.5     # /proc counts whole 10 ms ticks
        assert procstat.rss_bytes(parent.pid) > sum(procstat.child_rss_bytes(parent.pid)) > 0
        with procstat.RssSampler(parent.pid, interval_s=0.01) as sampler:
            time.sleep(0.1)
        assert sampler.peak_bytes >= sampler.average_bytes > 0
    finally:
        for st in procstat.tree(parent.pid)[1:]:
            os.kill(st.pid, 9)
        parent.kill()
        parent.wait()


def test_tree_of_a_gone_process_is_empty():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert procstat.tree(proc.pid) == []
    assert procstat.cpu_seconds(proc.pid) == 0
