"""The worker's side of managed certificates: which context a handshake gets.

A listener with managed certificates has a `CertificateBook`: name -> SSLContext for
every certificate in storage, rebuilt when the storage's `changed` stamp moves (the
worker's tick looks once a second, a stat(2)), so a renewed certificate serves new
handshakes within seconds on every worker, with no reload; open connections keep
the certificate they started with. The listener's default context stays the one the
supervisor made before forking, so session tickets resume on any worker.

During a TLS-ALPN-01 validation, `alpn_challenges` holds a context per name being
validated; the handshake stage reads the ClientHello first and uses it only for a
client offering nothing but `acme-tls/1` for that name (nestgate.certs.clienthello).
"""

from __future__ import annotations

import ssl
import time

ACME_TLS_ALPN = "acme-tls/1"


def by_name(name: str | None, exact: dict, wildcard: dict):
    """What `exact` holds for a server name, else what `wildcard` holds for its parent
    (".example.com" for "a.example.com"), else None."""
    if not name:
        return None
    name = name.lower().rstrip(".")
    chosen = exact.get(name)
    if chosen is None and "." in name:
        chosen = wildcard.get(name[name.index("."):])
    return chosen


class CertificateBook:
    def __init__(self, storage, managed: list[tuple[str, str]], make_context) -> None:
        self.storage = storage
        self.managed = managed              # (kind, name) served on this listener
        self.make_context = make_context    # (cert file, key file) -> SSLContext
        self.exact: dict[str, ssl.SSLContext] = {}
        self.wildcard: dict[str, ssl.SSLContext] = {}
        self.fallback: ssl.SSLContext | None = None    # no SNI, or a name not served
        self.alpn_challenges: dict[str, ssl.SSLContext] = {}
        self.stamp = -1
        self.not_after: dict[str, float] = {}          # for the figures: name -> expiry

    def refresh(self) -> bool:
        """Load what storage holds now, if it changed; whether anything was reloaded."""
        stamp = self.storage.stamp()
        if stamp == self.stamp:
            return False
        self.stamp = stamp
        exact, wildcard, not_after = {}, {}, {}
        fallback = None
        now = time.time()
        for kind, name in self.managed:
            folder = self.storage.folder(kind, name)
            stored = self.storage.load(kind, name)
            if stored is None or stored.not_after <= now:
                continue
            try:
                context = self.make_context(str(folder / "fullchain.pem"),
                                            str(folder / "key.pem"))
            except (ssl.SSLError, OSError):
                continue                     # mid-replacement: the next tick tries again
            if name.startswith("*."):
                wildcard[name[1:]] = context
            else:
                exact[name] = context
            not_after[name] = stored.not_after
            fallback = fallback or context
        challenges = {}
        for name, path in self.storage.alpn_challenges().items():
            try:
                context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                context.load_cert_chain(str(path))
                context.set_alpn_protocols([ACME_TLS_ALPN])
            except (ssl.SSLError, OSError):
                continue
            challenges[name] = context
        self.exact, self.wildcard, self.fallback = exact, wildcard, fallback
        self.alpn_challenges, self.not_after = challenges, not_after
        return True

    def choose(self, name: str | None) -> ssl.SSLContext | None:
        return by_name(name, self.exact, self.wildcard) or self.fallback

    def challenge_for(self, server_name: str | None, alpn: list[str]) -> ssl.SSLContext | None:
        """The TLS-ALPN-01 context for a ClientHello, when it is the CA's."""
        if not server_name or alpn != [ACME_TLS_ALPN]:
            return None
        return self.alpn_challenges.get(server_name.lower().rstrip("."))
