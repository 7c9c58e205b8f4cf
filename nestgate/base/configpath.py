"""File and folder names read from the config.

A name holding NUL, or one whose symbolic links loop, made the standard library raise
(ValueError, RuntimeError) where the reader expected a plain "no such file": `check`
printed a traceback, and a reload was refused without naming the key. Read through
these, each is a problem of its key like any missing file.
"""

from __future__ import annotations

import os
from pathlib import Path


def path_text(v) -> str:
    """A file or folder name as written: a string without NUL (no file name holds one,
    and the OS refuses it)."""
    if type(v) is not str:
        raise ValueError("a path as a string")
    if "\0" in v:
        raise ValueError("a path without a NUL character")
    return v


def resolved(base: Path, value: str) -> Path:
    """`value` (relative to `base`) with its symbolic links followed, as far as they
    go. os.path.realpath rather than Path.resolve: that one raises on a link that
    points at itself; this one leaves the loop in the path, which then is no file, and
    the key's own check names it."""
    return Path(os.path.realpath(Path(base) / value))
