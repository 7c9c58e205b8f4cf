"""`nestgate bench` arguments, pre-flight checks and the overview table (no load is run)."""

from pathlib import Path

import pytest

from nestgate.bench import cli, scenarios, tools


def opts(argv, monkeypatch=None):
    return cli.options(cli.parser().parse_args(argv), argv)


def test_list(capsys):
    assert cli.main(["--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # One line each, the name apart from its description (a shell can split on it).
    assert [line.split()[0] for line in lines] == [s.name for s in scenarios.SCENARIOS]


def test_quick_defaults_and_overrides():
    o = opts(["--quick"])
    assert (o.runs, o.duration_s, o.warmup_s) == (3, 5, 2)
    assert o.peers == ("nginx", "caddy") and o.output == Path("results").resolve()
    o = opts(["--runs", "7", "--peers", "nginx", "--output", "/tmp/x", "--workers", "2"])
    assert (o.runs, o.peers, o.output, o.workers) == (7, ("nginx",), Path("/tmp/x"), 2)
    assert o.require_zero_non2xx and o.command.startswith("nestgate bench --runs 7")


def test_require_zero_non2xx_switches(monkeypatch):
    monkeypatch.setenv("REQUIRE_ZERO_NON2XX", "0")
    assert not opts([]).require_zero_non2xx
    monkeypatch.setenv("REQUIRE_ZERO_NON2XX", "1")
    assert opts([]).require_zero_non2xx
    assert not opts(["--allow-non2xx"]).require_zero_non2xx


def test_usage_errors_exit_2(capsys):
    assert cli.main(["--scenario", "no-such"]) == 2
    assert "unknown scenario" in capsys.readouterr().err
    assert cli.main(["--peers", "apache"]) == 2
    assert "unknown peer" in capsys.readouterr().err


def test_missing_tools_are_named_with_their_debian_package(monkeypatch, capsys):
    monkeypatch.setattr(tools, "which", lambda tool: None)
    assert cli.main(["--scenario", "health", "--scenario", "h2-health"]) == 2
    err = capsys.readouterr().err
    assert "wrk (Debian package wrk)" in err
    assert "h2load (Debian package nghttp2-client)" in err
    assert "nginx (Debian package nginx-light" in err


def test_overview_puts_ratios_first():
    result = {"scenario": {"name": "health"},
              "nestgate": {"requests_per_s": {"median": 90_000.0},
                           "cpu_us_per_request": {"median": 15.0}},
              "nginx": {"requests_per_s": {"median": 100_000.0},
                        "cpu_us_per_request": {"median": 12.0}},
              "compare": {"nestgate_vs_nginx": {"requests_per_s_ratio_median": 0.9,
                                                "cpu_us_per_request_ratio_median": 1.25}}}
    text = cli.overview([result], {"page": "nestgate rejects"}, {}, opts(["--quick"]), 61.0)
    assert "| health | nginx | 0.9 | 1.25 | 90,000 | 100,000 | 15.0 | 12.0 | - | - |" in text
    assert "skipped page: nestgate rejects" in text


def test_a_missing_peer_is_said_on_the_console_before_the_runs(monkeypatch, capsys):
    real_which = tools.which
    monkeypatch.setattr(tools, "which", lambda tool: None if tool == "caddy" else real_which(tool))
    monkeypatch.setattr(cli, "run_all", lambda chosen, opts: 0)     # no run: only the start
    if any(real_which(t) is None for t in ("wrk", "nginx")):
        pytest.skip("wrk and nginx are needed to get past the tool check")
    assert cli.main(["--scenario", "health"]) == 0
    err = capsys.readouterr().err
    assert "nestgate bench: caddy left out: caddy is not installed (Debian package: caddy)" in err
