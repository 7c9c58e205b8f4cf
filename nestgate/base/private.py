"""Files that hold secrets (the state store, private keys) and the folders they live in.

Such a file is created 0600 and a folder nestgate makes for one 0700, whatever the
umask, so no other local user reads it, not even for the moment between creating
and tightening. A file or folder that already exists is left as its owner set it (a
folder such as /var/lib/nestgate may be shared on purpose): `open_to_others` says
when one is wider, for `check` to warn about.

What matters of a folder is who may write in it: a 0600 file is as private in a
0755 folder as in a 0700 one, but in a folder others may write to they can put their
own file in its place (or SQLite's -wal beside it before nestgate makes one).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

PRIVATE_FILE = 0o600
PRIVATE_FOLDER = 0o700


def make_private_folders(folder: str | os.PathLike, owner: os.stat_result | None = None) -> None:
    """Make `folder` and every missing folder above it, each 0700. Folders that exist
    are not changed. `owner`: the new folders are given to that owner (a process
    running as root writing for the server's user)."""
    folder = Path(folder)
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    for made in reversed(missing):
        try:
            made.mkdir(mode=PRIVATE_FOLDER)
        except FileExistsError:          # another process made it meanwhile
            continue
        os.chmod(made, PRIVATE_FOLDER)   # a umask such as 0277 would have taken more
        if owner is not None:
            os.chown(made, owner.st_uid, owner.st_gid)


def create_private_file(path: str | os.PathLike) -> bool:
    """Create `path` empty and 0600 when it does not exist (True), so that whatever
    opens it next (SQLite) finds it private from its first byte. An existing file,
    or a symlink in its place, is left alone (False)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     PRIVATE_FILE)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def open_to_others(path: str | os.PathLike, bits: int = 0o077) -> int | None:
    """The permission bits of `path` when they give its group or other users any of
    `bits` (by default anything: a file wider than 0600); None when they do not or it
    does not exist."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return None
    return mode if mode & bits else None
