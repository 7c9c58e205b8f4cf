"""TOTP (RFC 6238 over RFC 4226): HMAC-SHA1, 30 s steps, 6 digits, one step of skew."""

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


def verify(secret: str, code: str, at: float | None = None, skew: int = 1) -> bool:
    code = code.strip().replace(" ", "")
    if len(code) != DIGITS or not (code.isascii() and code.isdigit()):
        return False
    counter = int((time.time() if at is None else at) // STEP)
    ok = False
    for delta in range(-skew, skew + 1):        # no early exit: the same work either way
        ok |= hmac.compare_digest(code_at(secret, counter + delta), code)
    return ok


def otpauth_uri(secret: str, user: str, issuer: str = "nestgate") -> str:
    from urllib.parse import quote
    return (f"otpauth://totp/{quote(issuer)}:{quote(user)}?secret={secret}"
            f"&issuer={quote(issuer)}&period={STEP}&digits={DIGITS}")
