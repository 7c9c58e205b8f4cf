"""Automatic HTTPS against real components: Debian's Pebble as the ACME CA (with
pebble-challtestsrv as its DNS, or BIND / PowerDNS for DNS-01), real `nestgate serve` processes
answering the challenges, curl and h2load as clients, headless Chromium for the local
CA. Pebble makes a new root at every start; clients trust the one it hands out.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cryptography import x509

from bind import TSIG_NAME, Bind
from conftest import REPO, _env, admin_headers
from pdns import PowerDNS
from pebble import Pebble, free_port, order_as_a_new_account

SITE = """
[[site]]
hosts = {hosts}

[[site.route]]
path = "/"
type = "return"
body = "hello over TLS\\n"
"""


WORKERS_SEE_STORAGE = 1.2     # seconds: the worker tick that reloads certificates, twice


class Ports:
    def __init__(self) -> None:
        self.http, self.https = free_port(), free_port()


@pytest.fixture
def ports():
    return Ports()


@pytest.fixture
def pebble(tmp_path, ca, ports):
    server = Pebble(tmp_path / "pebble", ca, ports.http, ports.https)
    yield server
    server.stop()


def acme_config(pebble, ports, storage, *, names=("a.test", "b.test"), challenges=None,
                plain_extra="", extra="", workers=2, sites=None) -> str:
    chosen = f"challenges = {json.dumps(list(challenges))}" if challenges else ""
    return f"""
[server]
workers = {workers}

[[listen]]
address = "127.0.0.1:{ports.http}"
{plain_extra}

[[listen]]
address = "127.0.0.1:{ports.https}"

[[listen.certificate]]
acme = true

[acme]
directory = "{pebble.directory}"
ca_root = "{pebble.ca_file}"
storage = "{storage}"
email = "admin@example.org"
{chosen}
{extra}
{sites if sites is not None else SITE.format(hosts=json.dumps(list(names)))}
"""


def peer_certificate(port: int, name: str) -> x509.Certificate | None:
    """The certificate served for SNI `name` (not verified), or None if the handshake
    fails (no certificate for it yet)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
                ctx.wrap_socket(raw, server_hostname=name) as tls:
            return x509.load_der_x509_certificate(tls.getpeercert(binary_form=True))
    except (ssl.SSLError, OSError):
        return None


def wait_served(port: int, name: str, timeout: float = 60, not_serial: int | None = None,
                covering: str | None = None):
    """The certificate served for `name` once one for it (or for `covering`, a
    wildcard) is, and differs from `not_serial` (for a renewal)."""
    deadline = time.monotonic() + timeout
    while True:
        cert = peer_certificate(port, name)
        if cert is not None and (covering or name) in _dns_names(cert) \
                and cert.serial_number != not_serial:
            # One worker has it; each looks at storage every half second.
            time.sleep(WORKERS_SEE_STORAGE)
            return cert
        assert time.monotonic() < deadline, f"no certificate for {name} was served"
        time.sleep(0.2)


def _dns_names(cert: x509.Certificate) -> list[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return []
    return san.value.get_values_for_type(x509.DNSName)


def curl(port: int, name: str, root: Path, path: str = "/", host: str | None = None):
    """curl verifying the chain against `root` (exit status, body)."""
    out = subprocess.run(["curl", "-sS", "--max-time", "10", "--cacert", str(root),
                          "--resolve", f"{host or name}:{port}:127.0.0.1",
                          f"https://{host or name}:{port}{path}"],
                         capture_output=True, timeout=20)
    return out.returncode, out.stdout + out.stderr


def nestgate(*args: str, config: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nestgate", *args, "--config",
                           str(config)], capture_output=True, text=True,
                          env=_env(), cwd=REPO, timeout=180)


def save_root(pebble, folder: Path) -> Path:
    root = folder / "pebble-root.pem"
    root.write_bytes(pebble.root_pem())
    return root


def _ask(tls) -> bytes:
    """GET / on a kept-alive TLS connection: the body."""
    tls.sendall(b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < int(
            re.search(rb"content-length: (\d+)", data, re.I).group(1)):
        chunk = tls.recv(65536)
        assert chunk, "connection closed"
        data += chunk
    return data.split(b"\r\n\r\n", 1)[1]


def challenges_used(storage: Path, name: str) -> list[str]:
    """The challenge types the last order of `name` answered (from its meta.json)."""
    from nestgate.certs.storage import CertStorage
    return CertStorage(str(storage)).meta("acme", name)["challenges"]


def orders(server, name: str) -> int:
    return sum(f"ordering a certificate for {name} " in line for line in server.lines)


# ---------------------------------------------------------------- the three challenges

def test_http01_issues_two_names_and_curl_verifies_the_chain(start_server, pebble, ports,
                                                              tmp_path):
    server = start_server(acme_config(pebble, ports, tmp_path / "certs"))
    root = save_root(pebble, tmp_path)
    for name in ("a.test", "b.test"):
        cert = wait_served(ports.https, name)
        assert cert.issuer.rfc4514_string().startswith("CN=Pebble Intermediate")
        status, body = curl(ports.https, name, root)
        assert status == 0 and body == b"hello over TLS\n", body
    # Without the root, curl refuses it: the check above is a real verification.
    status, body = curl(ports.https, "a.test", tmp_path / "pebble" / "pebble-ca.pem")
    assert status != 0 and b"certificate" in body
    # Stored with private keys 0600; the challenge answers withdrawn.
    key = tmp_path / "certs" / "certificates" / "acme" / "a.test" / "key.pem"
    assert key.stat().st_mode & 0o777 == 0o600
    assert list((tmp_path / "certs" / "challenges" / "http").iterdir()) == []
    assert challenges_used(tmp_path / "certs", "a.test") == ["http-01"]
    listed = nestgate("cert", "list", config=server.config_path)
    assert listed.returncode == 0
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()[1:-1]}
    assert set(rows) == {"a.test", "b.test"}
    assert "Pebble Intermediate" in rows["a.test"] and rows["a.test"].rstrip().endswith("-")


def test_tls_alpn01_issues_two_names(start_server, pebble, ports, tmp_path):
    start_server(acme_config(pebble, ports, tmp_path / "certs", challenges=["tls-alpn-01"]))
    root = save_root(pebble, tmp_path)
    for name in ("a.test", "b.test"):
        wait_served(ports.https, name)
        status, body = curl(ports.https, name, root)
        assert status == 0 and body == b"hello over TLS\n"
    for name in ("a.test", "b.test"):
        assert challenges_used(tmp_path / "certs", name) == ["tls-alpn-01"]
    assert list((tmp_path / "certs" / "challenges" / "tls-alpn").iterdir()) == []


def test_dns01_issues_a_wildcard_through_bind(start_server, ca, ports, tmp_path):
    bind = Bind(tmp_path / "bind")
    pebble = Pebble(tmp_path / "pebble", ca, ports.http, ports.https,
                    dns_server=f"127.0.0.1:{bind.port}")
    try:
        dns = f"""
[acme.dns]
server = "127.0.0.1:{bind.port}"
zone = "example.test"
tsig_name = "{TSIG_NAME}"
tsig_secret = "{bind.secret}"
"""
        sites = SITE.format(hosts=json.dumps(["*.example.test"]))
        start_server(acme_config(pebble, ports, tmp_path / "certs", extra=dns, sites=sites))
        wait_served(ports.https, "files.example.test", covering="*.example.test")
        root = save_root(pebble, tmp_path)
        for name in ("files.example.test", "photos.example.test"):
            status, body = curl(ports.https, name, root)
            assert status == 0 and body == b"hello over TLS\n", body
        assert challenges_used(tmp_path / "certs", "*.example.test") == ["dns-01"]
        assert bind.txt("_acme-challenge.example.test") == set()     # removed afterwards
    finally:
        pebble.stop()
        bind.stop()


TOKEN_VARIABLE = "NESTGATE_TEST_PDNS_KEY"


def powerdns_dns(pdns, credentials_file: Path, token_from_env: bool = False) -> str:
    """[acme.dns] for the PowerDNS API: the key in the credentials file, or in the
    environment variable TOKEN_VARIABLE."""
    token = f'credentials = {{ auth_token_env = "{TOKEN_VARIABLE}" }}' if token_from_env \
        else ""
    return f"""
[acme.dns]
provider = "powerdns"
zone = "example.test"
credentials_file = "{credentials_file}"
{token}
options = {{ pdns_server = "{pdns.url}" }}
nameservers = ["127.0.0.1:{pdns.port}"]
"""


def api_writes(pdns) -> int:
    """Changes to the zone through PowerDNS's HTTP API (from its own log)."""
    return pdns.log().count('"PATCH /api/v1/servers/localhost/zones/example.test. ')


def test_dns01_through_a_provider_api_issues_and_renews_a_wildcard(start_server, ca, ports,
                                                                    tmp_path):
    pdns = PowerDNS(tmp_path / "pdns")
    pebble = Pebble(tmp_path / "pebble", ca, ports.http, ports.https,
                    dns_server=f"127.0.0.1:{pdns.port}")
    try:
        credentials = tmp_path / "dns.env"
        credentials.write_text(f"# PowerDNS API key\nAUTH_TOKEN={pdns.api_key}\n")
        credentials.chmod(0o600)
        sites = SITE.format(hosts=json.dumps(["*.example.test"]))
        server = start_server(acme_config(pebble, ports, tmp_path / "certs", sites=sites,
                                          extra=powerdns_dns(pdns, credentials)))
        first = wait_served(ports.https, "files.example.test", covering="*.example.test")
        root = save_root(pebble, tmp_path)
        for name in ("files.example.test", "photos.example.test"):
            status, body = curl(ports.https, name, root)
            assert status == 0 and body == b"hello over TLS\n", body
        assert challenges_used(tmp_path / "certs", "*.example.test") == ["dns-01"]
        assert api_writes(pdns) == 2                       # the record added, then removed
        assert pdns.txt("_acme-challenge.example.test") == set()
        # Renewed through the API the same way, with a new record.
        order_as_a_new_account(tmp_path / "certs")
        renewed = nestgate("cert", "renew", "*.example.test", config=server.config_path)
        assert renewed.returncode == 0, renewed.stderr
        cert = wait_served(ports.https, "files.example.test", covering="*.example.test",
                           not_serial=first.serial_number, timeout=10)
        assert cert.serial_number != first.serial_number
        assert api_writes(pdns) == 4
        assert pdns.txt("_acme-challenge.example.test") == set()
        status, body = curl(ports.https, "files.example.test", root)
        assert status == 0 and body == b"hello over TLS\n", body
    finally:
        pebble.stop()
        pdns.stop()


def test_dns_provider_credentials_are_never_shown(start_server, ca, ports, tmp_path,
                                                  monkeypatch):
    """The API key from the environment, another setting from the file: neither in
    GET /v1/config, the server's output, `cert renew`'s and `cert list`'s, nor the
    reason of a failed order (which the provider's error would otherwise carry)."""
    pdns = PowerDNS(tmp_path / "pdns")
    pebble = Pebble(tmp_path / "pebble", ca, ports.http, ports.https,
                    dns_server=f"127.0.0.1:{pdns.port}")
    monkeypatch.setenv(TOKEN_VARIABLE, pdns.api_key)
    try:
        credentials = tmp_path / "dns.env"
        credentials.write_text("PDNS_SERVER_ID=localhost\n")
        server = start_server(acme_config(
            pebble, ports, tmp_path / "certs", names=["a.example.test"],
            extra=powerdns_dns(pdns, credentials, token_from_env=True))
            + '\n[admin]\naddress = "127.0.0.1:0"\n')
        wait_served(ports.https, "a.example.test")
        admin = server.admin_port()
        conn = http.client.HTTPConnection("127.0.0.1", admin, timeout=5)
        conn.request("GET", "/v1/config", headers={"Host": "localhost", **admin_headers(admin)})
        answer = conn.getresponse()
        shown = answer.read().decode()
        assert answer.status == 200, shown
        dns = json.loads(shown)["acme"]["dns"]
        assert dns["provider"] == "powerdns" and dns["credentials_file"] == str(credentials)
        assert dns["credentials"] == [["auth_token", TOKEN_VARIABLE]]
        # A setting read from the file is treated as a secret too: one that the
        # provider puts in its URL (and so in its error) is replaced in the reason.
        secret_id = "server-" + os.urandom(8).hex()
        credentials.write_text(f"PDNS_SERVER_ID={secret_id}\n")
        # An account that has proved nothing: its order must write the TXT record (the
        # first one's could have been handed the authorization it already won, and
        # renewed without a call to PowerDNS; see tests/pebble.py).
        order_as_a_new_account(tmp_path / "certs")
        failed = nestgate("cert", "renew", "a.example.test", config=server.config_path)
        assert failed.returncode == 1
        assert "powerdns could not add the TXT record _acme-challenge.a.example.test: " \
               "404 Client Error" in failed.stderr and "<redacted>" in failed.stderr, \
            failed.stderr
        listed = nestgate("cert", "list", config=server.config_path)
        checked = nestgate("check", config=server.config_path)
        assert checked.returncode == 0, checked.stderr
        server.wait_for("a.example.test: new certificate")
        outputs = [shown, failed.stdout, failed.stderr, listed.stdout, listed.stderr,
                   checked.stdout, checked.stderr, *server.lines, *server.stdout_lines]
        for secret in (pdns.api_key, secret_id):
            assert not any(secret in text for text in outputs), secret
        assert secret_id not in (tmp_path / "certs" / "certificates" / "acme" /
                                 "a.example.test" / "meta.json").read_text()
    finally:
        pebble.stop()
        pdns.stop()


def test_check_refuses_an_unknown_dns_provider_and_a_missing_credentials_file(tmp_path):
    config = tmp_path / "dns.toml"
    base = """
[[listen]]
address = "127.0.0.1:0"

[[listen.certificate]]
acme = true

[acme]
storage = "certs"

[acme.dns]
zone = "example.com"
{dns}

[[site]]
hosts = ["*.example.com"]
"""
    config.write_text(base.format(dns='provider = "cloudfare"'))
    out = nestgate("check", config=config)
    assert out.returncode == 2
    assert "dns.toml: acme.dns.provider: expected \"rfc2136\" or a DNS provider dns-lexicon " \
           "knows (did you mean 'cloudflare'?), got 'cloudfare'" in out.stderr, out.stderr
    config.write_text(base.format(dns='provider = "cloudflare"\n'
                                      'credentials_file = "/etc/nestgate/none.env"'))
    out = nestgate("check", config=config)
    assert out.returncode == 2
    assert "dns.toml: acme.dns.credentials_file: expected a path to a readable file, got " \
           "'/etc/nestgate/none.env'" in out.stderr, out.stderr


def test_external_account_binding_and_rsa_keys(start_server, ca, ports, tmp_path):
    """A CA that requires EAB (as ZeroSSL and company CAs do): the account is bound
    with the configured key id and HMAC key; `key_type = "rsa2048"` gives RSA keys."""
    from cryptography.hazmat.primitives.asymmetric import rsa
    pebble = Pebble(tmp_path / "pebble", ca, ports.http, ports.https, eab=True)
    try:
        good = 'eab_kid = "kid-1"\neab_hmac_key = "%s"\nkey_type = "rsa2048"' \
            % Pebble.EAB_KEYS["kid-1"]
        server = start_server(acme_config(pebble, ports, tmp_path / "certs", names=["a.test"],
                                          extra=good))
        cert = wait_served(ports.https, "a.test")
        assert isinstance(cert.public_key(), rsa.RSAPublicKey)
        assert cert.public_key().key_size == 2048
        server.stop()
        # Without the binding the CA refuses the account, and says why.
        other = Ports()
        unbound = start_server(acme_config(pebble, other, tmp_path / "certs-unbound",
                                           names=["a.test"]), name="unbound.toml")
        line = unbound.wait_for("a.test: could not obtain a certificate", timeout=30)
        assert "externalAccountRequired" in line or "external account" in line.lower(), line
    finally:
        pebble.stop()


def test_wildcard_without_dns01_is_refused_by_check(tmp_path, pebble, ports):
    config = tmp_path / "wild.toml"
    config.write_text(acme_config(pebble, ports, tmp_path / "certs",
                                  sites=SITE.format(hosts='["*.example.test"]')))
    out = nestgate("check", config=config)
    assert out.returncode == 2
    assert f"{config}: listen[1].certificate[0].names (from the sites' hosts): expected " \
           "names without wildcards unless [acme.dns] is set" in out.stderr
    assert "'*.example.test'" in out.stderr


# ---------------------------------------------------------------- private sites

def test_signin_site_and_https_redirect_still_validate(start_server, pebble, ports, tmp_path):
    from argon2 import PasswordHasher
    sites = f"""
[auth]
store = "{tmp_path}/state.db"

[[auth.user]]
name = "ann"
password = "{PasswordHasher().hash("correct horse")}"

[[site]]
hosts = ["private.test"]
protected = true
allow = ["10.9.9.9/32"]

[[site.route]]
path = "/"
type = "return"
body = "secret\\n"
"""
    server = start_server(acme_config(pebble, ports, tmp_path / "certs", sites=sites,
                                      plain_extra="redirect_https = true\n"
                                                  f"https_port = {ports.https}"))
    wait_served(ports.https, "private.test")
    # The plain listener still redirects everything else, and the site stays private.
    conn = http.client.HTTPConnection("127.0.0.1", ports.http, timeout=5)
    conn.request("GET", "/x", headers={"Host": "private.test"})
    resp = conn.getresponse()
    assert resp.status == 308
    assert resp.getheader("location") == f"https://private.test:{ports.https}/x"
    resp.read()
    root = save_root(pebble, tmp_path)
    status, body = curl(ports.https, "private.test", root)
    assert status == 0 and b"secret" not in body
    # An unknown token is a 404 from the challenge answer, not the redirect.
    conn.request("GET", "/.well-known/acme-challenge/nothing-here",
                 headers={"Host": "private.test"})
    resp = conn.getresponse()
    assert resp.status == 404 and resp.read() == b"no such challenge\n"
    # A token is base64url or nothing: no path out of the challenge folder. (Dot
    # segments are resolved first, so the second is a path outside the challenge
    # prefix, and the listener's redirect answers it.)
    for escape in ("..%2F..%2Fcertificates%2Facme%2Fprivate.test%2Fkey.pem",
                   "%2E%2E/%2E%2E/certificates/acme/private.test/key.pem",
                   "..%5C..%5Cinternal-ca%5Croot-key.pem"):
        conn.request("GET", "/.well-known/acme-challenge/" + escape,
                     headers={"Host": "private.test"})
        resp = conn.getresponse()
        body = resp.read()
        assert resp.status in (308, 400, 404) and b"PRIVATE KEY" not in body, (escape, body)
        assert resp.status != 308 or resp.getheader("location").startswith("https://")
    assert server.proc.poll() is None


# ---------------------------------------------------------------- renewal

def test_forced_renewal_swaps_under_load_without_a_failed_request(start_server, pebble,
                                                                  ports, tmp_path):
    server = start_server(acme_config(pebble, ports, tmp_path / "certs"))
    first = wait_served(ports.https, "a.test")
    wait_served(ports.https, "b.test")
    root = save_root(pebble, tmp_path)
    ctx = ssl.create_default_context(cafile=str(root))
    kept = ctx.wrap_socket(socket.create_connection(("127.0.0.1", ports.https), timeout=10),
                           server_hostname="a.test")
    assert _ask(kept) == b"hello over TLS\n"
    # h2load in rounds (a connection ends after 1000 requests, as nginx's do, and
    # h2load does not reconnect) until the renewal has landed and one more round ran.
    rounds: list[str] = []
    renewed_at = []

    def load() -> None:
        while len(rounds) < 60 and (not renewed_at or len(rounds) <= renewed_at[0] + 1):
            out = subprocess.run(["h2load", "-n", "2000", "-c", "4", "-m", "4",
                                  f"--connect-to=127.0.0.1:{ports.https}",
                                  f"https://a.test:{ports.https}/"],
                                 capture_output=True, text=True, timeout=60)
            rounds.append(out.stdout + out.stderr)

    import threading
    loader = threading.Thread(target=load)
    loader.start()
    try:
        time.sleep(0.5)
        renewed = nestgate("cert", "renew", "a.test", config=server.config_path)
        assert renewed.returncode == 0, renewed.stderr
        assert "a.test: renewed" in renewed.stdout
        second = wait_served(ports.https, "a.test", timeout=10, not_serial=first.serial_number)
        renewed_at.append(len(rounds))
    finally:
        renewed_at.append(0)
        loader.join(120)
    assert len(rounds) >= 2
    for out in rounds:
        assert "requests: 2000 total, 2000 started, 2000 done, 2000 succeeded, 0 failed, " \
               "0 errored" in out, out
    assert second.serial_number != first.serial_number
    # The connection opened before the swap goes on with the certificate it had.
    assert _ask(kept) == b"hello over TLS\n"
    kept.close()
    assert orders(server, "a.test") == 1        # the renewal was the CLI's, not the server's


def test_failed_renewal_keeps_the_certificate_and_reports_why(start_server, pebble, ports,
                                                              tmp_path):
    server = start_server(acme_config(pebble, ports, tmp_path / "certs", names=["a.test"])
                          + "\n[admin]\naddress = \"127.0.0.1:0\"\n")
    first = wait_served(ports.https, "a.test")
    pebble.point_names_at("127.0.0.2")          # the CA now looks for the name elsewhere
    order_as_a_new_account(tmp_path / "certs")  # so it must look (tests/pebble.py)
    failed = nestgate("cert", "renew", "a.test", config=server.config_path)
    assert failed.returncode == 1
    assert "a.test: not renewed: a.test: " in failed.stderr
    assert "connection refused" in failed.stderr.lower(), failed.stderr
    assert peer_certificate(ports.https, "a.test").serial_number == first.serial_number
    listed = nestgate("cert", "list", config=server.config_path).stdout
    assert "connection refused" in listed.lower()
    admin = server.admin_port()
    deadline = time.monotonic() + 10
    while True:
        conn = http.client.HTTPConnection("127.0.0.1", admin, timeout=5)
        conn.request("GET", "/v1/ready", headers={"Host": "localhost", **admin_headers(admin)})
        ready = json.loads(conn.getresponse().read())
        entry = ready["certificates"][0]
        if "error" in entry or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert entry["names"] == ["a.test"] and entry["source"] == "acme"
    assert "connection refused" in entry["error"].lower() and entry["failures"] == 1
    conn.request("GET", "/metrics", headers={"Host": "localhost", **admin_headers(admin)})
    metrics = conn.getresponse().read().decode()
    assert re.search(r'nestgate_certificate_renewal_failures\{listener="127\.0\.0\.1:\d+",'
                     r'name="a\.test"\} 1', metrics), metrics
    # The way back: the name is reachable again, the next renewal succeeds.
    pebble.point_names_at("127.0.0.1")
    assert nestgate("cert", "renew", "a.test", config=server.config_path).returncode == 0
    wait_served(ports.https, "a.test", timeout=10, not_serial=first.serial_number)
    assert "-" == nestgate("cert", "list", config=server.config_path) \
        .stdout.splitlines()[1].split()[-1]


def test_a_renewal_that_cannot_write_the_storage_keeps_the_certificate_and_says_why(
        start_server, pebble, ports, tmp_path):
    """A full or read-only storage disk: the order's bookkeeping could not be written
    and `cert renew` (and the certificate process, the same code) died of the OSError
    with a traceback. Now it is a failed renewal like any other: the reason said, the
    back-off kept in memory when it cannot be written, the old certificate served. A
    file size limit stands in for the full disk (Python ignores SIGXFSZ, so a write
    past it fails with EFBIG)."""
    import resource
    server = start_server(acme_config(pebble, ports, tmp_path / "certs", names=["a.test"]))
    first = wait_served(ports.https, "a.test")

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))

    failed = subprocess.run([sys.executable, "-m", "nestgate", "cert", "renew", "a.test",
                             "--config", str(server.config_path)], capture_output=True,
                            text=True, env=_env(), cwd=REPO, timeout=180,
                            preexec_fn=small_files)
    assert failed.returncode == 1, failed.stderr
    assert f"a.test: not renewed: the certificate storage {tmp_path / 'certs'} cannot be " \
           "written: File too large\n" in failed.stderr, failed.stderr
    assert "Traceback" not in failed.stderr
    assert peer_certificate(ports.https, "a.test").serial_number == first.serial_number
    assert nestgate("cert", "renew", "a.test", config=server.config_path).returncode == 0
    wait_served(ports.https, "a.test", timeout=10, not_serial=first.serial_number)


def test_two_processes_sharing_storage_order_once(start_server, pebble, ports, tmp_path):
    storage = tmp_path / "certs"
    one = start_server(acme_config(pebble, ports, storage, names=["a.test"]), name="one.toml")
    other = Ports()
    two = start_server(acme_config(pebble, other, storage, names=["a.test"]),
                       name="two.toml")
    first = wait_served(ports.https, "a.test")
    second = wait_served(other.https, "a.test")
    assert first.serial_number == second.serial_number
    time.sleep(2)                               # time enough for a second order to show
    assert orders(one, "a.test") + orders(two, "a.test") == 1, one.lines + two.lines


def test_instances_sharing_redis_order_once_and_answer_each_others_challenges(
        start_server, pebble, ports, tmp_path):
    """[state] backend = "redis": each instance has its own storage folder; one orders,
    every instance serves, and a challenge answer published by one is answered by
    another (the CA reaches only instance one here)."""
    from redisserver import RedisServer
    redis = RedisServer(tmp_path)
    try:
        state = f'[state]\nbackend = "redis"\nurl = "{redis.url}"\nprefix = "certs:"\n'
        one = start_server(acme_config(pebble, ports, tmp_path / "one", names=["a.test"],
                                       extra=state), name="one.toml")
        first = wait_served(ports.https, "a.test")
        other = Ports()
        two = start_server(acme_config(pebble, other, tmp_path / "two", names=["a.test"],
                                       extra=state), name="two.toml")
        assert wait_served(other.https, "a.test", timeout=10).serial_number == \
            first.serial_number
        two.wait_for("a.test: certificate from another instance", timeout=5)
        # Instance two orders; the CA asks instance one, which has the answer from Redis.
        renewed = nestgate("cert", "renew", "a.test", config=two.config_path)
        assert renewed.returncode == 0, renewed.stderr
        second = wait_served(other.https, "a.test", timeout=10,
                             not_serial=first.serial_number)
        assert wait_served(ports.https, "a.test", timeout=10,
                           not_serial=first.serial_number).serial_number == \
            second.serial_number
        assert challenges_used(tmp_path / "two", "a.test") == ["http-01"]
        assert orders(one, "a.test") == 1 and orders(two, "a.test") == 0
        assert list((tmp_path / "one" / "challenges" / "http").iterdir()) == []
    finally:
        redis.proc.kill()
        redis.proc.wait()


def test_restart_serves_stored_certificates_without_the_ca(start_server, pebble, ports,
                                                           tmp_path):
    text = acme_config(pebble, ports, tmp_path / "certs")
    server = start_server(text)
    first = {n: wait_served(ports.https, n).serial_number for n in ("a.test", "b.test")}
    server.stop()
    pebble.stop()                               # no CA from now on
    again = start_server(text, name="again.toml")
    for name, serial in first.items():
        assert peer_certificate(ports.https, name).serial_number == serial
    time.sleep(1.5)
    assert orders(again, "a.test") == orders(again, "b.test") == 0
    assert not any("could not obtain" in line for line in again.lines)


# ---------------------------------------------------------------- local CA

LOCAL = """
[server]
workers = 1

[[listen]]
address = "127.0.0.1:{port}"
tls = "internal"

[acme]
storage = "{storage}"

[[site]]
hosts = ["nas.home.arpa", "app.localhost"]

[[site.route]]
path = "/"
type = "return"
body = "hello from the LAN\\n"
"""


def test_local_ca_certificates_verify_with_curl_and_chromium(start_server, tmp_path):
    port = free_port()
    server = start_server(LOCAL.format(port=port, storage=tmp_path / "certs"))
    root = tmp_path / "certs" / "internal-ca" / "root.pem"
    assert str(root) in server.wait_for("made the local CA")
    assert (tmp_path / "certs" / "internal-ca" / "root-key.pem").stat().st_mode & 0o777 == 0o600
    for name in ("nas.home.arpa", "app.localhost"):
        cert = peer_certificate(port, name)   # issued before the workers started
        assert cert is not None and _dns_names(cert) == [name]
        status, body = curl(port, name, root)
        assert status == 0 and body == b"hello from the LAN\n", body
    trust = nestgate("trust", config=server.config_path)
    assert trust.returncode == 0 and str(root) in trust.stdout
    assert "update-ca-certificates" in trust.stdout and "Android" in trust.stdout
    assert nestgate("trust", "--pem", config=server.config_path).stdout.encode() == \
        root.read_bytes()

    # Chromium trusts it once the root is in the NSS database of its HOME, and not before.
    from browser import Browser
    home = tmp_path / "home"
    nssdb = home / ".pki" / "nssdb"
    nssdb.mkdir(parents=True)
    subprocess.run(["certutil", "-N", "-d", f"sql:{nssdb}", "--empty-password"], check=True)
    env = {**os.environ, "HOME": str(home)}
    args = [f"--host-resolver-rules=MAP nas.home.arpa 127.0.0.1", "--disable-quic",
            "--disable-background-networking", "--disable-component-update"]
    url = f"https://nas.home.arpa:{port}/"
    untrusted = Browser(url, args, env)
    try:
        shown = untrusted.wait_for("document.body && document.body.innerText", timeout=20)
        assert "hello from the LAN" not in (shown or "")
    finally:
        untrusted.close()
    subprocess.run(["certutil", "-A", "-d", f"sql:{nssdb}", "-t", "C,,", "-n",
                    "nestgate-local-ca", "-i", str(root)], check=True)
    trusted = Browser(url, args, env)
    try:
        shown = trusted.wait_for("document.body && document.body.innerText.includes("
                                 "'hello from the LAN') && document.body.innerText")
        assert shown.strip() == "hello from the LAN"
        assert trusted.evaluate("location.protocol") == "https:"
    finally:
        trusted.close()


# ---------------------------------------------------------------- installed certificates

INSTALLED = """
[server]
workers = 1

[[listen]]
address = "127.0.0.1:{port}"

[[listen.certificate]]
installed = true
names = ["legacy.test"]

[acme]
storage = "{storage}"

[[site]]
hosts = ["legacy.test"]

[[site.route]]
path = "/"
type = "return"
body = "legacy\\n"
"""


def _pems(folder: Path, cert, label: str) -> tuple[Path, Path]:
    chain, key = folder / f"{label}.pem", folder / f"{label}.key"
    chain.write_bytes(b"".join(p.bytes() for p in cert.cert_chain_pems))
    key.write_bytes(cert.private_key_pem.bytes())
    return chain, key


def test_cert_install_validates_and_swaps_in(start_server, tmp_path):
    import datetime

    import trustme
    authority = trustme.CA()
    port = free_port()
    server = start_server(INSTALLED.format(port=port, storage=tmp_path / "certs"))
    assert peer_certificate(port, "legacy.test") is None          # nothing to serve yet
    later = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=90)
    good = authority.issue_cert("legacy.test", not_after=later)
    chain, key = _pems(tmp_path, good, "good")
    done = nestgate("cert", "install", "legacy.test", "--cert", str(chain), "--key", str(key),
                    config=server.config_path)
    assert done.returncode == 0, done.stderr
    served = wait_served(port, "legacy.test", timeout=10)
    ca_file = tmp_path / "authority.pem"
    authority.cert_pem.write_to_path(str(ca_file))
    assert curl(port, "legacy.test", ca_file) == (0, b"legacy\n")

    sooner = authority.issue_cert("legacy.test", not_after=later - datetime.timedelta(days=30))
    chain2, key2 = _pems(tmp_path, sooner, "sooner")
    refused = nestgate("cert", "install", "legacy.test", "--cert", str(chain2), "--key",
                       str(key2), config=server.config_path)
    assert refused.returncode == 1 and "earlier than the certificate it would replace" \
        in refused.stderr
    mismatched = nestgate("cert", "install", "legacy.test", "--cert", str(chain), "--key",
                          str(key2), config=server.config_path)
    assert mismatched.returncode == 1 and "does not belong" in mismatched.stderr
    other = authority.issue_cert("other.test", not_after=later + datetime.timedelta(days=1))
    chain3, key3 = _pems(tmp_path, other, "other")
    wrong_name = nestgate("cert", "install", "legacy.test", "--cert", str(chain3), "--key",
                          str(key3), config=server.config_path)
    assert wrong_name.returncode == 1 and "not legacy.test" in wrong_name.stderr
    assert peer_certificate(port, "legacy.test").serial_number == served.serial_number
    renew = nestgate("cert", "renew", "legacy.test", config=server.config_path)
    assert renew.returncode == 1 and "the tool that obtained it renews it" in renew.stderr

    # The admin API's PUT does the same checks and the same swap.
    def put(name: str, body: bytes):
        conn = http.client.HTTPConnection("127.0.0.1", server.admin_port(), timeout=30)
        conn.request("PUT", f"/v1/certificates/{name}", body=body,
                     headers={"Host": "localhost", "Content-Type": "application/json",
                              **admin_headers(server.admin_port())})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    newer = authority.issue_cert("legacy.test", not_after=later + datetime.timedelta(days=9))
    pems = {"cert": b"".join(p.bytes() for p in newer.cert_chain_pems).decode(),
            "key": newer.private_key_pem.bytes().decode()}
    status, answer = put("legacy.test", json.dumps({**pems, "key": pems["key"][:-80]}).encode())
    assert status == 422 and "key" in answer["error"]["message"]
    status, answer = put("nothing.test", json.dumps(pems).encode())
    assert status == 404 and answer["error"]["code"] == "not_found"
    assert put("legacy.test", b"{")[0] == 422
    status, answer = put("legacy.test", json.dumps(pems).encode())
    assert status == 200 and answer["name"] == "legacy.test" and answer["sources"] == ["installed"]
    assert abs(answer["not_after"] - newer_expiry(newer)) < 1
    wait_served(port, "legacy.test", timeout=10, not_serial=served.serial_number)
    assert any('"action":"certificate.install"' in line and "BEGIN" not in line
               for line in server.lines)


def newer_expiry(issued) -> float:
    cert = x509.load_pem_x509_certificate(issued.cert_chain_pems[0].bytes())
    return cert.not_valid_after_utc.timestamp()


@pytest.mark.skipif(os.geteuid() != 0, reason="certbot runs its hooks as root; so must this")
def test_certbot_deploy_hook_installs_for_the_servers_user(start_server, tmp_path):
    import trustme
    authority = trustme.CA()
    port = free_port()
    storage = tmp_path / "certs"
    storage.mkdir()
    os.chown(storage, 65534, 65534)            # the server's user ("nobody" here)
    server = start_server(INSTALLED.format(port=port, storage=storage))
    lineage = tmp_path / "live" / "legacy.test"
    lineage.mkdir(parents=True)
    issued = authority.issue_cert("legacy.test")
    (lineage / "fullchain.pem").write_bytes(b"".join(p.bytes() for p in issued.cert_chain_pems))
    (lineage / "privkey.pem").write_bytes(issued.private_key_pem.bytes())
    command = tmp_path / "nestgate"             # what `pipx install` puts on the PATH
    command.write_text(f"#!/bin/sh\nexec {sys.executable} -m nestgate \"$@\"\n")
    command.chmod(0o755)
    hook = subprocess.run([str(REPO / "deploy" / "certbot-deploy-hook")], env={
        **_env(), "RENEWED_LINEAGE": str(lineage), "RENEWED_DOMAINS": "legacy.test",
        "NESTGATE": str(command), "NESTGATE_CONFIG": str(server.config_path)},
        capture_output=True, text=True, cwd=REPO, timeout=60)
    assert hook.returncode == 0, hook.stderr
    wait_served(port, "legacy.test", timeout=10)
    for path in storage.rglob("*"):
        assert (path.stat().st_uid, path.stat().st_gid) == (65534, 65534), path
    key = storage / "certificates" / "installed" / "legacy.test" / "key.pem"
    assert key.stat().st_mode & 0o777 == 0o600
