"""Installing a certificate another tool obtained (certbot, acme.sh, lego): checked,
stored under the name's lock, and swapped in like a renewal. Used by
`nestgate cert install` and the admin API's `PUT /v1/certificates/{name}`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from nestgate.certs.manager import managed_certificates, storage_of
from nestgate.certs.storage import describe

LOCK_WAIT = 30.0


@dataclass(frozen=True)
class Installed:
    name: str
    status: int                # 200 installed, 404 not a managed name, 409 locked,
                               # 422 refused, 503 shared state unreachable
    problem: str = ""
    not_after: float = 0.0
    kinds: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status == 200


def when(t: float) -> str:
    """A Unix time as people read it in `cert` output; "-" for none."""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t)) if t else "-"


def install_problem(name: str, chain_pem: bytes, key_pem: bytes, current) -> str:
    """Why a certificate another tool obtained cannot replace `current` ("" if it can)."""
    try:
        chain = x509.load_pem_x509_certificates(chain_pem)
    except ValueError as exc:
        return f"the certificate is not PEM certificates ({exc})"
    try:
        key = serialization.load_pem_private_key(key_pem, None)
    except (ValueError, TypeError) as exc:
        return f"the key is not an unencrypted PEM private key ({exc})"
    leaf = chain[0]
    if not isinstance(key, (ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey)) or \
            key.public_key().public_numbers() != leaf.public_key().public_numbers():
        return "the key does not belong to the first certificate in the chain"
    now = time.time()
    not_before = leaf.not_valid_before_utc.timestamp()
    not_after = leaf.not_valid_after_utc.timestamp()
    if not_after <= now:
        return f"the certificate expired on {when(not_after)}"
    if not_before > now + 300:
        return f"the certificate is not valid before {when(not_before)}"
    names = describe(chain_pem)[3]
    wildcard = "*" + name[name.find("."):] if "." in name else ""
    if name not in names and wildcard not in names:
        return f"the certificate is for {', '.join(names) or 'no DNS name'}, not {name}"
    for child, parent in zip(chain, chain[1:]):
        try:
            child.verify_directly_issued_by(parent)
        except (ValueError, TypeError, InvalidSignature):
            return (f"the chain is broken: {child.subject.rfc4514_string()} is not signed "
                    "by the certificate after it")
    if current is not None and not_after < current.not_after:
        return (f"it expires {when(not_after)}, earlier than the certificate it would "
                f"replace ({when(current.not_after)})")
    return ""


def install_certificate(config, name: str, chain_pem: bytes, key_pem: bytes,
                        source: str = "") -> Installed:
    """Store `chain_pem`/`key_pem` for `name` on every listener certificate that
    manages the name (`installed = true`, or an ACME or local one it then replaces
    until its next renewal)."""
    name = name.lower().rstrip(".")
    kinds = tuple(sorted({m.kind for m in managed_certificates(config) if m.name == name}))
    if not kinds:
        return Installed(name, 404, f"not a name of a [[listen.certificate]] with "
                                    f"installed = true (or acme, internal) in {config.source}")
    storage = storage_of(config)
    storage.ensure()
    share_errors = storage.share.errors if storage.share else ()
    try:
        return _install(storage, config, name, kinds, chain_pem, key_pem, source)
    except share_errors as exc:
        return Installed(name, 503, f"the shared state (Redis) cannot be reached: {exc}")


def _install(storage, config, name, kinds, chain_pem, key_pem, source) -> Installed:
    for kind in kinds:
        with storage.lock(kind, name, wait=LOCK_WAIT) as mine:
            if not mine:
                return Installed(name, 409, "another process holds its lock (an order "
                                            "in progress); try again")
            problem = install_problem(name, chain_pem, key_pem, storage.load(kind, name))
            if problem:
                return Installed(name, 422, problem)
            storage.save(kind, name, chain_pem, key_pem, installed_from=source,
                         directory=config.acme.directory if kind == "acme" else "")
    return Installed(name, 200, not_after=storage.load(kinds[0], name).not_after, kinds=kinds)
