"""QUIC for HTTP/3: the worker's UDP listener (`QuicListener`, `serve_quic`) and the
certificates its handshakes present, chosen by server name (`QuicCertificates`). Each
new QUIC connection gets an `nestgate.wire.http3.HTTP3Connection`, the HTTP/3 adapter.

A TLS listener with `http3 = true` has, beside its TCP socket, one UDP socket per
worker slot, all bound by the supervisor to the listener's port with SO_REUSEPORT
(nestgate.server.supervisor): the kernel hashes a client's address to one of them, so the
datagrams of a QUIC connection keep reaching the one worker that knows it. In that
worker aioquic's `QuicServer` (here `QuicListener`) reads the socket and keeps an
`HTTP3Connection` per QUIC connection, found by connection id.

A client whose address changes (Wi-Fi to mobile data, a NAT rebinding) keeps its
connection ids, but the kernel hashes its new address, perhaps to another worker's
socket. That worker knows none of the ids: aioquic drops the datagrams (it sends no
stateless reset), the connection goes silent and the client, once its probes or its
idle timeout give up, opens a new one (a browser goes on over HTTP/2 meanwhile). A new
address that hashes to the same worker is followed as RFC 9000 section 9 says, and is
the connection's client once validated (`HTTP3Connection._judged_where_it_is`).

Stopping (a reload, a stop): the worker's listener takes no new connection, the open
ones finish their streams and close with H3_NO_ERROR, for at most `shutdown_timeout`.
The new worker of the same slot reads the same socket meanwhile, so some datagrams of
the old connections reach it and are dropped; QUIC resends them.
"""

from __future__ import annotations

from aioquic.asyncio.server import QuicServer
from aioquic.buffer import Buffer
from aioquic.h3.connection import H3_ALPN
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.packet import pull_quic_header
from aioquic.tls import load_pem_x509_certificates, pull_client_hello
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from nestgate.certs.book import CertificateBook, by_name
from nestgate.wire.http3 import HTTP3Connection


def _credentials(cert_file: str, key_file: str):
    """A certificate/key pair in aioquic's form: (certificate, chain, private key)."""
    with open(cert_file, "rb") as chain_file, open(key_file, "rb") as key_pem:
        chain = load_pem_x509_certificates(chain_file.read())
        key = load_pem_private_key(key_pem.read(), password=None)
    return chain[0], chain[1:], key


class QuicCertificates:
    """A listener's certificates for QUIC handshakes, chosen by server name as its TLS
    handshakes choose them (nestgate.wire.tls): PEM files by their names, managed ones from
    the same storage through a `CertificateBook` that the worker's tick refreshes, so a
    renewal reaches HTTP/3 when it reaches TLS."""

    def __init__(self, listener, tls_book) -> None:
        self.exact: dict = {}
        self.wildcard: dict = {}
        self.default = None
        for cert in listener.certificates:
            if cert.managed:
                continue
            chosen = _credentials(cert.cert, cert.key)
            self.default = self.default or chosen
            for name in cert.names:
                name = name.lower().rstrip(".")
                if name.startswith("*."):
                    self.wildcard.setdefault(name[1:], chosen)
                else:
                    self.exact.setdefault(name, chosen)
        self.book = None
        if tls_book is not None:
            self.book = CertificateBook(tls_book.storage, tls_book.managed, _credentials)
            self.book.refresh()

    def choose(self, server_name: str | None):
        chosen = by_name(server_name, self.exact, self.wildcard)
        if chosen is None and self.book is not None and (server_name or not self.default):
            chosen = self.book.choose(server_name)
        return chosen or self.default


def configuration(limits) -> QuicConfiguration:
    return QuicConfiguration(is_client=False, alpn_protocols=H3_ALPN,
                             idle_timeout=limits.keepalive_timeout)


class QuicListener(QuicServer):
    """aioquic's server on one worker's UDP socket; once stopping, it starts no new
    connection (their datagrams are dropped: the client tries again, and reaches the
    new worker of this slot, which reads the same socket)."""

    draining = False

    def datagram_received(self, data, addr) -> None:
        if self.draining:
            try:
                header = pull_quic_header(
                    Buffer(data=data), host_cid_length=self._configuration.connection_id_length)
            except ValueError:
                return
            if header.destination_cid not in self._protocols:
                return
        QuicServer.datagram_received(self, data, addr)


def choose_certificate_by_name(quic, certificates: QuicCertificates) -> None:
    """aioquic takes one certificate from its configuration; the one for the client's
    server name is put in its place as the ClientHello is read, before it is used."""
    initialize = quic._initialize

    def initialize_then_pick(peer_cid: bytes) -> None:
        initialize(peer_cid)
        tls = quic.tls
        handle_hello = tls._server_handle_hello

        def pick(input_buf, initial_buf, handshake_buf):
            start_at = input_buf.tell()
            name = pull_client_hello(input_buf).server_name
            input_buf.seek(start_at)
            chosen = certificates.choose(name)
            if chosen is not None:
                tls.certificate, tls.certificate_chain, tls.certificate_private_key = chosen
            return handle_hello(input_buf, initial_buf, handshake_buf)

        tls._server_handle_hello = pick

    quic._initialize = initialize_then_pick


def grant_credit_as_delivered(quic) -> None:
    """Receive windows that move with the bytes aioquic has passed on in order.

    aioquic doubles a stream's window (MAX_STREAM_DATA) once the client has sent past
    half of it, and the connection's (MAX_DATA) likewise, by the highest offset seen:
    whether the bytes before it came or not. A client that never sends a stream's first
    byte and one byte at the far end of each window it is granted has aioquic hold the
    hole, zero-filled, waiting for the bytes that would fill it: the window, and the
    worker, doubled each round trip (+890 MB from about ten one-byte frames). Here a
    stream may send `max_stream_data` past what aioquic has delivered in order, and a
    connection `max_data` past what its streams have delivered, so what aioquic holds
    out of order is at most `max_data` per connection. What it delivers goes on to the
    HTTP/3 layer, which holds no more than a head (nestgate.wire.http3) or a body up
    to `max_body`."""
    stream_window = quic._configuration.max_stream_data
    connection_window = quic._configuration.max_data
    write_stream_limits = quic._write_stream_limits
    write_connection_limits = quic._write_connection_limits

    def stream_limits(builder, space, stream) -> None:
        receiver = stream.receiver
        granted = receiver.starting_offset() + stream_window
        if stream.max_stream_data_local and \
                granted - stream.max_stream_data_local >= stream_window // 2:
            stream.max_stream_data_local = granted       # in halves, not every packet
        # aioquic's own method sends the new limit; its doubling is kept from acting
        # by a highest offset of 0 for the time of the call.
        highest, receiver.highest_offset = receiver.highest_offset, 0
        try:
            write_stream_limits(builder, space, stream)
        finally:
            receiver.highest_offset = highest

    def connection_limits(builder, space) -> None:
        max_data = quic._local_max_data
        used = max_data.used              # bytes up to each stream's highest offset
        if used * 2 > max_data.value:     # where aioquic would double it
            held = sum(s.receiver.highest_offset - s.receiver.starting_offset()
                       for s in quic._streams.values())
            granted = used - held + connection_window
            if granted - max_data.value >= connection_window // 2:
                max_data.value = granted
        max_data.used = 0
        try:
            write_connection_limits(builder, space)
        finally:
            max_data.used = used

    quic._write_stream_limits = stream_limits
    quic._write_connection_limits = connection_limits


async def serve_quic(ctx, listener, sock, tls_book):
    """Serve HTTP/3 on this worker's UDP socket of `listener`: the `QuicListener`, whose
    `certificates.book` the worker refreshes with the others."""
    certificates = QuicCertificates(listener, tls_book)
    config = configuration(ctx.limits)
    config.certificate, config.certificate_chain, config.private_key = \
        certificates.choose(None) or (None, [], None)

    def connection(quic, stream_handler=None):
        choose_certificate_by_name(quic, certificates)
        grant_credit_as_delivered(quic)
        return HTTP3Connection(ctx, quic, stream_handler)

    _transport, server = await ctx.loop.create_datagram_endpoint(
        lambda: QuicListener(configuration=config, create_protocol=connection), sock=sock)
    server.certificates = certificates
    return server
