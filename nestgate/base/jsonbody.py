"""Request bodies sent as JSON (the admin API, the notes API), read strictly.

`json.loads` takes more than RFC 8259 JSON, and what it lets through broke the
handlers behind it or made the body mean two things:

- a lone surrogate (`"\\ud800"`) is a str that cannot be encoded: the store, a file or
  a PEM write failed later with a 500;
- a key given twice kept the last value silently, where another reader of the same
  body (a proxy, a log) may take the first;
- bytes are guessed as UTF-16 or UTF-32 when they look so;
- `NaN`, `Infinity` are not JSON, and `1e400` read as infinity; an integer of
  thousands of digits costs time to convert (Python refuses past 4,300);
- nesting too deep for the reader is a RecursionError.

Each is a ValueError here, whose message says what is wrong, for the endpoint's 422.
A UTF-8 byte-order mark is skipped (RFC 8259 lets a reader ignore it).
"""

from __future__ import annotations

import json
import math

MAX_DIGITS = 100          # no count, size or time the API takes is longer


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON value")


def _integer(text: str) -> int:
    if len(text) > MAX_DIGITS:
        raise ValueError(f"a number of {len(text)} digits")
    return int(text)


def _real(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:20]} is too large a number")
    return value


def _object(pairs: list) -> dict:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen = set()
        for key, _value in pairs:
            if key in seen:
                raise ValueError(f"the key {key!r} is given twice")
            seen.add(key)
    return value


def read_json(raw: bytes):
    """The JSON value of `raw`; ValueError naming what is wrong when it is not one."""
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        value = json.loads(text, object_pairs_hook=_object, parse_constant=_no_constant,
                           parse_int=_integer, parse_float=_real)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc.msg} at character {exc.pos})") from None
    try:
        # Escapes can name a lone surrogate; the decoded text above cannot hold one.
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("a string holds a lone surrogate (\\ud800-\\udfff), which is "
                         "not a character") from None
    return value
