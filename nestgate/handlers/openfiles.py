"""Open descriptors of large static files, kept between requests (nginx's open_file_cache).

A large file (at or above the route's `sendfile_min`, or too big for the response
cache) is opened and checked off the loop by `StaticFiles`; its descriptor, stat,
real path and the header fields that do not change are then kept here by relative
path, so the next requests for it within `recheck` need no executor trip and no
system call but the `sendfile` (or the TLS path's `pread`s) that sends it.

A kept file may be dropped (changed on disk, evicted, the handler stopped) while
responses still send from it: each answer holds it (`users`) and the descriptor is
closed when it is dropped and the last user lets go. `sendfile` and `pread` take
explicit offsets, so sharing one descriptor moves no file position.

The number kept is bounded (`KEEP_OPEN_MAX`, least recently used out first), so many
distinct big files cannot use up the worker's descriptors.

This module does no disk work but `close`; opening and re-checking are the handler's.
"""

from __future__ import annotations

import collections
import os

from nestgate.base.responses import header_block

KEEP_OPEN_MAX = 64          # descriptors kept per StaticFiles handler


class KeptFile:
    """One open large file: descriptor, stat, where it is, and its ready header fields."""

    __slots__ = ("fd", "st", "real", "signature", "etag", "headers", "block", "checked",
                 "users", "dropped")

    def __init__(self, fd: int, st, real: str, etag: str, headers: list, now: float) -> None:
        self.fd, self.st, self.real = fd, st, real
        self.signature = (st.st_ino, st.st_mtime_ns, st.st_size)
        self.etag = etag
        self.headers = headers          # the 200's fields, Content-Length aside
        self.block = header_block(headers)      # the same as header lines, made once
        self.checked = now
        self.users = 0
        self.dropped = False

    def hold(self) -> None:
        self.users += 1

    def release(self) -> None:
        self.users -= 1
        if self.dropped and not self.users:
            self._close()

    def drop(self) -> None:
        """Out of the table: closed now, or when the last answer sending from it ends."""
        self.dropped = True
        if not self.users:
            self._close()

    def _close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class OpenFiles:
    """Kept large files by relative path, least recently used first."""

    def __init__(self, limit: int = KEEP_OPEN_MAX) -> None:
        self.limit = limit
        self._kept: collections.OrderedDict[str, KeptFile] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, rel: str) -> KeptFile | None:
        kept = self._kept.get(rel)
        if kept is not None:
            self._kept.move_to_end(rel)
        return kept

    def keep(self, rel: str, kept: KeptFile) -> None:
        self.drop(rel)
        self._kept[rel] = kept
        while len(self._kept) > self.limit:
            self._kept.popitem(last=False)[1].drop()

    def drop(self, rel: str, only: KeptFile | None = None) -> None:
        """Drop what is kept for `rel`; with `only`, only if that is still it (another
        answer may have kept a newer open of the path meanwhile)."""
        old = self._kept.get(rel)
        if old is None or (only is not None and old is not only):
            return
        del self._kept[rel]
        old.drop()

    def drop_all(self) -> None:
        while self._kept:
            self._kept.popitem()[1].drop()
