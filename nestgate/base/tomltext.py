"""TOML files and bodies (the config, a users file, the admin API's validate), read
into data or refused with one line saying why.

tomllib raises more than TOMLDecodeError on what a file can hold: RecursionError
for arrays or inline tables nested a few thousand deep, and ValueError for an
integer of more than 4,300 digits. Each made `check` print a traceback, the
validate endpoint answer 500, and a reload be refused without naming the file.
A UTF-8 byte-order mark, which some editors write, is skipped.
"""

from __future__ import annotations

import sys
import tomllib


def read_toml(raw: bytes) -> dict:
    """The TOML document in `raw`; ValueError with what is wrong when it is not one."""
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(f"expected UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"not valid TOML: {exc}") from None
    except RecursionError:
        raise ValueError("not valid TOML: nested too deeply") from None
    except ValueError:                        # int(): past sys.get_int_max_str_digits()
        raise ValueError(f"not valid TOML: an integer of more than "
                         f"{sys.get_int_max_str_digits()} digits") from None
