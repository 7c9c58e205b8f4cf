"""Ordering a certificate from an ACME CA (RFC 8555), with certbot's `acme` client.

One name per certificate (as Caddy does: one name failing its challenge does not hold
the others back). The challenge is the first the CA offers among those this config
can answer, in the order DNS-01 (the only one for a wildcard), HTTP-01, TLS-ALPN-01:

- HTTP-01: the key authorization is written to storage; every worker answers
  `/.well-known/acme-challenge/{token}` from there (nestgate.certs.challenge).
- TLS-ALPN-01 (RFC 8737): a self-signed certificate carrying the key authorization's
  digest is written to storage; workers hand it to handshakes that offer only
  `acme-tls/1` for that name (nestgate.certs.book).
- DNS-01: a TXT record by RFC 2136 update (nestgate.certs.dnsupdate) or through a DNS
  provider's API (nestgate.certs.dnsprovider), waited for on the zone's servers.

Whatever was published is withdrawn afterwards, issued or not.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import time

import josepy as jose
from acme import challenges, client, crypto_util, errors, messages
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from nestgate.certs.config import RFC2136
from nestgate.certs.shared import MIRROR_WAIT
from nestgate.certs.storage import CertStorage, key_pem, slug
from nestgate.base.private import PRIVATE_FILE

USER_AGENT = "nestgate"
ACME_IDENTIFIER = x509.ObjectIdentifier("1.3.6.1.5.5.7.1.31")    # RFC 8737 id-pe-acmeIdentifier
ORDER_TIMEOUT = 90.0
NONCE_RETRIES = 3
ARI_DEFAULT_RECHECK = 6 * 3600.0      # RFC 9773 4.3.3's default when the CA is silent


class IssueError(Exception):
    """An order that did not end in a certificate: `str()` says why, in the CA's words
    where it gave them; `retry_after` is the CA's own wait (rate limits), or 0."""

    def __init__(self, message: str, retry_after: float = 0.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class TlsAlpnResponse(challenges.KeyAuthorizationChallengeResponse):
    """The answer to a tls-alpn-01 challenge, sent as `{}` like the others: the `acme`
    package no longer builds this one. (A response with no fields at all would be
    sent as an empty POST-as-GET, which asks instead of answering.)"""
    typ = "tls-alpn-01"


class Network(client.ClientNetwork):
    """certbot's client network, keeping the CA's `Retry-After` on its errors: a CA
    that rate-limits says how long to wait, and the manager waits at least that."""

    @classmethod
    def _check_response(cls, response, content_type=None):
        try:
            return super()._check_response(response, content_type)
        except messages.Error as exc:
            object.__setattr__(exc, "retry_after",
                               _seconds(response.headers.get("Retry-After", "")))
            raise


def _seconds(value: str) -> float:
    """A Retry-After value (seconds or an HTTP date) as seconds from now; 0 if none."""
    if not value:
        return 0.0
    if value.strip().isdigit():
        return float(value)
    from email.utils import parsedate_to_datetime
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return 0.0


def new_private_key(key_type: str):
    if key_type == "rsa2048":
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return ec.generate_private_key(ec.SECP256R1())


def alpn_challenge_pem(name: str, key_authorization: str) -> bytes:
    """RFC 8737's self-signed certificate for `name`, with the acmeIdentifier
    extension: the DER OCTET STRING of SHA-256(key authorization), critical."""
    key = ec.generate_private_key(ec.SECP256R1())
    digest = hashlib.sha256(key_authorization.encode()).digest()
    now = datetime.datetime.now(datetime.timezone.utc)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "acme-tls-alpn-01")])
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .add_extension(x509.UnrecognizedExtension(ACME_IDENTIFIER,
                                                      b"\x04\x20" + digest), critical=True)
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM) + key_pem(key)


class AcmeIssuer:
    """Orders certificates for one [acme] config; the account is made once and kept
    in storage per directory URL."""

    def __init__(self, acme, storage: CertStorage, challenge_types: tuple[str, ...],
                 log=print) -> None:
        self.acme = acme
        self.storage = storage
        self.challenge_types = challenge_types   # what this config can answer, preferred first
        self.log = log
        self.last_challenges: list[str] = []     # the types the last order answered
        self._client: client.ClientV2 | None = None
        self._account_key: jose.JWK | None = None

    # ------------------------------------------------------------ account
    def _account(self) -> client.ClientV2:
        if self._client is not None:
            return self._client
        folder = self.storage.root / "accounts" / slug(self.acme.directory.split("://", 1)[-1])
        key_file, account_file = folder / "account-key.pem", folder / "account.json"
        if key_file.exists():
            account_key = jose.JWKEC.load(key_file.read_bytes())
        else:
            account_key = jose.JWKEC(key=ec.generate_private_key(ec.SECP256R1()))
            self.storage.write(key_file, key_pem(account_key.key), PRIVATE_FILE)
        net = Network(account_key, alg=jose.ES256, user_agent=USER_AGENT,
                      verify_ssl=self.acme.ca_root or True)
        directory = client.ClientV2.get_directory(self.acme.directory, net)
        acme_client = client.ClientV2(directory, net=net)
        regr = None
        if account_file.exists():
            try:
                regr = messages.RegistrationResource.json_loads(account_file.read_text())
            except (ValueError, jose.DeserializationError):
                regr = None
        if regr is not None:
            net.account = regr
        else:
            eab = None
            if self.acme.eab_kid:
                eab = messages.ExternalAccountBinding.from_data(
                    account_public_key=account_key.public_key(), kid=self.acme.eab_kid,
                    hmac_key=self.acme.eab_hmac_key, directory=directory)
            fields = {"terms_of_service_agreed": True}
            if self.acme.email:
                fields["email"] = self.acme.email
            if eab is not None:
                fields["external_account_binding"] = eab
            try:
                regr = acme_client.new_account(messages.NewRegistration.from_data(**fields))
            except errors.ConflictError as exc:     # the key has an account already
                regr = acme_client.query_registration(
                    messages.RegistrationResource(uri=exc.location,
                                                  body=messages.Registration()))
            self.storage.write(account_file, json.dumps(regr.to_json()).encode(), PRIVATE_FILE)
        self._client, self._account_key = acme_client, account_key
        return acme_client

    # ------------------------------------------------------------ renewal information
    def renewal_window(self, chain_pem: bytes) -> tuple[float | None, float]:
        """ACME Renewal Information (RFC 9773), where the CA offers it: (when to renew,
        a moment chosen in the CA's suggested window, or None without ARI; when to
        ask again), as Unix times."""
        try:
            when, ask_again = self._account().renewal_time(chain_pem)
        except (errors.Error, messages.Error, OSError, ValueError):
            return None, time.time() + ARI_DEFAULT_RECHECK
        return (when.timestamp() if when is not None else None), ask_again.timestamp()

    # ------------------------------------------------------------ orders
    def issue(self, name: str) -> tuple[bytes, bytes]:
        """(full chain PEM, private key PEM) for `name`, or IssueError."""
        for attempt in range(NONCE_RETRIES):
            try:
                return self._issue(name)
            except messages.Error as exc:
                # A CA may refuse any nonce (RFC 8555 6.5; Pebble refuses 5 % on
                # purpose); the client retries a request once, then the order is
                # placed again.
                if exc.code == "badNonce" and attempt + 1 < NONCE_RETRIES:
                    continue
                raise IssueError(_ca_words(exc), _retry_after(exc)) from None
            except errors.ValidationError as exc:
                raise IssueError("; ".join(_authz_failure(a) for a in exc.failed_authzrs)) \
                    from None
            except errors.TimeoutError:
                raise IssueError("the CA did not finish the order in time") from None
            except (errors.Error, OSError, ValueError) as exc:
                self._client = None           # a new session (and nonce) next time
                raise IssueError(f"{type(exc).__name__}: {exc}") from None
        raise AssertionError("unreachable")

    def _issue(self, name: str) -> tuple[bytes, bytes]:
        acme_client = self._account()
        private_key = new_private_key(self.acme.key_type)
        pem = key_pem(private_key)
        order = acme_client.new_order(crypto_util.make_csr(pem, [name]))
        cleanups = []
        self.last_challenges = []
        try:
            for authz in order.authorizations:
                if authz.body.status == messages.STATUS_VALID:
                    continue                  # proven recently; the CA remembers
                cleanups.append(self._answer(acme_client, authz))
            deadline = datetime.datetime.now() + datetime.timedelta(seconds=ORDER_TIMEOUT)
            order = acme_client.poll_and_finalize(order, deadline)
        finally:
            for cleanup in cleanups:
                try:
                    cleanup()
                except Exception as exc:       # noqa: BLE001 - withdrawing is best effort
                    self.log(f"could not withdraw a challenge for {name}: {exc}")
        return order.fullchain_pem.encode(), pem

    def _answer(self, acme_client, authz):
        """Publish the answer to one authorization's challenge and tell the CA; the
        function that withdraws it."""
        name = authz.body.identifier.value
        offered = {c.chall.typ if not isinstance(c.chall, challenges.UnrecognizedChallenge)
                   else c.chall.jobj.get("type"): c for c in authz.body.challenges}
        wildcard = bool(authz.body.wildcard)
        for kind in self.challenge_types:
            if kind in offered and (kind == "dns-01" or not wildcard):
                break
        else:
            raise IssueError(f"{name}: the CA offers {', '.join(sorted(offered))}; this "
                             f"config answers {', '.join(self.challenge_types) or 'none'}")
        challb = offered[kind]
        self.last_challenges.append(kind)
        account_key = self._account_key
        if kind == "http-01":
            token = challb.chall.encode("token")
            self.storage.publish_http(token, challb.chall.key_authorization(account_key))
            if self.storage.share is not None:
                time.sleep(MIRROR_WAIT)       # the other instances copy the answer
            acme_client.answer_challenge(challb, challb.chall.response(account_key))
            return lambda: self.storage.withdraw_http(token)
        if kind == "tls-alpn-01":
            token = challb.chall.jobj["token"]
            thumbprint = jose.b64encode(account_key.thumbprint(
                hash_function=hashes.SHA256)).decode()
            self.storage.publish_alpn(name, alpn_challenge_pem(name, f"{token}.{thumbprint}"))
            # Every worker reloads within a tick (and other instances mirror it).
            time.sleep(MIRROR_WAIT if self.storage.share is not None else 1.5)
            acme_client.answer_challenge(
                challb, TlsAlpnResponse(key_authorization=f"{token}.{thumbprint}"))
            return lambda: self.storage.withdraw_alpn(name)
        record = dns_challenge(self.acme.dns)
        fqdn = challb.chall.validation_domain_name(name)
        value = challb.chall.validation(account_key)
        record.add(fqdn, value)
        try:
            record.wait_visible(fqdn, value)
        except Exception:
            record.remove(fqdn, value)
            raise
        acme_client.answer_challenge(challb, challb.chall.response(account_key))
        return lambda: record.remove(fqdn, value)


def dns_challenge(settings):
    """The DNS-01 publisher `[acme.dns]` asks for: add, wait_visible, remove."""
    if settings.provider == RFC2136:
        from nestgate.certs.dnsupdate import DnsChallenge
        return DnsChallenge(settings)
    from nestgate.certs.dnsprovider import ProviderChallenge
    return ProviderChallenge(settings)


def _ca_words(exc: messages.Error) -> str:
    parts = [exc.typ.rsplit(":", 1)[-1] if exc.typ else "error"]
    if exc.detail:
        parts.append(exc.detail)
    for sub in exc.subproblems or ():
        parts.append(f"{sub.identifier.value if sub.identifier else ''}: {sub.detail}")
    return ": ".join(parts)


def _retry_after(exc: messages.Error) -> float:
    """The CA's own wait; an hour for a rate limit that states none."""
    stated = getattr(exc, "retry_after", 0.0)
    return stated or (3600.0 if exc.code == "rateLimited" else 0.0)


def _authz_failure(authzr) -> str:
    name = authzr.body.identifier.value
    for challb in authzr.body.challenges:
        if challb.error is not None:
            return f"{name}: {challb.chall.typ if hasattr(challb.chall, 'typ') else ''} " \
                   f"{_ca_words(challb.error)}"
    return f"{name}: {authzr.body.status}"
