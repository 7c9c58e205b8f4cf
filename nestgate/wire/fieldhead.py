"""Request and response heads carried as lists of fields (HTTP/2 and HTTP/3), checked once for both.

HTTP/3 takes HTTP/2's rules for a request's fields (RFC 9114 4.2-4.3 point to RFC 9113
8.2-8.3): pseudo-fields (:method, :scheme, :path, :authority) each once and before the
others; field names lower-case tokens; values without controls (NUL, CR, LF; and,
as in HTTP/1.1, any other but HTAB) or surrounding whitespace; no connection-specific field, no `te` but `trailers`; a Host that repeats
:authority. The method and target are copied into an upstream's HTTP/1.1 request line,
so a :path must be visible ASCII, as llhttp demands of HTTP/1.1, and a :method one of
the methods llhttp takes (`METHODS`): the same request is then served, or refused with
the same 400, whichever protocol carried it (a lower-case `get` went upstream as it came,
where a strict upstream answered 502). A :scheme must be a URI scheme (RFC 3986 3.1)
and one nestgate serves, http or https in any case, as HTTP/1.1's absolute-form allows;
it need not be the connection's (a proxy ending TLS in front speaks h2c and says https)
and is read for nothing else: the scheme a request is handled and forwarded under is
the connection's, or a trusted proxy's X-Forwarded-Proto (nestgate.pipeline.dispatch).
A head that breaks a rule is malformed: a 400 on its stream, never the whole
connection (RFC 9113 8.1.1); past a limit, 414 or 431.

The answer's fields are made here too (`response_fields`). Only the checks and the
fields live here: each adapter has its own way of saying how long a body is
and of refusing a stream.
"""

from __future__ import annotations

import re

from nestgate.base.errors import RequestError
from nestgate.base.grammar import LOWER_TCHAR, METHODS, VISIBLE
from nestgate.wire.h2engine import CONNECTION_SPECIFIC
from nestgate.base.responses import SERVER

STATUS_VALUES = {s: str(s).encode() for s in range(100, 600)}   # :status, as sent
# NUL, CR and LF (RFC 9113 8.2.1) and every other control but HTAB, as an HTTP/1.1
# field value may not hold them (RFC 9110 5.5) and nestgate's own HTTP/1.1 parser
# refuses them: forwarded to an HTTP/1.1 upstream, a DEL or VT was a 502 from a strict
# one and reached a lenient one as it was.
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]|\A[ \t]|[ \t]\Z").search
_PSEUDO = {b":method": 1, b":scheme": 2, b":path": 4, b":authority": 8}   # bits
SCHEMES = frozenset((b"https", b"http"))
_URI_SCHEME = re.compile(rb"[A-Za-z][A-Za-z0-9+.\-]*\Z").match       # RFC 3986 3.1


def field_problem(headers, authority: bytes) -> str | None:
    """Why a request's regular fields make it malformed (RFC 9113 8.2), or None."""
    for name, value in headers:
        if not name or name.translate(None, LOWER_TCHAR):
            return "field name is not a lower-case token"
        if _BAD_VALUE(value):
            return "field value with a control character or surrounding whitespace"
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
    method = raw_target = authority = scheme = b""
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
            elif bit == 2:
                scheme = value
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
    return method, raw_target, authority, headers, _limit(
        bad, method, scheme, raw_target, size, len(headers), limits)


def scheme_problem(scheme: bytes) -> str | None:
    """Why a request's :scheme is refused, or None for http or https in another case
    (schemes are case-insensitive, RFC 3986 3.1)."""
    if scheme.lower() in SCHEMES:
        return None
    if not _URI_SCHEME(scheme):
        return ":scheme is not a URI scheme"
    return ":scheme is neither http nor https"


def _limit(bad, method: bytes, scheme: bytes, raw_target: bytes, size: int, count: int,
           limits):
    if bad is not None:
        return RequestError(400, bad)
    if method not in METHODS:
        return RequestError(400, ":method is not one HTTP/1.1 takes here")
    if scheme not in SCHEMES:
        problem = scheme_problem(scheme)
        if problem is not None:
            return RequestError(400, problem)
    if raw_target[:1] != b"/":
        return RequestError(400, ":path must be an absolute path")     # RFC 9113 8.3.1
    if len(raw_target) > limits.max_url:
        return RequestError(414)
    if raw_target.translate(None, VISIBLE):
        return RequestError(400, ":path has a byte outside visible ASCII")
    if size > limits.max_header_bytes or count > limits.max_headers:
        return RequestError(431)
    return None


def response_fields(status: int, pairs, content_length: int | None) -> list:
    """A response's fields for HTTP/2, Date apart: `:status` and Server first, the
    connection-specific ones (RFC 9113 8.2.2) and any Content-Length left out, then the
    framing's own length."""
    fields = [(b":status", STATUS_VALUES.get(status) or str(status).encode()),
              (b"server", SERVER.value)]
    for name, value in pairs:
        name = name.lower()
        if name not in CONNECTION_SPECIFIC and name != b"content-length":
            fields.append((name, value))
    if content_length is not None:
        fields.append((b"content-length", b"%d" % content_length))
    return fields


def ready_fields(response) -> list:
    """A `Prebuilt` response's fields without its Date: `:status`, Server, then its own
    fields in lower case but the connection-specific ones."""
    fields = [(b":status", STATUS_VALUES[response.status]), (b"server", SERVER.value)]
    for name, value in response.fields:
        name = name.lower()
        if name not in CONNECTION_SPECIFIC:
            fields.append((name, value))
    return fields


def pairs_of(block: bytes) -> list:
    """(name, value) pairs from header lines (`name: value\\r\\n` each) that were
    parsed and checked elsewhere, such as an upstream's."""
    pairs = []
    for line in block.split(b"\r\n"):
        if line:
            name, _, value = line.partition(b":")
            pairs.append((name.strip(), value.strip()))
    return pairs


def declared_length(headers) -> int | None:
    """The one content-length of a head that has a body (None without one); RequestError
    when it repeats or is not a number (malformed, RFC 9110 8.6)."""
    length = None
    for name, value in headers:
        if name == b"content-length":
            if length is not None or not value.isdigit() or len(value) > 18:
                raise RequestError(400, "content-length repeated or not a number")
            length = int(value)
    return length
