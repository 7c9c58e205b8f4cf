"""Responses built ahead of time: status lines, header blocks and whole error pages.

A `Prebuilt` response holds everything but the Date line and the Connection header
as bytes, so answering it costs one concatenation (DESIGN.md: the hot path).
"""

from __future__ import annotations

import html
from http import HTTPStatus

from nestgate.base.clock import CLOCK



class ServerName:
    """What nestgate calls itself in the Server header and on its pages: "nestgate",
    or "nestgate/<version>" with `[server] server_tokens = true` (nginx's key of the
    same name; the version tells an attacker which known faults to try). A worker sets
    it from its config before building anything (`site.build_router`); responses
    built before keep what it was then."""

    def __init__(self) -> None:
        self.show_version(False)

    def show_version(self, on: bool) -> bool:
        """True when that changed what it was."""
        from nestgate import __version__
        text = f"nestgate/{__version__}" if on else "nestgate"
        changed = text != getattr(self, "text", None)
        self.text = text
        self.value = text.encode()
        self.line = b"server: " + self.value + b"\r\n"
        return changed


SERVER = ServerName()

# The three ways a response can end its header block, indexed by connection mode.
KEEP_ALIVE, CLOSE, KEEP_ALIVE_EXPLICIT = 0, 1, 2
# Added to a mode on a listener that also serves HTTP/3: the same ending after an
# Alt-Svc line (RFC 7838) naming it. `announce_http3` writes those three endings
# before the worker builds its routes; until then (and in a process serving no HTTP/3)
# they are the plain ones, the same objects.
ALT_SVC = 3
WRITEV_ABOVE = 2048           # body bytes
_PLAIN_ENDINGS = (b"\r\n", b"connection: close\r\n\r\n", b"connection: keep-alive\r\n\r\n")
CONNECTION_ENDINGS = list(_PLAIN_ENDINGS * 2)       # written in place: importers see it


def announce_http3(ports) -> None:
    """The Alt-Svc line of the listeners with `http3 = true` (they share the sites, so it
    names every such port). Answers built from now on carry it in their ALT_SVC modes;
    ready answers built before (the protocol layer's own error pages) do not."""
    value = ", ".join(f'h3=":{port}"; ma=86400' for port in sorted(set(ports)))
    _ALT_SVC[0] = value.encode()
    line = b"alt-svc: " + _ALT_SVC[0] + b"\r\n" if value else b""
    for mode, ending in enumerate(_PLAIN_ENDINGS):
        CONNECTION_ENDINGS[ALT_SVC + mode] = line + ending if line else ending


def alt_svc_value() -> bytes:
    """The Alt-Svc value `announce_http3` made (b"" before)."""
    return _ALT_SVC[0]


_ALT_SVC = [b""]


def _tails(body: bytes) -> tuple:
    """Each connection ending followed by `body`, by mode; without an Alt-Svc line the
    ALT_SVC modes share the plain ones (no second copy of the body)."""
    plain = tuple(end + body for end in _PLAIN_ENDINGS)
    if CONNECTION_ENDINGS[ALT_SVC] is _PLAIN_ENDINGS[0]:
        return plain + plain
    return plain + tuple(end + body for end in CONNECTION_ENDINGS[ALT_SVC:])


def reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


def status_line(status: int) -> bytes:
    return f"HTTP/1.1 {status} {reason(status)}\r\n".encode()


STATUS_LINES = {s.value: status_line(s.value) for s in HTTPStatus}


def header_pairs(headers) -> list[tuple[bytes, bytes]]:
    """(name, value) pairs as bytes from (str|bytes, str|bytes) pairs, checked."""
    out = []
    for name, value in headers:
        name = name.encode("latin-1") if isinstance(name, str) else name
        value = value.encode("latin-1") if isinstance(value, str) else value
        # CR and LF as ints (13, 10): `b"\r" in value` first tries the operand as an int
        # in CPython, raising and clearing a TypeError each time (see base/paths.py).
        if 13 in value or 10 in value or 13 in name or 10 in name:
            raise ValueError(f"header {name!r} holds a line break")
        out.append((name, value))
    return out


def lines_of(pairs) -> bytes:
    """HTTP/1 header lines (`name: value\\r\\n` each) from checked bytes pairs."""
    return b"".join([name + b": " + value + b"\r\n" for name, value in pairs])


def header_block(headers) -> bytes:
    """`name: value\\r\\n` lines from (str|bytes, str|bytes) pairs."""
    return lines_of(header_pairs(headers))


class Prebuilt:
    """A whole response except Date and Connection. Also a route handler: it answers
    every method with itself (HEAD without the body), like nginx's `return`."""

    is_async = False
    __slots__ = ("status", "body", "_head", "_full_tails", "_head_tails", "content_length",
                 "fields", "h2_cache", "write_to", "_kept_alive", "_kept_alive_date")

    def __init__(self, status: int, body: bytes = b"", content_type: str | None = None,
                 headers=()) -> None:
        self.status = status
        self.body = body
        lines = [("content-type", content_type)] if content_type and body is not None else []
        lines.append(("content-length", str(len(body))))
        # The header fields as pairs (for HTTP/2) and as HTTP/1 lines, made once.
        self.fields = header_pairs(list(headers) + lines)
        self._head = STATUS_LINES.get(status) or status_line(status)
        self._head += SERVER.line + lines_of(self.fields)
        self._full_tails = _tails(body)
        self._head_tails = tuple(CONNECTION_ENDINGS)
        self.content_length = len(body)
        self.h2_cache = None          # the HTTP/2 header block, encoded on first use
        # The whole keep-alive answer to a GET, as it was for `_kept_alive_date` (the
        # clock's date line): rebuilt on the first request in a new second, not on each.
        self._kept_alive = b""
        self._kept_alive_date = None
        # Small responses go out as one joined bytes; above this, the body is handed to
        # writev as it is instead of being copied behind the head.
        self.write_to = self._write_joined if len(body) < WRITEV_ABOVE else self._write_vector

    def render(self, mode: int, head_only: bool = False) -> bytes:
        tails = self._head_tails if head_only else self._full_tails
        return self._head + CLOCK.date_line + tails[mode]

    # `write_to` returns the number of bytes written, for the connection's figures.
    def _write_joined(self, transport, mode: int, head_only: bool = False) -> int:
        if mode == KEEP_ALIVE_EXPLICIT and not head_only:
            date_line = CLOCK.date_line
            if self._kept_alive_date is not date_line:
                self._kept_alive = self._head + date_line + self._full_tails[mode]
                self._kept_alive_date = date_line
            data = self._kept_alive
        else:
            tails = self._head_tails if head_only else self._full_tails
            data = self._head + CLOCK.date_line + tails[mode]
        transport.write(data)
        return len(data)

    def _write_vector(self, transport, mode: int, head_only: bool = False) -> int:
        tails = self._head_tails if head_only else self._full_tails
        head = self._head + CLOCK.date_line
        tail = tails[mode]
        transport.writelines((head, tail))
        return len(head) + len(tail)


def html_page(status: int, detail: str = "") -> bytes:
    title = f"{status} {reason(status)}"
    extra = f"<p>{html.escape(detail)}</p>" if detail else ""
    return (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>{title}</title>"
            f"</head><body><h1>{title}</h1>{extra}<hr><p>{SERVER.text}</p>"
            f"</body></html>\n").encode()


CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
