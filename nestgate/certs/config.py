"""The `[acme]` table: which CA, which account, where certificates are kept, and how
names are proven (HTTP-01, TLS-ALPN-01, DNS-01 through `[acme.dns]`: RFC 2136 updates,
or a DNS provider's API through dns-lexicon).

Read with the rest of the config (nestgate.config), so `check` names the file and key
of every mistake. The managed certificates themselves are `[[listen.certificate]]`
tables with `acme = true` or `internal = true` (or `tls = "internal"` on a listener).
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass

from nestgate.base.configpath import resolved

LETS_ENCRYPT = "https://acme-v02.api.letsencrypt.org/directory"
LETS_ENCRYPT_STAGING = "https://acme-staging-v02.api.letsencrypt.org/directory"
CHALLENGES = ("http-01", "tls-alpn-01", "dns-01")
KEY_TYPES = ("p256", "rsa2048")
TSIG_ALGORITHMS = ("hmac-sha256", "hmac-sha384", "hmac-sha512", "hmac-sha1")
DEFAULT_STORAGE = "nestgate-certificates"     # beside the config file


RFC2136 = "rfc2136"
DNS_TTL = 60                                  # seconds, for the challenge's TXT record


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
    ttl: int = DNS_TTL
    provider: str = RFC2136


@dataclass(frozen=True)
class DnsProvider:
    """`[acme.dns]` with `provider = "<lexicon provider>"`: the TXT record through a DNS
    provider's API. Holds where the credentials are, never their values: they are
    read when a record is written (nestgate.certs.dnsprovider), so they are not in
    the config object the admin API shows, nor in the config file."""
    provider: str                             # a dns-lexicon provider name
    zone: str
    credentials_file: str = ""                # absolute; KEY=value lines
    credentials: tuple[tuple[str, str], ...] = ()   # (provider option, environment variable)
    options: tuple[tuple[str, str], ...] = ()       # provider options that are not secret
    nameservers: tuple[tuple[str, int], ...] = ()   # asked for the TXT; () = the zone's NS
    propagation_timeout: float = 120.0
    ttl: int = DNS_TTL


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
    dns: DnsUpdate | DnsProvider | None = None
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
    storage = s.path("storage", DEFAULT_STORAGE)
    storage = str(resolved(s.state_base, os.path.expanduser(storage)))
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


def _read_dns(s) -> DnsUpdate | DnsProvider:
    provider = s.str("provider", RFC2136)
    zone = s.str("zone").rstrip(".").lower()
    if not zone or "." not in zone and zone != "localhost":
        s.fail("zone", "the DNS zone the names are in, e.g. \"example.com\"", zone)
    timeout = s.positive_duration("propagation_timeout", 120.0)
    ttl = s.int("ttl", DNS_TTL, 1, 86400)
    if provider == RFC2136:
        dns = _read_rfc2136(s, zone, timeout, ttl)
    else:
        dns = _read_provider(s, provider, zone, timeout, ttl)
    s.check_unknown()
    return dns


def _read_rfc2136(s, zone: str, timeout: float, ttl: int) -> DnsUpdate:
    server = s.str("server")
    host, port = _host_port(server) or ("", 53)
    if not host:
        s.fail("server", "the zone's primary DNS server, \"host\" or \"host:port\"", server)
    tsig_name, secret = s.str("tsig_name"), s.str("tsig_secret")
    if not tsig_name:
        s.fail("tsig_name", "the TSIG key's name, as configured on the DNS server")
    try:
        if not base64.b64decode(secret, validate=True):
            raise ValueError
    except ValueError:
        s.fail("tsig_secret", "the TSIG key's base64 secret")     # not shown: a secret
    return DnsUpdate(server=host, port=port, zone=zone, tsig_name=tsig_name,
                     tsig_secret=secret,
                     tsig_algorithm=s.choice("tsig_algorithm", "hmac-sha256", TSIG_ALGORITHMS),
                     propagation_timeout=timeout, ttl=ttl)


def _read_provider(s, provider: str, zone: str, timeout: float, ttl: int) -> DnsProvider:
    from nestgate.certs import dnsprovider
    known = dnsprovider.provider_names()
    if provider not in known:
        s.fail("provider", f"\"{RFC2136}\" or a DNS provider dns-lexicon knows"
               f"{s.near(provider, [RFC2136, *known], 0.6)}", provider)
    elif not known[provider]:
        s.fail("provider", f"a provider whose libraries are installed (pip install "
               f"'dns-lexicon[{provider}]' in nestgate's environment)", provider)
    if not known.get(provider):
        # The rest is not judged against a provider that cannot be used.
        s.seen.update(("credentials_file", "credentials", "options", "nameservers"))
        return DnsProvider(provider=provider, zone=zone)
    accepted = dnsprovider.provider_options(provider)
    settings = DnsProvider(
        provider=provider, zone=zone, credentials_file=s.readable_file("credentials_file", secret=True),
        credentials=_read_credential_names(s, accepted),
        options=_read_plain_options(s, accepted), nameservers=_read_nameservers(s),
        propagation_timeout=timeout, ttl=ttl)
    if s.data.get("credentials_file") and not settings.credentials_file:
        return settings                      # already said: the file cannot be read
    for key, message in dnsprovider.credential_problems(settings, os.environ):
        s.fail(key, message)
    return settings


def _read_credential_names(s, accepted: list[str]) -> tuple[tuple[str, str], ...]:
    """`credentials = { auth_token_env = "CF_TOKEN" }`: each provider option named with
    the environment variable that holds it. A value in place of a variable's name is
    refused without being shown: it is most likely the secret itself."""
    table = s.table("credentials")
    names = []
    for key, variable in table.data.items():
        table.seen.add(key)
        option = key[:-len("_env")] if key.endswith("_env") else ""
        if not option:
            table.fail(key, "<option>_env = \"VARIABLE\", naming the environment variable "
                       "that holds it (secrets are not kept in the config file)")
        elif option not in accepted:
            table.fail(key, f"an option of this provider ({', '.join(accepted)}) + \"_env\""
                       f"{s.near(option, accepted)}")
        elif not isinstance(variable, str) or not variable.replace("_", "a").isalnum():
            table.fail(key, "the name of an environment variable, e.g. \"CF_TOKEN\"")
        else:
            names.append((option, variable))
    return tuple(names)


def _read_plain_options(s, accepted: list[str]) -> tuple[tuple[str, str], ...]:
    """`options = { pdns_server = "http://ns1:8081" }`: provider options that are not
    secret. One whose name says it is (token, key, secret, password) belongs in the
    credentials file or the environment."""
    from nestgate.certs.dnsprovider import looks_secret
    table = s.table("options")
    options = []
    for key, value in table.data.items():
        table.seen.add(key)
        if key not in accepted:
            table.fail(key, f"an option of this provider ({', '.join(accepted)})"
                       f"{s.near(key, accepted)}")
        elif looks_secret(key):
            table.fail(key, "no secret here: put it in credentials_file, or name an "
                       f"environment variable with credentials = {{ {key}_env = \"...\" }}")
        elif not isinstance(value, (str, int, bool)):
            table.fail(key, "a string", value)
        else:
            options.append((key, str(value).lower() if isinstance(value, bool) else str(value)))
    return tuple(options)


def _read_nameservers(s) -> tuple[tuple[str, int], ...]:
    found = []
    for entry in s.strings("nameservers"):
        server = _host_port(entry)
        if server is None:
            s.fail("nameservers", "a list of \"host\" or \"host:port\"", entry)
        else:
            found.append(server)
    return tuple(found)


def _host_port(value: str) -> tuple[str, int] | None:
    """"host" or "host:port" (port 53); an IPv6 address is written without a port."""
    host, _, port = value.rpartition(":") if value.count(":") == 1 else (value, "", "53")
    if not value or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host or value, int(port)
