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
    merge_slashes). Climbing above "/" is refused rather than clamped, and so is a
    dot segment with `;` parameters (`..;`)."""
    return "/".join(_without_dots(path.split("/"), path.split("/")))


def forwarded_path(raw: bytes) -> bytes:
    """The raw request target (query included) as it goes to an upstream: its path
    with the dot segments removed and slashes merged exactly as `decode_path` did for
    routing, each remaining segment spelt as the client spelt it.

    Routes and their access lists match the normalised path; an upstream given the
    client's `/admin/../public/x` or `/admin/%2e%2e/public/x` where nestgate matched
    `/public/x` may route on the raw path (Node, Express and many apps do not remove
    dot segments) and serve `/admin/` to whoever `/public/` lets in. Called only for
    a target `decode_path` accepted; one that needs nothing is returned as it is."""
    if 37 not in raw and raw.find(b"/.") < 0 and raw.find(b"//") < 0:
        return raw                          # the usual target: nothing to remove
    # A percent sign (perhaps an encoded dot) or a dot or slash after a slash: the
    # segments are read.
    qmark = raw.find(b"?")
    path, query = (raw, b"") if qmark < 0 else (raw[:qmark], raw[qmark:])
    segments = path.split(b"/")
    # An encoded "/" is refused by `decode_path`, so the raw segments are the decoded
    # path's segments; each is a dot segment when it decodes to one ("%2e", "%2E.").
    names = [unquote_to_bytes(s).decode("latin-1") if 37 in s else s.decode("latin-1")
             for s in segments]
    return b"/".join(_without_dots(segments, names)) + query


def has_dot_segments(raw: bytes) -> bool:
    """Whether a raw request target's path holds a `.` or `..` segment, spelt plainly
    or percent-encoded (`%2e`): a path that one server reads with them removed and
    another as it is."""
    path = raw.partition(b"?")[0]
    if path.find(b"/.") < 0 and path.find(b"%2e") < 0 and path.find(b"%2E") < 0:
        return False
    return any(unquote_to_bytes(segment) in (b".", b"..") for segment in path.split(b"/"))


def _without_dots(segments: list, names: list[str]) -> list:
    """The segments of an absolute path (the first one empty) less its dot segments
    and empty ones, a trailing slash kept, as `remove_dot_segments` says; `names` are
    the segments as compared (decoded), `segments` as returned."""
    out: list = []
    for segment, name in zip(segments[1:], names[1:]):
        if name.startswith((".;", "..;")):
            # A dot segment to Tomcat, Jetty and Spring, which drop a segment's ";"
            # parameters first: `/public/..;/admin/` is `/admin/` there and a path
            # under `/public/` to every route match. Refused, never guessed at.
            raise RequestError(400, "dot segment with parameters")
        if name == "..":
            if not out:
                raise RequestError(400, "path climbs above the root")
            out.pop()
        elif name not in (".", ""):
            out.append(segment)
    empty = segments[0][:0]                 # "" or b"", as the segments are
    if not out or (names[-1] in ("", ".", "..") and len(names) > 1):
        out.append(empty)                   # "/" alone, or the trailing slash
    return [empty, *out]
