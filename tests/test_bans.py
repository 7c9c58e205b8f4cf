"""Bans: the shared table, [[ban]] rules counting what clients do, refusal at accept in
every worker, the 403 page, escalation, the store (restart, Redis), `nestgate ban`, the
admin API and metrics. Clients are told apart by their loopback source address
(127.0.0.0/8 is all the machine's), so rules here set `ban_loopback = true`."""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import subprocess
import sys
import time

import pytest

from conftest import (HELLO, PASSWORD_HASH, REPO, Browser, _env, admin_headers, admin_token,
                      config, get_from, one_request, poll,
                      scrape, tls_block)
from nestgate.bans.store import open_bans
from nestgate.bans.table import BanTable, client_network, process_shared_lock
from nestgate.config import ConfigError, parse_config

SCANNER_RULE = """
[[ban]]
name = "scanners"
on = "scanner"
paths = ["/wp-*", "*.php", "/.env"]
count = 3
window = "1m"
ban_for = ["1h"]
ban_loopback = true
{extra}
"""

HELLO_SITE = '\n[[site]]\nhosts = ["*"]\n' + HELLO


def site_with(rules: str, store, workers: int = 2, listen: str = "", top: str = "") -> str:
    return config(HELLO_SITE + f'\n[bans]\nstore = "{store}"\n' + rules, listen,
                  top + f"workers = {workers}\n").replace("workers = 1\n", "", 1)


def refused(port: int, source: str) -> bool:
    """True when a connection from `source` is closed before any answer."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5,
                                      source_address=(source, 0)) as sock:
            sock.sendall(b"GET /hello HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            return sock.recv(65536) == b""
    except ConnectionResetError:
        return True


def scan(port: int, source: str, paths) -> list[int]:
    """Each path from `source` on a new connection: its status, 0 when refused."""
    out = []
    for path in paths:
        try:
            out.append(get_from(port, path, source=source)[0])
        except (ConnectionResetError, IndexError, ValueError):
            out.append(0)
    return out


# ------------------------------------------------------------------ the table
def test_table_holds_addresses_ranges_and_ipv6_prefixes():
    table = BanTable(4096)
    now = time.time()
    assert len(table) == 0 and table.lookup("192.0.2.7") is None
    table.add("192.0.2.7", now + 60, "rule", "scanners", "403")
    table.add("10.0.0.0/8", now + 60, "crowdsec", "ssh-bf")
    table.add(client_network("2001:db8:1:2::77"), now + 60, "rule", "sign-in")
    table.add("198.51.100.9", now - 1, "rule", "ended")
    assert table.lookup("192.0.2.7").answer == "403"
    assert table.lookup("192.0.2.8") is None
    # A range stays a range: any address in it, and its IPv4-mapped spelling.
    assert table.lookup("10.200.3.4").network == "10.0.0.0/8"
    assert table.lookup("::ffff:10.1.1.1").origin == "crowdsec"
    assert table.lookup("11.0.0.1") is None
    # An IPv6 client is banned by its /64.
    assert table.lookup("2001:db8:1:2:ffff::1").network == "2001:db8:1:2::/64"
    assert table.lookup("2001:db8:1:3::1") is None
    assert table.lookup("198.51.100.9") is None                  # ended
    assert {b.network for b in table.entries()} == {
        "192.0.2.7/32", "10.0.0.0/8", "2001:db8:1:2::/64"}
    assert not table.remove("10.0.0.0/8")                       # not nestgate's own
    assert table.remove("10.0.0.0/8", "crowdsec") and table.lookup("10.200.3.4") is None
    assert not table.remove("10.0.0.0/8", "crowdsec")
    with pytest.raises(ValueError, match="not an IP address or CIDR"):
        table.add("10.0.0.300", now + 60)


def test_a_network_with_a_zone_is_refused_with_the_reason():
    from nestgate.bans.table import network_key
    for spelled in ("2001:db8::1%eth0", "2001:db8::%3/64", "fe80::1%25eth0"):
        with pytest.raises(ValueError, match="zone"):
            network_key(spelled)
    table = BanTable(4096)
    with pytest.raises(ValueError, match="zone"):
        table.add("fe80::1%eth0", time.time() + 60)
    assert table.entries() == [] and table.lookup("fe80::1") is None


def test_table_is_shared_with_forked_processes():
    table = BanTable(1024)
    pid = os.fork()
    if pid == 0:                                   # the child bans; the parent sees it
        table.add("203.0.113.5", time.time() + 60, "rule", "child")
        os._exit(0)
    os.waitpid(pid, 0)
    assert table.lookup("203.0.113.5").reason == "child"


def test_crowdsec_decisions_and_nestgates_bans_on_one_network_are_lifted_apart():
    table = BanTable(4096)
    now = time.time()
    table.add("198.51.100.0/24", now + 60, "crowdsec", "ssh-bf")
    table.add("198.51.100.0/24", now + 30, "rule", "scanners", "403")
    assert {(b.origin, b.reason) for b in table.entries()} == {
        ("crowdsec", "ssh-bf"), ("rule", "scanners")}
    assert table.counts() == {"crowdsec": 1, "rule": 1}
    # CrowdSec deleting its decision leaves nestgate's ban, and the other way round.
    assert table.remove("198.51.100.0/24", "crowdsec")
    assert table.lookup("198.51.100.4").origin == "rule"
    table.add("198.51.100.0/24", now + 60, "crowdsec", "ssh-bf")
    assert table.remove("198.51.100.0/24")
    assert table.lookup("198.51.100.4").origin == "crowdsec"
    # One that has ended gives way to the other kind's, still in force.
    table.add("198.51.100.0/24", now - 1, "rule", "ended")
    assert table.lookup("198.51.100.4").origin == "crowdsec"


def test_fifty_thousand_decisions_keep_a_lookup_short():
    """What fills the table (bans.table.CAPACITY): a large Local API's decisions plus
    nestgate's own bans. A lookup reads a bounded number of entries: one probe
    sequence per prefix length in use, each a couple of entries long at this load,
    whether the client is banned or not."""
    import random

    from nestgate.bans.table import CAPACITY, PROBES
    rng = random.Random(35)
    table = BanTable()
    until = time.time() + 3600

    def address() -> str:
        return f"{rng.randrange(1, 223)}.{rng.randrange(256)}.{rng.randrange(256)}." \
            f"{rng.randrange(256)}"
    decided = [address() for _ in range(45_000)]
    decided += [address().rsplit(".", 1)[0] + ".0/24" for _ in range(4_000)]
    decided += [f"2001:db8:{rng.randrange(65536):x}::/48" for _ in range(1_000)]
    for network in decided:
        table.add(network, until, "crowdsec", "crowdsecurity/http-probing")
    own = [address() for _ in range(500)] + \
        [client_network(f"2001:db8:ffff:{i:x}::1") for i in range(500)]
    for network in own:
        table.add(network, until, "rule", "scanners")
    assert not table.full_said                       # every ban found a place
    assert len(table) >= 50_900 and len(table) < 0.4 * CAPACITY
    for network in decided[::499] + own[::97]:
        assert table.lookup(network.split("/")[0]) is not None, network
    assert table.lookup("2001:db8:ffff:3:abcd::9").origin == "rule"

    # Lengths in use: IPv4 /32 and /24, IPv6 /64 and /48; a lookup probes only those.
    assert table._lengths_of(False) == (32, 24)
    assert table._lengths_of(True) == (64, 48)
    clients = [address() for _ in range(5_000)]
    table.entries_read = 0
    for client in clients:
        table.lookup(client)
    per_length = table.entries_read / (len(clients) * 2)
    assert per_length < 3, per_length                 # linear probing at load < 0.4
    # The worst any lookup can cost, whatever the table holds: PROBES per length.
    worst = 0
    for client in clients[:500]:
        before = table.entries_read
        table.lookup(client)
        worst = max(worst, table.entries_read - before)
    assert worst <= 2 * PROBES


def test_ten_thousand_bans_fit_and_are_found():
    table = BanTable()
    until = time.time() + 600
    for i in range(10_000):
        table.add(f"100.{64 + i // 65536}.{i // 256 % 256}.{i % 256}", until)
    assert len(table) == 10_000
    assert all(table.lookup(f"100.64.{i // 256}.{i % 256}") for i in range(0, 10_000, 97))
    assert table.lookup("100.127.0.1") is None


# ------------------------------------------------------------------ config
def test_check_names_the_file_and_key_of_a_bad_rule(tmp_path):
    bad = site_with("""
[[ban]]
on = "scanners"

[[ban]]
name = "x"
on = "scanner"
count = 0
ban_for = ["10m", "soon"]
exempt = ["10.0.0.0/33"]
ban_answer = "404"

[[ban]]
name = "x"
on = "status"
site = "nowhere"
""", tmp_path / "s.db")
    import tomllib
    with pytest.raises(ConfigError) as info:
        parse_config(tomllib.loads(bad), "home.toml")
    problems = "\n".join(info.value.problems)
    for expected in ("home.toml: ban[0].on: expected one of 'signin', 'scanner'",
                     "home.toml: ban[1].count: expected an integer 1..",
                     "home.toml: ban[1].ban_for: expected a duration",
                     "home.toml: ban[1].exempt:", "home.toml: ban[1].ban_answer:",
                     "home.toml: ban[1].paths: expected at least one path pattern",
                     "home.toml: ban[2].name: expected a name no other [[ban]] rule has",
                     "home.toml: ban[2].status: expected a list of statuses",
                     "home.toml: ban[2].site: expected the name of a [[site]]"):
        assert expected in problems, problems


def test_shipped_rules_load():
    import tomllib
    rules = (REPO / "examples" / "bans.toml").read_text()
    cfg = parse_config(tomllib.loads(config(HELLO_SITE + rules)), "bans.toml")
    assert {r.on for r in cfg.bans.rules} >= {"scanner", "signin", "malformed"}
    assert all(not r.ban_loopback for r in cfg.bans.rules)


# ------------------------------------------------------------------ serving
def test_a_scanner_is_closed_at_accept_by_every_worker(start_server, tmp_path):
    server = start_server(site_with(SCANNER_RULE.format(extra=""), tmp_path / "s.db"))
    port = server.port()
    statuses = scan(port, "127.0.0.5", ["/wp-login.php", "/.env", "/x.php", "/wp-admin/"])
    assert statuses[:3] == [404, 404, 404] and statuses[3] == 0, statuses
    server.wait_for("banned 127.0.0.5/32 (scanners")
    # Refused by both workers (each connection lands on either), before any answer.
    assert all(refused(port, "127.0.0.5") for _ in range(12))
    # Nobody else pays: another address, and a 404 that is not a scanner's.
    assert get_from(port, "/hello", source="127.0.0.6")[0] == 200
    assert scan(port, "127.0.0.7", ["/missing"] * 6) == [404] * 6
    assert get_from(port, "/hello", source="127.0.0.7")[0] == 200
    # Kept in the store (written off the worker's loop, just after the ban), with the
    # rule and its first strike.
    bans = open_bans(str(tmp_path / "s.db"))
    [row] = poll(bans.live, bool, timeout=5)
    bans.close()
    assert (row.network, row.rule, row.strikes, row.origin) == (
        "127.0.0.5/32", "scanners", 1, "rule")
    assert 3500 < row.until - time.time() <= 3600


def test_a_scanner_on_one_kept_alive_connection_is_cut_off_there_too(start_server, tmp_path):
    server = start_server(site_with(SCANNER_RULE.format(extra=""), tmp_path / "s.db",
                                    workers=1))
    port = server.port()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5,
                                      source_address=("127.0.0.25", 0))
    answers = []
    for path in ("/a.php", "/b.php", "/c.php", "/hello"):
        conn.request("GET", path)
        resp = conn.getresponse()
        answers.append((resp.status, resp.getheader("connection"), resp.read()))
    conn.close()
    # The third 404 bans: the answer under way goes out, the next is the page, and the
    # connection ends with it; new connections are closed at accept.
    assert [a[0] for a in answers] == [404, 404, 404, 403], answers
    assert answers[3][1] == "close" and b"banned until" in answers[3][2]
    assert refused(port, "127.0.0.25")


def test_loopback_is_never_banned_unless_asked(start_server, tmp_path):
    rule = SCANNER_RULE.format(extra="").replace("ban_loopback = true", "")
    server = start_server(site_with(rule, tmp_path / "s.db", workers=1))
    port = server.port()
    assert scan(port, "127.0.0.5", ["/x.php"] * 8) == [404] * 8
    assert get_from(port, "/hello", source="127.0.0.5")[0] == 200


def test_exempt_networks_are_never_banned(start_server, tmp_path):
    rule = SCANNER_RULE.format(extra='exempt = ["127.0.0.8/32"]')
    server = start_server(site_with(rule, tmp_path / "s.db", workers=1))
    port = server.port()
    assert scan(port, "127.0.0.8", ["/x.php"] * 8) == [404] * 8


def test_the_403_answer_says_until_when(start_server, tmp_path):
    rule = SCANNER_RULE.format(extra='ban_answer = "403"')
    server = start_server(site_with(rule, tmp_path / "s.db", workers=1))
    port = server.port()
    scan(port, "127.0.0.9", ["/x.php"] * 3)
    status, fields, body = get_from(port, "/hello", source="127.0.0.9")
    assert status == 403 and fields["cache-control"] == "no-store"
    until = time.strftime("%Y-%m-%d %H:", time.gmtime(time.time() + 3600))
    assert b"banned until " + until.encode() in body and b"(scanners)" in body
    assert b"127.0.0.9" in body and b"<style>" in body
    # Every path and Host of that connection is the page; another client is served.
    assert get_from(port, "/anything", source="127.0.0.9")[0] == 403
    assert get_from(port, "/hello", source="127.0.0.10")[0] == 200


def tls_listener(certs) -> str:
    return '\n[[listen]]\naddress = "127.0.0.1:0"\n' + tls_block(certs)


def test_the_403_answer_over_http2(start_server, tmp_path, certs):
    from h2client import H2Client
    rule = SCANNER_RULE.format(extra='ban_answer = "403"')
    server = start_server(site_with(rule, tmp_path / "s.db", workers=1,
                                    listen=tls_listener(certs)))
    scan(server.port(), "127.0.0.11", ["/x.php"] * 3)
    client = H2Client(server.port("https"), certs["ca"], source="127.0.0.11")
    status, _headers, body = client.request("GET", "/hello")
    client.close()
    assert status == 403 and b"banned until" in body
    other = H2Client(server.port("https"), certs["ca"], source="127.0.0.24")
    assert other.request("GET", "/hello")[0] == 200
    other.close()


def test_tls_is_never_started_for_a_banned_client(start_server, tmp_path, certs):
    server = start_server(site_with(SCANNER_RULE.format(extra=""), tmp_path / "s.db",
                                    workers=1, listen=tls_listener(certs)))
    scan(server.port(), "127.0.0.12", ["/x.php"] * 3)
    raw = socket.create_connection(("127.0.0.1", server.port("https")), timeout=5,
                                   source_address=("127.0.0.12", 0))
    ctx = ssl.create_default_context(cafile=certs["ca"])
    with pytest.raises((ssl.SSLError, ConnectionResetError, OSError)):
        ctx.wrap_socket(raw, server_hostname="localhost")     # closed: no ServerHello
    raw.close()


def test_failed_passkey_sign_ins_count_as_failed_sign_ins(start_server, tmp_path):
    import softauthn
    rule = ('\n[[ban]]\nname = "sign-in"\non = "signin"\ncount = 3\nwindow = "1m"\n'
            'ban_for = ["1h"]\nban_loopback = true\n')
    auth = (f'\n[auth]\nstore = "{tmp_path / "s.db"}"\n\n[[auth.user]]\nname = "demo"\n'
            f'password = "{PASSWORD_HASH}"\n\n[[site]]\nname = "private"\n'
            'hosts = ["private.test"]\nprotected = true\n\n[[site.route]]\npath = "/"\n'
            'type = "return"\nbody = "in"\n')
    server = start_server(site_with(rule, tmp_path / "s.db", workers=1) + auth)
    port = server.port()
    sprayer = Browser(port, source="127.0.0.31")
    for _ in range(2):      # a ceremony begun, answered with what no authenticator signed
        resp, page = softauthn.finish_sign_in(sprayer, softauthn.begin_sign_in(sprayer)[0],
                                              "{}")
        assert resp.status == 401 and b"Passkey refused" in page
    softauthn.finish_sign_in(sprayer, softauthn.begin_sign_in(sprayer)[0], "{}")
    assert refused(port, "127.0.0.31")          # the third failure banned it
    assert get_from(port, "/hello", source="127.0.0.32")[0] == 200


SIGN_IN_RULE = ('\n[[ban]]\nname = "sign-in"\non = "signin"\ncount = 3\nwindow = "1m"\n'
                'ban_for = ["1h"]\n')
PROTECTED = ('\n[auth]\nstore = "{store}"\ncookie_secure = false\n\n[[auth.user]]\n'
             'name = "demo"\npassword = "{hash}"\n\n[[site]]\nname = "private"\n'
             'hosts = ["private.test"]\nprotected = true\n\n[[site.route]]\npath = "/"\n'
             'type = "return"\nbody = "in"\n')


def test_forward_auth_basic_failures_ban_the_client_the_proxy_names(start_server, tmp_path):
    """Another proxy asks nestgate (forward auth) with a Basic credential: each wrong
    password counts as a failed sign-in of the client the trusted proxy names, so a
    password spray through Caddy or nginx is banned as one on the sign-in form is."""
    import base64
    top = '[client_ip]\ntrusted_proxies = ["127.0.0.1"]\n'
    server = start_server(site_with(SIGN_IN_RULE, tmp_path / "s.db", workers=1) + "\n" + top
                          + PROTECTED.format(store=tmp_path / "s.db", hash=PASSWORD_HASH))
    port = server.port()

    def ask(client: str, password: str) -> int:
        basic = base64.b64encode(f"demo:{password}".encode()).decode()
        return one_request(port, "/api/authz/forward-auth", "private.test", {
            "X-Forwarded-For": client,
            "X-Forwarded-Method": "GET", "X-Forwarded-Proto": "https",
            "X-Forwarded-Host": "private.test", "X-Forwarded-Uri": "/",
            "Authorization": f"Basic {basic}"})[0]

    assert ask("203.0.113.70", "demo-password") == 200
    assert [ask("203.0.113.71", "wrong") for _ in range(3)] == [401, 401, 401]
    # Banned: even the right password is refused for that client, and only for it.
    assert ask("203.0.113.71", "demo-password") == 403
    assert ask("203.0.113.70", "demo-password") == 200
    listed = poll(lambda: ban_cli("list", "--config", str(tmp_path / "nestgate.toml"),
                                  cwd=tmp_path).stdout,
                  lambda out: "203.0.113.71" in out, timeout=5)
    assert "203.0.113.71/32" in listed and "sign-in" in listed, listed


def test_refused_provider_callbacks_count_as_failed_sign_ins(start_server, tmp_path):
    """A callback from a sign-in provider that this browser did not start (a forged or
    replayed state) is a failed sign-in: [[ban]] rules on "signin" count it."""
    provider = ('\n[[auth.oidc]]\nname = "idp"\nissuer = "https://idp.test"\n'
                'client_id = "nestgate"\nclient_secret = "s3cret"\nallow_unknown = true\n')
    server = start_server(site_with(SIGN_IN_RULE + "ban_loopback = true\n", tmp_path / "s.db",
                                    workers=1)
                          + PROTECTED.format(store=tmp_path / "s.db", hash=PASSWORD_HASH)
                          + provider)
    port = server.port()
    callback = "/__auth__/oidc/idp/callback?code=stolen&state=forged"
    statuses = [one_request(port, callback, "private.test", source="127.0.0.33")[0]
                for _ in range(3)]
    assert statuses == [400, 400, 400], statuses
    assert refused(port, "127.0.0.33")          # the third failure banned it
    assert get_from(port, "/hello", source="127.0.0.34")[0] == 200


def h3_status(port: int, ca: str, headers=()) -> int:
    """GET /hello over HTTP/3 (from 127.0.0.1): its status, 0 when the QUIC connection
    is refused (closed before it is established)."""
    import asyncio

    import h3client

    async def ask():
        return await asyncio.wait_for(
            h3client.requests(port, ca, [("GET", "/hello", headers, None)]), 10)
    try:
        return asyncio.run(ask())[0].status
    except (ConnectionError, asyncio.TimeoutError):
        return 0


def test_http3_a_banned_client_gets_the_page_or_its_connection_refused(
        start_server, tmp_path, certs):
    listen = '\n[[listen]]\naddress = "127.0.0.1:0"\nhttp3 = true\n' + tls_block(certs)
    top = '[client_ip]\ntrusted_proxies = ["127.0.0.1"]\n'
    server = start_server(site_with("", tmp_path / "s.db", workers=1, listen=listen)
                          + "\n" + top)
    port, ca = server.port("https"), certs["ca"]
    assert h3_status(port, ca) == 200
    bans = open_bans(str(tmp_path / "s.db"))
    # A client the trusted proxy names is banned with the page: its requests get it, the
    # proxy's others are served on the same footing.
    bans.ban("203.0.113.66", (3600.0,), 0.0, "operator", "", "seen in the logs", "403")
    named = [("x-forwarded-for", "203.0.113.66")]
    assert poll(lambda: h3_status(port, ca, named), lambda s: s == 403, timeout=3) == 403
    assert h3_status(port, ca, [("x-forwarded-for", "203.0.113.67")]) == 200
    # The QUIC peer itself banned with the page: every stream of its connections.
    bans.ban("127.0.0.1", (3600.0,), 0.0, "operator", "", "seen in the logs", "403")
    assert poll(lambda: h3_status(port, ca), lambda s: s == 403, timeout=3) == 403
    # ... and banned to be closed: its QUIC connection is refused before the handshake.
    bans.ban("127.0.0.1", (3600.0,), 0.0, "operator", "", "seen in the logs", "close",
             replace=True)
    assert poll(lambda: h3_status(port, ca), lambda s: s == 0, timeout=3) == 0
    bans.unban("127.0.0.1")
    assert poll(lambda: h3_status(port, ca), lambda s: s == 200, timeout=3) == 200


def test_a_client_named_by_a_trusted_proxy_gets_the_page_and_the_proxy_stays(
        start_server, tmp_path):
    top = '[client_ip]\ntrusted_proxies = ["127.0.0.1"]\n'
    server = start_server(site_with(SCANNER_RULE.format(extra=""), tmp_path / "s.db",
                                    workers=1) + "\n" + top)
    port = server.port()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    statuses = []
    for path in ("/x.php", "/y.php", "/z.php", "/hello", "/hello"):
        conn.request("GET", path, headers={"X-Forwarded-For": "203.0.113.66"})
        resp = conn.getresponse()
        resp.read()
        statuses.append(resp.status)
    conn.close()
    # The proxy's connection is never closed for one client: that client gets the page.
    assert statuses == [404, 404, 404, 403, 403], statuses
    assert get_from(port, "/hello", {"X-Forwarded-For": "203.0.113.67"})[0] == 200
    assert get_from(port, "/hello")[0] == 200                       # the proxy itself


def test_a_client_named_by_a_proxy_protocol_header_is_closed(start_server, tmp_path):
    from conftest import ask, v1
    listen = '\n[[listen]]\naddress = "127.0.0.1:0"\nproxy_protocol_from = ["127.0.0.1"]\n'
    toml = site_with(SCANNER_RULE.format(extra=""), tmp_path / "s.db", workers=1)
    server = start_server(toml.replace('[[listen]]\naddress = "127.0.0.1:0"\n', listen, 1))
    port = server.port()
    statuses = [ask(port, "a", path, proxy=v1("198.51.100.30"))[0]
                for path in ("/a.php", "/b.php", "/c.php", "/hello")]
    assert statuses == [404, 404, 404, 0], statuses
    assert ask(port, "a", "/hello", proxy=v1("198.51.100.31")) == (200, b"hello")
    assert ask(port, "a", "/hello") == (200, b"hello")          # the proxy itself


def test_proxy_protocol_before_tls_the_named_client_gets_its_page(start_server, tmp_path,
                                                                  certs):
    from conftest import v1
    from h2client import H2Client
    listen = ('\n[[listen]]\naddress = "127.0.0.1:0"\nproxy_protocol_from = ["127.0.0.1"]\n'
              + tls_block(certs))
    rule = SCANNER_RULE.format(extra='ban_answer = "403"')
    server = start_server(site_with(rule, tmp_path / "s.db", workers=1, listen=listen))
    port = server.port("https")

    def get(ip: str, path: str) -> tuple[int, bytes]:
        client = H2Client(port, certs["ca"], preamble=v1(ip))
        status, _headers, body = client.request("GET", path)
        client.close()
        return status, body

    assert [get("198.51.100.40", p)[0] for p in ("/a.php", "/b.php", "/c.php")] == [404] * 3
    status, body = get("198.51.100.40", "/hello")
    assert status == 403 and b"banned until" in body and b"198.51.100.40" in body
    assert get("198.51.100.41", "/hello")[0] == 200


def test_a_repeat_offender_is_banned_longer(start_server, tmp_path):
    rule = """
[[ban]]
name = "broken"
on = "malformed"
count = 1
ban_for = ["1s", "1h"]
ban_loopback = true
"""
    server = start_server(site_with(rule, tmp_path / "s.db", workers=1))
    port = server.port()

    def garbage() -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=5,
                                      source_address=("127.0.0.13", 0)) as sock:
            sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
            return sock.recv(65536)

    assert garbage().startswith(b"HTTP/1.1 400")
    assert refused(port, "127.0.0.13")
    assert poll(lambda: refused(port, "127.0.0.13"), lambda banned: not banned,
                timeout=5) is False                                   # the 1 s is over
    assert garbage().startswith(b"HTTP/1.1 400")                   # the second offence
    server.wait_for("banned for the 2nd time (broken)")
    bans = open_bans(str(tmp_path / "s.db"))
    [row] = bans.live()
    bans.close()
    assert row.strikes == 2 and row.until - time.time() > 3500
    time.sleep(1.5)
    assert refused(port, "127.0.0.13")


def test_bans_survive_a_restart(start_server, tmp_path):
    toml = site_with(SCANNER_RULE.format(extra=""), tmp_path / "s.db", workers=1)
    server = start_server(toml)
    scan(server.port(), "127.0.0.14", ["/x.php"] * 3)
    server.wait_for("banned 127.0.0.14/32")
    time.sleep(0.3)                                   # the store write after the table's
    server.stop()
    again = start_server(toml, name="again.toml")
    assert refused(again.port(), "127.0.0.14")
    assert get_from(again.port(), "/hello", source="127.0.0.15")[0] == 200


def ban_cli(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nestgate", "ban", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=30, env=_env())


def test_ban_cli_adds_lists_and_lifts_within_a_second(start_server, tmp_path):
    server = start_server(site_with("", tmp_path / "s.db"))    # no rules: [bans] alone
    port = server.port()
    conf = str(tmp_path / "nestgate.toml")
    done = ban_cli("add", "127.0.0.16", "--for", "2h", "--reason", "seen in the logs",
                   "--config", conf, cwd=tmp_path)
    assert done.returncode == 0 and "127.0.0.16/32 banned until" in done.stdout
    assert poll(lambda: refused(port, "127.0.0.16"), bool, timeout=2)
    listed = ban_cli("list", "--config", conf, cwd=tmp_path).stdout
    assert "127.0.0.16/32" in listed and "operator" in listed and "seen in the logs" in listed
    assert ban_cli("remove", "127.0.0.16", "--config", conf, cwd=tmp_path).returncode == 0
    assert poll(lambda: refused(port, "127.0.0.16"), lambda r: not r, timeout=2) is False
    gone = ban_cli("remove", "127.0.0.16", "--config", conf, cwd=tmp_path)
    assert gone.returncode == 1 and "no ban in force on 127.0.0.16" in gone.stderr
    bad = ban_cli("add", "127.0.0.300", "--config", conf, cwd=tmp_path)
    assert bad.returncode == 2 and "not an IP address or CIDR" in bad.stderr


def test_ban_cli_without_bans_in_the_config_says_so(tmp_path):
    (tmp_path / "n.toml").write_text(config(HELLO_SITE))
    done = ban_cli("list", "--config", str(tmp_path / "n.toml"), cwd=tmp_path)
    assert done.returncode != 0 and "ban: expected [[ban]] rules or a [bans] table" in \
        done.stderr


def api(port: int, method: str, path: str, body=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = admin_headers(port)
    if body is not None:
        headers["Content-Type"] = "application/json"
    conn.request(method, path, json.dumps(body) if body is not None else None, headers)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, json.loads(data) if data else None


def test_admin_api_lists_adds_and_lifts_with_audit_and_metrics(start_server, tmp_path):
    audit = tmp_path / "audit.log"
    server = start_server(site_with(SCANNER_RULE.format(extra=""), tmp_path / "s.db")
                          + f'\n[admin]\naudit_log = "{audit}"\n')
    port, admin = server.port(), server.admin_port()
    admin_token(admin)
    scan(port, "127.0.0.17", ["/x.php"] * 4)
    status, body = api(admin, "POST", "/v1/bans", {"network": "127.0.0.18", "for": "2h",
                                                   "reason": "abuse report", "answer": "403"})
    assert status == 201 and body["network"] == "127.0.0.18/32"
    assert get_from(port, "/hello", source="127.0.0.18")[0] == 403      # at once
    status, body = api(admin, "GET", "/v1/bans")
    shown = {b["network"]: b for b in body["bans"]}
    assert shown["127.0.0.17/32"]["rule"] == "scanners" and \
        shown["127.0.0.17/32"]["strikes"] == 1
    assert shown["127.0.0.18/32"]["origin"] == "operator" and \
        shown["127.0.0.18/32"]["reason"] == "abuse report"
    assert 7100 < shown["127.0.0.18/32"]["until"] - time.time() <= 7200
    assert api(admin, "POST", "/v1/bans", {"network": "nope"})[0] == 422
    assert refused(port, "127.0.0.17")

    def metrics():
        return scrape(admin)[2]
    # Each worker publishes its own counters and the ban store's figures on its tick:
    # wait until every sample this test reads has been collected.
    samples = poll(metrics, lambda s: s.get("nestgate_ban_refused_total", [({}, 0)])[0][1] >= 2
                   and ({"rule": "scanners"}, 1.0) in s.get("nestgate_bans_total", [])
                   and len(s.get("nestgate_bans_active", [])) >= 2)
    assert ({"rule": "scanners"}, 1.0) in samples["nestgate_bans_total"]
    assert ({"origin": "rule"}, 1.0) in samples["nestgate_bans_active"]
    assert ({"origin": "operator"}, 1.0) in samples["nestgate_bans_active"]

    assert api(admin, "DELETE", "/v1/bans/127.0.0.18")[0] == 204
    assert get_from(port, "/hello", source="127.0.0.18")[0] == 200
    assert api(admin, "DELETE", "/v1/bans/127.0.0.17/32")[0] == 204
    assert api(admin, "DELETE", "/v1/bans/127.0.0.17")[0] == 404
    assert poll(lambda: refused(port, "127.0.0.17"), lambda r: not r, timeout=2) is False
    actions = [json.loads(line)["action"] for line in audit.read_text().splitlines()]
    assert actions == ["ban.add", "ban.remove", "ban.remove"]


def test_bans_are_shared_by_instances_through_redis(start_server, tmp_path):
    from redisserver import RedisServer
    redis = RedisServer(tmp_path)
    try:
        toml = site_with(SCANNER_RULE.format(extra=""), "unused.db", workers=1).replace(
            '[bans]\nstore = "unused.db"\n', f'[state]\nbackend = "redis"\nurl = "{redis.url}"\n')
        one = start_server(toml, name="one.toml")
        two = start_server(toml, name="two.toml")
        scan(one.port(), "127.0.0.19", ["/x.php"] * 3)
        assert refused(one.port(), "127.0.0.19")
        assert poll(lambda: refused(two.port(), "127.0.0.19"), bool, timeout=3)
        assert get_from(two.port(), "/hello", source="127.0.0.20")[0] == 200
    finally:
        redis.stop()


def test_unreadable_bans_in_redis_are_left_out_and_the_rest_kept_in_step(start_server,
                                                                       tmp_path):
    """A ban row nestgate did not write (a hand edit, another program under the prefix,
    a field it does not know) raised in every worker's load, every half second: no
    change after it was taken, not even a lift. It is left out, and said once."""
    import redis as redislib

    from redisserver import RedisServer
    server_redis = RedisServer(tmp_path)
    try:
        toml = site_with("", "unused.db", workers=1).replace(
            '[bans]\nstore = "unused.db"\n',
            f'[state]\nbackend = "redis"\nurl = "{server_redis.url}"\nprefix = "gw:"\n'
            '\n[bans]\n')
        server = start_server(toml)
        port = server.port()
        bans = open_bans(redis_locator_of(server_redis.url, "gw:"))
        bans.ban("127.0.0.81", (3600.0,), 0.0, "operator", "", "first", "close")
        assert poll(lambda: refused(port, "127.0.0.81"), bool, timeout=3)
        raw = redislib.Redis.from_url(server_redis.url)
        until = time.time() + 3600
        fields = {"until": until, "origin": "rule", "rule": "x", "reason": "x",
                  "answer": "close", "strikes": 1}
        for network, extra in (("junk", {}), ("127.0.0.82/32", {"answer": "tarpit"}),
                               ("127.0.0.83/32", {"until": "soon"})):
            raw.hset(f"gw:ban:{network}", mapping={**fields, **extra})
            raw.zadd("gw:bans", {network: until})
        bans.ban("127.0.0.84", (3600.0,), 0.0, "operator", "", "after", "close")
        # The ban made after them is in force; the lift of one made before them too.
        assert poll(lambda: refused(port, "127.0.0.84"), bool, timeout=3)
        assert bans.unban("127.0.0.81/32")
        assert poll(lambda: refused(port, "127.0.0.81"), lambda r: not r, timeout=3) is False
        line = server.wait_for("cannot be read and are left out")
        assert "3 ban(s)" in line and "'junk'" in line
        assert get_from(port, "/hello", source="127.0.0.82")[0] == 200
        assert {row.network for row in bans.live()} == {"127.0.0.84/32"}
        bans.close()
    finally:
        server_redis.stop()


def redis_locator_of(url: str, prefix: str) -> str:
    from nestgate.handlers.auth.redisstore import redis_locator
    return redis_locator(url, prefix)


def test_rate_limit_refusals_and_watched_statuses_ban(start_server, tmp_path):
    rules = """
[[ban]]
name = "flood"
on = "ratelimit"
count = 3
ban_loopback = true

[[ban]]
name = "forbidden"
on = "status"
status = [403]
site = "home"
route = "/private"
count = 2
ban_loopback = true
"""
    toml = config(f"""
[[site]]
name = "home"
hosts = ["*"]

[[site.route]]
path = "/limited"
type = "return"
body = "ok"
rate_limit = {{ rate = "1/m", burst = 1 }}

[[site.route]]
path = "/private"
type = "return"
body = "no"
allow = ["192.0.2.0/24"]

[[site.route]]
path = "/hello"
type = "return"
body = "hello"

[bans]
store = "{tmp_path / 's.db'}"
{rules}
""")
    server = start_server(toml)
    port = server.port()
    assert scan(port, "127.0.0.21", ["/limited"] * 5)[:4] == [200, 429, 429, 429]
    assert refused(port, "127.0.0.21")
    assert scan(port, "127.0.0.22", ["/private"] * 3) == [403, 403, 0]
    server.wait_for("banned 127.0.0.22/32 (forbidden")
    assert get_from(port, "/hello", source="127.0.0.23")[0] == 200


def test_the_table_lock_is_held_across_processes_forked_after_it():
    """Every process writes the one table: the lock made before the fork must keep a
    child out while the supervisor holds it, and let it in once released (a copy of a
    thread lock would stay held in the child for ever)."""
    lock = process_shared_lock()
    to_parent_r, to_parent_w = os.pipe()
    to_child_r, to_child_w = os.pipe()
    lock.acquire()
    pid = os.fork()
    if pid == 0:                                    # the child: report, never return
        try:
            os.write(to_parent_w, b"1" if lock.acquire(True, 0.2) else b"0")
            os.read(to_child_r, 1)                  # the parent has released it
            os.write(to_parent_w, b"1" if lock.acquire(True, 5) else b"0")
        finally:
            os._exit(0)
    try:
        assert os.read(to_parent_r, 1) == b"0"      # kept out while held
        lock.release()
        os.write(to_child_w, b"x")
        assert os.read(to_parent_r, 1) == b"1"      # let in once released
    finally:
        os.waitpid(pid, 0)
        for fd in (to_parent_r, to_parent_w, to_child_r, to_child_w):
            os.close(fd)
