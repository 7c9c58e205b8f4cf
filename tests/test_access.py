"""Access control: allow/deny lists, local exemption, per-route lists, PROXY protocol
and X-Forwarded-For as the source of the client address, decided once per connection."""

from __future__ import annotations

import json
import random
import socket
import time

import pytest

from conftest import HELLO, ask, config, v1, v2
from nestgate.pipeline.access import Policy
from nestgate.config import ConfigError, parse_config
from wire import Wire, config_dict


def test_invalid_entries_rejected_at_load_with_their_names():
    with pytest.raises(ConfigError) as info:
        parse_config({"listen": [{"address": "127.0.0.1:0"}],
                      "site": [{"hosts": ["*"], "allow": ["10.0.0.0/8", "10.0.0.0/33"],
                                "route": [{"path": "/", "type": "return",
                                           "deny": ["nope"]}]}]})
    text = "\n".join(info.value.problems)
    assert "site[*].allow" in text and "'10.0.0.0/33'" in text
    assert "site[*].route[0].deny" in text and "'nope'" in text


def test_allow_deny_and_local_exemption(start_server):
    server = start_server(config(f"""
[[site]]
hosts = ["lan.test"]
allow = ["10.0.0.0/8"]
deny = ["10.6.6.0/24"]
{HELLO}
[[site]]
hosts = ["home.test"]
allow = ["203.0.113.0/24"]
exempt_local = true
{HELLO}
[[site]]
hosts = ["*"]
{HELLO}
""", listen='proxy_protocol_from = ["127.0.0.1"]'))
    port = server.port()
    assert ask(port, "lan.test")[0] == 403                          # 127.0.0.1 is not listed
    assert ask(port, "lan.test", proxy=v1("10.1.2.3")) == (200, b"hello")
    assert ask(port, "lan.test", proxy=v2("10.1.2.3")) == (200, b"hello")
    assert ask(port, "lan.test", proxy=v1("10.6.6.6"))[0] == 403    # deny wins
    assert ask(port, "lan.test", proxy=v1("198.51.100.1"))[0] == 403
    assert ask(port, "lan.test", path="/missing", proxy=v1("198.51.100.1"))[0] == 403
    assert ask(port, "lan.test", path="/api/v1/health", proxy=v1("198.51.100.1"))[0] == 403
    assert ask(port, "lan.test", path="/missing", proxy=v1("10.1.1.1"))[0] == 404
    assert ask(port, "home.test")[0] == 200                         # loopback is local
    assert ask(port, "home.test", proxy=v1("192.168.1.20"))[0] == 200
    assert ask(port, "home.test", proxy=v1("198.51.100.1"))[0] == 403
    assert ask(port, "home.test", proxy=v1("203.0.113.77"))[0] == 200
    assert ask(port, "other.test", proxy=v1("198.51.100.1"))[0] == 200   # no list: open
    assert ask(port, "other.test", proxy=b"PROXY UNKNOWN\r\n")[0] == 200


def test_route_list_replaces_the_site_list(start_server):
    server = start_server(config("""
[[site]]
hosts = ["*"]
allow = ["10.0.0.0/8"]

[[site.route]]
path = "/hello"
type = "return"
body = "hello"

[[site.route]]
path = "/public"
type = "return"
body = "public"
allow = ["0.0.0.0/0", "::/0"]
deny = ["10.9.0.0/16"]
""", listen='proxy_protocol_from = ["127.0.0.1"]'))
    port = server.port()
    assert ask(port, path="/hello", proxy=v1("198.51.100.1"))[0] == 403
    assert ask(port, path="/public", proxy=v1("198.51.100.1")) == (200, b"public")
    assert ask(port, path="/public", proxy=v1("10.9.1.1"))[0] == 403


def test_proxy_header_refused_from_untrusted_peers(start_server):
    server = start_server(config(f"""
[[site]]
hosts = ["*"]
{HELLO}
""", listen='proxy_protocol_from = ["10.9.9.9"]'))
    assert ask(server.port(), proxy=v1("10.1.2.3"))[0] == 400
    assert ask(server.port(), proxy=v2("10.1.2.3"))[0] == 400
    assert ask(server.port())[0] == 200                     # a plain request is fine
    plain = start_server(config(f"""
[[site]]
hosts = ["*"]
{HELLO}
"""), name="plain.toml")
    assert ask(plain.port(), proxy=v1("10.1.2.3"))[0] == 400


def test_proxy_header_split_across_packets(start_server):
    server = start_server(config(f"""
[[site]]
hosts = ["*"]
allow = ["10.0.0.0/8"]
{HELLO}
""", listen='proxy_protocol_from = ["127.0.0.1"]'))
    with socket.create_connection(("127.0.0.1", server.port()), timeout=5) as sock:
        for part in (v2("10.1.2.3")[:7], v2("10.1.2.3")[7:20], v2("10.1.2.3")[20:]):
            sock.sendall(part)
            time.sleep(0.02)
        sock.sendall(b"GET /hello HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 200")


def test_forwarded_for_from_trusted_proxies(start_server, upstream):
    up = upstream()
    server = start_server(config(f"""
[[site]]
hosts = ["*"]
allow = ["10.0.0.0/8"]

[[site.route]]
prefix = "/"
type = "proxy"
upstream = "{up.url}"
""", top='[client_ip]\ntrusted_proxies = ["127.0.0.1"]'))
    status, body = ask(server.port(), path="/echo", headers=b"X-Forwarded-For: 1.2.3.4, 10.1.1.1\r\n"
                       b"X-Forwarded-Proto: https\r\n")
    assert status == 200
    seen = dict(json.loads(body)["headers"])
    assert seen["x-forwarded-for"] == "1.2.3.4, 10.1.1.1, 127.0.0.1"   # the chain, extended
    assert seen["x-forwarded-proto"] == "https"                      # a trusted proxy's word
    status, _ = ask(server.port(), path="/echo", headers=b"X-Forwarded-For: 198.51.100.4\r\n")
    assert status == 403


def test_a_proxy_that_writes_ports_names_its_clients_not_itself(start_server):
    """`X-Forwarded-For: 203.0.113.7:4711` (Azure's Application Gateway writes ports)
    was garbage to the walk: the client was the proxy, inside the site's `allow`."""
    server = start_server(config("""
[[site]]
hosts = ["*"]
allow = ["127.0.0.0/8"]

[[site.route]]
path = "/hello"
type = "return"
body = "hello"
""", top='[client_ip]\ntrusted_proxies = ["127.0.0.1"]'))
    for named in (b"203.0.113.7:4711", b"[2001:db8::7]:4711"):
        status, _ = ask(server.port(), host="a", headers=b"X-Forwarded-For: %s\r\n" % named)
        assert status == 403, named
    assert ask(server.port(), host="a", headers=b"X-Forwarded-For: 127.0.0.9:1\r\n")[0] == 200


def test_decision_is_made_once_per_connection(monkeypatch):
    calls = []
    original = Policy.verdict

    def counting(self, client, dynamic):
        calls.append(client)
        return original(self, client, dynamic)

    monkeypatch.setattr(Policy, "verdict", counting)
    sites = [{"hosts": ["*"], "allow": ["192.0.2.0/24"],
              "route": [{"path": "/hello", "type": "return", "body": "hello\n"}]}]
    wire = Wire(config_dict(sites=sites), peer=("192.0.2.10", 40000))
    for _ in range(5):
        wire.send(b"GET /hello HTTP/1.1\r\nHost: a\r\n\r\n")
    wire.send(b"GET /nothing HTTP/1.1\r\nHost: a\r\n\r\n")
    assert [r.status for r in wire.responses()] == [200] * 5 + [404]
    assert calls == ["192.0.2.10"]
    wire.close()
    denied = Wire(config_dict(sites=sites), peer=("198.51.100.1", 40000))
    denied.send(b"GET /hello HTTP/1.1\r\nHost: a\r\n\r\n")
    assert [r.status for r in denied.responses()] == [403]
    denied.close()


def test_thousands_of_entries_cost_what_a_handful_does():
    rng = random.Random(7)
    big = [f"{rng.randrange(1, 223)}.{rng.randrange(256)}.{rng.randrange(256)}.0/24"
           for _ in range(5000)] + [f"2001:db8:{rng.randrange(65536):x}::/48"
                                    for _ in range(1000)]
    small = ["10.0.0.0/8", "192.168.0.0/16", "2001:db8::/32"]
    from nestgate.base.clientip import Networks
    probes = [f"{rng.randrange(1, 223)}.{rng.randrange(256)}.1.1" for _ in range(2000)]

    def cost(nets) -> float:
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for ip in probes:
                ip in nets
            best = min(best, time.perf_counter() - t0)
        return best
    # One set lookup per distinct prefix length: the big list has two lengths per family.
    assert cost(Networks(big)) < 3 * cost(Networks(small)) + 0.002
