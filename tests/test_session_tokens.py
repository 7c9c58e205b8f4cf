"""Session tokens that vouch for themselves (nestgate.handlers.auth.sessiontoken), the
sessions of untagged tokens issued before them, and stored sessions someone else wrote:
through a real server and its SQLite store (Redis: tests/test_redis_state.py)."""

from __future__ import annotations

import sqlite3
import time

import pytest

from conftest import Browser, poll, protected
from nestgate.handlers.auth.sessiontoken import (SessionTokens, Untagged, new_token, tag_ok,
                                                 token_hash)
from nestgate.handlers.auth.store import Store

JSON = {"Accept": "application/json"}


def status(port: int, cookie: str) -> int:
    browser = Browser(port)
    browser.jar["nestgate_session"] = cookie
    return browser.request("GET", "/secret", headers=JSON)[0].status


def test_a_token_carries_a_tag_only_its_secret_makes():
    secret, other = b"k" * 32, b"o" * 32
    token = new_token(secret)
    body, dot, tag = token.rpartition(".")
    assert dot and len(body) == 43 and len(tag) == 22       # 256 random bits, 128-bit tag
    assert tag_ok(secret, token)
    assert not tag_ok(other, token)
    assert not tag_ok(secret, body + "." + tag[:-1] + ("A" if tag[-1] != "A" else "B"))
    assert not tag_ok(secret, body)                           # untagged
    assert not tag_ok(secret, new_token(secret).split(".")[0] + "." + tag)  # another body
    assert new_token(secret) != token
    assert secret.hex() not in token and other.hex() not in token


def test_untagged_tokens_are_judged_by_the_sessions_live_at_start():
    live, gone = token_hash("old-live"), token_hash("old-gone")
    tokens = SessionTokens()
    assert tokens.hash_of("anything") == token_hash("anything")   # before the store answered
    now = time.time()
    tokens.load(b"k" * 32, [(live, now + 60), (gone, now - 1)])
    assert tokens.hash_of("old-live") == live
    assert tokens.hash_of("old-gone") == b""
    assert tokens.hash_of("made-up") == b""
    good = new_token(b"k" * 32)
    assert tokens.hash_of(good) == token_hash(good)
    assert tokens.hash_of(good[:-1] + "x") in (b"", token_hash(good[:-1] + "x"))
    assert tokens.hash_of(good + "x") == b""
    # Once the last of them is over, nothing is kept.
    untagged = Untagged([(live, now + 60)])
    assert not untagged.may_be_live(live, now + 61) and untagged.expiries == {}


def test_tagged_sessions_and_the_ones_from_before(start_server, upstream, tmp_path):
    path = str(tmp_path / "state.db")
    # A session of the untagged form, issued before the server (or its new version)
    # started: good for the rest of its life.
    store = Store(path)
    store.create_session(token_hash("issued-before-tags"), "demo", time.time() + 3600, "")
    store.close()
    server = start_server(protected(upstream().url, path, extra_auth="cookie_secure = false\n"))
    port = server.port()
    assert status(port, "issued-before-tags") == 200

    visitor = Browser(port)
    resp, _ = visitor.sign_in(next_url="/secret")
    assert resp.status == 303
    cookie = resp.getheader("set-cookie")
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie and "Path=/" in cookie
    token = visitor.jar["nestgate_session"]
    assert "." in token and status(port, token) == 200
    # A tag changed, a tag moved to another body, a made-up token of either form: none
    # is a session, and none reaches the store (counted as forged).
    body, _, tag = token.rpartition(".")
    flipped = tag[:-1] + ("A" if tag[-1] != "A" else "B")
    for made_up in (f"{body}.{flipped}", f"{new_token(b'x' * 32).split('.')[0]}.{tag}",
                    new_token(b"x" * 32), "issued-after-start", body):
        assert status(port, made_up) == 401, made_up
    # An untagged session written after the worker started (an older instance sharing
    # the store): asked to sign in on this one.
    store = Store(path)
    store.create_session(token_hash("issued-after-start"), "demo", time.time() + 3600, "")
    store.close()
    assert status(port, "issued-after-start") == 401
    # Signing out ends a tagged session as before.
    assert visitor.sign_out()[0].status == 303
    assert status(port, token) == 401


@pytest.mark.parametrize("column, value", [
    ("expires", "tomorrow"), ("expires", "nan"), ("expires", b"\x00\x01"),
    ("user", b"\xff\xfe"), ("factors", b"\xff"), ("last_seen", "never")])
def test_a_session_row_not_as_nestgate_wrote_it_is_no_session(start_server, upstream, tmp_path,
                                                               column, value):
    path = str(tmp_path / "state.db")
    server = start_server(protected(upstream().url, path, extra_auth="cookie_secure = false\n"))
    port = server.port()
    visitor = Browser(port)
    assert visitor.sign_in(next_url="/secret")[0].status == 303
    token = visitor.jar["nestgate_session"]
    db = sqlite3.connect(path, isolation_level=None)
    db.execute(f"UPDATE sessions SET {column} = ? WHERE token_hash = ?", (value, token_hash(token)))
    db.close()
    # The worker trusts a checked session for portal.RECHECK (1 s), then asks again.
    assert poll(lambda: status(port, token), lambda got: got != 200) == 401
    for _ in range(3):
        assert status(port, token) == 401                  # never a 500, never a way in
    said = server.wait_for("is not as nestgate wrote it")
    assert token_hash(token).hex()[:16] in said and "taken as no session" in said
    assert sum("is not as nestgate wrote it" in line for line in server.lines) == 1
