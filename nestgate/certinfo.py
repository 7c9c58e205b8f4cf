"""What the configured certificates say about themselves: names and expiry, for the
management API (`/v1/ready`, `/metrics`). Read when a config is loaded, not per request.
"""

from __future__ import annotations

from cryptography import x509


def certificate_expiry(config) -> list[dict]:
    """One entry per `[[listen.certificate]]`: the listener, the file, the names it is
    served for, and when its leaf certificate expires (Unix time), or why it could not
    be read."""
    found = []
    for listener in config.listeners:
        for cert in listener.certificates:
            entry = {"listener": f"{listener.host}:{listener.port}", "file": cert.cert,
                     "names": list(cert.names)}
            try:
                with open(cert.cert, "rb") as f:
                    leaf = x509.load_pem_x509_certificate(f.read())   # the first in the chain
            except (OSError, ValueError) as exc:
                entry["error"] = str(exc)
            else:
                entry["not_after"] = leaf.not_valid_after_utc.timestamp()
                if not entry["names"]:
                    try:
                        san = leaf.extensions.get_extension_for_class(
                            x509.SubjectAlternativeName)
                        entry["names"] = san.value.get_values_for_type(x509.DNSName)
                    except x509.ExtensionNotFound:
                        pass
            found.append(entry)
    return found
