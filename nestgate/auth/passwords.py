"""Passwords: argon2id hashes (argon2-cffi), and `nestgate passwd` that prints one."""

from __future__ import annotations

import argparse
import getpass
import sys

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

_HASHER = PasswordHasher()
# Verified when the user name is unknown, so both cases cost the same.
_DUMMY = _HASHER.hash("nestgate: no such user")


def hash_password(password: str) -> str:
    return _HASHER.hash(password)


def verify_password(hashed: str | None, password: str) -> bool:
    """Constant work whether or not the user exists. Runs for tens of milliseconds:
    call it off the event loop."""
    try:
        return _HASHER.verify(hashed or _DUMMY, password) and hashed is not None
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return False


def passwd_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="nestgate passwd",
        description="Print an argon2 hash of a password, for [[auth.user]] password = ...")
    parser.add_argument("--stdin", action="store_true",
                        help="read the password from the first line of stdin (no prompt; "
                        "the default when stdin is not a terminal)")
    parser.add_argument("--totp", metavar="USER",
                        help="also print a new TOTP secret and its otpauth:// URI for USER")
    args = parser.parse_args(argv)
    # Piped in (`echo ... | nestgate passwd`): read the line, as --stdin does; getpass
    # would prompt on a terminal it cannot find, then fail at the end of the input.
    if args.stdin or not sys.stdin.isatty():
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        try:
            password = getpass.getpass("Password: ")
            again = getpass.getpass("Again: ")
        except (EOFError, KeyboardInterrupt):
            print("\nnestgate passwd: no password given", file=sys.stderr)
            return 1
        if again != password:
            print("nestgate passwd: the passwords differ", file=sys.stderr)
            return 1
    if not password:
        print("nestgate passwd: empty password", file=sys.stderr)
        return 1
    print(hash_password(password))
    if args.totp:
        from nestgate.auth.totp import new_secret, otpauth_uri
        secret = new_secret()
        print(f"totp = \"{secret}\"")
        print(otpauth_uri(secret, args.totp))
    return 0
