"""nestgate's own certificate authority, for names no public CA will sign
(`nas.home.arpa`, `*.lan`, `app.localhost`, a LAN address).

The root is made once, in storage (`internal-ca/root.pem`, its key 0600), and lives ten
years; visitors' devices trust it once (`nestgate trust` says how). Leaf certificates
are signed by it directly, live LEAF_DAYS and are renewed like ACME ones, at two
thirds of their life, by the same manager.
"""

from __future__ import annotations

import datetime
import ipaddress
import socket

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from nestgate.certs.storage import PRIVATE, CertStorage, key_pem

ROOT_YEARS = 10
LEAF_DAYS = 7


class LocalCA:
    def __init__(self, storage: CertStorage) -> None:
        self.storage = storage
        self.root_file = storage.root / "internal-ca" / "root.pem"
        self.key_file = storage.root / "internal-ca" / "root-key.pem"

    def root_pem(self) -> bytes:
        """The root certificate, made on first use (under the storage's lock, so two
        processes sharing the folder make one; with shared state, one for every
        instance, so devices trust one root whichever instance they reach)."""
        share = self.storage.share
        if not self.root_file.exists() or share is not None:
            with self.storage.lock("internal-ca", "root", wait=30.0):
                shared = share.local_ca() if share is not None else None
                if shared is not None:
                    if not self.root_file.exists() or self.root_file.read_bytes() != shared[0]:
                        self.storage.write(self.key_file, shared[1], PRIVATE)
                        self.storage.write(self.root_file, shared[0])
                elif not self.root_file.exists():
                    self._make_root()
                if share is not None and shared is None:
                    share.publish_local_ca(self.root_file.read_bytes(),
                                           self.key_file.read_bytes())
        return self.root_file.read_bytes()

    def _make_root(self) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        name = x509.Name([
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "nestgate"),
            x509.NameAttribute(NameOID.COMMON_NAME,
                               f"nestgate local CA ({socket.gethostname()})"[:64]),
        ])
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(hours=1))
                .not_valid_after(now + datetime.timedelta(days=365 * ROOT_YEARS))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(
                    digital_signature=False, content_commitment=False,
                    key_encipherment=False, data_encipherment=False, key_agreement=False,
                    key_cert_sign=True, crl_sign=True, encipher_only=False,
                    decipher_only=False), critical=True)
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                               critical=False)
                .sign(key, hashes.SHA256()))
        # The key first: a root certificate without its key could never sign.
        self.storage.write(self.key_file, key_pem(key), PRIVATE)
        self.storage.write(self.root_file, cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str) -> tuple[bytes, bytes]:
        """(certificate PEM, private key PEM) for `name`, signed by the root."""
        root = x509.load_pem_x509_certificate(self.root_pem())
        root_key = serialization.load_pem_private_key(self.key_file.read_bytes(), None)
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        try:
            alt: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(name))
        except ValueError:
            alt = x509.DNSName(name)
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
                .issuer_name(root.subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=LEAF_DAYS))
                .add_extension(x509.SubjectAlternativeName([alt]), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None),
                               critical=True)
                .add_extension(x509.KeyUsage(
                    digital_signature=True, content_commitment=False,
                    key_encipherment=False, data_encipherment=False, key_agreement=False,
                    key_cert_sign=False, crl_sign=False, encipher_only=False,
                    decipher_only=False), critical=True)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                               critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                    root_key.public_key()), critical=False)
                .sign(root_key, hashes.SHA256()))
        return cert.public_bytes(serialization.Encoding.PEM), key_pem(key)


def trust_instructions(root_file: str) -> str:
    """How to make devices trust the local root, per system."""
    return f"""\
nestgate's local CA root certificate: {root_file}

Trust it once on each device that visits the LAN names:

  Debian, Ubuntu   sudo cp {root_file} /usr/local/share/ca-certificates/nestgate-local-ca.crt
                   sudo update-ca-certificates          (or: sudo nestgate trust --install)
  Fedora, RHEL     sudo trust anchor --store {root_file}
  Chrome/Chromium  on Linux they read their own NSS database:
  and Firefox      certutil -d sql:$HOME/.pki/nssdb -A -t C,, -n nestgate -i {root_file}
                   (Firefox: Settings > Privacy & Security > Certificates > Import)
  macOS            sudo security add-trusted-cert -d -r trustRoot \\
                       -k /Library/Keychains/System.keychain {root_file}
  Windows          certutil -addstore -f ROOT nestgate-local-ca.crt   (an administrator shell)
  Android          copy the file to the device, then Settings > Security > Encryption &
                   credentials > Install a certificate > CA certificate
  iOS, iPadOS      send the file to the device and install the profile, then
                   Settings > General > About > Certificate Trust Settings: turn it on

Keep {root_file.replace('root.pem', 'root-key.pem')} secret: whoever has it can make
certificates these devices believe.
"""
