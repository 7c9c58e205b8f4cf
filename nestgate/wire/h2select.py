"""Which protocol a connection speaks, chosen before any request: on a TLS listener by
ALPN (`ALPNSwitch`), on a plain one with `http2_cleartext = true` by the client's first
bytes (`PriorKnowledge`). Each hands the transport to an `HTTP2Connection` or to the
listener's HTTP/1.1 protocol, and is gone. (asyncio.Protocol's callbacks that do
nothing stand for those that are not reached or have nothing to do before then.)
"""

from __future__ import annotations

import asyncio

from nestgate.wire import h2engine as engine
from nestgate.wire.http2 import HTTP2Connection


class ALPNSwitch(asyncio.Protocol):
    """Starts every TLS connection; becomes HTTP/2 or HTTP/1.1 as ALPN decided."""

    def __init__(self, ctx, http1_factory) -> None:
        self.ctx = ctx
        self.http1_factory = http1_factory

    def connection_made(self, transport) -> None:
        ssl_object = transport.get_extra_info("ssl_object")
        chosen = ssl_object.selected_alpn_protocol() if ssl_object is not None else None
        protocol = HTTP2Connection(self.ctx) if chosen == "h2" else self.http1_factory()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)

    def data_received(self, data) -> None:  # not reached: replaced in connection_made
        raise RuntimeError("ALPNSwitch received data before choosing a protocol")


class PriorKnowledge(asyncio.Protocol):
    """Starts every connection of a plain listener with `http2_cleartext = true`: a
    client whose first bytes are the HTTP/2 connection preface speaks HTTP/2 in clear
    ("h2c" with prior knowledge, RFC 9113 3.3), any other HTTP/1.1. Counted among the
    worker's connections from the accept, and closed if the first bytes take
    `header_timeout`, as a request head would be."""

    served = 0                         # no request yet (for the worker's figures)
    bytes_in = bytes_out = 0
    protocol = ""                      # none chosen yet (the figures count a handshake)

    def __init__(self, ctx, http1_factory) -> None:
        self.ctx = ctx
        self.http1_factory = http1_factory
        self.transport = None
        self._seen = b""
        self._age = 0.0

    def connection_made(self, transport) -> None:
        self.transport = transport
        if len(self.ctx.connections) >= self.ctx.limits.max_connections:
            transport.close()
            return
        self.ctx.connections.add(self)

    def data_received(self, data: bytes) -> None:
        seen = self._seen + data
        if len(seen) < len(engine.PREFACE) and engine.PREFACE.startswith(seen):
            self._seen = seen
            return                     # not sure yet
        self.ctx.connections.discard(self)
        protocol = HTTP2Connection(self.ctx) if seen.startswith(engine.PREFACE) \
            else self.http1_factory()
        self.transport.set_protocol(protocol)
        protocol.connection_made(self.transport)
        if not self.transport.is_closing():
            protocol.data_received(seen)

    def connection_lost(self, exc) -> None:
        self.ctx.connections.discard(self)

    def tick(self, elapsed: float) -> None:
        self._age += elapsed
        if self._age >= self.ctx.limits.header_timeout and not self.transport.is_closing():
            self.transport.close()

    def finish_and_close(self) -> None:
        self.transport.close()         # no request has begun
