"""Summary arithmetic: statistics per peer, median ratios, tables."""

import json

import pytest

from nestgate.bench import summary as s


def run(peer, n, rps, cpu, kind="run", **metrics):
    return {"kind": kind, "peer": peer, "run": n,
            "metrics": {"requests_per_s": rps, "cpu_us_per_request": cpu,
                        "latency_p99_ms": metrics.get("p99", 1.0), "rss_peak_mb": 20.0}}


RUNS = [
    run("nestgate", 0, 1.0, 99.0, kind="warmup"),    # never counted
    run("nginx", 0, 1.0, 99.0, kind="warmup"),
    run("nestgate", 1, 80_000, 14.0), run("nginx", 1, 100_000, 12.0),
    run("nestgate", 2, 90_000, 15.0), run("nginx", 2, 90_000, 13.0),
    run("nestgate", 3, 70_000, 16.0), run("nginx", 3, 110_000, 11.0),
]


def test_stats_known_values():
    st = s.stats([2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0])
    assert st == {"n": 8, "mean": 5.0, "median": 4.5, "min": 2.0, "max": 9.0,
                  "stdev": pytest.approx(2.138, abs=1e-3)}     # sample stdev (n - 1)


def test_stats_single_and_empty_and_none():
    assert s.stats([3.0])["stdev"] == 0.0
    assert s.stats([])["median"] is None
    assert s.stats([None, 1.0, 3.0])["mean"] == 2.0


def test_aggregate_skips_warmup_and_sweep():
    agg = s.aggregate(RUNS + [dict(run("nginx", 1, 5.0, 5.0), kind="sweep", concurrency=1)])
    assert agg["nestgate"]["requests_per_s"]["n"] == 3
    assert agg["nestgate"]["requests_per_s"]["median"] == 80_000
    assert agg["nginx"]["requests_per_s"]["median"] == 100_000
    assert agg["nginx"]["cpu_us_per_request"]["min"] == 11.0


def test_compare_is_a_ratio_of_medians():
    block = s.compare(s.aggregate(RUNS))["nestgate_vs_nginx"]
    assert block["requests_per_s_ratio_median"] == pytest.approx(0.8)
    assert block["cpu_us_per_request_ratio_median"] == pytest.approx(15.0 / 12.0)
    assert block["requests_per_s_gap_pct_median"] == pytest.approx(-20.0)
    assert block["rss_peak_mb_ratio_median"] == 1.0


def test_compare_without_nestgate_or_with_missing_metric():
    assert s.compare(s.aggregate([r for r in RUNS if r["peer"] == "nginx"])) == {}
    assert s.ratio(None, 2.0) is None and s.ratio(1.0, 0.0) is None


def test_sweep_medians_per_concurrency():
    sweep = [dict(run("nginx", i, rps, 10.0, p99=p99), kind="sweep", concurrency=c)
             for i, (c, rps, p99) in enumerate([(1, 10, 0.1), (1, 30, 0.3), (1, 20, 0.2),
                                                (64, 100, 2.0)])]
    table = s.sweep_table(sweep)
    assert table["nginx"][1]["requests_per_s"] == 20
    assert table["nginx"][1]["latency_p99_ms"] == 0.2
    assert list(table["nginx"]) == [1, 64]


def test_build_write_and_tables(tmp_path):
    scenario = {"name": "health", "title": "small response"}
    result = s.build(scenario, {"runs": 3, "warmup_s": 2, "command": "nestgate bench --quick"},
                     RUNS, {"servers": {"nestgate": {"worker_rss_idle_mb": 21.0,
                                                     "worker_rss_after_mb": 22.5}}})
    s.write(tmp_path, result)
    data = json.loads((tmp_path / "summary.json").read_text())
    assert data["compare"]["nestgate_vs_nginx"]["requests_per_s_ratio_median"] == pytest.approx(0.8)
    assert data["nginx"]["requests_per_s"]["mean"] == pytest.approx(100_000)
    md = (tmp_path / "summary.md").read_text()
    assert "| requests/s | 80,000 (70,000-90,000) | 100,000 (90,000-110,000) |" in md
    assert "nestgate / nginx" in md
    text = s.console(result)
    assert "req/s x0.8" in text and "CPU per request x1.25" in text
    assert "idle 21.0 MB, after the runs 22.5 MB" in text
    assert s.peers_of(result) == ["nestgate", "nginx"]


@pytest.mark.parametrize("value, unit, text", [
    (None, "", "-"), (63187.0, "", "63,187"), (0.834, "", "0.834"), (14.25, "us", "14.2 us"),
    (3, "", "3")])
def test_fmt(value, unit, text):
    assert s.fmt(value, unit) == text


def test_sweep_socket_errors_are_added_up_and_shown(tmp_path):
    refused = dict(run("nestgate", 2, 50.0, 10.0), kind="sweep", concurrency=1024,
                   errors={"connect": 312, "read": 0, "write": 0, "timeout": 4})
    refused["metrics"]["errors"] = 316
    clean = dict(run("nestgate", 1, 60.0, 10.0), kind="sweep", concurrency=1024,
                 errors={"connect": 0})
    clean["metrics"]["errors"] = 0
    result = s.build({"name": "health", "title": "t"}, {}, RUNS + [clean, refused], {})
    assert result["sweep"]["nestgate"][1024]["errors"] == 316
    md = s.markdown(result)
    assert "| nestgate | 1024 | 55.0 | 1 | 10.0 | 316 |" in md
    assert "- nestgate sweep c=1024 2: connect 312, timeout 4" in md
    assert "socket errors: nestgate sweep c=1024 2: connect 312, timeout 4" in s.console(result)


def test_console_names_a_peer_that_did_not_run():
    result = s.build({"name": "health", "title": "t"}, {}, RUNS,
                     {"skipped_peers": {"caddy": "caddy is not installed (Debian package: caddy)"}})
    assert "caddy not run: caddy is not installed (Debian package: caddy)" in s.console(result)
