"""Files a worker reads again when they change (a GeoIP database, the CrowdSec decision
table): what tells a changed file from the one read before."""

from __future__ import annotations

import os


def file_stamp(path: str):
    """(inode, size, mtime) of `path`, None when it cannot be stat'ed. A file renamed into
    place has a new inode; one rewritten in place a new size or mtime."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns
