"""Files replaced whole: a reader (another process, the next start) sees the old file or
the new one, never half of one, and a failed write leaves the old one as it was."""

from __future__ import annotations

import contextlib
import os


def replace_file(path, data: bytes, mode: int = 0o644, owner: os.stat_result | None = None,
                 sync_folder: bool = False) -> None:
    """Write `data` to a temporary file beside `path` (created with `mode`, given to
    `owner`'s uid and gid when one is passed), fsync it, and rename it over `path`;
    the temporary file is removed if any step fails. `sync_folder`: fsync the folder
    too, so the rename itself survives a crash."""
    path = os.fspath(path)
    folder = os.path.dirname(path) or "."
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        if owner is not None:
            os.fchown(fd, owner.st_uid, owner.st_gid)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if sync_folder:
        folder_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(folder_fd)
        finally:
            os.close(folder_fd)
