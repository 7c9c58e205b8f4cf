"""The admin token nestgate makes for itself when none is configured.

At its first start the supervisor writes 32
random bytes, in hex (`secrets.token_hex`: never a leading "-" that `nestgate ctl
--token TOKEN` would read as an option, as base64url can), to `admin.token` in `[acme] storage`
(default `nestgate-certificates` in the state folder): the one folder every config has
that the service user can write, made 0700, whose files of secrets are 0600 and
replaced whole. A token is never replaced once made: the next
start, a reload and `nestgate ctl` (which reads the same config) all read it.
Whoever may read that file may drive the admin API; nobody else on the machine can,
nor any web page the operator's browser has open.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

TOKEN_FILE = "admin.token"
TOKEN_BYTES = 32


class TokenError(OSError):
    """The generated token cannot be made or read: the server cannot start."""


def token_path(state_folder: str) -> Path:
    return Path(state_folder) / TOKEN_FILE


def read_token(path: Path) -> str:
    """The token in `path`; "" when it is missing or this user may not read it."""
    try:
        return path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return ""


def ensure_token(config, previous=None):
    """`config` with its admin token, made now if it does not exist yet. Started as
    root with `[server] user`, this runs before the switch of user and the folder and
    file it makes are given to that user. A reload that cannot read the file (a root-
    owned one after the switch) keeps the token of `previous`, the serving config."""
    admin = config.admin
    if admin.token or not admin.token_file:
        return config
    path = Path(admin.token_file)
    if not path.exists():
        _make(path, _owner(config.server))
    token = read_token(path)
    if not token and previous is not None and previous.admin.token_file == admin.token_file:
        token = previous.admin.token
    if not token:
        raise TokenError(f"admin token {path}: cannot be read by this user, or empty "
                         "(delete it and a new one is made at the next start)")
    return replace(config, admin=replace(admin, token=token))


def _owner(server) -> SimpleNamespace | None:
    """`[server] user` (st_uid, st_gid) when running as root, else None."""
    if os.geteuid() != 0 or not server.user:
        return None
    import grp
    import pwd
    entry = pwd.getpwnam(server.user)
    gid = grp.getgrnam(server.group).gr_gid if server.group else entry.pw_gid
    return SimpleNamespace(st_uid=entry.pw_uid, st_gid=gid)


def _make(path: Path, owner: SimpleNamespace | None) -> None:
    from nestgate.certs.storage import CertStorage
    from nestgate.base.private import PRIVATE_FILE, make_private_folders
    aside = path.with_name(f".{path.name}.{os.getpid()}.new")
    try:
        make_private_folders(path.parent, owner)
        # CertStorage writes whole files and, run as root, gives them to the folder's
        # owner.
        CertStorage(str(path.parent)).write(
            aside, secrets.token_hex(TOKEN_BYTES).encode() + b"\n", PRIVATE_FILE)
        try:
            # A link never replaces: two instances starting at once keep the first token.
            os.link(aside, path)
        except FileExistsError:
            pass
    except OSError as exc:
        raise TokenError(f"admin token {path}: cannot be written ({exc.strerror or exc}); "
                         "set [admin] token or token_file, or make [acme] storage "
                         "writable") from None
    finally:
        try:
            os.unlink(aside)
        except OSError:
            pass
