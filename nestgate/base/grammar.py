"""Character classes of HTTP's grammar (RFC 9110 5.6.2, 5.1) as byte strings.

They are used with `bytes.translate(None, CLASS)`, which deletes the allowed bytes and
leaves the bad ones: a value is well formed when nothing is left. That is cheaper
than a regular expression for the short values a request carries.
"""

import re

TCHAR = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
# A token in lower case: an HTTP/2 field name (RFC 9113 8.2.1).
LOWER_TCHAR = TCHAR.translate(None, b"ABCDEFGHIJKLMNOPQRSTUVWXYZ")
VISIBLE = bytes(range(0x21, 0x7F))          # VCHAR: a request target's bytes
_SEPARATORS = (b"-", b"_", b".")
_SEPARATOR = re.compile(rb"[-_.]")
_MIXED_SEPARATORS_MAX = 6

# The methods llhttp takes in an HTTP/1.x request line (its METHODS_HTTP), but CONNECT,
# which nestgate refuses on every protocol (it is no forward proxy). An HTTP/1.1 request
# with any other method is refused by the parser with 400; HTTP/2 and HTTP/3 refuse the
# same ones (nestgate.wire.fieldhead), with one set lookup in place of a character
# check, and so does forward auth of the method a question names.
METHODS = frozenset((
    b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"OPTIONS", b"TRACE", b"PATCH",
    b"COPY", b"LOCK", b"MKCOL", b"MOVE", b"PROPFIND", b"PROPPATCH", b"SEARCH", b"UNLOCK",
    b"BIND", b"REBIND", b"UNBIND", b"ACL", b"REPORT", b"MKACTIVITY", b"CHECKOUT", b"MERGE",
    b"M-SEARCH", b"NOTIFY", b"SUBSCRIBE", b"UNSUBSCRIBE", b"PURGE", b"MKCALENDAR", b"LINK",
    b"UNLINK", b"SOURCE", b"QUERY"))


def with_cgi_spellings(names) -> frozenset[bytes]:
    """Lower-case field `names` and every spelling of each with any of its separators
    (`-`, `_`, `.`) written as another (`remote_user`, `remote.user`, `x_forwarded-for`...).

    CGI, WSGI, PHP and the servers built on them read a field by a name in which `-`
    and `_` are one character (`HTTP_REMOTE_USER`), so a client's `Remote_User: ann`
    reaches such an app as the identity header nestgate vouches for, beside or instead
    of nestgate's own `Remote-User`. PHP also turns every `.` of a variable's name into
    `_`: where the server in front of PHP-FPM passes `Remote.User` on as
    `HTTP_REMOTE.USER` (Caddy's `php_fastcgi` does), PHP fills
    `$_SERVER['HTTP_REMOTE_USER']` from it, and from whichever of the two came last.
    A set of names no client may send must hold these spellings too (nginx ignores
    every name with `_` or `.` for the same reason). A name has few separators, so the
    set stays small and the lookup per field stays one set test."""
    spelt: set[bytes] = set()
    for name in names:
        parts = _SEPARATOR.split(name.lower())
        if len(parts) > _MIXED_SEPARATORS_MAX + 1:
            # Past a few separators only the uniform spellings (3^n mixed ones would be
            # too many to hold); the names nestgate and proxies use have at most three.
            spelt.update(sep.join(parts) for sep in _SEPARATORS)
            continue
        variants = [parts[0]]
        for part in parts[1:]:
            variants = [v + sep + part for v in variants for sep in _SEPARATORS]
        spelt.update(variants)
    return frozenset(spelt)
