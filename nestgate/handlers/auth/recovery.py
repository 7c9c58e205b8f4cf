"""Recovery codes: ten single-use codes per user, for when the second factor (the
phone with the TOTP app, the passkey) is lost.

A code is 80 random bits written as four groups of four base32 letters
(`abcd-efgh-ijkm-npqr`), shown once when made. The store keeps the SHA-256 of the user
and the code, never the code: with 80 bits nobody finds a code from its hash, so a
slow hash (argon2, as for passwords people choose) would buy nothing. Using one
removes it, in one statement of the shared store, so it is good once on any worker.
"""

from __future__ import annotations

import base64
import hashlib
import secrets

COUNT = 10
_GROUPS, _GROUP = 4, 4
_ALPHABET = "abcdefghijklmnopqrstuvwxyz234567"


def new_codes() -> list[str]:
    return [_format(base64.b32encode(secrets.token_bytes(10)).decode().lower())
            for _ in range(COUNT)]


def _format(letters: str) -> str:
    return "-".join(letters[i:i + _GROUP] for i in range(0, _GROUPS * _GROUP, _GROUP))


def normal(code: str) -> str | None:
    """The code as made, from what a person typed (any case, spaces or dashes
    anywhere); None when it cannot be one."""
    letters = "".join(c for c in code.lower() if c not in " -")
    if len(letters) != _GROUPS * _GROUP or not all(c in _ALPHABET for c in letters):
        return None
    return _format(letters)


def code_hash(user: str, code: str) -> bytes:
    return hashlib.sha256(f"nestgate recovery\0{user}\0{code}".encode()).digest()
