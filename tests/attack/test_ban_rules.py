"""The shipped ban rules (examples/bans.toml) against a scanner and a password spray,
while a normal visitor uses the same server.

A scanner works through 200 paths only scanners ask for, each on a new connection,
from one address; a spray tries passwords at the sign-in page from 20 addresses. Each
is banned by the rule for it: the scanner's connections are closed at accept after
the rule's count of 404s, the sprayers get the page saying until when. A signed-in
visitor reading the protected app and the public pages all along is answered every
time; nothing of the attackers' reaches the upstream; the workers do not grow.
Clients are distinct loopback addresses (rules get `ban_loopback = true`, the only
change to the shipped text)."""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter

import pytest

from conftest import PASSWORD_HASH, REPO, Browser, rss_kib

pytestmark = pytest.mark.attack

ATTACK_SECONDS = 45.0
SPRAYERS = [f"127.0.0.{100 + i}" for i in range(20)]
SCANNER = "127.0.0.50"
VISITOR = "127.0.0.1"
# The worker's heap after the attack: the bans are a few entries of shared memory, the
# counts a few of the rate table's; 200 refused connections and 20 banned clients' pages
# leave nothing per client behind. A leak of 20 KiB per attacking connection would be
# 5 MiB.
RSS_GROWTH_BOUND_KIB = 4 * 1024

# Paths from real scanner logs, and made-up variants of them, 200 in all.
SCANNED = ["/wp-login.php", "/.env", "/.git/config", "/xmlrpc.php", "/phpmyadmin/",
           "/wp-admin/setup-config.php", "/cgi-bin/luci", "/vendor/phpunit/eval-stdin.php",
           "/.aws/credentials", "/actuator/health", "/HNAP1/", "/boaform/admin/formLogin",
           "/owa/auth/logon.aspx", "/solr/admin/info/system", "/server-status",
           "/config.json", "/backup.sql", "/shell.php", "/.DS_Store", "/console/"]
SCANNED += [f"/wp-content/plugins/plugin-{i}/readme.php" for i in range(90)]
SCANNED += [f"/x{i}.php" for i in range(90)]


def config(up_url: str, store: str) -> str:
    rules = (REPO / "examples" / "bans.toml").read_text().replace(
        "[[ban]]\n", "[[ban]]\nban_loopback = true\n")
    return f"""
[server]
workers = 2

[[listen]]
address = "127.0.0.1:0"

[auth]
store = "{store}"

[[auth.user]]
name = "demo"
password = "{PASSWORD_HASH}"

[[site]]
name = "home"
hosts = ["home.test"]

[[site.route]]
path = "/hello"
type = "return"
body = "hello"

[[site]]
name = "app"
hosts = ["private.test"]
protected = true

[[site.route]]
prefix = "/"
type = "proxy"
upstream = "{up_url}"

{rules}
"""


def ask(port: int, source: str, path: str, host: str = "home.test") -> int:
    """One GET on a new connection from `source`: its status, 0 when closed unanswered."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5,
                                      source_address=(source, 0)) as sock:
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
                         .encode())
            data = sock.recv(65536)
    except ConnectionResetError:
        return 0
    return int(data.split(b" ", 2)[1]) if data else 0


def spray(port: int, deadline: float) -> tuple[Counter, dict[str, str]]:
    """Wrong passwords from every sprayer, round-robin, until each is banned: how the
    attempts were answered, and what each sprayer saw last."""
    answers: Counter = Counter()
    last = {ip: "" for ip in SPRAYERS}
    round_ = 0
    while any(v != "banned" for v in last.values()) and time.monotonic() < deadline:
        round_ += 1
        for ip in SPRAYERS:
            if last[ip] == "banned":
                continue
            browser = Browser(port, source=ip)
            resp, page = browser.request("GET", "/__auth__/login?next=/",
                                         headers={"Accept": "text/html"})
            if resp.status == 403 and b"banned until" in page:
                last[ip] = "banned"
                continue
            token = page.split(b'name="csrf" value="')[1].split(b'"')[0].decode()
            resp, _ = browser.post_form("/__auth__/login", {
                "user": "demo", "password": f"guess-{round_}", "csrf": token, "next": "/"})
            answers[resp.status] += 1
            last[ip] = str(resp.status)
    return answers, last


def test_shipped_rules_ban_a_scanner_and_a_spray_while_a_visitor_is_served(
        start_server, upstream, tmp_path):
    up = upstream()
    server = start_server(config(up.url, str(tmp_path / "state.db")))
    port = server.port()
    visitor = Browser(port, source=VISITOR)
    assert visitor.sign_in()[0].status == 303
    workers = server.worker_pids()
    before = {pid: rss_kib(pid) for pid in workers}

    seen: Counter = Counter()
    stop = threading.Event()

    def visit() -> None:
        while not stop.is_set():
            seen[visitor.request("GET", "/hi")[0].status] += 1
            seen[ask(port, VISITOR, "/hello")] += 1
            stop.wait(0.02)                  # a person's pace, not a flood of our own

    reader = threading.Thread(target=visit, daemon=True)
    reader.start()
    deadline = time.monotonic() + ATTACK_SECONDS
    try:
        scanned = Counter(ask(port, SCANNER, path) for path in SCANNED)
        answers, last = spray(port, deadline)
    finally:
        stop.set()
        reader.join(10)
    print(f"scanner: {dict(scanned)}; spray: {dict(answers)}; visitor: {dict(seen)}")

    # The scanner: five 404s (the rule's count), then closed at accept, 195 times.
    assert scanned == Counter({404: 5, 0: 195}), scanned
    server.wait_for(f"banned {SCANNER}/32 (scanners")
    # The spray: every address banned, each after at most the rule's 10 failures
    # (answered 401, or 429 once the account's delay holds it back).
    assert all(state == "banned" for state in last.values()), last
    assert set(answers) <= {401, 429} and sum(answers.values()) <= 10 * len(SPRAYERS)
    for ip in SPRAYERS[:3]:
        assert ask(port, ip, "/hello") == 403                 # the page, on every site
    # The visitor: every request answered, the app reached.
    assert set(seen) == {200} and seen[200] > 20, seen
    clients = {value for r in up.requests for name, value in r["headers"]
               if name == "x-forwarded-for"}
    assert clients == {VISITOR}, clients
    # Both workers refuse them (a ban is in the shared table), and neither grew.
    assert all(ask(port, SCANNER, "/hello") == 0 for _ in range(8))
    for pid in workers:
        grown = rss_kib(pid) - before[pid]
        print(f"worker {pid}: RSS +{grown} KiB")
        assert grown < RSS_GROWTH_BOUND_KIB, grown
