"""Passwords: argon2id hashes (argon2-cffi), and `nestgate passwd` that prints one (and,
with --totp, a new TOTP secret with its QR code for the authenticator app: in the
terminal, and as a PNG with --png, drawn by segno)."""

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
                        help="also print a new TOTP secret, its otpauth:// URI and its QR "
                        "code (to scan with the authenticator app) for USER")
    parser.add_argument("--png", metavar="FILE",
                        help="with --totp: also write the QR code to FILE as a PNG image")
    parser.add_argument("--issuer", default="nestgate",
                        help="with --totp: the name the authenticator app shows")
    args = parser.parse_args(argv)
    if args.png and not args.totp:
        parser.error("--png needs --totp USER")
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
        from nestgate.handlers.auth.totp import new_secret, otpauth_uri
        secret = new_secret()
        uri = otpauth_uri(secret, args.totp, args.issuer)
        print(f"totp = \"{secret}\"")
        print(uri)
        return _show_qr(uri, args.png)
    return 0


def _show_qr(uri: str, png: str | None) -> int:
    """The QR code of `uri` in the terminal (two rows of modules per line of text, so
    it fits), and in `png` when given."""
    import segno
    code = segno.make(uri, error="m")
    sys.stdout.flush()
    code.terminal(out=sys.stdout, compact=True)
    if png:
        try:
            code.save(png, kind="png", scale=8, border=4)
        except OSError as exc:
            print(f"nestgate passwd: cannot write {png}: {exc.strerror or exc}",
                  file=sys.stderr)
            return 1
        print(f"QR code written to {png}", file=sys.stderr)
    return 0
