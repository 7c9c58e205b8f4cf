"""Passkey and recovery-code attacks on a real server with two workers: an assertion
replayed (to two workers at once, or against a new challenge), made for another origin
or relying party, from a cloned authenticator whose counter falls behind; a recovery
code spent twice at once; a flood of ceremonies. Each is refused (401, or 503 past the
bound on ceremonies), no refused attempt reaches the upstream, and the worker's memory
stays put."""

from __future__ import annotations

import threading
import time

import softauthn
from conftest import Browser, otp_code, settled_step
from softauthn import SoftAuthenticator

ATTACK_SECONDS = 20.0
RSS_GROWTH_BOUND_KIB = 8 * 1024


def owner_with_passkey(port: int) -> SoftAuthenticator:
    owner = Browser(port)
    assert owner.sign_in()[0].status == 303
    key = SoftAuthenticator()
    assert softauthn.register(owner, key) == 303
    return key


def at_once(calls) -> list:
    """Run the calls together (released by one barrier); their results."""
    barrier = threading.Barrier(len(calls))
    results = [None] * len(calls)

    def run(i, call):
        barrier.wait(timeout=10)
        results[i] = call()
    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return results


def copy_of(browser: Browser) -> Browser:
    twin = Browser(browser.port)
    twin.jar = dict(browser.jar)
    return twin


def reaches_upstream(browser: Browser, up) -> bool:
    before = len(up.requests)
    status = browser.request("GET", "/echo")[0].status
    return status == 200 and len(up.requests) > before


def test_the_same_assertion_signs_in_once(gate):
    server, up = gate(workers=2)
    port = server.port()
    key = owner_with_passkey(port)
    thief = Browser(port)
    csrf, opts = softauthn.begin_sign_in(thief)
    # An authenticator without a counter (it sends 0 each time): only the challenge,
    # good once, stops the replay.
    answer = key.assert_(opts, softauthn.origin_of(thief), count=0)
    twins = [thief, copy_of(thief), copy_of(thief)]
    results = at_once([lambda b=b: softauthn.finish_sign_in(b, csrf, answer)[0].status
                       for b in twins])
    assert sorted(results) == [303, 401, 401]
    # The answer again, against a challenge of its own: the challenge does not match.
    late = Browser(port)
    csrf, _opts = softauthn.begin_sign_in(late)
    resp, body = softauthn.finish_sign_in(late, csrf, answer)
    assert resp.status == 401 and b"does not verify" in body
    assert not reaches_upstream(late, up)
    # Without the ceremony's cookie (another browser), nothing to answer.
    bare = Browser(port)
    resp, body = softauthn.finish_sign_in(bare, bare.login_form(), answer)
    assert resp.status == 401 and b"expired or was already answered" in body


def test_another_origin_or_relying_party_is_refused(gate):
    server, up = gate(workers=2)
    port = server.port()
    key = owner_with_passkey(port)
    for origin, rp_id in (("http://evil.test", None), ("https://private.test", None),
                          ("http://private.test", "evil.test"), ("http://private.test", "test")):
        visitor = Browser(port)
        csrf, opts = softauthn.begin_sign_in(visitor)
        resp, body = softauthn.finish_sign_in(visitor, csrf,
                                              key.assert_(opts, origin, rp_id=rp_id))
        assert resp.status == 401 and b"does not verify" in body, (origin, rp_id)
        assert not reaches_upstream(visitor, up)
    # A registration made for another origin adds nothing.
    owner = Browser(port)
    softauthn.sign_in(owner, key)
    csrf = owner.form_token("/__auth__/account")
    _status, opts = softauthn.options(owner, "register", csrf)
    stranger = SoftAuthenticator()
    resp, page = owner.post_form("/__auth__/account", {
        "csrf": csrf, "action": "add", "credential": stranger.register(opts, "http://evil.test")})
    assert resp.status == 200 and b"Not done" in page
    assert softauthn.sign_in(Browser(port), stranger)[0].status == 401


def test_a_counter_going_backwards_is_refused(gate):
    server, up = gate(workers=2)
    port = server.port()
    key = owner_with_passkey(port)

    def sign_in_with(count: int) -> int:
        visitor = Browser(port)
        csrf, opts = softauthn.begin_sign_in(visitor)
        answer = key.assert_(opts, softauthn.origin_of(visitor), count=count)
        status = softauthn.finish_sign_in(visitor, csrf, answer)[0].status
        assert reaches_upstream(visitor, up) == (status == 303)
        return status
    assert sign_in_with(5) == 303
    assert sign_in_with(5) == 401            # a clone that has signed the same count
    assert sign_in_with(3) == 401            # one that fell behind
    assert sign_in_with(6) == 303


def test_a_recovery_code_sent_twice_at_once_signs_in_once(gate):
    server, up = gate(workers=2)
    port = server.port()
    step = settled_step()
    owner = Browser(port)
    assert owner.sign_in(user="otp", code=otp_code(step))[0].status == 303
    csrf = owner.form_token("/__auth__/account")
    page = owner.post_form("/__auth__/account", {"csrf": csrf, "action": "recovery"})[1]
    code = page.decode().split("<code>")[1].split("</code>")[0]
    thieves = [Browser(port) for _ in range(3)]
    tokens = [b.login_form() for b in thieves]
    results = at_once([lambda b=b, t=t: b.sign_in(user="otp", code=code, csrf=t)[0].status
                       for b, t in zip(thieves, tokens)])
    assert sorted(results) == [303, 401, 401]
    assert [reaches_upstream(b, up) for b in thieves].count(True) == 1


def test_a_flood_of_ceremonies_and_forged_answers_keeps_memory(gate):
    server, up = gate()
    port = server.port()
    key = owner_with_passkey(port)
    before = server.worker_rss_kib()
    flooder = Browser(port, keep=True)
    csrf = flooder.login_form()
    forged = SoftAuthenticator()               # never registered
    deadline = time.monotonic() + ATTACK_SECONDS
    answered = {}
    for i in range(300):
        if time.monotonic() > deadline:
            break
        status, opts = softauthn.options(flooder, "signin", csrf)
        answered[status] = answered.get(status, 0) + 1
        if i % 2 and status == 200:
            resp, _ = softauthn.finish_sign_in(
                flooder, csrf, forged.assert_(opts, softauthn.origin_of(flooder)))
            answered[resp.status] = answered.get(resp.status, 0) + 1
            csrf = flooder.login_form()
    print(f"answers: {answered}")
    assert set(answered) <= {200, 401} and answered.get(200, 0) >= 100
    grown = server.worker_rss_kib() - before
    assert grown < RSS_GROWTH_BOUND_KIB, f"worker grew {grown} KiB"
    assert not up.requests
    assert softauthn.sign_in(Browser(port), key)[0].status == 303     # the owner still can
