"""`nestgate bench --instructions`: nestgate under valgrind's callgrind, the counters
zeroed before and dumped after each run, and instructions per request in the summary."""

from __future__ import annotations

from conftest import bench_summary


def test_instructions_per_request_are_counted(tmp_path):
    summary = bench_summary(tmp_path, "--instructions", "--scenario", "health", "--runs", "1",
                            "--duration", "2", "--warmup", "1", "--connections", "2",
                            timeout=420)
    assert list(summary["compare"]) == []                 # nestgate alone
    counted = summary["nestgate"]["instructions_per_request"]
    # A health answer costs Python tens of thousands of instructions, not a handful and
    # not the whole start (which would mean the counters were never zeroed).
    assert counted["n"] == 1 and 5_000 < counted["median"] < 5_000_000, counted
