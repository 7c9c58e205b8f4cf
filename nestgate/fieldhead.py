"""A request head carried as a list of fields (HTTP/2 and HTTP/3), checked once for both.

HTTP/3 takes HTTP/2's rules for a request's fields (RFC 9114 4.2-4.3 point to RFC 9113
8.2-8.3): pseudo-fields (:method, :scheme, :path, :authority) each once and before the
others; field names lower-case tokens; values without NUL, CR, LF or surrounding
whitespace; no connection-specific field, no `te` but `trailers`; a Host that repeats
:authority. The method and target are copied into an upstream's HTTP/1.1 request line,
so a method must be a token (RFC 9110 5.6.2) and a :path visible ASCII, as llhttp
demands of HTTP/1.1. A head that breaks a rule is malformed: a 400 on its stream, never
the whole connection (RFC 9113 8.1.1); past a limit, 414 or 431.

Only the checks live here: each adapter has its own way of saying how long a body is
and of refusing a stream.
"""

from __future__ import annotations

import re

from nestgate.errors import RequestError
from nestgate.grammar import LOWER_TCHAR, TCHAR, VISIBLE
from nestgate.h2engine import CONNECTION_SPECIFIC

_BAD_VALUE = re.compile(rb"[\0\r\n]|\A[ \t]|[ \t]\Z").search
_PSEUDO = {b":method": 1, b":scheme": 2, b":path": 4, b":authority": 8}   # bits


def field_problem(headers, authority: bytes) -> str | None:
    """Why a request's regular fields make it malformed (RFC 9113 8.2), or None."""
    for name, value in headers:
        if not name or name.translate(None, LOWER_TCHAR):
            return "field name is not a lower-case token"
        if _BAD_VALUE(value):
            return "field value with NUL, CR, LF or surrounding whitespace"
        if name in CONNECTION_SPECIFIC:
            return "connection-specific field"                       # 8.2.2
        if name == b"te" and value.lower() != b"trailers":
            return "te other than trailers"                         # 8.2.2
        if name == b"host" and authority and value.lower() != authority.lower():
            return "host differs from :authority"                   # 8.3.1
    return None


def read_head(fields, ended: bool, limits):
    """(method, target, authority, regular fields, problem): `problem` is None or the
    RequestError the stream is answered with. `ended`: no body follows the head."""
    method = raw_target = authority = b""
    host = None
    headers = []
    size = found = lengths = 0
    bad = None
    for name, value in fields:
        size += len(name) + len(value)
        if name[:1] == b":":
            # A request's pseudo-fields, each once, before the others (8.3).
            bit = _PSEUDO.get(name, 0)
            if not bit or bit & found or headers:
                bad = f"pseudo-field {name[:20]!r} unknown, repeated or late"
            found |= bit
            if bit == 1:
                method = value
            elif bit == 4:
                raw_target = value
            elif bit == 8:
                authority = value
        else:
            headers.append((name, value))
            if name == b"host":
                if host is not None:
                    # Which one routes and which one goes upstream? (RFC 9112 3.2)
                    bad = "repeated host"
                host = value
            elif name == b"content-length" and ended:
                # No body follows, so only one "0" agrees with it (8.1.1); the adapter
                # holds a body that does follow to its length.
                if value != b"0" or lengths:
                    bad = "content-length on a request without a body, or repeated"
                lengths += 1
    bad = bad or field_problem(headers, authority) or \
        (None if found & 7 == 7 else ":method, :scheme or :path missing")
    authority = authority or host or b""
    return method, raw_target, authority, headers, _limit(bad, method, raw_target, size,
                                                          len(headers), limits)


def _limit(bad, method: bytes, raw_target: bytes, size: int, count: int, limits):
    if bad is not None:
        return RequestError(400, bad)
    if not method or method.translate(None, TCHAR):
        return RequestError(400, ":method is not a token")
    if raw_target[:1] != b"/":
        return RequestError(400, ":path must be an absolute path")     # RFC 9113 8.3.1
    if len(raw_target) > limits.max_url:
        return RequestError(414)
    if raw_target.translate(None, VISIBLE):
        return RequestError(400, ":path has a byte outside visible ASCII")
    if size > limits.max_header_bytes or count > limits.max_headers:
        return RequestError(431)
    return None
