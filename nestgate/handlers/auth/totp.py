"""TOTP (RFC 6238 over RFC 4226): HMAC-SHA1, 30 s steps, 6 digits, one step of skew.

Pure computation: which step a code belongs to. Remembering the steps already
used, so that a code is accepted once, is the shared store's job.
"""

from __future__ import annotations

import base64
import hmac
import secrets
import struct
import time

STEP = 30
DIGITS = 6


def new_secret() -> str:
    return base64.b32encode(secrets.token_bytes(20)).decode().rstrip("=")


MIN_SECRET_BYTES = 16          # 128 bits, RFC 4226 4's least (160 recommended)
_HEX = frozenset("0123456789ABCDEF")


def secret_problem(secret: str) -> str | None:
    """What is wrong with a configured secret, said so that the owner can fix it
    (never quoting the secret); None when it is good."""
    text = secret.upper().replace(" ", "")
    if text.startswith("OTPAUTH://"):
        return ("a base32 TOTP secret, not the otpauth:// URI: give only the value of "
                "its secret= parameter")
    try:
        key = _key(text)
    except ValueError:
        if len(text) % 2 == 0 and set(text) <= _HEX:
            return ("a base32 TOTP secret; this looks like hex: convert it with python3 -c "
                    "\"import base64,sys; print(base64.b32encode(bytes.fromhex(sys.argv[1]))"
                    ".decode())\" HEX, or make one with `nestgate passwd --totp NAME`")
        return "a base32 TOTP secret (letters A-Z and digits 2-7)"
    if len(key) < MIN_SECRET_BYTES:
        return (f"a TOTP secret of at least 128 bits (26 base32 characters), got "
                f"{len(key) * 8} bits: make a new one with `nestgate passwd --totp NAME`")
    return None


def _key(secret: str) -> bytes:
    secret = secret.upper().replace(" ", "")
    return base64.b32decode(secret + "=" * (-len(secret) % 8))


def code_at(secret: str, counter: int) -> str:
    digest = hmac.digest(_key(secret), struct.pack(">Q", counter), "sha1")
    offset = digest[-1] & 0x0F
    value = struct.unpack_from(">I", digest, offset)[0] & 0x7FFFFFFF
    return str(value % 10**DIGITS).zfill(DIGITS)


def now_code(secret: str, at: float | None = None) -> str:
    return code_at(secret, int((time.time() if at is None else at) // STEP))


def matching_step(secret: str, code: str, at: float | None = None,
                  skew: int = 1) -> int | None:
    """The latest time step within `skew` steps of `at` (default now) whose code is
    `code`, or None. The caller must refuse a step it has accepted before
    (RFC 6238 section 5.2: a code is good once); see `Store.use_totp_step`."""
    code = code.strip().replace(" ", "")
    if len(code) != DIGITS or not (code.isascii() and code.isdigit()):
        return None
    counter = int((time.time() if at is None else at) // STEP)
    found = None
    for step in range(counter - skew, counter + skew + 1):   # no early exit: same work
        if hmac.compare_digest(code_at(secret, step), code):
            found = step
    return found


def verify(secret: str, code: str, at: float | None = None, skew: int = 1) -> bool:
    """Whether `code` is right at `at` (default now), replays not considered."""
    return matching_step(secret, code, at, skew) is not None


def otpauth_uri(secret: str, user: str, issuer: str = "nestgate") -> str:
    from urllib.parse import quote
    return (f"otpauth://totp/{quote(issuer)}:{quote(user)}?secret={secret}"
            f"&issuer={quote(issuer)}&period={STEP}&digits={DIGITS}")
