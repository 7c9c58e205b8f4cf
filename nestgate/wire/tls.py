"""TLS server contexts: certificates per listener chosen by SNI, ALPN offered.

Built in the supervisor at load time (so `check` and reload catch a bad key) and
inherited by the forked workers. ALPN offers h2 (unless the listener sets
`http2 = false`) and http/1.1; the worker picks the protocol from what ALPN selected.
A client whose ALPN offer has none of them is refused with the no_application_protocol
alert, as nginx does (`refuses_alpn`).
"""

from __future__ import annotations

import functools
import socket
import ssl

ALPN_HTTP1 = ["http/1.1"]
ALPN_HTTP2 = ["h2", "http/1.1"]
# SSL_OP_ENABLE_KTLS (OpenSSL 3), named `ssl.OP_ENABLE_KTLS` from Python 3.12 on.
OP_ENABLE_KTLS = getattr(ssl, "OP_ENABLE_KTLS", 1 << 3)
_TCP_ULP = getattr(socket, "TCP_ULP", 31)


@functools.cache
def kernel_tls_problem() -> str:
    """"" when this kernel can take TLS records over (its `tls` module answers a
    socket asking for it), else why it cannot. Asked once, at start."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(1)
        with socket.create_connection(listening.getsockname(), timeout=2) as probe:
            accepted, _ = listening.accept()
            accepted.close()
            try:
                probe.setsockopt(socket.IPPROTO_TCP, _TCP_ULP, b"tls")
            except OSError as exc:
                return f"the kernel offers no TLS (its tls module: {exc.strerror})"
    return ""


# A fatal alert record, no_application_protocol (RFC 7301 3.2), sent in clear in
# answer to a ClientHello: content type 21 (alert), record version 3.3, two bytes,
# level 2 (fatal), description 120.
NO_APPLICATION_PROTOCOL_ALERT = bytes([21, 3, 3, 0, 2, 2, 120])


def refuses_alpn(offered, ours) -> bool:
    """True when a client offers ALPN protocols and none of them is one of `ours`: it
    gets NO_APPLICATION_PROTOCOL_ALERT. No offer at all is HTTP/1.1, as ever.

    Why not in OpenSSL: Python's `ssl` selects ALPN in its own callback, which answers
    "nothing in common" by going on without a protocol (SSL_TLSEXT_ERR_NOACK) and has
    no way to make it the fatal alert nginx sends; the SNI callback, which can end a
    handshake with an alert, does not see what the client offered. So the first record
    of the ClientHello is read in clear before the handshake (nestgate.wire.proxytls,
    nestgate.wire.tlssocket) and judged here."""
    return bool(offered) and not any(protocol in ours for protocol in offered)


def _base_context(alpn) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(alpn)
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
    if not kernel_tls_problem():
        # OpenSSL moves each connection's records into the kernel after the handshake
        # where it can (cipher and kernel permitting); it needs TLS on the socket
        # itself, which nestgate.wire.tlssocket gives it. Otherwise the usual path.
        ctx.options |= OP_ENABLE_KTLS
    # Session tickets stay on (OpenSSL's default, two per TLS 1.3 handshake): the
    # context is made by the supervisor before it forks, so every worker has the same
    # ticket keys and a returning browser resumes on whichever worker it reaches.
    return ctx


def _context(cert: str, key: str, alpn=ALPN_HTTP1) -> ssl.SSLContext:
    ctx = _base_context(alpn)
    ctx.load_cert_chain(cert, key)
    return ctx


def alpn_protocols(listener) -> list[str]:
    """What the listener offers by ALPN, in its order of preference."""
    return ALPN_HTTP2 if listener.http2 else ALPN_HTTP1


def server_context(listener, storage=None) -> ssl.SSLContext:
    """The listener's default context; others are switched in by SNI. Certificates
    nestgate manages (nestgate.certs) come from `storage` through the context's
    `certificate_book`, which the worker refreshes while serving."""
    alpn = alpn_protocols(listener)
    files = [c for c in listener.certificates if not c.managed]
    contexts = [_context(c.cert, c.key, alpn) for c in files]
    exact: dict[str, ssl.SSLContext] = {}
    wildcard: dict[str, ssl.SSLContext] = {}
    for cert, ctx in zip(files, contexts):
        for name in cert.names:
            name = name.lower().rstrip(".")
            if name.startswith("*."):
                wildcard.setdefault(name[1:], ctx)
            else:
                exact.setdefault(name, ctx)
    managed = [(c.managed, name) for c in listener.certificates if c.managed
               for name in c.names]
    book = None
    if managed:
        from nestgate.certs.book import CertificateBook
        book = CertificateBook(storage, managed, lambda cert, key: _context(cert, key, alpn))
        book.refresh()
        # Made here, before the fork, with no certificate of its own: its session
        # ticket keys are the ones every worker's handshakes use.
        default = contexts[0] if contexts else _base_context(alpn)
        default.certificate_book = book
    else:
        default = contexts[0]

    if len(contexts) > 1 or book is not None:
        def choose(ssl_object, server_name, _initial):
            chosen = None
            if server_name:
                name = server_name.lower().rstrip(".")
                chosen = exact.get(name)
                if chosen is None and "." in name:
                    chosen = wildcard.get(name[name.index("."):])
            if chosen is None and book is not None and (server_name or not contexts):
                chosen = book.choose(server_name)
            if chosen is not None and chosen is not ssl_object.context:
                ssl_object.context = chosen
            return None

        default.sni_callback = choose
    return default


def certificate_problem(certificate) -> str:
    """Why a certificate/key pair cannot be loaded, or "" when it can."""
    try:
        _context(certificate.cert, certificate.key)
    except (ssl.SSLError, OSError) as exc:
        return str(exc)
    return ""
