"""Host names as a Host header (or :authority) carries them: whether the value is
well formed, the name without port or trailing dot, and the name when it is plain
enough to send back in a redirect. Pure functions on bytes."""

from __future__ import annotations

_HOST_CHARS = (b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
               b"-._~!$&'()*+,;=%:[]")


def valid_host(value: bytes) -> bool:
    """uri-host [ ":" port ] (RFC 3986 3.2.2): nothing outside the host characters; a
    name or IPv4 address with at most one colon, or an IP literal in brackets (its
    colons are not a port); a port of digits. `example.com:443:`, `a:1:2` and
    `[::1]example.com` were taken, and routed by a name no site has (a catch-all site's)
    while the upstream got the Host as it came."""
    if value.translate(None, _HOST_CHARS):
        return False
    if value[:1] == b"[":
        end = value.find(b"]")
        if end < 0 or b"[" in value[1:] or b"]" in value[end + 1:]:
            return False
        port = value[end + 1:]
        return not port or (port[:1] == b":" and (port[1:].isdigit() or port == b":"))
    if b"[" in value or b"]" in value:
        return False
    _, colon, port = value.partition(b":")
    return not colon or port.isdigit() or port == b""


# What a host name (or IP literal) is made of once lower-cased, without the characters
# a Host header may carry but a name never does: what a redirect may send back.
_NAME_CHARS = b"abcdefghijklmnopqrstuvwxyz0123456789.-[]:"


def plain_host_name(raw: bytes) -> bytes | None:
    """`host_name(raw)` when it is made of host-name characters only, else None."""
    host = host_name(raw)
    if not host or host.translate(None, _NAME_CHARS):
        return None
    return host


def host_name(raw: bytes) -> bytes:
    """Lower-case host without port or trailing dot, from a Host header value."""
    raw = raw.strip().lower()
    if raw.startswith(b"["):                      # [v6]:port
        end = raw.find(b"]")
        return raw[: end + 1] if end > 0 else raw
    if raw.count(b":") == 1:
        raw = raw.split(b":", 1)[0]
    return raw.rstrip(b".")


def configured_host_problem(name: str) -> str:
    """What is wrong with `name` as a config names a host (a site's `hosts`, a
    certificate's `names`): "" for a name a request's Host can match once lower-cased,
    as `host_name` leaves it ("*" and one leading "*." allowed). A name written with
    Unicode, a trailing dot or a port was taken, and then no request ever reached the
    site nor a CA certified it."""
    if name == "*":
        return ""
    bare = name[2:] if name.startswith("*.") else name
    if not bare.isascii():
        try:
            spelt = bare.encode("idna").decode("ascii")
        except UnicodeError:
            return "an ASCII name (a Unicode name in its IDNA form)"
        return f"an ASCII name (a Unicode name in its IDNA form: {name[:-len(bare)]}{spelt})"
    if bare.startswith("["):
        import ipaddress
        try:
            ipaddress.IPv6Address(bare[1:-1] if bare.endswith("]") else "-")
            return ""
        except ValueError:
            return "an IPv6 address in brackets"
    if bare.endswith("."):
        return f"a name without the trailing dot ({name.rstrip('.')})"
    if ":" in bare:
        return "a name without a port (a Host's port is not compared)"
    labels = bare.split(".")
    if len(bare) > 253 or not all(0 < len(label) <= 63 for label in labels):
        return "a name of dot-separated labels of 1 to 63 characters, 253 in all"
    if any(label.strip(_LABEL_CHARS) or label[0] == "-" or label[-1] == "-"
           for label in labels):
        return "labels of letters, digits, - and _, none starting or ending with -"
    return ""


_LABEL_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"
