"""Request paths: percent-decode once, refuse what could escape, remove dot segments.

The result is what routes match and what file handlers join to their root, so
it is decoded exactly once here; a later layer must never decode again.
"""

from __future__ import annotations

from urllib.parse import unquote_to_bytes

from nestgate.base.errors import RequestError

# Encoded forms that would change the meaning of a path once decoded.
_FORBIDDEN_ENCODED = (b"%2f", b"%5c", b"%00")


def decode_path(raw: bytes) -> str:
    """Normalised, decoded path from the raw request path (no query).

    Raises RequestError(400) for encoded '/', '\\' or NUL, bad UTF-8, or a path
    that climbs above the root.
    """
    # Single bytes are tested as ints and pairs with find(): `b"x" in raw` first tries
    # the operand as an int in CPython, which costs more than the search itself.
    if 37 not in raw and 92 not in raw and raw.find(b"/.") < 0 and raw.find(b"//") < 0:
        try:
            return raw.decode("ascii")          # the common case costs one decode
        except UnicodeDecodeError:
            pass
    lowered = raw.lower()
    if any(bad in lowered for bad in _FORBIDDEN_ENCODED) or b"\\" in raw:
        raise RequestError(400, "encoded /, \\ or NUL in path")
    try:
        text = unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise RequestError(400, "path is not UTF-8") from None
    if "\x00" in text:
        raise RequestError(400, "NUL in path")
    return remove_dot_segments(text)


def remove_dot_segments(path: str) -> str:
    """RFC 3986 5.2.4 on an absolute path, also merging repeated slashes (nginx's
    merge_slashes). Climbing above "/" is refused rather than clamped."""
    out: list[str] = []
    segments = path.split("/")
    for segment in segments[1:]:
        if segment == "..":
            if not out:
                raise RequestError(400, "path climbs above the root")
            out.pop()
        elif segment not in (".", ""):
            out.append(segment)
    trailing = segments[-1] in ("", ".", "..") and len(segments) > 1 and out
    return "/" + "/".join(out) + ("/" if trailing else "")
