"""Host names as a Host header (or :authority) carries them: whether the value is
well formed, the name without port or trailing dot, and the name when it is plain
enough to send back in a redirect. Pure functions on bytes."""

from __future__ import annotations

_HOST_CHARS = (b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
               b"-._~!$&'()*+,;=%:[]")


def valid_host(value: bytes) -> bool:
    """uri-host [ ":" port ]: nothing outside the host characters, digits for a port
    (an IPv6 literal's colons are not a port)."""
    if value.translate(None, _HOST_CHARS):
        return False
    _, colon, port = value.rpartition(b":")
    return not colon or 93 in port or port.isdigit() or port == b""     # 93: "]"


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
