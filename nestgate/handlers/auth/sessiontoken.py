"""Session tokens that vouch for themselves, so a made-up cookie costs no store call.

A token is `<body>.<tag>`: 32 random bytes (base64url, as the whole token was before)
and the first 16 bytes of HMAC-SHA256 under the store's secret (the one the CSRF
tokens use: one for every worker and, through Redis, every instance) over
"session-token:" and the body. A worker checks the tag in memory
(hmac.compare_digest) before it asks the store anything: a cookie nobody issued is no
session at once, and the store's one thread stays free for real visitors' checks.
The store still decides whether a well-tagged token is a live session (sign-out,
revocation and expiry are the store's); the tag only spares it the questions whose
answer is certainly no. It is a MAC, not the secret: a tag reveals nothing of the key,
and the body's 256 random bits keep a token unguessable as before. The prefix keeps
the tag apart from the CSRF MACs made with the same key ("csrf:", "csrf-session:").

Tokens issued before tags (a body alone, no ".") stay good for the rest of their life
rather than signing everyone out: a worker reads the hashes and expiries of the
sessions live in the store when it starts (`Untagged`), and only a token of that form
whose hash is among them is asked about. A made-up token of the old form is then as
cheap as one of the new. No token of the old form is issued any more, so the list only
shrinks, and it is dropped once the last of them has expired.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time

BODY_BYTES = 32              # random bytes of a token (256 bits: unguessable)
TAG_BYTES = 16               # bytes of the HMAC kept (128 bits: unforgeable)
_TAG_PREFIX = b"session-token:"


def token_hash(token: str) -> bytes:
    """What the store keys a session by: its token is never stored."""
    return hashlib.sha256(token.encode("latin-1")).digest()


def _tag(secret: bytes, body: bytes) -> bytes:
    mac = hmac.new(secret, _TAG_PREFIX + body, hashlib.sha256).digest()[:TAG_BYTES]
    return base64.urlsafe_b64encode(mac).rstrip(b"=")


def new_token(secret: bytes) -> str:
    """A fresh session token, tagged under the store's `secret`."""
    body = secrets.token_urlsafe(BODY_BYTES).encode()
    return (body + b"." + _tag(secret, body)).decode()


def tag_ok(secret: bytes, token: str) -> bool:
    """The token carries the tag `secret` gives its body."""
    body, dot, tag = token.encode("latin-1").rpartition(b".")
    return bool(dot) and hmac.compare_digest(_tag(secret, body), tag)


class Untagged:
    """The sessions of untagged tokens that may still be live: the hash -> expiry of
    every session live in the store when the worker read it. Never grows."""

    def __init__(self, live) -> None:
        self.expiries: dict[bytes, float] = {bytes(h): float(e) for h, e in live}
        self.until = max(self.expiries.values(), default=0.0)

    def may_be_live(self, hashed: bytes, now: float) -> bool:
        if now >= self.until:
            self.expiries.clear()          # the last of them is over: nothing to keep
            return False
        return self.expiries.get(hashed, 0.0) > now


class SessionTokens:
    """What a worker knows to judge a session cookie without the store: the secret
    and the untagged sessions, both read from the store (None until it answered)."""

    def __init__(self) -> None:
        self.secret: bytes | None = None
        self.untagged: Untagged | None = None

    def load(self, secret: bytes, live) -> None:
        """The store's secret and its live sessions' (hash, expiry)."""
        self.untagged = Untagged(live)
        self.secret = secret

    def hash_of(self, token: str) -> bytes:
        """The hash to ask the store about; b"" when `token` cannot be a session.
        Before the store was read, every token is the store's to judge."""
        secret = self.secret
        if secret is None:
            return token_hash(token)
        if "." in token:
            return token_hash(token) if tag_ok(secret, token) else b""
        hashed = token_hash(token)
        return hashed if self.untagged.may_be_live(hashed, time.time()) else b""
