"""Countries and networks by name: `allow_countries`/`deny_countries` and
`allow_asn`/`deny_asn` decided in the site's guard from MaxMind-format databases the
tests write (mmdb-writer), over IPv4 and IPv6; the 403 page and the request log name
the country; a database replaced while serving is read again; `check` names a missing,
unreadable or foreign file and countries without a database.

Clients are told apart by the PROXY protocol from loopback (v1 carries IPv6 too)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from mmdb_writer import MMDBWriter
from netaddr import IPSet

from conftest import HELLO, _env, ask, config, poll, v1
from nestgate.pipeline.access import AccessConfig, NoDynamic, Policy, DENY, SIGN_IN
from nestgate.config import ConfigError, parse_config
from nestgate.pipeline.geoip import MEMO_MAX, GeoConfig, GeoLookup

GERMAN, FRENCH, UNPLACED = "203.0.113.7", "198.51.100.7", "192.0.2.7"
GERMAN6, FRENCH6 = "2001:db8:de::7", "2001:db8:f::7"
HOSTING = "198.51.100.200"         # French, in AS 64500 (a hosting network)


def write_countries(path, places: dict[str, str]) -> None:
    """A GeoLite2-Country-like file: network -> ISO code."""
    writer = MMDBWriter(ip_version=6, database_type="GeoLite2-Country", ipv4_compatible=True)
    for network, code in places.items():
        writer.insert_network(IPSet([network]), {"country": {"iso_code": code,
                                                             "names": {"en": code}}})
    writer.to_db_file(str(path))


def write_asns(path, systems: dict[str, int]) -> None:
    """A GeoLite2-ASN-like file: network -> AS number."""
    writer = MMDBWriter(ip_version=6, database_type="GeoLite2-ASN", ipv4_compatible=True)
    for network, number in systems.items():
        writer.insert_network(IPSet([network]), {"autonomous_system_number": number,
                                                 "autonomous_system_organization": "Host"})
    writer.to_db_file(str(path))


PLACES = {"203.0.113.0/24": "DE", "198.51.100.0/24": "FR",
          "2001:db8:de::/48": "DE", "2001:db8:f::/48": "FR"}


@pytest.fixture
def databases(tmp_path):
    countries, asns = tmp_path / "country.mmdb", tmp_path / "asn.mmdb"
    write_countries(countries, PLACES)
    write_asns(asns, {"198.51.100.192/26": 64500, "2001:db8:f:1::/64": 64500})
    return countries, asns


def geo_sites(countries, asns, log) -> str:
    return config(f"""
[[site]]
hosts = ["de.test"]
allow_countries = ["de"]
{HELLO}
[[site]]
hosts = ["nofr.test"]
deny_countries = ["FR"]
{HELLO}
[[site.route]]
path = "/nohosting"
type = "return"
body = "people only"
deny_asn = ["AS64500"]

[[site]]
hosts = ["lan.test"]
allow = ["192.0.2.0/24"]
allow_countries = ["FR"]
{HELLO}
""", listen='proxy_protocol_from = ["127.0.0.1", "::1"]', top=f"""
[geoip]
database = "{countries}"
asn_database = "{asns}"

[log]
path = "{log}"
flush_interval = "100ms"
log_loopback = true
""")


def test_countries_and_networks_decide_over_ipv4_and_ipv6(start_server, databases, tmp_path):
    countries, asns = databases
    log = tmp_path / "requests.log"
    server = start_server(geo_sites(countries, asns, log))
    port = server.port()
    for german, french in ((GERMAN, FRENCH), (GERMAN6, FRENCH6)):
        assert ask(port, "de.test", proxy=v1(german)) == (200, b"hello")
        assert ask(port, "de.test", proxy=v1(french))[0] == 403
        assert ask(port, "nofr.test", proxy=v1(german)) == (200, b"hello")
        assert ask(port, "nofr.test", proxy=v1(french))[0] == 403
        assert ask(port, "nofr.test", path="/nohosting", proxy=v1(german)) == \
            (200, b"people only")
    # Unplaced addresses (private, loopback, not in the file) are in no country.
    assert ask(port, "de.test", proxy=v1(UNPLACED))[0] == 403
    assert ask(port, "de.test")[0] == 403
    assert ask(port, "nofr.test", proxy=v1(UNPLACED)) == (200, b"hello")
    # A route's own list replaces the site's: AS 64500 is refused there, wherever it is.
    assert ask(port, "nofr.test", path="/nohosting", proxy=v1(HOSTING))[0] == 403
    assert ask(port, "nofr.test", path="/nohosting", proxy=v1("2001:db8:f:1::9"))[0] == 403
    assert ask(port, "nofr.test", path="/nohosting", proxy=v1("198.51.100.9")) == \
        (200, b"people only")                 # French, but not the hosting AS
    # Allow lists add up: the CIDR or the country admits.
    assert ask(port, "lan.test", proxy=v1(UNPLACED)) == (200, b"hello")
    assert ask(port, "lan.test", proxy=v1(FRENCH)) == (200, b"hello")
    assert ask(port, "lan.test", proxy=v1(GERMAN))[0] == 403


def test_the_refusal_and_the_request_log_name_the_country(start_server, databases, tmp_path):
    countries, asns = databases
    log = tmp_path / "requests.log"
    server = start_server(geo_sites(countries, asns, log))
    port = server.port()
    status, page = ask(port, "de.test", proxy=v1(FRENCH))
    assert status == 403 and b"<code>198.51.100.7</code>, in country <code>FR</code>" in page
    status, body = ask(port, "de.test", proxy=v1(FRENCH6),
                       headers=b"Accept: application/json\r\n")
    assert status == 403 and json.loads(body) == {
        "status": 403, "error": "Forbidden", "detail": "This address is not allowed here.",
        "client": "2001:db8:f::7", "country": "FR"}
    assert ask(port, "de.test", proxy=v1(GERMAN))[0] == 200
    assert ask(port, "de.test", proxy=v1(UNPLACED))[0] == 403
    records = poll(lambda: [json.loads(line) for line in log.read_text().splitlines()]
                   if log.exists() else [], lambda found: len(found) >= 4)
    by_client = {r["client"]: r for r in records}
    assert by_client[FRENCH]["country"] == "FR" and by_client[FRENCH]["status"] == 403
    assert by_client[FRENCH6]["country"] == "FR"
    assert by_client[GERMAN]["country"] == "DE" and by_client[GERMAN]["status"] == 200
    assert by_client[UNPLACED]["country"] == ""


def test_a_database_replaced_while_serving_is_read_again(start_server, databases, tmp_path):
    countries, asns = databases
    server = start_server(geo_sites(countries, asns, tmp_path / "requests.log"))
    port = server.port()
    assert ask(port, "de.test", proxy=v1(FRENCH))[0] == 403
    # geoipupdate's way: a new file renamed over the old one.
    fresh = tmp_path / "country.mmdb.new"
    write_countries(fresh, {**PLACES, "198.51.100.0/24": "DE"})
    os.replace(fresh, countries)
    poll(lambda: ask(port, "de.test", proxy=v1(FRENCH))[0], lambda status: status == 200,
         timeout=20)
    assert ask(port, "nofr.test", proxy=v1(FRENCH))[0] == 200
    # A broken file is said once; the last good one stays in use.
    countries.write_bytes(b"not a database")
    server.wait_for(f"cannot open {countries}", timeout=20)
    assert ask(port, "de.test", proxy=v1(FRENCH))[0] == 200
    assert ask(port, "de.test", proxy=v1(FRENCH6))[0] == 403


def test_lookups_are_kept_per_address_and_read_every_layout(tmp_path):
    path = tmp_path / "ipinfo.mmdb"
    # IPinfo lite's layout: country and AS side by side in one file.
    writer = MMDBWriter(ip_version=6, database_type="ipinfo lite", ipv4_compatible=True)
    writer.insert_network(IPSet(["203.0.113.0/24"]), {"country_code": "de", "asn": "AS64501"})
    writer.to_db_file(str(path))
    geo = GeoLookup(GeoConfig(database=str(path)))
    assert geo.place(GERMAN) == ("DE", 64501)
    assert geo.place("2001:db8::1") == ("", 0)
    assert geo.place("") == ("", 0)                  # PROXY UNKNOWN: no address
    assert GERMAN in geo.memo
    policy = Policy(AccessConfig(allow_asn=frozenset({64501})), geo)
    assert policy.verdict(GERMAN, NoDynamic()) == SIGN_IN
    assert policy.verdict(FRENCH, NoDynamic()) == DENY
    # The memo is bounded, and an answer many addresses share is held once.
    for n in range(MEMO_MAX + 10):
        geo.place(f"10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}")
    assert len(geo.memo) <= MEMO_MAX
    assert geo.place("10.0.0.1") is geo.place("10.9.9.9")
    # A policy without countries or AS numbers never looks an address up.
    assert Policy(AccessConfig(allow=("10.0.0.0/8",)), geo).geo is None
    geo.stop()


def test_config_names_bad_codes_and_countries_without_a_database(tmp_path):
    listen = {"listen": [{"address": "127.0.0.1:0"}]}
    with pytest.raises(ConfigError) as info:
        parse_config({**listen, "site": [{
            "hosts": ["photos.example.com"], "allow_countries": ["Germany"], "deny_asn": ["ASX"],
            "route": [{"path": "/", "type": "return", "deny_countries": ["FR"]}]}]},
            "site.toml")
    problems = info.value.problems
    site = "site[photos.example.com]"
    assert any(f"{site}.allow_countries: expected a list of two-letter ISO 3166 country "
               "codes" in p for p in problems)
    assert any(f"{site}.deny_asn: expected a list of autonomous system numbers" in p
               for p in problems)
    assert f"site.toml: {site}.route[0].deny_countries: expected a [geoip] database to " \
        "look addresses up in" in problems
    with pytest.raises(ConfigError) as info:
        parse_config({**listen, "geoip": {"asn_database": str(tmp_path / "none.mmdb")},
                      "site": [{"hosts": ["*"], "allow_asn": [64500]}]}, "site.toml")
    assert info.value.problems[0].startswith("site.toml: geoip.asn_database: expected a path "
                                             "to a readable file")


@pytest.mark.parametrize("content, expected", [
    (None, "expected a path to a readable file, got"),
    (b"not a database", "expected a MaxMind-format .mmdb file ("),
])
def test_check_names_a_missing_or_foreign_database(tmp_path, content, expected):
    database = tmp_path / "GeoLite2-Country.mmdb"
    if content is not None:
        database.write_bytes(content)
    path = tmp_path / "nestgate.toml"
    path.write_text(config(f"""
[[site]]
hosts = ["*"]
deny_countries = ["FR"]
{HELLO}""", top=f'[geoip]\ndatabase = "{database}"\n'))
    done = subprocess.run([sys.executable, "-m", "nestgate", "check", "--config", str(path)],
                          capture_output=True, text=True, timeout=60, env=_env())
    assert done.returncode != 0
    assert f"geoip.database: {expected}" in done.stderr + done.stdout
    assert "site[*].deny_countries: expected a [geoip] database" in done.stderr + done.stdout

