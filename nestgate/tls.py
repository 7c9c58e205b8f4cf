"""TLS server contexts: certificates per listener chosen by SNI, ALPN offered.

Built in the supervisor at load time (so `check` and reload catch a bad key) and
inherited by the forked workers. ALPN offers h2 (unless the listener sets
`http2 = false`) and http/1.1; the worker picks the protocol from what ALPN selected.
"""

from __future__ import annotations

import ssl

ALPN_HTTP1 = ["http/1.1"]
ALPN_HTTP2 = ["h2", "http/1.1"]


def _context(cert: str, key: str, alpn=ALPN_HTTP1) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    ctx.set_alpn_protocols(alpn)
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
    # Session tickets stay on (OpenSSL's default, two per TLS 1.3 handshake): the
    # context is made by the supervisor before it forks, so every worker has the same
    # ticket keys and a returning browser resumes on whichever worker it reaches.
    return ctx


def server_context(listener) -> ssl.SSLContext:
    """The listener's default context; others are switched in by SNI."""
    alpn = ALPN_HTTP2 if listener.http2 else ALPN_HTTP1
    contexts = [_context(c.cert, c.key, alpn) for c in listener.certificates]
    default = contexts[0]
    exact: dict[str, ssl.SSLContext] = {}
    wildcard: dict[str, ssl.SSLContext] = {}
    for cert, ctx in zip(listener.certificates, contexts):
        for name in cert.names:
            name = name.lower().rstrip(".")
            if name.startswith("*."):
                wildcard.setdefault(name[1:], ctx)
            else:
                exact.setdefault(name, ctx)

    if len(contexts) > 1:
        def choose(ssl_object, server_name, _initial):
            if server_name:
                name = server_name.lower().rstrip(".")
                chosen = exact.get(name)
                if chosen is None and "." in name:
                    chosen = wildcard.get(name[name.index("."):])
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
