"""The admin listener on a real `nestgate serve` with two workers: liveness, readiness,
status with the workers' figures, the token gate and its back-off, the separation from
the sites, reload results, and the admin process kept running by the supervisor."""

from __future__ import annotations

import http.client
import json
import re
import os
import signal
import subprocess
import sys
import shutil
import socket
import time
from pathlib import Path

from conftest import (RETURN_SITE, _env, admin_headers, admin_token, free_port, poll,  # noqa: F401
                      refused_port, scrape)

TOKEN = "4f1c9e0b7a2d4c6e8f0a1b2c3d4e5f60"

CONFIG = RETURN_SITE


def admin_get(port: int, path: str, token: str | None = None, host: str = "localhost"):
    """GET on the admin API with `token`, else the one the server made (if it did)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", path, headers={"Host": host, **admin_headers(port, token)})
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp.status, dict(resp.getheaders()), json.loads(body) if body else None


def site_get(port: int, path: str = "/") -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", path)
    resp = conn.getresponse()
    status, body = resp.status, resp.read()
    conn.close()
    return status, body


def test_health_ready_and_status_count_the_requests_served(start_server):
    server = start_server(CONFIG.format(admin="", body="hello"))
    admin = server.admin_port()
    assert admin_get(admin, "/v1/health")[:1] == (200,)
    status, _headers, ready = poll(lambda: admin_get(admin, "/v1/ready"), lambda r: r[0] == 200)
    assert status == 200 and ready == {"ready": True, "generation": 1, "upstreams": [], "certificates": []}

    sent = 37
    for _ in range(sent):
        assert site_get(server.port()) == (200, b"hello")

    def served():
        answer = admin_get(admin, "/v1/status")[2]
        workers = answer["generations"][0]["workers"]
        return answer, sum(w.get("requests", 0) for w in workers)

    answer, total = poll(served, lambda v: v[1] >= sent)
    assert total == sent                       # exactly the requests sent, no more
    workers = answer["generations"][0]["workers"]
    assert sorted(w["pid"] for w in workers) == sorted(server.worker_pids())
    assert all(w["ready"] and w["uptime_s"] >= 0 for w in workers)
    assert answer["generation"] == 1 and answer["pid"] == server.proc.pid
    assert answer["config"]["file"] == str(server.config_path)
    assert len(answer["config"]["sha256"]) == 64
    assert answer["listeners"] == [{"address": f"127.0.0.1:{server.port()}", "bound": True}]


def test_open_connections_are_reported_by_protocol(start_server):
    server = start_server(CONFIG.format(admin="", body="hello"))
    admin = server.admin_port()
    held = [http.client.HTTPConnection("127.0.0.1", server.port(), timeout=5)
            for _ in range(3)]
    for conn in held:
        conn.request("GET", "/")
        conn.getresponse().read()

    def open_h1():
        workers = admin_get(admin, "/v1/status")[2]["generations"][0]["workers"]
        return sum(w["connections"]["http1"] for w in workers if "connections" in w)

    assert poll(open_h1, lambda n: n == 3) == 3
    for conn in held:
        conn.close()
    assert poll(open_h1, lambda n: n == 0) == 0


def test_without_a_configured_token_one_is_made_and_sites_never_reach_it(start_server):
    server = start_server(CONFIG.format(admin="", body="site page"))
    admin = server.admin_port()
    line = server.wait_for("admin API on")
    made = server.config_path.parent / "nestgate-certificates" / "admin.token"
    assert f"bearer token required; the token is in {made})" in line
    token = made.read_text().strip()
    # 32 bytes in hex: never a leading "-" that `ctl --token TOKEN` would take for an option.
    assert len(token) == 64 and int(token, 16) >= 0 and made.stat().st_mode & 0o777 == 0o600
    assert made.parent.stat().st_mode & 0o777 == 0o700
    # Loopback clients need it too (a page in the operator's browser is a loopback client).
    assert admin_get(admin, "/v1/status", token="")[0] == 401
    assert admin_get(admin, "/v1/status", token=token)[0] == 200
    # A site's Host on the admin port: refused, never the site (nor the admin's answers).
    status, _h, body = admin_get(admin, "/index.html", host="example.com")
    assert status == 421 and body["error"]["code"] == "misdirected_request"
    # The admin's paths on a site's port: the site's answer, never the admin's.
    status, body = site_get(server.port(), "/v1/status")
    assert status == 404 and b"generations" not in body
    # The next start (a restart) keeps the token; `nestgate ctl` reads it from there.
    server.stop()
    again = start_server(CONFIG.format(admin="", body="site page"))
    assert made.read_text().strip() == token
    result = ctl("status", "--config", str(again.config_path), env=_env() | {
        "NESTGATE_ADMIN": f"127.0.0.1:{again.admin_port()}"})
    assert result.returncode == 0 and "generation 1 (serving):" in result.stdout, result.stderr


def test_loopback_without_token_answers_loopback_clients_only(start_server):
    server = start_server(CONFIG.format(admin="[admin]\nloopback_without_token = true",
                                        body="x"))
    admin = server.admin_port()
    assert "loopback clients need no token" in server.wait_for("admin API on")
    assert not (server.config_path.parent / "nestgate-certificates" / "admin.token").exists()
    assert admin_get(admin, "/v1/status")[0] == 200
    assert admin_get(admin, "/v1/status", host="evil.example")[0] == 421


def test_loopback_is_decided_on_parsed_addresses():
    """Not by the text's prefix: "::1:2" starts like "::1" but is another address; an
    IPv4-mapped loopback address is loopback."""
    from nestgate.admin.origin import ip_loopback
    assert [ip_loopback(a) for a in ("127.0.0.1", "127.8.9.10", "::1", "::ffff:127.0.0.1",
                                     "0:0:0:0:0:0:0:1")] == [True] * 5
    assert [ip_loopback(a) for a in ("::1:2", "::1:ffff", "1.2.3.4", "::ffff:10.0.0.1",
                                     "128.0.0.1", "", "localhost")] == [False] * 7


def test_a_token_is_required_and_guessing_is_slowed(start_server):
    server = start_server(CONFIG.format(admin=f'[admin]\ntoken = "{TOKEN}"', body="x"))
    admin = server.admin_port()
    assert "bearer token required)" in server.wait_for("admin API on")
    assert admin_get(admin, "/v1/health")[0] == 200            # liveness needs no token
    status, headers, body = admin_get(admin, "/v1/status")
    assert status == 401 and headers["www-authenticate"].startswith("Bearer")
    assert body["error"]["code"] == "unauthorized"
    # No Authorization at all is not a guess (a browser's favicon.ico, a page opened
    # before signing in): never counted towards the back-off.
    for _ in range(6):
        assert admin_get(admin, "/favicon.ico")[0] == 401
    assert admin_get(admin, "/v1/status", TOKEN)[0] == 200
    assert admin_get(admin, "/v1/status", TOKEN[:-1] + "1")[0] == 401
    assert admin_get(admin, "/v1/status", "Basic " + TOKEN)[0] == 401
    for _ in range(3):              # the 3rd to 5th failure (MAX_FAILURES)
        assert admin_get(admin, "/v1/ready", "wrong-token-guess-0000")[0] == 401
    status, headers, body = admin_get(admin, "/v1/status", "another-guess-00000000")
    assert status == 429 and int(headers["retry-after"]) > 0
    # The right token is never locked out, from the same client or any other (the
    # pace of wrong guesses over every client: tests/attack/test_admin_token_guessing.py).
    started = time.monotonic()
    assert admin_get(admin, "/v1/status", TOKEN)[0] == 200
    assert time.monotonic() - started < 1
    assert admin_get(admin, "/v1/health")[0] == 200


def test_the_token_can_come_from_the_environment(tmp_path):
    config = tmp_path / "nestgate.toml"
    config.write_text(CONFIG.format(admin="", body="x"))
    env = _env() | {"NESTGATE_ADMIN_TOKEN": TOKEN}
    from conftest import Server
    server = Server(config, env=env)
    try:
        admin = server.admin_port()
        assert admin_get(admin, "/v1/status")[0] == 401
        assert admin_get(admin, "/v1/status", TOKEN)[0] == 200
    finally:
        server.stop()


def test_reload_results_are_reported(start_server):
    server = start_server(CONFIG.format(admin="", body="one"))
    admin = server.admin_port()
    server.config_path.write_text(CONFIG.format(admin="", body="two") + "\nbogus = 1\n")
    mark = len(server.lines)
    server.signal(signal.SIGHUP)
    server.wait_for("reload refused", start=mark)
    reloads = poll(lambda: admin_get(admin, "/v1/status")[2]["reloads"], bool)
    assert reloads[-1]["ok"] is False and "bogus" in reloads[-1]["message"]
    assert site_get(server.port()) == (200, b"one")

    server.config_path.write_text(CONFIG.format(admin="", body="two"))
    mark = len(server.lines)
    server.signal(signal.SIGHUP)
    server.wait_for("reloaded", start=mark)
    answer = poll(lambda: admin_get(admin, "/v1/status")[2],
                  lambda a: a["generation"] == 2 and len(a["reloads"]) == 2)
    assert answer["reloads"][-1] == {**answer["reloads"][-1], "ok": True,
                                     "message": "generation 2 serving"}
    assert admin_get(admin, "/v1/ready")[2] == {"ready": True, "generation": 2, "upstreams": [], "certificates": []}
    # The old workers stop accepting a moment after the new ones serve: SIGHUP makes
    # no promise about the very next request (the admin API's reload does, below).
    assert poll(lambda: site_get(server.port()), lambda a: a == (200, b"two")) == (200, b"two")


def test_the_admin_clock_moves_with_time_and_across_reloads(start_server):
    """What the admin process reports from the clock (its own and the workers' uptime,
    the Date header) follows the wall clock, also for workers started by a reload."""
    from email.utils import parsedate_to_datetime
    server = start_server(CONFIG.format(admin="", body="one"))
    admin = server.admin_port()
    _status, headers, first = poll(lambda: admin_get(admin, "/v1/status"),
                                   lambda r: r[2]["generation"] == 1)
    time.sleep(2.5)
    _status, later_headers, later = admin_get(admin, "/v1/status")
    assert later["uptime_s"] - first["uptime_s"] >= 2.0
    date = parsedate_to_datetime(headers["date"])
    assert (parsedate_to_datetime(later_headers["date"]) - date).total_seconds() >= 2

    server.config_path.write_text(CONFIG.format(admin="", body="two"))
    mark = len(server.lines)
    server.signal(signal.SIGHUP)
    server.wait_for("reloaded", start=mark)
    answer = poll(lambda: admin_get(admin, "/v1/status")[2],
                  lambda a: a["generation"] == 2 and all(
                      "uptime_s" in w for w in a["generations"][-1]["workers"]))
    for worker in answer["generations"][-1]["workers"]:
        assert 0 <= worker["uptime_s"] < answer["uptime_s"] - 2
    assert "its tick failed" not in "".join(server.lines)


def test_a_killed_admin_process_is_started_again(start_server):
    server = start_server(CONFIG.format(admin="", body="x"))
    admin = server.admin_port()
    victim = server.admin_pid()
    mark = len(server.lines)
    os.kill(victim, signal.SIGKILL)
    server.wait_for(f"admin process {victim} exited", start=mark)
    status = poll(lambda: _status_or_none(admin), lambda s: s == 200)
    assert status == 200 and server.admin_pid() != victim
    assert site_get(server.port()) == (200, b"x")          # the sites never noticed


def _status_or_none(port: int):
    try:
        return admin_get(port, "/v1/health")[0]
    except OSError:
        return None


def test_admin_config_problems_name_the_key(tmp_path):
    cases = {
        '[admin]\ntoken = "short"': "admin.token: expected a token of at least 16",
        '[admin]\naddress = "127.0.0.1:8"\nbogus = 1': "admin.bogus: unknown key",
        '[admin]\naddress = "nowhere"': "admin.address: expected HOST:PORT",
    }
    for admin, expected in cases.items():
        config = tmp_path / "nestgate.toml"
        config.write_text(CONFIG.format(admin=admin, body="x"))
        result = subprocess.run([sys.executable, "-m", "nestgate", "check", "--config",
                                 str(config)], capture_output=True, text=True, env=_env(),
                                timeout=30)
        assert result.returncode != 0 and expected in result.stdout + result.stderr, \
            (admin, result.stdout, result.stderr)


def test_the_admin_port_cannot_be_a_sites_port(tmp_path):
    config = tmp_path / "nestgate.toml"
    config.write_text(CONFIG.format(admin='[admin]\naddress = "127.0.0.1:18181"', body="x")
                      .replace("127.0.0.1:0", "127.0.0.1:18181"))
    env = _env()
    env.pop("NESTGATE_ADMIN")
    result = subprocess.run([sys.executable, "-m", "nestgate", "check", "--config",
                             str(config)], capture_output=True, text=True, env=env, timeout=30)
    assert result.returncode != 0
    assert "admin.address: expected an address that listen[0].address does not take" \
        in result.stdout + result.stderr


def test_off_turns_the_admin_listener_off(tmp_path):
    config = tmp_path / "nestgate.toml"
    config.write_text(CONFIG.format(admin="[admin]\nenabled = false", body="x"))
    from conftest import Server
    server = Server(config)
    try:
        assert site_get(server.port()) == (200, b"x")
        assert not any("admin API" in line for line in server.lines)
        assert len(server.children()) == 2
    finally:
        server.stop()


def test_metrics_count_the_requests_and_only_grow(start_server):
    server = start_server(CONFIG.format(admin=f'[admin]\ntoken = "{TOKEN}"', body="x"))
    admin = server.admin_port()
    assert scrape(admin)[0] == 401
    for _ in range(20):
        site_get(server.port())

    def served(samples):
        return sum(v for _l, v in samples.get("nestgate_requests_served_total", []))

    status, content_type, first = poll(lambda: scrape(admin, TOKEN),
                                       lambda r: served(r[2]) >= 20)
    assert status == 200 and content_type == "text/plain; version=0.0.4; charset=utf-8"
    assert served(first) == 20
    assert first["nestgate_build_info"][0][0]["version"]
    assert first["nestgate_generation"] == [({}, 1.0)]
    assert ({"state": "ready"}, 2.0) in first["nestgate_workers"]
    roles = sorted(l["process"] for l, _v in first["nestgate_process_resident_memory_bytes"])
    assert roles == ["admin", "supervisor", "worker", "worker"]
    assert all(v > 1_000_000 for _l, v in first["nestgate_process_resident_memory_bytes"])

    for _ in range(15):
        site_get(server.port())
    _s, _c, second = poll(lambda: scrape(admin, TOKEN), lambda r: served(r[2]) >= 35)
    assert served(second) == 35
    for name in ("nestgate_requests_served_total", "nestgate_process_cpu_seconds_total"):
        before = {tuple(sorted(l.items())): v for l, v in first[name]}
        after = {tuple(sorted(l.items())): v for l, v in second[name]}
        assert before.keys() == after.keys()
        assert all(after[k] >= before[k] for k in before), name


def ctl(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nestgate", "ctl", *args], capture_output=True,
                          text=True, env=env or _env(), timeout=30)


def test_ctl_reads_the_address_and_token_from_the_config(tmp_path):
    from conftest import Server
    config = tmp_path / "nestgate.toml"
    config.write_text(CONFIG.format(admin=f'[admin]\ntoken = "{TOKEN}"', body="x"))
    env = _env() | {"NESTGATE_ADMIN": f"127.0.0.1:{free_port()}"}
    server = Server(config, env=env)
    try:
        poll(lambda: ctl("ready", "--config", str(config), env=env), lambda r: r.returncode == 0)
        result = ctl("status", "--config", str(config), env=env)
        assert result.returncode == 0, result.stderr
        assert "generation 1 (serving):" in result.stdout
        assert result.stdout.count(" ready ") == 2
        result = ctl("status", "--json", "--config", str(config), env=env)
        assert json.loads(result.stdout)["pid"] == server.proc.pid
        result = ctl("ready", "--config", str(config), env=env)
        assert (result.returncode, result.stdout) == (0, "ready\n")
        result = ctl("metrics", "--config", str(config), env=env)
        assert result.returncode == 0 and "# TYPE nestgate_requests_served_total counter" in result.stdout
        config.write_text(config.read_text().replace('body = "x"', 'body = "y"\nbogus = 1'))
        # A broken file is refused before the server is asked (ctl reads it for the
        # address and token): the same problems, exit 2; the server is not touched.
        result = ctl("reload", "--config", str(config), env=env)
        assert result.returncode == 2 and "site[*].route[0].bogus: unknown key" in result.stderr
        result = ctl("reload", "--address", f"127.0.0.1:{server.admin_port()}", "--token",
                     TOKEN, env=env)
        assert result.returncode == 1 and "site[*].route[0].bogus: unknown key" in result.stderr
        config.write_text(config.read_text().replace("\nbogus = 1", ""))
        result = ctl("reload", "--config", str(config), env=env)
        assert (result.returncode, result.stdout) == (0, "reloaded: generation 2 serving\n")
        assert site_get(server.port()) == (200, b"y")
        result = ctl("status", "--config", str(config), "--token", "not-the-token-000000",
                     env=env)
        assert result.returncode == 1 and "401" in result.stderr
    finally:
        server.stop()
    result = ctl("status", "--config", str(config), env=env)
    assert result.returncode == 3 and "cannot reach the admin listener" in result.stderr


ALLOW_CONFIG = """
[server]
workers = 2

[[listen]]
address = "127.0.0.1:0"

[admin]
token = "{token}"
audit_log = "audit.log"

[auth]
store = "state.db"

[[site]]
hosts = ["*"]
allow = ["10.0.0.0/8"]

[[site.route]]
path = "/"
type = "return"
body = "inside"
"""


def admin_call(port: int, method: str, path: str, body=None, token: str | None = None):
    """A JSON call with `token`, else the one the server made, else the tests' TOKEN."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    data = json.dumps(body).encode() if body is not None else None
    conn.request(method, path, body=data, headers={
        **admin_headers(port, token or admin_token(port) or TOKEN),
        "Content-Type": "application/json"})
    resp = conn.getresponse()
    raw = resp.read()
    conn.close()
    return resp.status, json.loads(raw) if raw else None


def test_allow_entries_added_through_the_api_open_every_worker(start_server, tmp_path):
    server = start_server(ALLOW_CONFIG.format(token=TOKEN))
    admin = server.admin_port()
    assert site_get(server.port())[0] == 403
    status, added = admin_call(admin, "POST", "/v1/allow",
                               {"cidr": "127.0.0.1", "ttl": "10m", "comment": "laptop"})
    assert status == 201 and added["cidr"] == "127.0.0.1" and added["ttl"] == 600.0
    # Every worker lets the address in within a second or two (connections spread).
    opened = poll(lambda: [site_get(server.port())[0] for _ in range(8)],
                  lambda statuses: set(statuses) == {200}, timeout=5)
    assert set(opened) == {200}
    status, listed = admin_call(admin, "GET", "/v1/allow")
    assert status == 200 and [e["id"] for e in listed["entries"]] == [added["id"]]
    assert listed["entries"][0]["comment"] == "laptop"

    assert admin_call(admin, "DELETE", f"/v1/allow/{added['id']}") == (204, None)
    assert admin_call(admin, "DELETE", f"/v1/allow/{added['id']}")[0] == 404
    closed = poll(lambda: [site_get(server.port())[0] for _ in range(8)],
                  lambda statuses: set(statuses) == {403}, timeout=5)
    assert set(closed) == {403}

    audit = [json.loads(line) for line in (tmp_path / "audit.log").read_text().splitlines()]
    assert [(r["action"], r["who"], r["client"]) for r in audit] == [
        ("allow.add", "token", "127.0.0.1"), ("allow.remove", "token", "127.0.0.1")]
    assert TOKEN not in (tmp_path / "audit.log").read_text()


def test_allow_entries_are_checked_before_they_are_stored(start_server):
    server = start_server(ALLOW_CONFIG.format(token=TOKEN))
    admin = server.admin_port()
    for body, expected in [({"cidr": "300.1.1.1"}, "cidr"), ({"cidr": "10.0.0.1", "ttl": "-1h"},
                           "ttl"), ({"cidr": "10.0.0.1", "extra": 1}, "unknown field"),
                           (["10.0.0.1"], "JSON object")]:
        status, answer = admin_call(admin, "POST", "/v1/allow", body)
        assert status == 422 and expected in answer["error"]["message"], (body, answer)
    assert admin_call(admin, "GET", "/v1/allow")[1] == {"entries": []}
    assert admin_call(admin, "POST", "/v1/allow", {"cidr": "10.0.0.1"}, token="wrong-0000000000")[0] == 401
    assert admin_call(admin, "PUT", "/v1/allow", {"cidr": "10.0.0.1"})[0] == 405


def test_an_entry_for_every_address_needs_saying_so(start_server, tmp_path):
    # 0.0.0.0/0 as a dynamic allow entry opens every site with allow_dynamic (the
    # default), protected ones past sign-in, to everyone. Before: 201, silently.
    server = start_server(ALLOW_CONFIG.format(token=TOKEN))
    admin = server.admin_port()
    for cidr in ("0.0.0.0/0", "::/0", "::ffff:0:0/96", "0.0.0.0/0 "):
        status, answer = admin_call(admin, "POST", "/v1/allow", {"cidr": cidr})
        assert status == 400 and answer["error"]["code"] == "every_address", (cidr, answer)
        assert "holds every address" in answer["error"]["message"]
        assert '"allow_everyone": true' in answer["error"]["message"]
    assert admin_call(admin, "POST", "/v1/allow",
                      {"cidr": "0.0.0.0/0", "allow_everyone": "yes"})[0] == 422
    assert admin_call(admin, "GET", "/v1/allow")[1] == {"entries": []}
    assert site_get(server.port())[0] == 403
    status, added = admin_call(admin, "POST", "/v1/allow",
                               {"cidr": "0.0.0.0/0", "ttl": "5m", "allow_everyone": True})
    assert status == 201 and added["cidr"] == "0.0.0.0/0" and "allow_everyone" not in added
    opened = poll(lambda: site_get(server.port())[0], lambda status: status == 200, timeout=5)
    assert opened == 200
    # A narrower entry needs nothing more, and says nothing of it.
    assert admin_call(admin, "POST", "/v1/allow", {"cidr": "0.0.0.0/1"})[0] == 201
    audit = [json.loads(line) for line in (tmp_path / "audit.log").read_text().splitlines()]
    assert [r["action"] for r in audit] == ["allow.add", "allow.add"]


RELOAD_CONFIG = """
[server]
workers = 2

[[listen]]
address = "127.0.0.1:0"

[admin]
token = "{token}"

[auth]
store = "state.db"
[[auth.user]]
name = "ops"
password = "$argon2id$v=19$m=65536,t=3,p=4$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA"

[[site]]
name = "main"
hosts = ["*"]

[[site.route]]
path = "/"
type = "return"
body = "main"
{extra}
"""

SECOND_SITE = """
[[site]]
name = "blog"
hosts = ["blog.localhost"]

[[site.route]]
path = "/"
type = "return"
body = "blog"
"""


def post_raw(port: int, path: str, body: bytes = b"", token: str = TOKEN,
             content_type: str = "application/toml"):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=70)
    conn.request("POST", path, body=body, headers={"Authorization": f"Bearer {token}",
                                                   "Content-Type": content_type})
    resp = conn.getresponse()
    raw = resp.read()
    conn.close()
    return resp.status, json.loads(raw) if raw.startswith(b"{") else raw


def host_get(port: int, host: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", "/", headers={"Host": host})
    resp = conn.getresponse()
    answer = resp.status, resp.read()
    conn.close()
    return answer


def test_config_is_shown_with_its_secrets_redacted(start_server):
    server = start_server(RELOAD_CONFIG.format(token=TOKEN, extra=""))
    status, _h, config = admin_get(server.admin_port(), "/v1/config", TOKEN)
    assert status == 200
    assert config["admin"]["token"] == "<redacted>"
    assert config["auth"]["users"][0] == {**config["auth"]["users"][0], "name": "ops",
                                          "password": "<redacted>", "totp": ""}
    assert [s["name"] for s in config["sites"]] == ["main"]
    assert TOKEN not in json.dumps(config) and "argon2" not in json.dumps(config)


def test_validate_lists_the_problems_check_would(start_server):
    server = start_server(RELOAD_CONFIG.format(token=TOKEN, extra=""))
    admin = server.admin_port()
    good = RELOAD_CONFIG.format(token=TOKEN, extra=SECOND_SITE).encode()
    assert post_raw(admin, "/v1/config/validate", good) == \
        (200, {"ok": True, "problems": [], "warnings": []})
    # What `check` would warn about comes back with a 200.
    status, answer = post_raw(admin, "/v1/config/validate", good.replace(
        b'name = "main"', b'name = "main"\nallow = ["0.0.0.0/0"]'))
    assert status == 200 and [(w["file"], w["key"]) for w in answer["warnings"]] == \
        [("<body>", "site[*].allow")]
    assert "'0.0.0.0/0' holds every address" in answer["warnings"][0]["message"]
    status, answer = post_raw(admin, "/v1/config/validate",
                              good.replace(b"workers = 2", b"workers = -1\nbogus = 1"))
    assert status == 422 and answer["error"]["code"] == "invalid_config"
    keys = {p["key"] for p in answer["error"]["details"]["problems"]}
    assert keys == {"server.workers", "server.bogus"}
    assert all(p["file"] == "<body>" for p in answer["error"]["details"]["problems"])
    status, answer = post_raw(admin, "/v1/config/validate", b"[server\nworkers = 2")
    assert status == 422 and "not valid TOML" in answer["error"]["details"]["problems"][0]["message"]


def test_reload_through_the_api_waits_for_the_new_workers_and_names_the_changes(start_server):
    server = start_server(RELOAD_CONFIG.format(token=TOKEN, extra=""))
    admin = server.admin_port()
    assert host_get(server.port(), "blog.localhost") == (200, b"main")
    server.config_path.write_text(RELOAD_CONFIG.format(token=TOKEN, extra=SECOND_SITE))
    status, answer = post_raw(admin, "/v1/config/reload")
    assert status == 200, answer
    assert answer["generation"] == 2
    assert answer["changed"]["sites"] == {"added": ["blog"], "removed": []}
    assert answer["changed"]["routes"] == {"added": ["blog /"], "removed": []}
    # Served by every worker as soon as the answer came: new connections, both workers.
    assert {host_get(server.port(), "blog.localhost") for _ in range(10)} == {(200, b"blog")}

    server.config_path.write_text(RELOAD_CONFIG.format(token=TOKEN, extra=SECOND_SITE)
                                  .replace('name = "blog"', 'name = "blog"\nbogus = 1'))
    status, answer = post_raw(admin, "/v1/config/reload")
    assert status == 422 and answer["error"]["code"] == "reload_refused"
    assert [p["key"] for p in answer["error"]["details"]["problems"]] == ["site[blog.localhost].bogus"]
    assert host_get(server.port(), "blog.localhost") == (200, b"blog")   # still serving


def test_a_reload_names_the_admin_keys_that_wait_for_a_restart(start_server, tmp_path):
    # The admin listener is bound once and the admin process reads its table when it
    # starts: a reload left changes to [admin] unapplied, and its answer said "ok" and
    # nothing of them. Before: no `not_applied`, no line in the log.
    server = start_server(RELOAD_CONFIG.format(token=TOKEN, extra=""))
    admin = server.admin_port()
    status, answer = post_raw(admin, "/v1/config/reload")
    assert (status, answer["not_applied"]) == (200, []), answer
    changed = RELOAD_CONFIG.format(token=TOKEN, extra="").replace(
        f'token = "{TOKEN}"\n', f'token = "{TOKEN}"\nallowed_hosts = ["admin.home.arpa"]\n'
        f'audit_log = "{tmp_path / "audit.log"}"\nloopback_without_token = true\n')
    server.config_path.write_text(changed)
    mark = len(server.lines)
    status, answer = post_raw(admin, "/v1/config/reload")
    assert status == 200 and answer["generation"] == 3, answer
    assert answer["not_applied"] == ["admin.allowed_hosts", "admin.loopback_without_token",
                                     "admin.audit_log"]
    line = server.wait_for("reloaded without", start=mark)
    assert "admin.allowed_hosts, admin.loopback_without_token, admin.audit_log" in line
    assert "take effect when nestgate restarts" in line
    # What the answer says is so: the Host check is as it was, a token still needed.
    assert raw_admin(admin, "GET", "/v1/status", {"Host": "admin.home.arpa"},
                     token=TOKEN)[0] == 421
    assert raw_admin(admin, "GET", "/v1/status", {"Host": f"127.0.0.1:{admin}",
                                                  "Authorization": ""})[0] == 401
    # A later reload still tells them (the running admin process has not changed).
    status, answer = post_raw(admin, "/v1/config/reload")
    assert answer["not_applied"] == ["admin.allowed_hosts", "admin.loopback_without_token",
                                     "admin.audit_log"]
    status, listed = admin_call(admin, "GET", "/v1/status")
    assert listed["reloads"][-1]["not_applied"] == answer["not_applied"]
    result = ctl("reload", "--address", f"127.0.0.1:{admin}", "--token", TOKEN)
    assert result.returncode == 0 and "  ! admin.audit_log not applied: it takes effect " \
        "when nestgate restarts" in result.stdout, result


def test_which_admin_keys_a_reload_leaves_for_a_restart():
    from dataclasses import replace
    from nestgate.admin.config import AdminConfig, keys_not_applied
    bound = running = AdminConfig(token=TOKEN)
    moved = replace(bound, port=7999, enabled=False, allowed_hosts=("a.test",))
    assert keys_not_applied(bound, running, moved) == [
        "admin.address", "admin.enabled", "admin.allowed_hosts"]
    # A new token starts the admin process anew with the reloaded table: only the
    # listener's keys wait.
    assert keys_not_applied(bound, running, replace(moved, token=TOKEN[::-1])) == [
        "admin.address", "admin.enabled"]
    assert keys_not_applied(bound, running, running) == []


def test_a_reload_of_a_file_the_reader_chokes_on_names_the_file_and_key(start_server):
    """A body_file that is a symbolic link to itself, or a NUL in its name, or arrays
    nested 5,000 deep: the reload was refused, but its problem read "cannot load the
    config: RuntimeError(...)" under the file name "refused, the running config stays".
    Now each names the file and key like any other problem; the old config serves on
    in both workers."""
    server = start_server(RELOAD_CONFIG.format(token=TOKEN, extra=""))
    admin = server.admin_port()
    (server.config_path.parent / "loop").symlink_to("loop")
    good = RELOAD_CONFIG.format(token=TOKEN, extra="")
    file = str(server.config_path)
    for changed, key, message in [
            (good.replace('body = "main"', 'body_file = "loop"'), "site[*].route[0].body_file",
             "expected a path to a readable file, got 'loop'"),
            (good.replace('body = "main"', 'body_file = "a\\u0000b"'),
             "site[*].route[0].body_file",
             "expected a path without a NUL character, got 'a\\x00b'"),
            ("x = " + "[" * 5000 + "]" * 5000 + "\n" + good, "",
             "not valid TOML: nested too deeply")]:
        server.config_path.write_text(changed)
        status, answer = post_raw(admin, "/v1/config/reload")
        assert status == 422 and answer["error"]["code"] == "reload_refused"
        assert {"file": file, "key": key, "message": message} in \
            answer["error"]["details"]["problems"], answer
        assert {host_get(server.port(), "x.localhost") for _ in range(6)} == {(200, b"main")}
    # A listener that cannot be bound: one line from the supervisor, split the same way.
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        server.config_path.write_text(good + f'\n[[listen]]\naddress = "127.0.0.1:{port}"\n')
        status, answer = post_raw(admin, "/v1/config/reload")
    assert status == 422
    [problem] = answer["error"]["details"]["problems"]
    assert (problem["file"], problem["key"]) == (file, "listen[1].address")
    assert problem["message"].startswith(f"cannot bind 127.0.0.1:{port} (Address already in use)")
    assert not any("Traceback" in line for line in server.lines)


def test_sessions_are_listed_and_revoked_on_every_worker(start_server, upstream, tmp_path):
    from conftest import Browser, protected
    up = upstream()
    config = protected(up.url, str(tmp_path / "state.db"), workers=2).replace(
        "[auth]", f'[admin]\ntoken = "{TOKEN}"\naudit_log = "audit.log"\n\n[auth]', 1)
    server = start_server(config)
    admin = server.admin_port()
    alice, again = Browser(server.port()), Browser(server.port())
    for browser in (alice, again):
        assert browser.sign_in()[0].status == 303
    assert Browser(server.port()).sign_in(password="wrong")[0].status == 401

    def figures(samples):
        return ({l["result"]: v for l, v in samples.get("nestgate_signins_total", [])},
                samples.get("nestgate_sessions_active"), samples.get("nestgate_allow_entries"))
    # Each worker publishes its figures on its own tick: wait until all of them agree.
    expected = ({"success": 2, "failure": 1, "refused": 0}, [({}, 2.0)], [({}, 0.0)])
    assert poll(lambda: figures(scrape(admin, TOKEN)[2]), lambda f: f == expected) == expected
    status, listed = admin_call(admin, "GET", "/v1/sessions")
    assert status == 200 and [s["user"] for s in listed["sessions"]] == ["demo", "demo"]
    first = listed["sessions"][0]
    assert set(first) == {"id", "user", "client", "created", "last_seen", "expires", "factors"}
    assert first["factors"] == ["password"]
    assert first["last_seen"] == first["created"]            # signed in, not used since
    assert first["client"] == "127.0.0.1" and len(first["id"]) == 16
    for browser in (alice, again):            # the id is not the cookie's token
        assert first["id"] not in browser.jar["nestgate_session"]

    def statuses(browser):
        return {browser.request("GET", "/echo")[0].status for _ in range(6)}

    assert statuses(alice) == {200} and statuses(again) == {200}
    # Use is written as last_seen, at most once a minute per session (store.SEEN_EVERY).
    import sqlite3
    db = sqlite3.connect(str(tmp_path / "state.db"), isolation_level=None)
    db.execute("UPDATE sessions SET last_seen = last_seen - 120")     # two minutes ago
    db.close()
    time.sleep(1.1)                                      # past the workers' RECHECK
    assert statuses(alice) == {200}
    seen = poll(lambda: admin_call(admin, "GET", "/v1/sessions")[1]["sessions"],
                lambda rows: max(r["last_seen"] for r in rows) > time.time() - 10)
    assert sum(r["last_seen"] > time.time() - 10 for r in seen) == 1   # alice's only
    revoked = next(s for s in listed["sessions"]
                   if s["id"] == first["id"])
    assert admin_call(admin, "DELETE", f"/v1/sessions/{revoked['id']}") == (204, None)
    assert admin_call(admin, "DELETE", f"/v1/sessions/{revoked['id']}")[0] == 404
    # One of the two browsers is signed out on every worker within a second or two.
    outcome = poll(lambda: sorted([statuses(alice), statuses(again)], key=sorted),
                   lambda o: {401} in o, timeout=5)
    assert {401} in outcome and {200} in outcome
    assert admin_call(admin, "DELETE", "/v1/users/demo/sessions") == (200, {"revoked": 1})
    assert poll(lambda: statuses(alice) | statuses(again), lambda s: s == {401}) == {401}
    assert admin_call(admin, "GET", "/v1/sessions")[1] == {"sessions": []}
    actions = [json.loads(line)["action"]
               for line in (tmp_path / "audit.log").read_text().splitlines()]
    assert actions == ["sessions.revoke", "sessions.revoke_user"]


def test_the_openapi_document_describes_exactly_the_routes(start_server):
    from nestgate.admin.api import AdminState, admin_router
    from nestgate.admin.openapi import DOCUMENT
    from nestgate.admin.stats import WorkerTable
    from nestgate.config import parse_config
    config = parse_config({"listen": [{"address": "127.0.0.1:0"}]})
    site = admin_router(AdminState(WorkerTable(1)), config).unclaimed
    routed = set(site.exact) | {path for entries in site.patterns.values()
                                for _segments, _handler, path, _tally in entries}
    assert routed == set(DOCUMENT["paths"])

    def refs(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "$ref":
                    yield value
                else:
                    yield from refs(value)
        elif isinstance(node, list):
            for value in node:
                yield from refs(value)
    for ref in refs(DOCUMENT):
        target = DOCUMENT
        for part in ref.removeprefix("#/").split("/"):
            target = target[part]
        assert isinstance(target, dict), ref

    server = start_server(CONFIG.format(admin=f'[admin]\ntoken = "{TOKEN}"', body="x"))
    status, _h, served = admin_get(server.admin_port(), "/docs/json")   # no token needed
    assert status == 200 and served == DOCUMENT and served["openapi"] == "3.1.0"


def page_get(port: int, path: str = "/", cookies: str = ""):
    """The status page as a browser gets it: with `cookies`, else (for a server that
    made its token) with that token."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", path, headers={"Cookie": cookies} if cookies else admin_headers(port))
    resp = conn.getresponse()
    answer = resp.status, resp.msg, resp.read().decode()
    conn.close()
    return answer


def test_the_status_page_shows_the_workers_and_needs_the_token_to_sign_in(start_server):
    import re
    from urllib.parse import urlencode
    server = start_server(CONFIG.format(admin=f'[admin]\ntoken = "{TOKEN}"', body="x"))
    admin = server.admin_port()
    status, headers, _ = page_get(admin)
    assert status == 303 and headers["location"] == "/login"
    status, headers, form = page_get(admin, "/login")
    assert status == 200 and 'name="token"' in form
    nonce = re.search(r'name="csrf" value="([0-9a-f]+)"', form).group(1)
    csrf_cookie = headers["set-cookie"].split(";")[0]
    assert "SameSite=Strict" in headers["set-cookie"] and "HttpOnly" in headers["set-cookie"]

    def post(fields, cookie):
        conn = http.client.HTTPConnection("127.0.0.1", admin, timeout=5)
        conn.request("POST", "/login", body=urlencode(fields), headers={
            "Content-Type": "application/x-www-form-urlencoded", "Cookie": cookie})
        resp = conn.getresponse()
        resp.read()
        conn.close()
        return resp

    assert post({"token": TOKEN, "csrf": "0" * 32}, csrf_cookie).status == 403
    assert post({"token": "wrong-token-1234567", "csrf": nonce}, csrf_cookie).status == 401
    resp = post({"token": TOKEN, "csrf": nonce}, csrf_cookie)
    assert resp.status == 303 and resp.getheader("location") == "/"
    session = [c for c in resp.msg.get_all("set-cookie") if c.startswith("nestgate_admin=")][0]
    assert "HttpOnly" in session and "SameSite=Strict" in session
    assert TOKEN not in session
    for _ in range(5):
        site_get(server.port())
    status, headers, page = page_get(admin, "/", session.split(";")[0])
    assert status == 200 and headers["content-type"] == "text/html; charset=utf-8"
    assert "default-src 'none'" in headers["content-security-policy"]
    for pid in server.worker_pids():
        assert f"<td>{pid}</td>" in page
    assert "Requests per second" in page and "<script" not in page and "http" not in \
        page.split("<body>")[1].replace("http1", "")
    assert page_get(admin, "/", "nestgate_admin=" + "0" * 64)[0] == 303


def test_ctl_edits_the_allow_list_and_revokes_sessions(start_server):
    server = start_server(ALLOW_CONFIG.format(token=TOKEN))
    where = ["--address", f"127.0.0.1:{server.admin_port()}", "--token", TOKEN]
    result = ctl("allow", "add", "203.0.113.7", "--for", "2h", "--comment", "phone", *where)
    assert result.returncode == 0, result.stderr
    entry_id = int(result.stdout)
    result = ctl("allow", "list", *where)
    assert result.returncode == 0 and "203.0.113.7" in result.stdout and "phone" in result.stdout
    assert ctl("allow", "add", "300.1.2.3", *where).returncode == 1
    refused = ctl("allow", "add", "::/0", *where)
    assert refused.returncode == 1 and "holds every address" in refused.stderr, refused
    everyone = ctl("allow", "add", "::/0", "--allow-everyone", "--for", "1m", *where)
    assert everyone.returncode == 0 and everyone.stdout.strip().isdigit(), everyone
    assert ctl("allow", "remove", everyone.stdout.strip(), *where).stdout == "done\n"
    assert ctl("allow", "remove", str(entry_id), *where).stdout == "done\n"
    assert ctl("allow", "remove", str(entry_id), *where).returncode == 1
    assert ctl("allow", *where).stdout == ""
    result = ctl("sessions", *where)
    assert (result.returncode, result.stdout) == (0, "")
    assert ctl("revoke", "--user", "demo", *where).stdout == "revoked 0\n"
    assert ctl("revoke", "0123456789abcdef", *where).returncode == 1
    assert ctl("allow", "frobnicate", *where).returncode == 2


def chromium_dom(url: str) -> str:
    """The page's DOM after headless Chromium ran its scripts."""
    chromium = shutil.which("chromium")
    assert chromium, "chromium is installed by `make test` (debian-deps)"
    out = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu",
                          "--virtual-time-budget=15000", "--dump-dom", url],
                         capture_output=True, text=True, timeout=90)
    assert out.returncode == 0 and "<body" in out.stdout, out.stderr[-2000:]
    return out.stdout


def test_swagger_ui_is_bundled_and_renders_the_api_in_chromium(start_server):
    import brotli
    server = start_server(CONFIG.format(admin=f'[admin]\ntoken = "{TOKEN}"', body="x"))
    admin = server.admin_port()
    status, headers, page = page_get(admin, "/docs")                  # open, like /docs/json
    assert status == 200 and headers["content-type"] == "text/html; charset=utf-8"
    assert "script-src 'self';" in headers["content-security-policy"]
    assert '<script src="/docs/swagger-ui-bundle.js">' in page and "//" not in page.replace(
        "/docs/", "")                                                 # nothing from elsewhere
    bundle = Path(__file__).parent.parent / "nestgate/admin/swagger_ui/swagger-ui-bundle.js"
    conn = http.client.HTTPConnection("127.0.0.1", admin, timeout=10)
    conn.request("GET", "/docs/swagger-ui-bundle.js", headers={"Accept-Encoding": "br"})
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    assert resp.status == 200 and resp.getheader("content-type") == "text/javascript; charset=utf-8"
    assert resp.getheader("content-encoding") == "br" and len(body) < bundle.stat().st_size / 3
    assert brotli.decompress(body) == bundle.read_bytes()
    status, _h, script = page_get(admin, "/docs/start.js")
    assert status == 200 and 'url: "/docs/json"' in script

    # A real browser runs the page: Swagger UI reads the document and lists the operations.
    dom = chromium_dom(f"http://127.0.0.1:{admin}/docs")
    assert "nestgate management API" in dom
    for path in ("/v1/status", "/v1/ready", "/v1/allow", "/v1/config/reload", "/metrics"):
        assert f'data-path="{path}"' in dom, path
    assert "OAS 3.1" in dom

    # And an operator uses it: Authorize with the token, then "Try it out" on
    # /v1/status and Execute; the answer shown is the server's status, not a 401.
    from browser import Browser
    browser = Browser(f"http://127.0.0.1:{admin}/docs")
    op = "#operations-default-get_v1_status"
    try:
        assert browser.wait_for("document.querySelectorAll('.opblock').length") >= 20
        browser.evaluate("document.querySelector('.btn.authorize').click()")
        assert browser.wait_for("!!document.querySelector('.auth-container input')")
        browser.type_into(".auth-container input", TOKEN)
        browser.evaluate("document.querySelector('.auth-container .btn.authorize').click()")
        assert "Authorized" in browser.wait_for(
            "document.querySelector('.auth-container').innerText.includes('Authorized')"
            " && document.querySelector('.auth-container').innerText")
        browser.evaluate("document.querySelector('.auth-container .btn-done').click()")
        browser.evaluate(f"document.querySelector('{op} .opblock-summary button').click()")
        assert browser.wait_for(f"!!document.querySelector('{op} .try-out__btn')")
        browser.evaluate(f"document.querySelector('{op} .try-out__btn').click()")
        assert browser.wait_for(f"!!document.querySelector('{op} .btn.execute')")
        browser.evaluate(f"document.querySelector('{op} .btn.execute').click()")
        row = f"{op} .live-responses-table tbody"
        code = browser.wait_for(f"document.querySelector('{row} .response-col_status')"
                                "?.innerText.trim()")
        shown = browser.evaluate(f"document.querySelector('{row} .response-col_description')"
                                 ".innerText")
        curl = browser.evaluate(f"document.querySelector('{op} .curl-command')?.innerText")
    finally:
        browser.close()
    assert code == "200", shown
    assert '"generations"' in shown and '"version"' in shown
    assert f"Authorization: Bearer {TOKEN}" in curl


def test_the_status_page_signs_in_and_renders_in_chromium(start_server):
    """A browser signs in at /login with the token the server made (its form, the CSRF
    nonce and the Origin and Sec-Fetch-Site Chromium sends all pass the checks) and
    then sees the page."""
    import re
    from browser import Browser
    server = start_server(CONFIG.format(admin="", body="x"))     # the token is made
    admin = server.admin_port()
    workers = set(server.worker_pids())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:             # until every worker has reported
        status = admin_get(admin, "/v1/status")[2]
        if {w["pid"] for g in status["generations"] for w in g["workers"]
                if w["ready"]} == workers:
            break
        time.sleep(0.1)
    browser = Browser(f"http://127.0.0.1:{admin}/")
    try:
        assert browser.wait_for("location.pathname == '/login' && "
                                "!!document.querySelector('input[name=token]')")
        browser.type_into("input[name=token]", admin_token(admin))
        browser.evaluate("document.querySelector('form').submit()")
        assert browser.wait_for("document.body && document.body.innerHTML.includes("
                                "'<h2>Workers</h2>')")
        dom = browser.evaluate("document.documentElement.outerHTML")
    finally:
        browser.close()
    assert "<h2>Requests per second</h2>" in dom
    pids = set(re.findall(r"<tr><td>\d+</td><td>(\d+)</td><td>ready</td>", dom))
    assert pids == {str(pid) for pid in workers}


ANSWERS_SITE = """
[server]
workers = 2

[[listen]]
address = "127.0.0.1:0"

[[site]]
name = "main"
hosts = ["*"]

[[site.route]]
path = "/"
type = "return"
body = "{body}"

[[site.route]]
prefix = "/app/"
type = "proxy"
upstream = "{upstream}"
strip_prefix = true

[[site.route]]
prefix = "/dead/"
type = "proxy"
upstream = "http://127.0.0.1:{dead}"
health_path = "/health"
health_interval = "0.2s"
"""


def test_metrics_count_answers_by_site_route_and_code_across_a_reload(start_server, upstream):
    up = upstream()
    dead = refused_port()
    server = start_server(ANSWERS_SITE.format(body="one", upstream=up.url, dead=dead))
    admin = server.admin_port()
    port = server.port()
    for _ in range(30):
        site_get(port, "/")                          # ready answers, from the parser
    for _ in range(7):
        assert site_get(port, "/app/hi") == (200, b"hi")     # proxied: a timed task
    for _ in range(4):
        site_get(port, "/nowhere")
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        raw.sendall(b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: x\r\n\r\n")   # refused
        assert raw.recv(100).startswith(b"HTTP/1.1 400")

    def answers(samples):
        return {(l["site"], l["route"], l["code"]): v
                for l, v in samples.get("nestgate_requests_total", [])}
    expected = {("main", "/", "200"): 30, ("main", "/app/*", "200"): 7,
                ("main", "-", "404"): 4, ("-", "-", "400"): 1}
    samples = poll(lambda: scrape(admin)[2], lambda s: answers(s) == expected)
    assert answers(samples) == expected
    buckets = {l["le"]: v for l, v in samples["nestgate_request_duration_seconds_bucket"]
               if l["site"] == "main"}
    counts = {l["site"]: v for l, v in samples["nestgate_request_duration_seconds_count"]}
    assert counts["main"] == 41 and buckets["+Inf"] == 41
    assert buckets["0.005"] >= 34                  # the untimed 34, and the quick proxied
    values = [buckets[k] for k in sorted(buckets, key=lambda k: float(k))]
    assert values == sorted(values)               # cumulative
    sums = {l["site"]: v for l, v in samples["nestgate_request_duration_seconds_sum"]}
    assert 0 < sums["main"] < 7 * 5                # only the 7 proxied answers were timed

    # Drained by hand: no new request goes to it in any worker; then back.
    app = {"route": "/app/*", "upstream": up.url}
    assert admin_call(admin, "POST", "/v1/upstreams/drain", app) == \
        (200, {"applied_by_workers": 2, **app})
    assert {site_get(port, "/app/hi")[0] for _ in range(6)} == {502}
    listed = {u["route"]: u for u in admin_call(admin, "GET", "/v1/upstreams")[1][
        "upstreams"]}
    assert listed["/app/*"]["drained"] is True and listed["/app/*"]["healthy"] is False
    assert admin_call(admin, "POST", "/v1/upstreams/undrain", app)[0] == 200
    assert {site_get(port, "/app/hi") for _ in range(6)} == {(200, b"hi")}
    assert admin_call(admin, "POST", "/v1/upstreams/drain",
                      {"route": "/app/*", "upstream": "http://nowhere:1"})[0] == 404
    assert admin_call(admin, "POST", "/v1/upstreams/drain", {"route": 1})[0] == 422
    assert admin_call(admin, "GET", "/v1/upstreams/drain")[0] == 405
    expected[("main", "/app/*", "502")] = 6
    expected[("main", "/app/*", "200")] += 6

    # A reload replaces both workers: what they counted is kept, and new answers add up.
    # Upstreams: counted over the workers, and their health shown in /v1/ready (which
    # an unhealthy upstream does not fail).
    def upstream_state(samples):
        return {(l["route"], l["upstream"]): v
                for l, v in samples.get("nestgate_upstream_healthy", [])}
    samples = poll(lambda: scrape(admin)[2],
                   lambda s: upstream_state(s).get(("/dead/*", f"http://127.0.0.1:{dead}")) == 0)
    assert upstream_state(samples) == {("/app/*", up.url): 1,
                                       ("/dead/*", f"http://127.0.0.1:{dead}"): 0}
    requests = {l["route"]: v for l, v in samples["nestgate_upstream_requests_total"]}
    assert requests == {"/app/*": 7, "/dead/*": 0}
    status, _h, ready = admin_get(admin, "/v1/ready")
    assert status == 200 and ready["ready"] is True
    shown = {u["route"]: u for u in ready["upstreams"]}
    assert shown["/app/*"]["healthy"] is True and shown["/app/*"]["last_check"] is None
    assert shown["/dead/*"]["healthy"] is False and shown["/dead/*"]["failing_in_workers"] == 2
    assert shown["/dead/*"]["last_check"] > time.time() - 10
    status, _h, page = page_get(admin)                  # the status page shows them too
    assert status == 200 and f"<td>{up.url}</td><td class=\"\">healthy</td>" in page
    assert "failing in 2 workers" in page and "<td>no TLS listener</td>" in page

    server.config_path.write_text(ANSWERS_SITE.format(body="two", upstream=up.url, dead=dead))
    mark = len(server.lines)
    server.signal(signal.SIGHUP)
    server.wait_for("reloaded", start=mark)
    asked = []

    def ask():
        asked.append(1)
        return site_get(port)
    assert poll(ask, lambda a: a == (200, b"two")) == (200, b"two")
    for _ in range(5):
        site_get(port, "/")
    served = 30 + len(asked) + 5                   # by old and new workers alike
    after = poll(lambda: scrape(admin)[2],
                 lambda s: answers(s).get(("main", "/", "200"), 0) >= served)
    assert answers(after) == {**expected, ("main", "/", "200"): served}
    # promtool (Debian's prometheus package, installed by `make test`) accepts it all.
    promtool = shutil.which("promtool")
    assert promtool, "promtool is installed by `make test` (debian-deps)"
    conn = http.client.HTTPConnection("127.0.0.1", admin, timeout=5)
    conn.request("GET", "/metrics", headers=admin_headers(admin))
    exposition = conn.getresponse().read()
    conn.close()
    linted = subprocess.run([promtool, "check", "metrics"], input=exposition,
                            capture_output=True, timeout=30)
    assert linted.returncode == 0, linted.stdout.decode() + linted.stderr.decode()
    assert {u["route"]: u["drained"] for u in admin_call(admin, "GET", "/v1/upstreams")[1][
        "upstreams"]} == \
        {"/app/*": False, "/dead/*": False}


def test_metrics_count_http2_answers(start_server, certs):
    from h2client import H2Client
    from conftest import tls_block
    server = start_server(CONFIG.format(admin="", body="x").replace(
        "[[site]]", f'[[listen]]\naddress = "127.0.0.1:0"\n{tls_block(certs)}\n[[site]]', 1))
    client = H2Client(server.port("https"), certs["ca"])
    try:
        for path, status in (("/", 200), ("/", 200), ("/nowhere", 404)):
            assert client.request("GET", path)[0] == status
        assert client.request("POST", "/", body=b"y" * 10)[0] == 200    # read, then answered
    finally:
        client.close()
    expected = {("site0", "/", "200"): 3, ("site0", "-", "404"): 1}
    samples = poll(lambda: scrape(server.admin_port())[2],
                   lambda s: {(l["site"], l["route"], l["code"]): v
                              for l, v in s.get("nestgate_requests_total", [])} == expected)
    assert {(l["site"], l["route"], l["code"]): v
            for l, v in samples["nestgate_requests_total"]} == expected
    # The listener's certificates, with their expiry, in /v1/ready and /metrics.
    from cryptography import x509
    status, _h, ready = admin_get(server.admin_port(), "/v1/ready")
    assert status == 200
    shown = {c["file"]: c for c in ready["certificates"]}
    assert set(shown) == {certs["local"][0], certs["other"][0]}
    for pem, names in ((certs["local"][0], ["localhost", "127.0.0.1"]),
                       (certs["other"][0], ["other.test"])):
        leaf = x509.load_pem_x509_certificate(Path(pem).read_bytes())
        assert shown[pem]["not_after"] == leaf.not_valid_after_utc.timestamp()
        assert shown[pem]["names"] == names and shown[pem]["expires_in_days"] > 300
    expiry = {l["file"]: v for l, v in samples["nestgate_certificate_expiry_seconds"]}
    assert expiry == {pem: c["not_after"] for pem, c in shown.items()}
    page = page_get(server.admin_port())[2]
    assert "<td>127.0.0.1:" in page and "<td>other.test</td>" in page and " days)</td>" in page


def test_the_admin_listener_over_https(tmp_path, certs):
    import ssl
    from conftest import Server
    cert, key = certs["local"]
    config = tmp_path / "nestgate.toml"
    config.write_text(CONFIG.format(body="x", admin=(
        f'[admin]\ntoken = "{TOKEN}"\ncertificate = {{ cert = "{cert}", key = "{key}" }}')))
    env = _env() | {"NESTGATE_ADMIN": f"127.0.0.1:{free_port()}"}
    server = Server(config, env=env)
    try:
        assert "admin API on https://" in server.wait_for("admin API on")
        admin = server.admin_port()
        ctx = ssl.create_default_context(cafile=certs["ca"])
        conn = http.client.HTTPSConnection("127.0.0.1", admin, timeout=5, context=ctx)
        conn.request("GET", "/v1/status", headers={"Authorization": f"Bearer {TOKEN}"})
        resp = conn.getresponse()
        assert resp.status == 200 and json.loads(resp.read())["pid"] == server.proc.pid
        conn.close()
        with socket.create_connection(("127.0.0.1", admin), timeout=5) as raw:  # clear text
            raw.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert not raw.recv(100).startswith(b"HTTP/1.1 200")
        poll(lambda: ctl("ready", "--config", str(config), env=env), lambda r: r.returncode == 0)
        result = ctl("status", "--config", str(config), env=env)   # trusts the cert file
        assert result.returncode == 0 and "generation 1 (serving):" in result.stdout
        result = ctl("status", "--config", str(config), "--cafile", certs["other"][0], env=env)
        assert result.returncode == 3 and "CERTIFICATE_VERIFY_FAILED" in result.stderr
    finally:
        server.stop()



def test_notes_are_purged_and_read_again_through_the_api(start_server, tmp_path):
    folder = tmp_path / "notes"
    folder.mkdir()
    note = folder / "hello.md"
    note.write_text("---\ntitle: Hello\ndate: 2026-01-01\n---\n\nfirst text\n")
    from conftest import NOTES_SITE      # two workers, notes
    server = start_server(NOTES_SITE.format(notes=folder))
    admin, port = server.admin_port(), server.port()
    assert all(b"first text" in site_get(port, "/notes/hello")[1] for _ in range(6))
    # An edit that keeps the file's size and mtime: the folder check cannot see it.
    st = note.stat()
    note.write_text(note.read_text().replace("first text", "fixed text"))
    os.utime(note, ns=(st.st_atime_ns, st.st_mtime_ns))
    time.sleep(1.5)                                   # two folder checks later
    assert all(b"first text" in site_get(port, "/notes/hello")[1] for _ in range(6))
    assert admin_call(admin, "POST", "/v1/notes/purge") == \
        (200, {"applied_by_workers": 2})
    assert admin_call(admin, "POST", "/v1/notes/reread") == \
        (200, {"applied_by_workers": 2})
    pages = [site_get(port, "/notes/hello")[1] for _ in range(8)]   # both workers
    assert all(b"fixed text" in page for page in pages)
    def pages_cache(samples):
        return [v for name in ("nestgate_cache_hits_total", "nestgate_cache_misses_total",
                               "nestgate_cache_bytes")
                for l, v in samples.get(name, []) if l["cache"] == "pages"]
    figures = pages_cache(poll(lambda: scrape(admin)[2],
                               lambda s: len(pages_cache(s)) == 3 and all(pages_cache(s))))
    assert len(figures) == 3 and all(figures)          # hits, misses (renders), bytes held
    audit = [json.loads(line.split("nestgate: audit ", 1)[1])["action"]
             for line in server.lines if "nestgate: audit " in line]
    assert audit == ["notes.purge", "notes.reread"]


def test_schemathesis_finds_every_answer_in_the_document(start_server, upstream, tmp_path):
    """Schemathesis against a running server, every operation, with and without the
    token, valid and invalid requests: no 5xx, and every status, content type, header
    and body as documented. Left out: the checks that expect 401 where the back-off
    answers 429 (five failed token checks in a minute, by design) or that expect any
    string the schema allows to be a valid CIDR; and /v1/config/validate, whose TOML
    body it cannot write (tested in this file)."""
    st = Path(sys.executable).with_name("st")
    proxy = f'[[site.route]]\nprefix = "/app/"\ntype = "proxy"\nupstream = "{upstream().url}"\n'
    config = RELOAD_CONFIG.format(token=TOKEN, extra=proxy)
    server = start_server(config)
    url = f"http://127.0.0.1:{server.admin_port()}/docs/json"
    checks = ("not_a_server_error,status_code_conformance,content_type_conformance,"
              "response_headers_conformance,response_schema_conformance,unsupported_method")
    # With the token (never locked out by the wrong ones schemathesis also sends), and
    # without it (each answer is then a documented 401 or 429, some of them held).
    for auth in (["-H", f"Authorization: Bearer {TOKEN}"], []):
        run = subprocess.run([str(st), "run", url, *auth, "--checks", checks,
                              "--max-examples", "8", "--seed", "7", "--workers", "1",
                              "--exclude-path", "/v1/config/validate"],
                             capture_output=True, text=True, timeout=240, cwd=tmp_path)
        assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]


def _bytes_counted(admin: int) -> tuple[float, float]:
    samples = scrape(admin)[2]
    return (sum(v for _l, v in samples.get("nestgate_received_bytes_total", [])),
            sum(v for _l, v in samples.get("nestgate_sent_bytes_total", [])))


def _exchange(port: int, data: bytes) -> bytes:
    """Send `data` on one connection and read until the server closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received


def test_metrics_count_the_bytes_both_ways_exactly(start_server, tmp_path):
    """HTTP/1.1 bytes read and written, over every way an answer leaves: a ready answer
    from the parser callback, one after its body, HEAD, an error page, a file a handler
    sends, a protocol error's closing answer."""
    files = tmp_path / "files"
    files.mkdir()
    (files / "big.bin").write_bytes(os.urandom(70_000))
    server = start_server(f"""
        [server]
        workers = 2
        [[listen]]
        address = "127.0.0.1:0"
        [[site]]
        hosts = ["*"]
        [[site.route]]
        path = "/"
        type = "return"
        body = "hello"
        [[site.route]]
        prefix = "/files/"
        type = "static"
        root = "{files}"
        sendfile_min = "64KiB"
        """)
    admin, port = server.admin_port(), server.port()
    assert _bytes_counted(admin) == (0, 0)
    keep_alive = (b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"
                  b"HEAD / HTTP/1.1\r\nHost: a\r\n\r\n"
                  b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc"
                  b"GET /nothing-here HTTP/1.1\r\nHost: a\r\n\r\n"
                  b"GET /files/big.bin HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
    smuggling = (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n")
    answers = _exchange(port, keep_alive)
    assert answers.count(b"HTTP/1.1 200") == 4 and b"HTTP/1.1 404" in answers
    refused = _exchange(port, smuggling)
    assert refused.startswith(b"HTTP/1.1 400")
    expected = (len(keep_alive) + len(smuggling), len(answers) + len(refused))
    assert poll(lambda: _bytes_counted(admin), lambda r: r == expected) == expected


def test_metrics_count_http2_bytes_inside_tls(start_server, certs):
    from h2client import H2Client
    from conftest import TEMPLATE, tls_block
    server = start_server(TEMPLATE.format(tls=tls_block(certs)))
    admin = server.admin_port()
    client = H2Client(server.port("https"), certs["ca"])
    for path in ("/hello", "/docs/a", "/nothing"):
        client.request("GET", path)
    # Ask the server to end the connection and read what it still writes.
    client.h2.close_connection()
    client.send(client.h2.data_to_send())
    while client.recv():
        pass
    client.close()
    expected = (client.sent, client.received)
    assert expected[0] > 24 and expected[1] > 100        # the preface, three answers
    assert poll(lambda: _bytes_counted(admin), lambda r: r == expected) == expected


def raw_admin(port: int, method: str, path: str, headers: dict, body: bytes = b"",
              token: str | None = None) -> tuple[int, dict]:
    """One request written as it is (Host included, or left out), on a socket: its
    status and JSON answer."""
    fields = {**admin_headers(port, token), **headers}
    if body:
        fields["Content-Length"] = str(len(body))
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(
        f"{name}: {value}\r\n" for name, value in fields.items()) + "Connection: close\r\n\r\n"
    answer = _exchange(port, head.encode() + body)
    status = int(answer.split(b" ", 2)[1])
    payload = answer.partition(b"\r\n\r\n")[2]
    return status, json.loads(payload) if payload.startswith(b"{") else {}


ENTRY = json.dumps({"cidr": "0.0.0.0/0", "ttl": "366d"}).encode()


def test_pages_of_other_sites_and_rebound_names_cannot_drive_the_api(start_server):
    """Host (DNS rebinding), Origin and Sec-Fetch-Site (a page in the operator's
    browser), Content-Type (the bodies a page sends without a preflight), each on its
    own, with the right token: refused, and the allow-list is not touched."""
    server = start_server(ALLOW_CONFIG.format(token=TOKEN))
    admin = server.admin_port()
    own = f"127.0.0.1:{admin}"
    json_body = {"Content-Type": "application/json"}
    refused = [
        ({"Host": "evil.example"}, 421, "misdirected_request"),           # rebinding
        ({"Host": f"evil.example:{admin}"}, 421, "misdirected_request"),
        ({"Host": "127.0.0.1.evil.example"}, 421, "misdirected_request"),
        ({"Host": "localhost.evil.example"}, 421, "misdirected_request"),
        ({"Host": "10.0.0.1"}, 421, "misdirected_request"),               # not ours
        ({}, 421, "misdirected_request"),                                 # (HTTP/1.1 needs one: 400)
        ({"Host": own, "Origin": "http://evil.example"}, 403, "cross_site"),
        ({"Host": own, "Origin": "http://127.0.0.1:8080"}, 403, "cross_site"),
        ({"Host": own, "Origin": f"https://127.0.0.1:{admin}"}, 403, "cross_site"),
        ({"Host": own, "Origin": "null"}, 403, "cross_site"),
        ({"Host": own, "Sec-Fetch-Site": "cross-site"}, 403, "cross_site"),
        ({"Host": own, "Sec-Fetch-Site": "same-site"}, 403, "cross_site"),
    ]
    for headers, status, code in refused:
        answer = raw_admin(admin, "POST", "/v1/allow", {**headers, **json_body}, ENTRY,
                           token=TOKEN)
        expected = (400, {}) if not headers else (status, code)
        assert (answer[0], answer[1].get("error", {}).get("code", {})) == expected, headers
    for media in ("text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                  "multipart/form-data; boundary=x", "application/jsonp", None):
        typed = {"Content-Type": media} if media else {}
        status, answer = raw_admin(admin, "POST", "/v1/allow", {"Host": own, **typed}, ENTRY,
                                   token=TOKEN)
        assert (status, answer["error"]["code"]) == (415, "unsupported_media_type"), media
    # Validate reads TOML, the status page's sign-in a form: nothing else.
    assert raw_admin(admin, "POST", "/v1/config/validate", {"Host": own, **json_body},
                     b'{"server": {}}', token=TOKEN)[0] == 415
    assert raw_admin(admin, "POST", "/login", {"Host": own, **json_body}, b'{"token": 1}')[0] \
        == 415
    assert admin_call(admin, "GET", "/v1/allow")[1] == {"entries": []}
    # What the listener's own clients send passes: its addresses and localhost, with a
    # same-origin Origin or Sec-Fetch-Site (Swagger UI, the sign-in form) or none (curl).
    for headers in ({"Host": own}, {"Host": f"localhost:{admin}"}, {"Host": "localhost"},
                    {"Host": f"[::ffff:127.0.0.1]:{admin}"},
                    {"Host": own, "Origin": f"http://{own}", "Sec-Fetch-Site": "same-origin"},
                    {"Host": f"localhost:{admin}", "Origin": f"http://localhost:{admin}"},
                    {"Host": own, "Sec-Fetch-Site": "none"}):
        assert raw_admin(admin, "GET", "/v1/allow", headers, token=TOKEN)[0] == 200, headers
    status, added = raw_admin(admin, "POST", "/v1/allow", {
        "Host": own, "Content-Type": "application/json; charset=utf-8"},
        json.dumps({"cidr": "10.1.2.3"}).encode(), token=TOKEN)
    assert status == 201 and added["cidr"] == "10.1.2.3"
    # Liveness answers any Host (probes), and tells nothing but "ok".
    assert raw_admin(admin, "GET", "/v1/health", {"Host": "evil.example"})[0] == 200


def test_allowed_hosts_names_the_listener_by_other_names(start_server):
    server = start_server(CONFIG.format(admin=f'[admin]\ntoken = "{TOKEN}"\n'
                                              'allowed_hosts = ["Admin.Home.Arpa"]', body="x"))
    admin = server.admin_port()
    for host, status in (("admin.home.arpa", 200), (f"ADMIN.home.arpa:{admin}", 200),
                         ("admin.home.arpa.evil.example", 421), ("home.arpa", 421)):
        assert raw_admin(admin, "GET", "/v1/status", {"Host": host}, token=TOKEN)[0] == status
    assert raw_admin(admin, "GET", "/v1/status", {
        "Host": "admin.home.arpa", "Origin": "http://admin.home.arpa"}, token=TOKEN)[0] == 200


ATTACK_PAGE = """<!doctype html><html><body>
<form id="f" method="post" enctype="text/plain" action="{admin}/v1/allow" target="sink">
<input name='{{"cidr":"0.0.0.0/0","ttl":"366d","x":"' value='"}}'></form>
<iframe name="sink"></iframe></body></html>"""


def test_a_page_on_another_origin_cannot_post_to_the_api_from_chromium(start_server):
    """The attack as found: a page the operator's browser has open POSTs text/plain
    with `mode: "no-cors"` (no preflight), and submits a text/plain form, to the admin
    listener's /v1/allow. The server answers (the fetch resolves), and the allow-list
    does not change: with the token made by default, and with loopback clients let in
    without one, where only the Origin, Sec-Fetch-Site and Content-Type checks hold."""
    import http.server
    import threading
    from browser import Browser
    for admin_table in ("", "[admin]\nloopback_without_token = true"):
        server = start_server(ALLOW_CONFIG.replace('token = "{token}"', "")
                              .replace("[admin]", admin_table or "[admin]"))
        admin = server.admin_port()
        target = f"http://127.0.0.1:{admin}"
        page = ATTACK_PAGE.format(admin=target).encode()

        class Attacker(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)

            def log_message(self, *args):
                pass

        other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Attacker)
        threading.Thread(target=other.serve_forever, daemon=True).start()
        browser = Browser(f"http://localhost:{other.server_address[1]}/")
        try:
            assert browser.wait_for("!!document.getElementById('f')")
            answered = browser.evaluate(
                f"fetch('{target}/v1/allow', {{method: 'POST', mode: 'no-cors', headers: "
                "{'Content-Type': 'text/plain'}, body: JSON.stringify({cidr: '0.0.0.0/0', "
                "ttl: '366d'})}).then(r => r.type, e => 'failed: ' + e)")
            assert answered == "opaque"                    # it reached the listener
            browser.evaluate("document.getElementById('f').submit()")
            assert browser.wait_for("(() => { try { return frames['sink'].location.href; } "
                                    "catch (e) { return 'answered'; } })() == 'answered'")
        finally:
            browser.close()
            other.shutdown()
        assert admin_call(admin, "GET", "/v1/allow")[1] == {"entries": []}, admin_table
        assert site_get(server.port())[0] == 403              # still closed to everyone


NESTED = b"[" * 100_000 + b"]" * 100_000


def test_nested_bodies_are_422_never_a_traceback(start_server):
    proxy = '[[site.route]]\nprefix = "/app/"\ntype = "proxy"\nupstream = "http://127.0.0.1:9"\n'
    server = start_server(RELOAD_CONFIG.format(token=TOKEN, extra=proxy))
    admin = server.admin_port()
    for method, path in (("POST", "/v1/allow"), ("POST", "/v1/upstreams/drain"),
                         ("PUT", "/v1/certificates/example.test")):
        for body in (NESTED, b'{"cidr": ' + NESTED + b"}"):
            status, answer = raw_admin(admin, method, path, {
                "Host": "localhost", "Content-Type": "application/json"}, body, token=TOKEN)
            assert status == 422 and answer["error"]["message"], (path, answer)
    status, answer = post_raw(admin, "/v1/config/validate", b"a = " + NESTED)
    assert status == 422
    assert answer["error"]["details"]["problems"][0]["message"] == \
        "not valid TOML: nested too deeply"
    assert not any("Traceback" in line or "failed" in line for line in server.lines), \
        "\n".join(server.lines)


def test_validate_says_only_what_the_service_user_may_read(tmp_path):
    """Validate looks at files as the admin process's user: run as a service user (here
    `[server] user = "nobody"`), a file it may not read is reported exactly as a
    missing one, so the answer is no oracle for what only root may read."""
    import pytest
    if os.getuid() != 0:
        pytest.skip("running as another user needs root")
    from conftest import Server
    tmp_path.chmod(0o755)
    secret = tmp_path / "secret.txt"
    secret.write_text("only root reads this\n")
    secret.chmod(0o600)
    config = tmp_path / "nestgate.toml"
    config.write_text(CONFIG.format(admin=f'[admin]\ntoken = "{TOKEN}"', body="x")
                      .replace("workers = 2", 'workers = 1\nuser = "nobody"'))
    server = Server(config)
    try:
        admin = server.admin_port()

        def problem(path: str) -> str:
            body = CONFIG.format(admin="", body="x").replace(
                'body = "x"', f'body_file = "{path}"').encode()
            status, answer = post_raw(admin, "/v1/config/validate", body)
            assert status == 422, "\n".join(server.lines[-40:])
            [found] = [p for p in answer["error"]["details"]["problems"]
                       if p["key"].endswith("body_file")]
            return found["message"].replace(path, "PATH")

        missing = problem(str(tmp_path / "missing.txt"))
        assert missing == "expected a path to a readable file, got 'PATH'"
        assert problem(str(secret)) == missing
        assert problem("/etc/shadow") == missing == problem("/etc/no-such-file")
        assert "only root" not in json.dumps(post_raw(admin, "/v1/config/validate", b"")[1])
    finally:
        server.stop()


def test_ctl_covers_what_an_operator_does_and_speaks_json_for_scripts(start_server, upstream,
                                                                     tmp_path, certs):
    """validate, reload, upstreams, drain and undrain, purge and reread, install-cert:
    each answered in words, and with --json as the API's JSON."""
    up = upstream()
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "hello.md").write_text("---\ntitle: Hello\n---\n\nhi\n")
    config = f"""
[[listen]]
address = "127.0.0.1:0"

[admin]
token = "{TOKEN}"

[[site]]
hosts = ["*"]

[site.notes]
dir = "{notes}"

[[site.route]]
prefix = "/app/"
type = "proxy"
upstream = "{up.url}"
"""
    server = start_server(config)
    where = ["--address", f"127.0.0.1:{server.admin_port()}", "--token", TOKEN]

    good, bad = tmp_path / "good.toml", tmp_path / "bad.toml"
    good.write_text(config)
    bad.write_text(config + "\nbogus = 1\n")
    result = ctl("validate", str(good), *where)
    assert result.stdout.startswith("ok\n") and "warning: <body>: site[*].base_url" \
        in result.stdout                       # check's warnings come along
    result = ctl("validate", str(bad), *where)
    assert result.returncode == 1 and "bogus: unknown key" in result.stderr
    assert json.loads(ctl("validate", str(bad), "--json", *where).stdout)["error"]

    listed = ctl("upstreams", *where)
    assert listed.returncode == 0 and "/app/" in listed.stdout and up.url in listed.stdout
    route = json.loads(ctl("upstreams", "--json", *where).stdout)["upstreams"][0]["route"]
    assert re.fullmatch(r"done: applied by [12] workers\n", ctl("drain", route, up.url, *where).stdout)
    assert "drained" in ctl("upstreams", *where).stdout
    undrained = json.loads(ctl("undrain", route, up.url, "--json", *where).stdout)
    assert undrained["applied_by_workers"] >= 1
    assert ctl("drain", route, "http://127.0.0.1:9", *where).returncode == 1
    for what in ("purge", "reread"):
        assert json.loads(ctl(what, "--json", *where).stdout)["applied_by_workers"] >= 1

    result = ctl("reload", "--json", *where)
    assert result.returncode == 0 and json.loads(result.stdout)["generation"] == 2
    # No listener installs this name: the API's 404, said in words.
    chain, key = certs["local"]
    result = ctl("install-cert", "example.test", "--cert", chain, "--key", key, *where)
    assert result.returncode == 1 and "404" in result.stderr
    assert ctl("install-cert", "example.test", *where).returncode == 2     # no files named


def test_ctl_takes_an_id_that_begins_with_a_dash():
    """A passkey's id is base64url and may begin with "-": ctl reads it as the id (and
    goes on to ask the admin listener), while a misspelt option is still refused."""
    closed = free_port()
    asked = ctl("--address", f"127.0.0.1:{closed}", "--token", "t", "passkeys", "revoke",
                "-uoHaFfTSR9BMyRCOYnd-w")
    assert asked.returncode != 2 and "cannot reach the admin listener" in asked.stderr, \
        asked.stderr
    misspelt = ctl("--address", f"127.0.0.1:{closed}", "--token", "t", "passkeys", "--jsn")
    assert misspelt.returncode == 2 and "unrecognized arguments: --jsn" in misspelt.stderr
