"""The CrowdSec bouncer against the real Local API (Debian's crowdsec, run alone with
`-no-cs`): decisions added with `cscli decisions add` are refused at accept by every
worker within one update interval (before TLS on a TLS listener) and lifted as soon
after `cscli decisions delete`, addresses and ranges, IPv4 and IPv6, captcha as ban;
`ban_answer = "403"` gives the ban page instead; the Local API down keeps the last
decisions, said once, through a restart of nestgate too, and the bouncer recovers when
it is back. nestgate's own bans go to the Local API as alerts (a machine login) and
are refused by a second instance, while the first keeps them as one ban.

Clients are told apart by their loopback source address (127.0.0.0/8 is all the
machine's), and IPv6 ones by the PROXY protocol."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import ssl
import time

import pytest

from conftest import HELLO, admin_headers, ask, get_from, poll, scrape, tls_block, v1
from crowdsecapi import LocalApi
from nestgate.bans.table import BanTable
from nestgate.config import ConfigError, parse_config
from nestgate.bans.crowdsec import Bouncer, Decisions, go_duration

INTERVAL = 2.0            # update_interval of the servers here
# In force at the next accept once the bouncer's next poll has written the table.
WITHIN = INTERVAL + 1.5


@pytest.fixture(scope="module")
def lapi(tmp_path_factory):
    api = LocalApi(tmp_path_factory.mktemp("crowdsec"))
    yield api
    api.stop()


def bouncer_config(lapi, folder, key: str, workers: int = 2, extra: str = "",
                   listen: str = "", top: str = "") -> str:
    return f"""
[server]
workers = {workers}
state_dir = "{folder}"

[[listen]]
address = "127.0.0.1:0"

[[listen]]
address = "127.0.0.1:0"
proxy_protocol_from = ["127.0.0.1"]
{listen}
{top}
[crowdsec]
url = "{lapi.url}"
{key}
update_interval = "{INTERVAL:g}s"
{extra}

[[site]]
hosts = ["*"]
{HELLO}"""


def bouncing(start_server, lapi, folder, extra: str = "", listen: str = "",
             name: str = "nestgate.toml", top: str = "", workers: int = 2, key: str = ""):
    key_file = folder / "bouncer.key"
    key_file.write_text((key or lapi.bouncer_key) + "\n")
    return start_server(bouncer_config(lapi, folder, f'api_key_file = "{key_file}"', workers,
                                       extra, listen, top), name=name)


def status_from(port: int, source: str) -> int:
    """GET /hello on a new connection from `source`: its status, 0 when the connection
    is closed before any answer."""
    try:
        return get_from(port, "/hello", source=source)[0]
    except (ConnectionResetError, IndexError, ValueError):
        return 0


def status_as(port: int, address: str) -> int:
    """The same from `address`, named by a PROXY header (IPv6 clients)."""
    try:
        return ask(port, "app.test", proxy=v1(address))[0]
    except ConnectionResetError:
        return 0


def becomes(ask_status, address: str, status: int) -> float:
    """Seconds until `address` is answered `status` (asserted, within WITHIN)."""
    t0 = time.monotonic()
    # Several connections: with two workers, each must refuse it.
    seen = poll(lambda: [ask_status(address) for _ in range(4)],
                lambda found: set(found) == {status}, timeout=WITHIN + 5)
    took = time.monotonic() - t0
    assert set(seen) == {status}, (address, seen)
    assert took <= WITHIN, f"{address} answered {status} only after {took:.1f}s"
    return took


def admin_get(port: int, path: str):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path, headers=admin_headers(port))
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    assert resp.status == 200, (resp.status, body)
    return json.loads(body)


def handshake_closed(port: int, source: str, ca: str) -> bool:
    """True when a TLS connection from `source` is closed before the handshake."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
    try:
        ssl.create_default_context(cafile=ca).wrap_socket(raw, server_hostname="localhost")
    except (ssl.SSLError, ConnectionResetError, OSError):
        return True
    finally:
        raw.close()
    return False


def test_decisions_are_refused_at_accept_and_lifted_within_an_interval(
        start_server, lapi, tmp_path, certs):
    server = bouncing(start_server, lapi, tmp_path,
                      listen='\n[[listen]]\naddress = "127.0.0.1:0"\n' + tls_block(certs))
    plain, proxied, tls = (port for _s, _h, port in server.urls)
    server.wait_for("crowdsec: 0 addresses and ranges refused")

    def plain_status(source):
        return status_from(plain, source)

    def proxied_status(address):
        return status_as(proxied, address)
    assert plain_status("127.0.0.41") == 200
    lapi.ban("-i", "127.0.0.41")
    lapi.ban("-r", "127.0.1.0/24")
    lapi.ban("-r", "2001:db8:bad::/48")
    lapi.ban("-i", "127.0.0.43", kind="captcha")
    becomes(plain_status, "127.0.0.43", 0)             # the last added: all are in
    for decided in ("127.0.0.41", "127.0.1.1", "127.0.1.254"):
        assert plain_status(decided) == 0, decided
    assert handshake_closed(tls, "127.0.0.41", certs["ca"])       # no TLS at all
    assert proxied_status("2001:db8:bad:1::5") == 0
    for fine in ("127.0.0.2", "127.0.0.42", "127.0.2.1"):
        assert plain_status(fine) == 200, fine
    assert not handshake_closed(tls, "127.0.0.2", certs["ca"])
    assert proxied_status("2001:db8:bad0::1") == 200
    lapi.lift("-i", "127.0.0.41")
    lapi.lift("-r", "127.0.1.0/24")
    becomes(plain_status, "127.0.1.1", 200)
    assert plain_status("127.0.0.41") == 200
    assert proxied_status("2001:db8:bad:1::5") == 0
    lapi.lift("-r", "2001:db8:bad::/48")
    lapi.lift("-i", "127.0.0.43")
    becomes(proxied_status, "2001:db8:bad:1::5", 200)
    assert plain_status("127.0.0.43") == 200


def test_ban_answer_403_gives_decided_clients_the_ban_page_until_crowdsec_is_dropped(
        start_server, lapi, tmp_path):
    # With bans of its own, so clients are still looked up once [crowdsec] is gone.
    server = bouncing(start_server, lapi, tmp_path, extra='ban_answer = "403"', workers=1,
                      top=f'[bans]\nstore = "{tmp_path / "bans.db"}"\n')
    port = server.port()
    lapi.ban("-i", "127.0.0.44")
    try:
        becomes(lambda source: status_from(port, source), "127.0.0.44", 403)
        status, _headers, page = get_from(port, "/hello", source="127.0.0.44")
        assert b"banned until" in page and b"127.0.0.44" in page
        assert status_from(port, "127.0.0.2") == 200
        # A reload without [crowdsec]: the decisions go with the bouncer.
        text = server.config_path.read_text()
        server.config_path.write_text(text[:text.index("[crowdsec]")]
                                      + text[text.index("[[site]]"):])
        mark = len(server.lines)
        server.signal(signal.SIGHUP)
        server.wait_for("reloaded", start=mark)
        becomes(lambda source: status_from(port, source), "127.0.0.44", 200)
    finally:
        lapi.lift("-i", "127.0.0.44")


def test_the_api_down_keeps_the_last_decisions_said_once_and_through_a_restart(
        start_server, lapi, tmp_path):
    server = bouncing(start_server, lapi, tmp_path)
    port = server.port()

    def status(source):
        return status_from(port, source)
    lapi.ban("-i", "127.0.0.77")
    becomes(status, "127.0.0.77", 0)
    lapi.stop()
    try:
        server.wait_for(f"Local API at {lapi.url} cannot be used", timeout=WITHIN + 5)
        time.sleep(2 * INTERVAL)                      # more failed polls
        assert sum("cannot be used" in line for line in server.lines) == 1
        assert status("127.0.0.77") == 0
        assert status("127.0.0.78") == 200
        # A restart while the Local API is down: the decisions kept in the state
        # folder are in force before the bouncer has reached the Local API.
        server.stop()
        again = bouncing(start_server, lapi, tmp_path, name="again.toml")
        port = again.port()
        again.wait_for("cannot be used", timeout=WITHIN + 5)
        assert status("127.0.0.77") == 0
        assert status("127.0.0.78") == 200
    finally:
        lapi.start()
    again.wait_for("answers again", timeout=WITHIN + 5)
    lapi.lift("-i", "127.0.0.77")
    becomes(status, "127.0.0.77", 200)


def test_a_wrong_key_is_named(start_server, lapi, tmp_path):
    server = start_server(bouncer_config(lapi, tmp_path, 'api_key = "not-a-key"', 1))
    line = server.wait_for("cannot be used", timeout=15)
    assert "HTTP 403: the api_key is not a bouncer key it knows" in line
    assert "not-a-key" not in "\n".join(server.lines)


SCANNER_RULE = """
[[ban]]
name = "scanners"
on = "scanner"
paths = ["*.php"]
count = 2
window = "1m"
ban_for = ["1h"]
ban_loopback = true
"""


def test_own_bans_are_sent_as_alerts_and_refused_by_another_instance(
        start_server, lapi, tmp_path):
    import subprocess
    import sys
    password = "nestgate-machine-password-1"
    lapi.cscli("machines", "add", "nestgate-one", "--password", password, "-f", "/dev/null")
    first_dir, second_dir = tmp_path / "one", tmp_path / "two"
    first_dir.mkdir()
    second_dir.mkdir()
    (first_dir / "machine.password").write_text(password + "\n")
    first = bouncing(start_server, lapi, first_dir, name="one.toml", workers=1,
                     extra='machine_id = "nestgate-one"\n'
                           f'machine_password_file = "{first_dir / "machine.password"}"',
                     top=f'[bans]\nstore = "{first_dir / "bans.db"}"\n' + SCANNER_RULE)
    # Each instance its own bouncer: the Local API keeps one stream position per key.
    second_key = lapi.cscli("bouncers", "add", "nestgate-two", "-o", "raw").strip()
    second = bouncing(start_server, lapi, second_dir, name="two.toml", key=second_key)
    one, two = first.port(), second.port()
    assert "nestgate-machine-password-1" not in "\n".join(first.lines)
    assert status_from(two, "127.0.0.51") == 200
    assert [get_from(one, "/x.php", source="127.0.0.51")[0] for _ in range(2)] == [404, 404]
    assert status_from(one, "127.0.0.51") == 0            # banned by the rule
    first.wait_for("1 of nestgate's bans sent as alerts", timeout=WITHIN + 5)

    def decided() -> list:
        return json.loads(lapi.cscli("decisions", "list", "-a", "-o", "json")) or []
    alerts = poll(decided, lambda found: any(
        d["value"] == "127.0.0.51" for a in found for d in a["decisions"]))
    mine = [(a["machine_id"], d) for a in alerts for d in a["decisions"]
            if d["value"] == "127.0.0.51"]
    assert len(mine) == 1, mine                             # sent once
    machine, decision = mine[0]
    assert machine == "nestgate-one" and decision["type"] == "ban"
    assert decision["origin"] == "nestgate" and decision["scenario"] == "nestgate/scanners"
    assert decision["scope"] == "Ip" and 3500 < go_duration(decision["duration"]) <= 3600

    # The other instance, same Local API: refused at accept within an interval.
    becomes(lambda source: status_from(two, source), "127.0.0.51", 0)
    assert status_from(two, "127.0.0.52") == 200

    # The first instance read the same decision back; it stays one ban there, the
    # rule's, not a second one of CrowdSec's. (A decision added after it, refused
    # there, shows the first instance's bouncer has read the stream since.)
    lapi.ban("-i", "127.0.0.53")
    try:
        becomes(lambda source: status_from(one, source), "127.0.0.53", 0)
        listed = subprocess.run([sys.executable, "-m", "nestgate", "ban", "list", "--config",
                                 str(first.config_path)], capture_output=True, text=True,
                                timeout=30)
        assert listed.returncode == 0, listed.stderr
        rows = [line.split() for line in listed.stdout.splitlines()]
        assert [row[2] for row in rows if row[0] == "127.0.0.51/32"] == ["rule"]
        assert [row[2] for row in rows if row[0] == "127.0.0.53/32"] == ["crowdsec"]
        shown = admin_get(first.admin_port(), "/v1/bans")["bans"]
        assert [(b["origin"], b["rule"]) for b in shown if b["network"] == "127.0.0.51/32"] \
            == [("rule", "scanners")]
        assert [b["origin"] for b in shown if b["network"] == "127.0.0.53/32"] == ["crowdsec"]
    finally:
        lapi.lift("-i", "127.0.0.53")
    # The second instance shows and counts the decision as CrowdSec's (it has no
    # [[ban]] rules of its own: the table is there for CrowdSec alone).
    admin = second.admin_port()
    shown = admin_get(admin, "/v1/bans")["bans"]
    assert [(b["origin"], b["reason"]) for b in shown if b["network"] == "127.0.0.51/32"] \
        == [("crowdsec", "nestgate/scanners")]
    samples = poll(lambda: scrape(admin)[2], lambda found: any(
        labels == {"origin": "crowdsec"} and value >= 1
        for labels, value in found.get("nestgate_ban_refused_total", ())))
    assert any(labels == {"origin": "crowdsec"} and value >= 1
               for labels, value in samples["nestgate_bans_active"])
    # Nothing sent twice, however many rounds have passed.
    assert len([d for a in decided() for d in a["decisions"]
                if d["value"] == "127.0.0.51"]) == 1
    lapi.lift("-i", "127.0.0.51")


def test_alerts_wait_longer_while_the_api_is_down_and_are_sent_when_it_answers(lapi):
    from nestgate.bans.store import BanRow
    from nestgate.bans.crowdsec import CrowdSecConfig, LocalApi as Api
    from nestgate.bans.crowdsecalerts import MOST_BACKOFF, Reporter
    from nestgate.bench.ports import free_port
    password = "nestgate-machine-password-2"
    lapi.cscli("machines", "add", "nestgate-backoff", "--password", password, "-f", "/dev/null")
    config = CrowdSecConfig(lapi.url, "key", update_interval=2.0,
                            machine_id="nestgate-backoff", machine_password=password)
    said: list[str] = []
    api = Api(f"http://127.0.0.1:{free_port()}")            # nothing listens there
    reporter = Reporter(config, api, said.append)
    now = time.time()
    rows = [BanRow("2001:db8:77:1::/64", now + 86400, "rule", "sign-in", "sign-in", "close", 1)]
    nothing = Decisions()
    waits = []
    for _ in range(9):
        reporter.report(rows, nothing, now)
        waits.append(reporter.retry_at - now)
        reporter.report(rows, nothing, now + waits[-1] / 2)  # too early: not even tried
        now = reporter.retry_at
    assert waits[:4] == [2.0, 4.0, 8.0, 16.0] and waits[-1] == MOST_BACKOFF
    assert len(said) == 1 and said[0].startswith("cannot send nestgate's bans as alerts")
    api.url = lapi.url                                       # the Local API is back
    reporter.report(rows, nothing, now)
    assert said[1:] == ["the Local API takes nestgate's alerts again",
                        "1 of nestgate's bans sent as alerts"]
    reporter.report(rows, nothing, now + 10)                 # sent: not again
    assert len(said) == 3
    alerts = json.loads(lapi.cscli("decisions", "list", "-a", "-o", "json")) or []
    assert [(d["scope"], d["value"], d["scenario"]) for a in alerts for d in a["decisions"]
            if a["machine_id"] == "nestgate-backoff"] \
        == [("Range", "2001:db8:77:1::/64", "nestgate/sign-in")]
    wrong = Reporter(CrowdSecConfig(lapi.url, "key", machine_id="nestgate-backoff",
                                    machine_password="not-it"), Api(lapi.url), said.append)
    wrong.report(rows, Decisions(), time.time())
    assert "the machine_id and password are not a machine's it knows" in said[-1]
    assert "not-it" not in said[-1]
    lapi.lift("-r", "2001:db8:77:1::/64")


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
    assert decisions.values() == {"192.0.2.1/32", "10.0.0.0/8"}
    assert decisions.refused()["192.0.2.1/32"][0] == 7200.0     # its longest decision
    assert decisions.skipped == 3
    decisions.apply({"deleted": [{"id": 1}], "new": None}, now=10.0, startup=False)
    assert decisions.values() == {"192.0.2.1/32", "10.0.0.0/8"}  # id 2 still bans it
    decisions.expire(183.0)
    assert decisions.values() == {"192.0.2.1/32"}
    decisions.expire(7200.0)
    assert decisions.values() == frozenset()
    ignoring = Decisions(captcha="ignore")
    ignoring.apply({"new": [{"id": 3, "type": "captcha", "scope": "Ip", "value": "192.0.2.3",
                             "duration": "1h"}]}, now=0.0, startup=True)
    assert ignoring.values() == frozenset()


def test_echoes_of_own_bans_are_left_to_the_ban_store():
    decisions = Decisions()
    decisions.apply({"new": [
        {"id": 1, "type": "ban", "scope": "Ip", "value": "192.0.2.1", "duration": "1h",
         "origin": "nestgate", "scenario": "nestgate/scanners"},
        {"id": 2, "type": "ban", "scope": "Range", "value": "2001:db8:1:2::/64",
         "duration": "1h", "origin": "nestgate", "scenario": "nestgate/sign-in"},
        {"id": 3, "type": "ban", "scope": "Ip", "value": "192.0.2.3", "duration": "1h",
         "origin": "cscli", "scenario": "manual"}]}, now=0.0, startup=True)
    # This server's store holds 192.0.2.1 and 192.0.2.3: the first is its own ban's
    # echo; the second, decided by someone else, is CrowdSec's as well.
    ours = frozenset({"192.0.2.1/32", "192.0.2.3/32"})
    assert set(decisions.refused(ours)) == {"2001:db8:1:2::/64", "192.0.2.3/32"}
    assert decisions.own() == {"192.0.2.1/32": 3600.0, "2001:db8:1:2::/64": 3600.0}


def test_go_durations():
    assert go_duration("3h59m58.927402644s") == pytest.approx(14398.927402644)
    assert go_duration("-24.189905ms") == pytest.approx(-0.024189905)
    assert go_duration("720h0m0s") == 720 * 3600
    assert go_duration("1.5µs") == pytest.approx(1.5e-6)


def test_config_names_what_is_missing(tmp_path):
    listen = {"listen": [{"address": "127.0.0.1:0"}]}
    with pytest.raises(ConfigError) as info:
        parse_config({**listen, "crowdsec": {"url": "127.0.0.1:8080",
                                             "update_interval": "0s", "captcha": "show",
                                             "ban_answer": "404",
                                             "machine_id": "nestgate"}},
                     "site.toml")
    problems = "\n".join(info.value.problems)
    assert "crowdsec.url: expected the Local API's http:// or https:// address" in problems
    assert "crowdsec.api_key: expected the bouncer key `cscli bouncers add NAME` printed" \
        in problems
    assert "crowdsec.update_interval: expected a duration above 0" in problems
    assert "crowdsec.captcha: expected one of 'ban', 'ignore'" in problems
    assert "site.toml: crowdsec.ban_answer: expected one of 'close', '403'" in problems
    assert "site.toml: crowdsec.machine_password: expected the machine's password (or " \
        "machine_password_file) with machine_id" in problems
    assert "site.toml: crowdsec.machine_id: expected [[ban]] rules or a [bans] table with " \
        "it: the bans sent as alerts are read from the ban store" in problems
    empty = tmp_path / "key"
    empty.write_text("\n")
    with pytest.raises(ConfigError) as info:
        parse_config({**listen, "crowdsec": {"url": "http://127.0.0.1:8080",
                                             "api_key_file": str(empty),
                                             "machine_password_file": str(empty)}},
                     "site.toml")
    assert info.value.problems == [
        "site.toml: crowdsec.api_key_file: expected a file holding the bouncer key "
        "`cscli bouncers add NAME` printed",
        "site.toml: crowdsec.machine_password_file: expected a file holding the password "
        "of `cscli machines add NAME --password ...`",
        "site.toml: crowdsec.machine_id: expected the machine name `cscli machines add` was "
        "given, with machine_password"]


def test_the_secrets_are_never_shown_by_the_admin_api(tmp_path):
    from nestgate.admin.configapi import REDACTED, redacted
    config = parse_config({"listen": [{"address": "127.0.0.1:0"}],
                           "bans": {"store": str(tmp_path / "bans.db")},
                           "crowdsec": {"url": "http://127.0.0.1:8080",
                                        "api_key": "bouncer-secret-key",
                                        "machine_id": "nestgate",
                                        "machine_password": "machine-secret"}}, "site.toml")
    shown = redacted(config)
    assert shown["crowdsec"]["api_key"] == REDACTED
    assert shown["crowdsec"]["machine_password"] == REDACTED
    for secret in ("bouncer-secret-key", "machine-secret"):
        assert secret not in repr(shown) and secret not in repr(config)


def test_decisions_outlive_a_restart_and_a_file_that_cannot_be_written_is_said_once(
        tmp_path):
    from dataclasses import replace
    folder = tmp_path / "state"
    config = parse_config({"listen": [{"address": "127.0.0.1:0"}],
                           "crowdsec": {"url": "http://127.0.0.1:1", "api_key": "key"}},
                          str(tmp_path / "site.toml"))
    config = replace(config, crowdsec=replace(config.crowdsec,
                                              snapshot=str(folder / "crowdsec-decisions")))
    said: list[str] = []
    table = BanTable(4096)
    bouncer = Bouncer(config, table, said.append)
    decision = {"id": 1, "type": "ban", "scope": "Ip", "value": "192.0.2.1",
                "duration": "1h", "scenario": "crowdsecurity/ssh-bf"}
    bouncer.decisions.apply({"new": [decision]}, now=time.time(), startup=True)
    bouncer.synced = True
    bouncer._enforce(bouncer.decisions.refused())
    assert table.lookup("192.0.2.1").origin == "crowdsec"    # in force all the same
    assert [line for line in said if line.startswith("cannot write")] == [
        f"cannot write {folder}/crowdsec-decisions (No such file or directory); the "
        "decisions are in force but would not outlive a restart"]
    folder.mkdir()
    bouncer.decisions.apply({"new": [{**decision, "id": 2, "value": "198.51.100.0/24"}]},
                            now=time.time(), startup=False)
    bouncer._enforce(bouncer.decisions.refused())
    assert sum(line.startswith("cannot write") for line in said) == 1
    # A new process (a restart: a new table) puts them back before any call.
    fresh = BanTable(4096)
    Bouncer(config, fresh, said.append).restore()
    assert fresh.lookup("192.0.2.1").reason == "crowdsecurity/ssh-bf"
    assert fresh.lookup("198.51.100.7").network == "198.51.100.0/24"
    # A bouncer process started again in the same server lifts what its predecessor
    # wrote once the Local API no longer has it.
    again = Bouncer(config, fresh, said.append)
    again.restore()
    again.decisions.apply({"new": [decision]}, now=time.time(), startup=True)
    again._enforce(again.decisions.refused())
    assert fresh.lookup("198.51.100.7") is None and fresh.lookup("192.0.2.1") is not None


# A stream answer whose decisions are partly not what the Local API sends: each bad
# one skipped and named once, the others applied. (The bouncer crashed on the first
# and was restarted into the same answer, again and again.)
MALFORMED = [
    {"id": [1, 2], "type": "ban", "scope": "Ip", "value": "192.0.2.10", "duration": "1h"},
    {"id": {"a": 1}, "type": "ban", "scope": "Ip", "value": "192.0.2.11", "duration": "1h"},
    {"id": None, "type": "ban", "scope": "Ip", "value": "192.0.2.12", "duration": "1h"},
    {"id": "x" * 100_000, "type": "ban", "scope": "Ip", "value": "192.0.2.13",
     "duration": "1h"},
    {"id": 14, "type": "ban", "scope": "Ip", "value": "192.0.2.14", "duration": "1h",
     "scenario": "s" * 1_000_000},
    {"id": 15, "type": ["ban"], "scope": "Ip", "value": "192.0.2.15", "duration": "1h"},
    {"id": 16, "type": "ban", "scope": "Ip", "value": {"ip": "192.0.2.16"}, "duration": "1h"},
    {"id": True, "type": "ban", "scope": "Ip", "value": "192.0.2.17", "duration": "1h"},
    ["not", "an", "object"],
    None,
]
GOOD = [{"id": 1, "type": "ban", "scope": "Ip", "value": "192.0.2.1", "duration": "1h",
         "scenario": "crowdsecurity/ssh-bf"},
        {"id": "2", "type": "ban", "scope": "Range", "value": "198.51.100.0/24",
         "duration": "1h"}]


class StreamAnswers:
    """A Local API that answers the decision stream with what the test gives it."""

    def __init__(self) -> None:
        import http.server
        import threading
        self.answers: list[bytes] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):            # noqa: N802 - the http.server hook's name
                body = outer.answers.pop(0) if outer.answers else b'{"new": null}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_malformed_decisions_are_skipped_named_once_and_the_others_applied(tmp_path):
    from dataclasses import replace
    api = StreamAnswers()
    try:
        config = parse_config({"listen": [{"address": "127.0.0.1:0"}],
                               "crowdsec": {"url": api.url, "api_key": "key"}},
                              str(tmp_path / "site.toml"))
        config = replace(config, crowdsec=replace(
            config.crowdsec, snapshot=str(tmp_path / "crowdsec-decisions")))
        said: list[str] = []
        table = BanTable(4096)
        bouncer = Bouncer(config, table, said.append)
        answer = {"new": [*MALFORMED[:5], GOOD[0], *MALFORMED[5:], GOOD[1]],
                  "deleted": [{"id": [3]}, {"id": {"x": 1}}, "nonsense"]}
        api.answers.append(json.dumps(answer).encode())
        bouncer.poll()
        assert bouncer.synced and not bouncer.down
        assert table.lookup("192.0.2.1").reason == "crowdsecurity/ssh-bf"
        assert table.lookup("198.51.100.7").network == "198.51.100.0/24"
        for i in range(10, 18):
            assert table.lookup(f"192.0.2.{i}") is None
        named = [line for line in said if "skipped" in line]
        assert len(named) == len(MALFORMED) + 3, said
        assert all(len(line) < 300 for line in said)      # never a megabyte in the log
        assert any("decision 14 in 'new' has a scenario that is a string of 1000000 "
                   "characters" in line for line in named)
        assert any("has an id that is a list of 2 items" in line for line in named)
        assert any("has an id that is null" in line for line in named)
        # The same answer again (a full one after the Local API came back): applied,
        # and nothing named twice. An answer whose parts are not lists is left out.
        bouncer.synced = False
        api.answers.append(json.dumps(answer).encode())
        api.answers.append(b'{"new": {"id": 5}, "deleted": 7}')
        bouncer.poll()
        bouncer.poll()
        assert [line for line in said if "skipped" in line] == named
        assert sum("not a list" in line for line in said) == 2
        assert table.lookup("192.0.2.1") is not None and not bouncer.down
        # A later deletion still lifts a good one.
        api.answers.append(json.dumps({"deleted": [{"id": 1}, {"id": [1]}]}).encode())
        bouncer.poll()
        assert table.lookup("192.0.2.1") is None
        assert table.lookup("198.51.100.7") is not None
    finally:
        api.close()
