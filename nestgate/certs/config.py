"""The `[acme]` table: which CA, which account, where certificates are kept, and how
names are proven (HTTP-01, TLS-ALPN-01, DNS-01 through `[acme.dns]`).

Read with the rest of the config (nestgate.config), so `check` names the file and key
of every mistake. The managed certificates themselves are `[[listen.certificate]]`
tables with `acme = true` or `internal = true` (or `tls = "internal"` on a listener).
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass

LETS_ENCRYPT = "https://acme-v02.api.letsencrypt.org/directory"
LETS_ENCRYPT_STAGING = "https://acme-staging-v02.api.letsencrypt.org/directory"
CHALLENGES = ("http-01", "tls-alpn-01", "dns-01")
KEY_TYPES = ("p256", "rsa2048")
TSIG_ALGORITHMS = ("hmac-sha256", "hmac-sha384", "hmac-sha512", "hmac-sha1")
DEFAULT_STORAGE = "nestgate-certificates"     # beside the config file


@dataclass(frozen=True)
class DnsUpdate:
    """`[acme.dns]`: RFC 2136 dynamic updates signed with TSIG, for DNS-01."""
    server: str                               # host or address of the zone's primary
    port: int
    zone: str
    tsig_name: str
    tsig_secret: str                          # base64, as BIND's tsig-keygen prints it
    tsig_algorithm: str = "hmac-sha256"
    propagation_timeout: float = 120.0        # how long to wait for the TXT to be seen


@dataclass(frozen=True)
class AcmeConfig:
    email: str = ""
    directory: str = LETS_ENCRYPT
    eab_kid: str = ""
    eab_hmac_key: str = ""
    key_type: str = "p256"
    storage: str = ""                         # absolute; DEFAULT_STORAGE beside the config
    ca_root: str = ""                         # PEM trusted for the directory's own HTTPS
    challenges: tuple[str, ...] = ()          # empty: every one the listeners can answer
    dns: DnsUpdate | None = None
    renew_after: float = 2 / 3                # of a certificate's lifetime


def read_acme(s) -> AcmeConfig:
    """Reader for the top-level [acme] table (a config `_Section`); the defaults when
    it is absent, so the internal CA and `cert` commands always have a storage."""
    d = AcmeConfig()
    directory = s.str("directory", d.directory)
    if directory == "staging":
        directory = LETS_ENCRYPT_STAGING
    elif directory == "production":
        directory = LETS_ENCRYPT
    elif not directory.startswith("https://"):
        s.fail("directory", "an https:// ACME directory URL, \"staging\" or \"production\"",
               directory)
    email = s.str("email")
    if email and ("@" not in email or any(c.isspace() for c in email)):
        s.fail("email", "an email address for the CA's expiry notices", email)
    eab_kid, eab_hmac_key = s.str("eab_kid"), s.str("eab_hmac_key")
    if bool(eab_kid) != bool(eab_hmac_key):
        s.fail("eab_kid" if not eab_kid else "eab_hmac_key",
               "eab_kid and eab_hmac_key together (External Account Binding)")
    if eab_hmac_key:
        try:
            base64.urlsafe_b64decode(eab_hmac_key + "=" * (-len(eab_hmac_key) % 4))
        except ValueError:
            s.fail("eab_hmac_key", "the base64url HMAC key the CA gave")   # not shown
    storage = s.str("storage", DEFAULT_STORAGE)
    storage = str((s.state_base / os.path.expanduser(storage)).resolve())
    parent = os.path.dirname(storage)
    if not (os.path.isdir(storage) and os.access(storage, os.W_OK)) and not (
            os.path.isdir(parent) and os.access(parent, os.W_OK)):
        s.fail("storage", "a directory this user can write (or create)", storage)
    challenges = s.strings("challenges", ())
    for name in challenges:
        if name not in CHALLENGES:
            s.fail("challenges", f"a list of {', '.join(CHALLENGES)}", name)
    dns = _read_dns(s.table("dns")) if "dns" in s.data else None
    if "dns-01" in challenges and dns is None:
        s.fail("challenges", "an [acme.dns] table when \"dns-01\" is listed")
    cfg = AcmeConfig(email=email, directory=directory, eab_kid=eab_kid,
                     eab_hmac_key=eab_hmac_key,
                     key_type=s.choice("key_type", d.key_type, KEY_TYPES),
                     storage=storage, ca_root=s.readable_file("ca_root"),
                     challenges=challenges, dns=dns)
    s.check_unknown()
    return cfg


def _read_dns(s) -> DnsUpdate:
    server = s.str("server")
    host, _, port = server.rpartition(":") if server.count(":") == 1 else (server, "", "53")
    if not server or not port.isdigit() or not 0 < int(port) < 65536:
        s.fail("server", "the zone's primary DNS server, \"host\" or \"host:port\"", server)
        port = "53"
    zone = s.str("zone").rstrip(".").lower()
    if not zone or "." not in zone and zone != "localhost":
        s.fail("zone", "the DNS zone the names are in, e.g. \"example.com\"", zone)
    tsig_name, secret = s.str("tsig_name"), s.str("tsig_secret")
    if not tsig_name:
        s.fail("tsig_name", "the TSIG key's name, as configured on the DNS server")
    try:
        if not base64.b64decode(secret, validate=True):
            raise ValueError
    except ValueError:
        s.fail("tsig_secret", "the TSIG key's base64 secret")     # not shown: a secret
    dns = DnsUpdate(server=host or server, port=int(port), zone=zone, tsig_name=tsig_name,
                    tsig_secret=secret,
                    tsig_algorithm=s.choice("tsig_algorithm", "hmac-sha256", TSIG_ALGORITHMS),
                    propagation_timeout=s.positive_duration("propagation_timeout", 120.0))
    s.check_unknown()
    return dns
