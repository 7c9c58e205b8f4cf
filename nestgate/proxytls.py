"""PROXY protocol on TLS listeners: the header arrives in clear, then the handshake.

Load balancers (HAProxy `send-proxy`, AWS NLB) write the PROXY header before the
client's first TLS byte, so such a listener's server accepts in clear and each
connection starts as a `ProxyThenTLS`. It reads the header under the plain
listener's rules (`clientip.take_proxy_header`: only trusted peers may send one,
optional for them), upgrades the same connection with `loop.start_tls`, and hands
the TLS transport to the listener's usual protocol (the ALPN switch or HTTP/1.1)
with the client the header named.

Bytes read after the header are the start of the ClientHello, and `start_tls` takes
no bytes already read. They are replayed into the TLS protocol it installs from a
callback scheduled before its own (that protocol's `connection_made`, then the
transport's `resume_reading`), so they are the first bytes it sees and the socket
is read again only after them.

Until the hand-over the connection sits in the worker's set, and the tick closes
it once the header and the handshake together pass `header_timeout`. Nothing is
ever answered here: with no TLS yet there is no one to say 400 to, so a refused
header or a failed handshake closes the connection.
"""

from __future__ import annotations

import asyncio

from nestgate.clientip import ProxyHeaderError, take_proxy_header


class ProxyThenTLS(asyncio.Protocol):
    """One connection until its TLS handshake is done. Also the protocol `start_tls`
    reports to until the hand-over, keeping any application data that comes early."""

    def __init__(self, ctx, sslcontext, protocol_factory) -> None:
        self.ctx = ctx
        self.sslcontext = sslcontext
        self.protocol_factory = protocol_factory   # the listener's usual TLS protocol
        self.transport = None          # TCP; the worker aborts it at the end of a stop
        self.peer = ""
        self.source = None             # the client the PROXY header named
        self._header = b""             # what has come so far; None once the header is read
        self._early = b""              # application data before the hand-over
        self._age = 0.0
        self._task = None              # kept here: the loop holds its tasks weakly

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.peer = self.ctx.client_address(transport.get_extra_info("peername"))
        self.ctx.connections.add(self)

    def data_received(self, data: bytes) -> None:
        if self._header is None:       # from the TLS transport (asyncio sends it early)
            self._early += data
            return
        buf = self._header + data
        try:
            parsed = take_proxy_header(buf, self.peer, self.ctx.proxy_protocol_from)
        except ProxyHeaderError:
            self.transport.close()
            return
        if parsed is None:
            self._header = buf
            return
        consumed, self.source = parsed
        self._header = None
        self.transport.pause_reading()      # the rest is for the TLS protocol
        self._task = self.ctx.loop.create_task(self._start_tls(buf[consumed:]))

    async def _start_tls(self, hello: bytes) -> None:
        loop, tcp = self.ctx.loop, self.transport
        tls = None
        if not tcp.is_closing():        # not gone since the header came
            if hello:
                loop.call_soon(_replay, tcp, hello)
            try:
                tls = await loop.start_tls(tcp, self, self.sslcontext, server_side=True)
            except OSError:
                pass                    # a failed handshake: start_tls closed the connection
        self.ctx.connections.discard(self)
        if tls is not None and not tls.is_closing():   # else closed by the tick or the peer
            self._hand_over(tls)
        self.transport = self.protocol_factory = self._task = None

    def _hand_over(self, tls) -> None:
        protocol = self.protocol_factory()
        tls.set_protocol(protocol)
        protocol.connection_made(tls)
        protocol = tls.get_protocol()    # the ALPN switch has put HTTP/2 or HTTP/1.1 there
        if self.source:
            protocol.set_client(self.source)
        if self._early and not tls.is_closing():
            protocol.data_received(self._early)
        self._early = b""

    def connection_lost(self, exc) -> None:
        # The TCP connection while reading the header, or the TLS one before the hand-over.
        self.ctx.connections.discard(self)

    def tick(self, elapsed: float) -> None:
        """The worker's tick: the header and the handshake share `header_timeout`."""
        self._age += elapsed
        transport = self.transport
        if self._age >= self.ctx.limits.header_timeout and transport is not None \
                and not transport.is_closing():
            transport.abort()

    def drain(self) -> None:
        """Graceful stop: nothing to do. The header and handshake end within
        `header_timeout`, and the protocol handed over to sees the drain itself."""


def _replay(transport, data: bytes) -> None:
    """Give `data` to the transport's protocol as if the transport had just read it."""
    if transport.is_closing():
        return
    protocol = transport.get_protocol()
    if not hasattr(protocol, "get_buffer"):
        protocol.data_received(data)
        return
    view = memoryview(data)
    while view:
        buf = protocol.get_buffer(len(view))
        n = min(len(buf), len(view))
        buf[:n] = view[:n]
        protocol.buffer_updated(n)
        view = view[n:]
