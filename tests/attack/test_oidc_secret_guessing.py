"""Client-secret guessing at the OpenID provider's token endpoint, many at once.

Each guess costs an argon2 check (tens of milliseconds of CPU). Done on the event
loop, guesses in flight would stall every other request of the worker; on one pool
of threads with everything else, the JWKS waited 12 s behind 40 guesses (measured
on this machine). Now: client secrets are checked on threads of their own, the JWKS
is served from the worker's copy, and an address gets `max_failures` failed client
authentications per `failure_window` (5 per 60 s), then 429. Shown: of 24 guesses
sent 6 at a time, only the first few (the limit and those already in flight) are
checked, the rest are 429 with an RFC 6749 body, other requests keep answering
(within 2 s on a loaded machine, against 12 s before), and the worker's memory stays flat.

Sent all at once, the guesses each found the count under the limit before any was
counted: 40 guesses, 40 secrets checked (a thousand connections, a thousand guesses
a minute). Now an address has no more checks under way than it has failures left,
the rest wait for them, so 40 at once get 5 checks and 35 429s; an app's own
requests sent at once (the right secret) only wait for one another."""

from __future__ import annotations

import ssl
import threading
import time

import httpx
import pytest

from conftest import free_port
from oidcprovider import CLIENT_SECRET, start_provider

GUESSES = 24
PARALLEL = 6
AT_ONCE = 40
MAX_FAILURES = 5        # the provider's [auth] max_failures (the default)


@pytest.fixture
def provider(tmp_path, certs):
    """A one-worker provider: the server, its base address, a context that trusts it."""
    port = free_port()
    server = start_provider(tmp_path, certs, f'store = "{tmp_path}/state.db"', port=port,
                            workers=1)
    try:
        yield server, f"https://localhost:{port}", ssl.create_default_context(cafile=certs["ca"])
    finally:
        server.stop()


def test_guessed_secrets_queue_off_the_loop(provider):
    server, base, trust = provider
    with httpx.Client(verify=trust, timeout=30) as probe:
        assert probe.get(base + "/.well-known/openid-configuration").status_code == 200
        # The worker's first JWKS makes (or loads) the keys: before the attack.
        assert probe.get(base + "/__auth__/oidc/jwks").status_code == 200
        rss_before = server.worker_rss_kib()
        answers: list[httpx.Response] = []
        lock = threading.Lock()

        def guesser(n: int) -> None:
            with httpx.Client(verify=trust, timeout=60) as client:
                for i in range(n):
                    resp = client.post(base + "/__auth__/oidc/token",
                                       data={"grant_type": "authorization_code",
                                             "code": "x", "redirect_uri": "https://x/"},
                                       auth=("app", f"guess-{i}"))
                    with lock:
                        answers.append(resp)

        threads = [threading.Thread(target=guesser, args=(GUESSES // PARALLEL,))
                   for _ in range(PARALLEL)]
        started = time.monotonic()
        for t in threads:
            t.start()
        slowest = 0.0
        while any(t.is_alive() for t in threads) and time.monotonic() - started < 60:
            t0 = time.monotonic()
            assert probe.get(base + "/__auth__/oidc/jwks").status_code == 200
            slowest = max(slowest, time.monotonic() - t0)
            time.sleep(0.05)
        for t in threads:
            t.join(60)
        took = time.monotonic() - started
        print(f"{GUESSES} guesses in {took:.1f} s; slowest other request {slowest:.3f} s")
        assert len(answers) == GUESSES
        checked = [r for r in answers if r.status_code == 401]
        assert 5 <= len(checked) <= 5 + PARALLEL, len(checked)
        assert {r.status_code for r in answers} == {401, 429}
        assert {r.json()["error"] for r in answers} == {"invalid_client"}
        assert all(r.headers["retry-after"] == "60" for r in answers
                   if r.status_code == 429)
        assert slowest < 2.0, slowest
        # The right secret from this address now waits too (as a password does).
        right = probe.post(base + "/__auth__/oidc/token",
                           data={"grant_type": "authorization_code", "code": "x",
                                 "redirect_uri": "https://x/"},
                           auth=("app", CLIENT_SECRET))
        assert right.status_code == 429
        assert server.worker_rss_kib() - rss_before < 16 * 1024


def _at_once(base: str, trust, secrets: list[str]) -> list[httpx.Response]:
    """One token request per secret, each on its own connection (opened first), all
    let go together."""
    answers: list[httpx.Response] = []
    lock = threading.Lock()
    ready = threading.Barrier(len(secrets))

    def one(secret: str) -> None:
        with httpx.Client(verify=trust, timeout=60) as client:
            client.get(base + "/.well-known/openid-configuration")   # connected
            ready.wait(30)
            resp = client.post(base + "/__auth__/oidc/token",
                               data={"grant_type": "authorization_code", "code": "x",
                                     "redirect_uri": "https://x/"},
                               auth=("app", secret))
            with lock:
                answers.append(resp)

    threads = [threading.Thread(target=one, args=(s,)) for s in secrets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert len(answers) == len(secrets)
    return answers


def test_guesses_sent_at_once_are_checked_no_more_than_the_limit(provider):
    server, base, trust = provider
    # An app's own requests at once: its secret is right (the code is not), so
    # none is a failure and none is refused for the limit.
    mine = _at_once(base, trust, [CLIENT_SECRET] * (MAX_FAILURES + 3))
    assert {r.status_code for r in mine} == {400}
    assert {r.json()["error"] for r in mine} == {"invalid_grant"}
    rss_before = server.worker_rss_kib()
    answers = _at_once(base, trust, [f"guess-{i}" for i in range(AT_ONCE)])
    statuses = [r.status_code for r in answers]
    assert statuses.count(401) == MAX_FAILURES, sorted(statuses)
    assert statuses.count(429) == AT_ONCE - MAX_FAILURES, sorted(statuses)
    assert {r.json()["error"] for r in answers} == {"invalid_client"}
    assert server.worker_rss_kib() - rss_before < 16 * 1024
