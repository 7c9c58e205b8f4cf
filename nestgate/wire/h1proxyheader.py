"""The PROXY protocol header on a plain HTTP/1 listener: `ProxyProtocolConnection` reads
it before the connection's parser sees a byte, names the client it gives, then is an
ordinary `HTTP1Connection`. (On a TLS listener `nestgate.wire.proxytls` reads it before the
handshake.)
"""

from __future__ import annotations

from nestgate.base.clientip import ProxyHeaderError, take_proxy_header
from nestgate.base.errorpages import ERRORS
from nestgate.wire.h1phases import CLOSING, OPEN, PROXY_HEADER
from nestgate.wire.http1 import HTTP1Connection


class ProxyProtocolConnection(HTTP1Connection):
    """A connection on a listener that takes PROXY protocol v1/v2 headers, read here
    before httptools sees a byte. Only peers in the listener's `proxy_protocol_from`
    may send one (the header is optional for them); anyone else sending one gets 400."""

    first_phase = PROXY_HEADER
    _pp_buf = b""

    def data_received(self, data: bytes) -> None:
        if self.phase != PROXY_HEADER:
            return HTTP1Connection.data_received(self, data)
        buf = self._pp_buf + data
        try:
            parsed = take_proxy_header(buf, self.peer, self.ctx.proxy_protocol_from)
        except ProxyHeaderError:
            return self._refuse()
        if parsed is None:
            self._pp_buf = buf
            return
        consumed, source = parsed
        self._enter(OPEN)
        self._pp_buf = b""
        if source:
            self.set_client(source)
            if self.ctx.bans is not None and self.ctx.bans.refuses(self):
                self._enter(CLOSING)
                return
        if len(buf) > consumed:
            HTTP1Connection.data_received(self, buf[consumed:])

    def _refuse(self) -> None:
        self._enter(CLOSING)
        if not self._closing_transport():
            self.write_closing(ERRORS[400])
