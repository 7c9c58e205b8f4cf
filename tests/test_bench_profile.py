"""`nestgate bench --profile`: one more run per server under perf, its samples split by
shared object, and each part's CPU microseconds per request in the summary."""

from __future__ import annotations

from conftest import bench_summary
from nestgate.bench.perfprofile import category, per_request, shares, table

REPORT = """# Samples: 2K of event 'cpu-clock:ppp'
#
# Overhead  Shared Object
# ........  .....................................
#
    41.50%  [kernel.kallsyms]
    30.00%  libpython3.11.so.1.0
     9.25%  loop.cpython-311-x86_64-linux-gnu.so
     6.00%  libcrypto.so.3
     4.00%  libssl.so.3
     3.00%  parser.cpython-311-x86_64-linux-gnu.so
     3.00%  libc.so.6
     2.25%  _brotli.cpython-311-x86_64-linux-gnu.so
     1.00%  [vdso]
"""


def test_shared_objects_fall_into_their_parts():
    assert category("nginx") == category("caddy") == "server binary"
    assert category("libssl.so.3") == category("libcrypto.so.3") == "OpenSSL"
    assert category("url_parser.cpython-311-x86_64-linux-gnu.so") == "httptools"
    assert category("python3.11") == "Python interpreter"
    split = shares(REPORT)
    assert split == {"kernel": 0.425, "Python interpreter": 0.30,
                     "event loop (uvloop, libuv)": 0.0925, "OpenSSL": 0.10,
                     "httptools": 0.03, "libc": 0.03, "other": 0.0225}
    costs = per_request(split, 20.0)
    assert abs(sum(costs.values()) - 20.0) < 1e-9 and costs["kernel"] == 8.5
    rows = table({"nestgate": costs, "nginx": {"kernel": 5.0, "server binary": 3.0}})
    assert rows[2] == "| kernel | 8.50 | 5.00 |" and rows[-1] == "| total | 20.00 | 8.00 |"


def test_a_profile_run_splits_each_servers_cpu(tmp_path):
    summary = bench_summary(tmp_path, "--profile", "--scenario", "health", "--peers", "nginx",
                            "--runs", "1", "--duration", "2", "--warmup", "1", timeout=300)
    profile = summary["profile"]
    assert set(profile) == {"nestgate", "nginx"}
    # Every server spends part of a request in the kernel (the socket calls); nestgate
    # the larger part of the rest in the interpreter, nginx in its own binary.
    for peer, parts in profile.items():
        assert parts.get("kernel", 0) > 0, (peer, parts)
        median = summary[peer]["cpu_us_per_request"]["median"]
        assert abs(sum(parts.values()) - median) < 0.05 * median, (peer, parts, median)
    assert profile["nestgate"]["Python interpreter"] > profile["nestgate"].get("OpenSSL", 0)
    assert profile["nginx"]["server binary"] > 0
    assert "Where the CPU goes" in (summary["folder"] / "summary.md").read_text()
