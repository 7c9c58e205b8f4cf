"""Sizes and durations as written in config files: "64KiB", "1MiB", "30s", "250ms".

Values are written with units so a reader of the config never guesses; a bare
integer is accepted for sizes (bytes) and durations (seconds) for convenience.
"""

import math
import re

SECONDS = 1.0

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "kib": 1024,
    "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
    "g": 1000**3, "gb": 1000**3, "gib": 1024**3,
}
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_NUMBER_UNIT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value) -> int:
    """Bytes from "64KiB" / "1MiB" / 4096. Raises ValueError with what was expected."""
    if isinstance(value, bool):
        raise ValueError("a size such as \"64KiB\" or \"1MiB\"")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a size that is not negative")
        return value
    if isinstance(value, str):
        m = _NUMBER_UNIT.match(value)
        if m and m.group(2).lower() in _SIZE_UNITS:
            return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])
    raise ValueError("a size such as \"64KiB\" or \"1MiB\" (units: B, KB, KiB, MB, MiB, GB, GiB)")


def parse_duration(value) -> float:
    """Seconds from "30s" / "250ms" / "5m" / 10. Raises ValueError with what was expected."""
    if isinstance(value, bool):
        raise ValueError("a duration such as \"30s\" or \"250ms\"")
    if isinstance(value, (int, float)):
        # TOML has `nan` and `inf`: neither is a time a timer can wait.
        if not math.isfinite(value):
            raise ValueError("a duration such as \"30s\" (a finite number of seconds)")
        if value < 0:
            raise ValueError("a duration that is not negative")
        return float(value)
    if isinstance(value, str):
        m = _NUMBER_UNIT.match(value)
        if m and m.group(2).lower() in _DURATION_UNITS:
            return float(m.group(1)) * _DURATION_UNITS[m.group(2).lower()]
    raise ValueError("a duration such as \"30s\" or \"250ms\" (units: ms, s, m, h, d)")
