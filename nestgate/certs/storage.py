"""The certificate storage folder: what the issuing process writes and every worker
(and every instance sharing the folder) reads.

    certificates/<issuer>/<name>/fullchain.pem, key.pem, meta.json
    accounts/<directory>/account-key.pem, account.json
    challenges/http/<token>           HTTP-01 key authorizations being validated
    challenges/tls-alpn/<name>.pem    TLS-ALPN-01 certificate and key being validated
    internal-ca/root.pem, root-key.pem
    locks/<issuer>-<name>.lock        held while that certificate is being ordered
    changed                           touched after every change workers must see

Private keys are written 0600 and every file is replaced whole (a temporary file
renamed over it), so a reader never sees half a certificate and a failed write
leaves the old one serving. The lock is flock(2) on a file of its own: two
processes, or two nestgate instances sharing the folder, never order one name at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from nestgate.base.files import replace_file
from nestgate.base.private import PRIVATE_FILE, make_private_folders

PRIVATE = PRIVATE_FILE


TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def _is_token(token: str) -> bool:
    """An ACME token: base64url characters only (RFC 8555 8.3), so never a path."""
    return 0 < len(token) <= 256 and TOKEN_CHARS.issuperset(token)


def slug(text: str) -> str:
    """A name as a file name: lower case, `*` spelt out, nothing that walks paths."""
    text = text.lower().replace("*", "_wildcard_")
    cleaned = "".join(c if c.isalnum() or c in "-._" else "_" for c in text)
    return cleaned.lstrip(".") or "_"


@dataclass(frozen=True)
class StoredCertificate:
    name: str
    issuer_kind: str            # "acme" | "internal"
    chain_pem: bytes
    key_pem: bytes
    not_before: float
    not_after: float
    issuer: str                 # the issuing CA's common name
    names: tuple[str, ...]      # DNS names of the leaf
    serial: str                 # the leaf's serial number, in hex

    def renew_at(self, fraction: float) -> float:
        return self.not_before + (self.not_after - self.not_before) * fraction

    def covers(self, name: str) -> bool:
        return name in self.names


def describe(chain_pem: bytes) -> tuple[float, float, str, tuple[str, ...], str]:
    """(not_before, not_after, issuer common name, DNS names, serial) of a chain's leaf."""
    # cryptography (10 MB) is loaded by the configs that have certificates, not by all
    # that import this module (the supervisor does); see handler_modules.
    from cryptography import x509
    leaf = x509.load_pem_x509_certificate(chain_pem)
    issuer = leaf.issuer.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    try:
        san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName)
        names = tuple(n.lower() for n in san.value.get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        names = ()
    return (leaf.not_valid_before_utc.timestamp(), leaf.not_valid_after_utc.timestamp(),
            issuer[0].value if issuer else leaf.issuer.rfc4514_string(), names,
            format(leaf.serial_number, "x"))


def key_pem(private_key) -> bytes:
    from cryptography.hazmat.primitives import serialization
    return private_key.private_bytes(serialization.Encoding.PEM,
                                     serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption())


class CertStorage:
    def __init__(self, root: str, share=None) -> None:
        self.root = Path(root)
        # nestgate.certs.shared.RedisShare when instances share their state: locks,
        # certificates and challenge answers are published there too.
        self.share = share

    # ------------------------------------------------------------ files
    def ensure(self) -> None:
        for part in ("certificates", "accounts", "challenges/http", "challenges/tls-alpn",
                     "locks", "internal-ca"):
            self._folders(self.root / part)

    def _folders(self, folder: Path) -> None:
        """Make `folder` and what is missing above it (0700), owned like the root."""
        make_private_folders(self.root)
        make_private_folders(folder, os.stat(self.root) if os.geteuid() == 0 else None)

    def write(self, path: Path, data: bytes, mode: int = 0o644) -> None:
        """Replace `path` whole: a reader sees the old file or the new one. Run as
        root (a certbot hook), the file is given to the storage folder's owner, the
        user the server runs as."""
        self._folders(path.parent)
        replace_file(path, data, mode, os.stat(self.root) if os.geteuid() == 0 else None)

    def changed(self) -> None:
        """Tell the workers to look again (they compare this file's mtime each tick)."""
        self.write(self.root / "changed", b"%f\n" % time.time())

    def stamp(self) -> int:
        try:
            return os.stat(self.root / "changed").st_mtime_ns
        except OSError:
            return 0

    # ------------------------------------------------------------ certificates
    def folder(self, kind: str, name: str) -> Path:
        return self.root / "certificates" / kind / slug(name)

    def load(self, kind: str, name: str) -> StoredCertificate | None:
        folder = self.folder(kind, name)
        try:
            chain = (folder / "fullchain.pem").read_bytes()
            key = (folder / "key.pem").read_bytes()
            facts = describe(chain)
        except (OSError, ValueError):
            return None
        return StoredCertificate(name, kind, chain, key, *facts)

    def save(self, kind: str, name: str, chain_pem: bytes, key_pem_bytes: bytes,
             shared: bool = True, **meta) -> None:
        """Store a certificate: the key first, then the chain, each replaced whole;
        and for the other instances (unless it came from them)."""
        folder = self.folder(kind, name)
        self.write(folder / "key.pem", key_pem_bytes, PRIVATE)
        self.write(folder / "fullchain.pem", chain_pem)
        if shared and self.share is not None:
            self.share.publish_certificate(kind, name, chain_pem, key_pem_bytes,
                                           meta.get("directory", ""))
        self.set_meta(kind, name, last_error="", failures=0, next_attempt=0,
                      issued_at=time.time(), **meta)
        self.changed()

    def meta(self, kind: str, name: str) -> dict:
        try:
            return json.loads((self.folder(kind, name) / "meta.json").read_text())
        except (OSError, ValueError):
            return {}

    def set_meta(self, kind: str, name: str, **changes) -> dict:
        meta = self.meta(kind, name)
        meta.update(changes)
        meta["name"] = name
        self.write(self.folder(kind, name) / "meta.json",
                   json.dumps(meta, indent=1, sort_keys=True).encode())
        return meta

    def stored(self) -> list[tuple[str, str]]:
        """(kind, name) of every certificate folder, whatever the config says."""
        found = []
        for kind_dir in sorted((self.root / "certificates").glob("*")):
            for folder in sorted(kind_dir.glob("*")):
                name = self.meta(kind_dir.name, folder.name).get("name", folder.name)
                found.append((kind_dir.name, name))
        return found

    @contextlib.contextmanager
    def lock(self, kind: str, name: str, wait: float = 0.0):
        """Hold the order lock of one certificate; yields False when another process
        holds it for longer than `wait` seconds."""
        path = self.root / "locks" / f"{kind}-{slug(name)}.lock"
        self._folders(path.parent)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, PRIVATE)
        try:
            if os.geteuid() == 0:
                owner = os.stat(self.root)
                os.fchown(fd, owner.st_uid, owner.st_gid)
            deadline = time.monotonic() + wait
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        yield False
                        return
                    time.sleep(0.2)
            try:
                if self.share is None:
                    yield True
                else:               # and across instances
                    left = max(0.0, deadline - time.monotonic())
                    with self.share.lock(kind, name, wait=left) as everywhere:
                        yield everywhere
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    # ------------------------------------------------------------ challenges
    def publish_http(self, token: str, key_authorization: str) -> None:
        if not _is_token(token):
            raise ValueError(f"not an ACME token: {token!r}")
        self.write(self.root / "challenges" / "http" / token, key_authorization.encode())
        if self.share is not None:
            self.share.publish_http(token, key_authorization)

    def withdraw_http(self, token: str) -> None:
        if _is_token(token):
            with contextlib.suppress(OSError):
                os.unlink(self.root / "challenges" / "http" / token)
            if self.share is not None:
                self.share.withdraw_http(token)

    def mirror_http(self, answers: dict[str, bytes]) -> None:
        """Make the HTTP-01 answers here those of every instance (`answers`)."""
        folder = self.root / "challenges" / "http"
        for path in folder.glob("*"):
            if path.name not in answers and not path.name.startswith("."):
                with contextlib.suppress(OSError):
                    path.unlink()
        for token, answer in answers.items():
            if _is_token(token) and self.http_answer(token) != answer:
                self.write(folder / token, answer)

    def http_answer(self, token: str) -> bytes | None:
        """The key authorization for an HTTP-01 token, read by the workers."""
        if not _is_token(token):
            return None                 # a path, or anything a CA would not send
        try:
            return (self.root / "challenges" / "http" / token).read_bytes()
        except OSError:
            return None

    def publish_alpn(self, name: str, pem: bytes) -> None:
        self.write(self.root / "challenges" / "tls-alpn" / (slug(name) + ".pem"), pem,
                   PRIVATE)
        self.changed()
        if self.share is not None:
            self.share.publish_alpn(name, pem)

    def withdraw_alpn(self, name: str) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.root / "challenges" / "tls-alpn" / (slug(name) + ".pem"))
        self.changed()
        if self.share is not None:
            self.share.withdraw_alpn(name)

    def mirror_alpn(self, challenges: dict[str, bytes]) -> None:
        """Make the TLS-ALPN-01 certificates here those of every instance."""
        folder = self.root / "challenges" / "tls-alpn"
        wanted = {slug(name) + ".pem": pem for name, pem in challenges.items()}
        moved = False
        for path in folder.glob("*.pem"):
            if path.name not in wanted:
                with contextlib.suppress(OSError):
                    path.unlink()
                moved = True
        for file_name, pem in wanted.items():
            path = folder / file_name
            if not path.exists() or path.read_bytes() != pem:
                self.write(path, pem, PRIVATE)
                moved = True
        if moved:
            self.changed()

    def alpn_challenges(self) -> dict[str, Path]:
        """name -> PEM file (certificate and key) of each TLS-ALPN-01 being validated."""
        found = {}
        for path in (self.root / "challenges" / "tls-alpn").glob("*.pem"):
            found[path.name[:-4].replace("_wildcard_", "*")] = path
        return found
