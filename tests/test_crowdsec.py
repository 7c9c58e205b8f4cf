"""The CrowdSec bouncer against the real Local API (Debian's crowdsec, run alone with
`-no-cs`): decisions added with `cscli decisions add` are refused by every site within
one update interval and lifted as soon after `cscli decisions delete`, addresses and
ranges, IPv4 and IPv6, captcha as ban; the Local API down keeps the last decisions,
said once, and the bouncer recovers when it is back.

Clients are told apart by the PROXY protocol from loopback."""

from __future__ import annotations

import random
import time

import pytest

from conftest import HELLO, ask, poll, v1
from crowdsecapi import LocalApi
from nestgate.config import ConfigError, parse_config
from nestgate.crowdsec import Decisions, go_duration
from nestgate.decisions import CHECK_EVERY, DecisionTable

INTERVAL = 2.0            # update_interval of the servers here
# Seen by every worker: the next poll, then the worker's next look at the table.
WITHIN = INTERVAL + CHECK_EVERY + 1.5


@pytest.fixture(scope="module")
def lapi(tmp_path_factory):
    api = LocalApi(tmp_path_factory.mktemp("crowdsec"))
    yield api
    api.stop()


def bouncer_config(lapi, tmp_path, key: str, workers: int = 2) -> str:
    return f"""
[server]
workers = {workers}
state_dir = "{tmp_path}"

[[listen]]
address = "127.0.0.1:0"
proxy_protocol_from = ["127.0.0.1"]

[crowdsec]
url = "{lapi.url}"
{key}
update_interval = "{INTERVAL:g}s"

[[site]]
hosts = ["*"]
{HELLO}"""


def bouncing(start_server, lapi, tmp_path):
    key_file = tmp_path / "bouncer.key"
    key_file.write_text(lapi.bouncer_key + "\n")
    return start_server(bouncer_config(lapi, tmp_path, f'api_key_file = "{key_file}"'))


def status_of(port: int, address: str) -> int:
    return ask(port, "app.test", proxy=v1(address))[0]


def becomes(port: int, address: str, status: int) -> float:
    """Seconds until `address` is answered `status` (asserted, within WITHIN)."""
    t0 = time.monotonic()
    # Several connections: with two workers, each must have the table.
    seen = poll(lambda: [status_of(port, address) for _ in range(4)],
                lambda found: set(found) == {status}, timeout=WITHIN + 5)
    took = time.monotonic() - t0
    assert set(seen) == {status}, (address, seen)
    assert took <= WITHIN, f"{address} answered {status} only after {took:.1f}s"
    return took


def test_decisions_are_enforced_and_lifted_within_an_interval(start_server, lapi, tmp_path):
    server = bouncing(start_server, lapi, tmp_path)
    port = server.port()
    server.wait_for("crowdsec: 0 addresses and ranges refused")
    assert status_of(port, "198.51.100.7") == 200
    lapi.ban("-i", "198.51.100.7")
    lapi.ban("-r", "203.0.113.0/24")
    lapi.ban("-r", "2001:db8:bad::/48")
    lapi.ban("-i", "192.0.2.9", kind="captcha")
    becomes(port, "192.0.2.9", 403)                  # the last added: all are in
    for refused in ("198.51.100.7", "203.0.113.1", "203.0.113.254", "2001:db8:bad:1::5"):
        assert status_of(port, refused) == 403, refused
    for fine in ("198.51.100.8", "203.0.114.1", "2001:db8:bad0::1", "192.0.2.10"):
        assert status_of(port, fine) == 200, fine
    assert ask(port)[0] == 200                        # the proxy itself (loopback)
    status, page = ask(port, "app.test", proxy=v1("203.0.113.1"))
    assert b"<code>203.0.113.1</code>" in page
    lapi.lift("-i", "198.51.100.7")
    lapi.lift("-r", "203.0.113.0/24")
    becomes(port, "203.0.113.1", 200)
    assert status_of(port, "198.51.100.7") == 200
    assert status_of(port, "2001:db8:bad:1::5") == 403
    lapi.lift("-r", "2001:db8:bad::/48")
    lapi.lift("-i", "192.0.2.9")
    becomes(port, "2001:db8:bad:1::5", 200)


def test_the_api_down_keeps_the_last_decisions_said_once(start_server, lapi, tmp_path):
    server = bouncing(start_server, lapi, tmp_path)
    port = server.port()
    lapi.ban("-i", "198.51.100.77")
    becomes(port, "198.51.100.77", 403)
    lapi.stop()
    try:
        server.wait_for(f"Local API at {lapi.url} cannot be used", timeout=WITHIN + 5)
        time.sleep(3 * INTERVAL)                      # several failed polls
        assert sum("cannot be used" in line for line in server.lines) == 1
        assert status_of(port, "198.51.100.77") == 403
        assert status_of(port, "198.51.100.78") == 200
    finally:
        lapi.start()
    server.wait_for("answers again", timeout=WITHIN + 5)
    lapi.lift("-i", "198.51.100.77")
    becomes(port, "198.51.100.77", 200)


def test_a_wrong_key_is_named(start_server, lapi, tmp_path):
    server = start_server(bouncer_config(lapi, tmp_path, 'api_key = "not-a-key"', 1))
    line = server.wait_for("cannot be used", timeout=15)
    assert "HTTP 403: the api_key is not a bouncer key it knows" in line
    assert "not-a-key" not in "\n".join(server.lines)


# ---------------------------------------------------------------- without a server


def test_stream_answers_are_kept_by_id_and_expire():
    decisions = Decisions()
    decisions.apply({"new": [
        {"id": 1, "type": "ban", "scope": "Ip", "value": "192.0.2.1", "duration": "1h"},
        {"id": 2, "type": "ban", "scope": "Ip", "value": "192.0.2.1", "duration": "2h"},
        {"id": 3, "type": "captcha", "scope": "Range", "value": "10.0.0.0/8",
         "duration": "3m2.5s"},
        {"id": 4, "type": "ban", "scope": "Country", "value": "FR", "duration": "1h"},
        {"id": 5, "type": "throttle", "scope": "Ip", "value": "192.0.2.5", "duration": "1h"},
        {"id": 6, "type": "ban", "scope": "Ip", "value": "not-an-ip", "duration": "1h"},
    ], "deleted": None}, now=0.0, startup=True)
    assert decisions.values() == {"192.0.2.1", "10.0.0.0/8"}
    assert decisions.skipped == 3
    decisions.apply({"deleted": [{"id": 1}], "new": None}, now=10.0, startup=False)
    assert decisions.values() == {"192.0.2.1", "10.0.0.0/8"}   # id 2 still bans it
    decisions.expire(183.0)
    assert decisions.values() == {"192.0.2.1"}
    decisions.expire(7200.0)
    assert decisions.values() == frozenset()
    ignoring = Decisions(captcha="ignore")
    ignoring.apply({"new": [{"id": 3, "type": "captcha", "scope": "Ip", "value": "192.0.2.3",
                             "duration": "1h"}]}, now=0.0, startup=True)
    assert ignoring.values() == frozenset()


def test_go_durations():
    assert go_duration("3h59m58.927402644s") == pytest.approx(14398.927402644)
    assert go_duration("-24.189905ms") == pytest.approx(-0.024189905)
    assert go_duration("720h0m0s") == 720 * 3600
    assert go_duration("1.5µs") == pytest.approx(1.5e-6)


def test_fifty_thousand_decisions_cost_what_five_do():
    rng = random.Random(35)
    many = [f"{rng.randrange(1, 223)}.{rng.randrange(256)}.{rng.randrange(256)}."
            f"{rng.randrange(256)}" for _ in range(45_000)]
    many += [f"{rng.randrange(1, 223)}.{rng.randrange(256)}.{rng.randrange(256)}.0/24"
             for _ in range(4_000)]
    many += [f"2001:db8:{rng.randrange(65536):x}::/48" for _ in range(1_000)]
    few = ["192.0.2.1", "198.51.100.0/24", "10.0.0.0/8", "2001:db8::/32", "203.0.113.9"]
    built = DecisionTable(many)
    assert built.entries == 50_000 and len(built) > 45_000      # overlaps merged
    big = DecisionTable.decode(built.encode())                  # as a worker reads it
    assert len(big) == len(built)
    assert "10.0.0.1" not in DecisionTable([]) and many[0] in big
    assert many[-1].replace("::/48", "::1") in big
    probes = [f"{rng.randrange(1, 223)}.{rng.randrange(256)}.1.1" for _ in range(2000)]

    def cost(table) -> float:
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for ip in probes:
                ip in table
            best = min(best, time.perf_counter() - t0)
        return best
    # One bisect per lookup: log2(50,000) steps in C against log2(5); the slack is for
    # a shared machine's noise (a scan of the entries would take milliseconds each).
    assert cost(big) < 4 * cost(DecisionTable(few)) + 0.01


def test_config_names_what_is_missing(tmp_path):
    listen = {"listen": [{"address": "127.0.0.1:0"}]}
    with pytest.raises(ConfigError) as info:
        parse_config({**listen, "crowdsec": {"url": "127.0.0.1:8080",
                                             "update_interval": "0s", "captcha": "show"}},
                     "site.toml")
    problems = "\n".join(info.value.problems)
    assert "crowdsec.url: expected the Local API's http:// or https:// address" in problems
    assert "crowdsec.api_key: expected the bouncer key `cscli bouncers add NAME` printed" \
        in problems
    assert "crowdsec.update_interval: expected a duration above 0" in problems
    assert "crowdsec.captcha: expected one of 'ban', 'ignore'" in problems
    empty = tmp_path / "key"
    empty.write_text("\n")
    with pytest.raises(ConfigError) as info:
        parse_config({**listen, "crowdsec": {"url": "http://127.0.0.1:8080",
                                             "api_key_file": str(empty)}}, "site.toml")
    assert info.value.problems == ["site.toml: crowdsec.api_key_file: expected a file "
                                   "holding the bouncer key (`cscli bouncers add`)"]


def test_the_key_is_never_shown_by_the_admin_api():
    from nestgate.admin.configapi import REDACTED, redacted
    config = parse_config({"listen": [{"address": "127.0.0.1:0"}],
                           "crowdsec": {"url": "http://127.0.0.1:8080",
                                        "api_key": "bouncer-secret-key"}}, "site.toml")
    shown = redacted(config)
    assert shown["crowdsec"]["api_key"] == REDACTED
    assert "bouncer-secret-key" not in repr(shown) and "bouncer-secret-key" not in repr(config)


def test_a_table_that_cannot_be_written_is_said_once_and_written_later(tmp_path):
    from nestgate.crowdsec import Bouncer, CrowdSecConfig
    from nestgate.decisions import read_table
    folder = tmp_path / "state"
    said = []
    bouncer = Bouncer(CrowdSecConfig("http://127.0.0.1:1", "key",
                                     snapshot=str(folder / "crowdsec-decisions")),
                      say=said.append)
    bouncer.decisions.apply({"new": [{"id": 1, "type": "ban", "scope": "Ip",
                                      "value": "192.0.2.1", "duration": "1h"}]},
                            now=time.time(), startup=True)
    bouncer.write()
    bouncer.write()
    assert len(said) == 1 and said[0].startswith(f"cannot write {folder}")
    folder.mkdir()
    bouncer.write()
    assert "192.0.2.1" in read_table(str(folder / "crowdsec-decisions"))
    assert said[1:] == ["1 addresses and ranges refused"]
