"""Password guessing at one account from many addresses.

The per-address limit alone let 12 addresses x 5 failures = 60 guesses at one account
through in seconds, and then the right password from a 13th address still worked.
The per-account delay (shared by the workers through the store) holds every address
back after `account_failures` failures in a row; the owner's known address and the
owner's own session still pass.

An IPv6 client holds a whole /64: counted per address, it could take a new one for
every guess, and the per-address limit was no limit at all (12 addresses of one /64,
12 wrong passwords, never a 429). It is counted by its /64, as rate limits and bans
count it."""

from __future__ import annotations

import time
from collections import Counter

from conftest import Browser

TRUSTED = '\n[client_ip]\ntrusted_proxies = ["127.0.0.1"]\n'
ATTACK_SECONDS = 10.0


def from_address(ip: str) -> dict:
    return {"X-Forwarded-For": ip}


def guess(port: int, ip: str, password: str = "guess") -> int:
    return Browser(port).sign_in(password=password, headers=from_address(ip))[0].status


def attack(port: int, addresses: int, tries: int) -> Counter:
    """`tries` wrong passwords from each of `addresses` addresses, round-robin, for at
    most ATTACK_SECONDS: how each was answered (401: the password was checked)."""
    statuses: Counter = Counter()
    deadline = time.monotonic() + ATTACK_SECONDS
    for round_ in range(tries):
        for i in range(addresses):
            if time.monotonic() > deadline:
                return statuses
            statuses[guess(port, f"203.0.113.{i + 1}", f"guess-{round_}-{i}")] += 1
    return statuses


def test_many_addresses_get_a_few_guesses_and_the_owner_still_signs_in(gate):
    server, _up = gate(workers=2, extra_auth=TRUSTED)
    port = server.port()
    home = from_address("198.51.100.7")
    owner = Browser(port)
    assert owner.sign_in(headers=home)[0].status == 303        # home is now a known address

    statuses = attack(port, addresses=12, tries=6)
    print(f"12 addresses x 6 tries: {dict(statuses)}")
    # 3 free failures, then 1 s, 2 s, 4 s ... after the last: a handful in 10 s, not 60.
    assert statuses[401] <= 7, statuses
    assert set(statuses) <= {401, 429}

    # The right password from an address never seen: held back like a guess.
    stranger = Browser(port)
    resp, _ = stranger.sign_in(headers=from_address("192.0.2.99"))
    assert resp.status == 429 and int(resp.getheader("retry-after")) >= 1
    # The owner's own session passes, from anywhere (and a success starts the count again).
    resp, _ = owner.sign_in(headers=from_address("192.0.2.100"))
    assert resp.status == 303

    for i in range(6):
        guess(port, f"203.0.113.{100 + i}")
    assert guess(port, "192.0.2.101", "demo-password") == 429
    # The owner's known address passes, without a session.
    assert Browser(port).sign_in(headers=home)[0].status == 303


def test_addresses_of_one_ipv6_64_share_one_count(gate):
    server, _up = gate(extra_auth='max_failures = 3\nfailure_window = "60s"\n' + TRUSTED)
    port = server.port()
    # An unknown user: no account's delay, only the address's count.
    statuses = [Browser(port).sign_in(user="nobody", password="guess",
                                      headers=from_address(f"2001:db8:1:2::{i + 1:x}"))[0].status
                for i in range(8)]
    assert statuses == [401] * 3 + [429] * 5, statuses
    # Another spelling, a zone, another address of that /64: the same count.
    for spelling in ("2001:DB8:1:2:0:0:0:ffff", "2001:db8:1:2::1%eth0",
                     "[2001:db8:1:2:abcd::9]"):
        assert Browser(port).sign_in(headers=from_address(spelling))[0].status == 429
    # The next /64 is another client.
    assert Browser(port).sign_in(headers=from_address("2001:db8:1:3::1"))[0].status == 303
