"""`nestgate bench --instructions`: nestgate under valgrind's callgrind, the counters
zeroed before and dumped after each run, and instructions per request in the summary."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import _env


def test_instructions_per_request_are_counted(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "nestgate", "bench", "--instructions", "--scenario", "health",
         "--runs", "1", "--duration", "2", "--warmup", "1", "--connections", "2",
         "--output", str(tmp_path), "--quiet"],
        capture_output=True, text=True, env=_env(), timeout=420)
    assert out.returncode == 0, out.stderr[-3000:]
    [folder] = [p for p in tmp_path.iterdir() if p.is_dir()]
    summary = json.loads((folder / "summary.json").read_text())
    assert list(summary["compare"]) == []                 # nestgate alone
    counted = summary["nestgate"]["instructions_per_request"]
    # A health answer costs Python tens of thousands of instructions, not a handful and
    # not the whole start (which would mean the counters were never zeroed).
    assert counted["n"] == 1 and 5_000 < counted["median"] < 5_000_000, counted
