"""The TLS handshake as a stage of its own, and PROXY headers before it.

Every TLS listener's server accepts in clear and each connection starts as a
`TLSHandshake`: it is counted among the worker's connections from the accept (so
`max_connections` covers connections that are still handshaking, and one past the
limit is closed at once), the worker's tick closes it once it has taken
`header_timeout` (nginx bounds its handshake by `client_header_timeout`), and it
upgrades the connection with `loop.start_tls`, then hands the TLS transport to the
listener's usual protocol (the ALPN switch or HTTP/1.1). Left to the event loop, a
handshake would have uvloop's own deadline (60 s) and be counted nowhere until it
ended.

Load balancers (HAProxy `send-proxy`, AWS NLB) write a PROXY header before the
client's first TLS byte. On a listener that takes them the connection starts as a
`ProxyThenTLS`, which first reads the header under the plain listener's rules
(`clientip.take_proxy_header`: only trusted peers may send one, optional for them)
and hands over with the client the header named. The header and the handshake share
`header_timeout`.

Bytes read after the header are the start of the ClientHello, and `start_tls` takes
no bytes already read. They are replayed into the TLS protocol it installs from a
callback scheduled before its own (that protocol's `connection_made`, then the
transport's `resume_reading`), so they are the first bytes it sees and the socket
is read again only after them.

When the handshake starts with nothing read yet (no PROXY header, no ClientHello read
for a TLS-ALPN-01 validation), TLS runs on the socket itself (`nestgate.wire.tlssocket`):
the descriptor is taken from the loop's TCP transport and wrapped in an SSLSocket,
cheaper per request than the loop's memory-buffer TLS. `start_tls` serves the other
cases, and all of them when NESTGATE_LOOP_TLS=1 is set in the environment (for
comparison, or should an environment's sockets not allow it).

Before either TLS reads it, the first record of the ClientHello is looked at: a client
whose ALPN offer has nothing in common with the listener's is answered with the
no_application_protocol alert (`check_hello`, nestgate.wire.tls.refuses_alpn) and closed.
On the loop's TLS the record is read here and replayed, as after a PROXY header; on
the socket's, TLSSocketTransport peeks at it.

Nothing else is ever answered here: with no TLS yet there is no one to say 400 or 503
to, so a refused header, a connection past the limit or a failed handshake is closed.
"""

from __future__ import annotations

import asyncio
import os

from nestgate.wire import tlssocket
from nestgate.certs.clienthello import MAX_HELLO, NotClientHello, parse_client_hello
from nestgate.base.clientip import ProxyHeaderError, take_proxy_header
from nestgate.wire.tls import NO_APPLICATION_PROTOCOL_ALERT, refuses_alpn


# TLS on the socket (nestgate.wire.tlssocket) unless told to leave TLS to the event loop.
SOCKET_TLS = os.environ.get("NESTGATE_LOOP_TLS", "") in ("", "0")


class TLSHandshake(asyncio.Protocol):
    """One connection until its TLS handshake is done. Also the protocol `start_tls`
    reports to until the hand-over, keeping any application data that comes early."""

    served = 0                         # no request yet (for the worker's figures)
    bytes_in = bytes_out = 0           # nor HTTP bytes: the handshake's are not counted
    protocol = ""                      # none chosen yet (the figures count a handshake)

    def __init__(self, ctx, sslcontext, protocol_factory) -> None:
        self.ctx = ctx
        self.sslcontext = sslcontext
        self.protocol_factory = protocol_factory   # the listener's usual TLS protocol
        self.transport = None          # TCP; the worker aborts it at the end of a stop
        self.peer = ""
        self.source = None             # the client a PROXY header named
        self._hello = None             # ClientHello bytes read in clear, until start_tls
        self._early = b""              # application data before the hand-over
        self._age = 0.0
        self._task = None              # kept here: the loop holds its tasks weakly
        self._on_socket = False        # the descriptor went to a TLSSocketTransport

    def connection_made(self, transport) -> None:
        self.transport = transport
        ctx = self.ctx
        self.peer = ctx.client_address(transport.get_extra_info("peername"))
        if len(ctx.connections) >= ctx.limits.max_connections:
            transport.close()          # overload; no TLS yet to say 503 with
            return
        if ctx.bans is not None and ctx.bans.closes(self.peer):
            transport.close()          # banned (nestgate.bans): no handshake at all
            return
        ctx.connections.add(self)
        self.accepted()

    def accepted(self) -> None:
        """The connection is counted: the handshake begins."""
        self.handshake(b"")

    _peeking = False                   # reading the ClientHello in clear first

    def handshake(self, hello: bytes) -> None:
        """Upgrade to TLS; `hello` is the start of the ClientHello, already read."""
        book = self.ctx.certificate_book
        if not self._peeking and ((book is not None and book.alpn_challenges)
                                  or hello or not SOCKET_TLS):
            # See what this client offers first: a pending TLS-ALPN-01 validation, or
            # its ALPN protocols, which the loop's TLS would not refuse by itself (on
            # the socket's TLS, TLSSocketTransport shows them to `check_hello`).
            self._peeking = True
            self._hello = hello
            self._peek()
            return
        if not hello and SOCKET_TLS and self._start_on_socket():
            return
        self._hello = hello
        # The rest is for the TLS protocol. (uvloop starts reading after
        # connection_made even so: what comes until start_tls is kept in `_hello`.)
        self.transport.pause_reading()
        self._task = self.ctx.loop.create_task(self._start_tls())

    def _start_on_socket(self) -> bool:
        """TLS on the descriptor itself; False when the transport cannot give it."""
        tcp = self.transport
        if tcp.is_closing():
            return False
        sock = tlssocket.adopt(self.ctx.loop, tcp, self.sslcontext)
        if sock is None:
            return False
        self._on_socket = True        # the TCP transport's end is not the connection's
        self.transport = tlssocket.TLSSocketTransport(self.ctx.loop, sock, self)
        return True

    def handshake_done(self, tls) -> None:
        """From the TLSSocketTransport: hand the connection to the usual protocol."""
        self.ctx.connections.discard(self)
        self._hand_over(tls)
        self.transport = self.protocol_factory = None

    def handshake_failed(self) -> None:
        """From the TLSSocketTransport: the handshake failed or was cut (closed)."""
        self.ctx.connections.discard(self)
        self.transport = self.protocol_factory = None

    def _peek(self) -> None:
        try:
            parsed = parse_client_hello(self._hello)
        except NotClientHello:
            parsed = (None, [])
        if parsed is None and len(self._hello) < MAX_HELLO:
            return                     # the rest of the record is on its way
        book = self.ctx.certificate_book
        challenge = book.challenge_for(*parsed) if parsed and book is not None else None
        hello, self._hello = self._hello, None
        if challenge is not None:
            self.sslcontext = challenge    # the CA's validation handshake
        else:
            alert = self._refusal(parsed)
            if alert is not None:
                self.transport.write(alert)
                self.transport.close()
                return
        self.handshake(hello)

    def check_hello(self, hello: bytes) -> bytes | None:
        """From the TLSSocketTransport, before the handshake: the alert that refuses
        this ClientHello (its first record), or None to go on."""
        try:
            return self._refusal(parse_client_hello(hello))
        except NotClientHello:
            return None                # OpenSSL will say what is wrong with it

    def _refusal(self, parsed) -> bytes | None:
        if parsed is not None and refuses_alpn(parsed[1], self.ctx.alpn_protocols):
            return NO_APPLICATION_PROTOCOL_ALERT
        return None

    def data_received(self, data: bytes) -> None:
        if self._hello is not None:    # the ClientHello, before start_tls took over
            self._hello += data
            if self._peeking and self._task is None:
                self._peek()
        else:                          # from the TLS transport (asyncio hands it early)
            self._early += data

    async def _start_tls(self) -> None:
        loop, tcp = self.ctx.loop, self.transport
        tls = None
        hello, self._hello = self._hello, None
        if not tcp.is_closing():        # not gone since the accept or the header
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
            bans = self.ctx.bans
            if bans is not None and bans.refuses(protocol):    # (its ban answers the page)
                self._early = b""
                return
        if self._early and not tls.is_closing():
            protocol.data_received(self._early)
        self._early = b""

    def connection_lost(self, exc) -> None:
        # The TCP connection before the handshake, or the TLS one before the hand-over;
        # not the loop's TCP transport whose descriptor a TLSSocketTransport took.
        if not self._on_socket:
            self.ctx.connections.discard(self)

    def tick(self, elapsed: float) -> None:
        """The worker's tick: the handshake (and any PROXY header) takes at most
        `header_timeout` from the accept."""
        self._age += elapsed
        transport = self.transport
        if self._age >= self.ctx.limits.header_timeout and transport is not None \
                and not transport.is_closing():
            transport.abort()

    def finish_and_close(self) -> None:
        """Graceful stop: nothing to do. The handshake ends within `header_timeout`,
        and the protocol handed over to sees the worker draining itself."""


class ProxyThenTLS(TLSHandshake):
    """A `TLSHandshake` that first reads a PROXY header in clear."""

    _header = b""                      # what has come so far; None once the header is read

    def accepted(self) -> None:
        pass                           # the handshake begins once the header is read

    def data_received(self, data: bytes) -> None:
        if self._header is None:       # from the TLS transport
            return TLSHandshake.data_received(self, data)
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
        if self.source and self.ctx.bans is not None and self.ctx.bans.closes(self.source):
            self.transport.close()     # the client the header named is banned
            return
        self.handshake(buf[consumed:])


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
