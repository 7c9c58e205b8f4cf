"""Upgrades and tunnels of an HTTP/1 connection (`Tunnels`, mixed into
`nestgate.wire.http1.HTTP1Connection`).

Only handlers that take over the connection (`upgrades = True`, such as the proxy
relaying a WebSocket) accept an upgrade request; for the rest the request is answered
as usual and the connection ends after it. An accepted upgrade holds the client's next
bytes (UPGRADING, reading stopped) until the handler answers: with `take_over` it
writes its 101 and gets those bytes, then `set_sink` hands every later byte to it
(TUNNEL) until the connection closes.
"""

from __future__ import annotations

from nestgate.wire.h1phases import CLOSING, IDLE, TUNNEL, UPGRADING
from nestgate.wire.h1request import HTTP1Request


class Tunnels:
    """The client's bytes after an upgrade request, and the handler that takes them."""

    def _upgrade(self, data, offset: int) -> bool:
        """httptools stopped at an upgrade request's end, `offset` bytes into `data`.
        The upgrade request is the last one read: being answered, or waiting its turn
        behind answers to pipelined requests ahead of it. True when its handler takes
        the connection; else the connection ends after the answers ahead."""
        req = self._queue[-1] if self._queue else self._active
        if (type(req) is HTTP1Request and req.upgrade
                and getattr(req.handler, "upgrades", False)):
            # Hold the client's next bytes until the handler knows the answer.
            self._enter(UPGRADING)
            req.keep_alive = False
            self._upgrade_tail = bytes(data[offset:])
            self.transport.pause_reading()
            return True
        self._enter(CLOSING)
        self._close_when_idle()
        return False

    def become_tunnel(self, head: bytes) -> bytes:
        self.state = IDLE
        self.write(head)
        tail, self._upgrade_tail = self._upgrade_tail or b"", None
        return tail

    def tunnelled(self) -> bool:
        """The connection is a tunnel, or about to be one (an upgrade being answered)."""
        return self.phase in (UPGRADING, TUNNEL)

    def cut_tunnel(self) -> None:
        """End the tunnel the connection carries, if any (its session ended)."""
        if self.tunnelled():
            self.transport.close()

    def set_sink(self, sink) -> None:
        """After `Request.take_over`: `sink(bytes)` gets what the client sends; reading
        resumes. Nothing to do when the client has gone meanwhile."""
        if self.phase != UPGRADING:
            return
        self._enter(TUNNEL)
        self._sink = sink
        if not self._closing_transport():
            self.transport.resume_reading()
