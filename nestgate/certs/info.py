"""What the configured certificates say about themselves: names and expiry, for the
management API (`/v1/ready`, `/metrics`). Read when a config is loaded, not per request.
"""

from __future__ import annotations


def certificate_expiry(config) -> list[dict]:
    """One entry per `[[listen.certificate]]`: the listener, the file, the names it is
    served for, and when its leaf certificate expires (Unix time), or why it could not
    be read."""
    found = []
    for listener in config.listeners:
        for cert in listener.certificates:
            if cert.managed:
                found += _managed_entries(config, listener, cert)
                continue
            entry = {"listener": f"{listener.host}:{listener.port}", "file": cert.cert,
                     "names": list(cert.names)}
            # cryptography (10 MB) only for configs with certificate files.
            from cryptography import x509
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


def _managed_entries(config, listener, cert) -> list[dict]:
    """A certificate nestgate obtains (or `cert install` stored): one entry per name,
    from storage, with the last failed attempt's reason and the consecutive failures."""
    from nestgate.certs.manager import storage_of
    storage = storage_of(config)
    entries = []
    for name in cert.names:
        stored = storage.load(cert.managed, name)
        meta = storage.meta(cert.managed, name)
        entry = {"listener": f"{listener.host}:{listener.port}",
                 "file": str(storage.folder(cert.managed, name) / "fullchain.pem"),
                 "names": [name], "source": cert.managed,
                 "failures": meta.get("failures", 0)}
        if stored is not None:
            entry["not_after"] = stored.not_after
            entry["issuer"] = stored.issuer
        if meta.get("last_error"):
            entry["error"] = meta["last_error"]
        elif stored is None:
            entry["error"] = "not obtained yet"
        entries.append(entry)
    return entries


def certificate_stamp(config) -> int:
    """Changes whenever managed certificates change in storage (0 when there are none)."""
    if not any(c.managed for listener in config.listeners for c in listener.certificates):
        return 0
    from nestgate.certs.manager import storage_of
    return storage_of(config).stamp()
