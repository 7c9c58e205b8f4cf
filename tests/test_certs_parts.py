"""The parts of automatic HTTPS that need no CA: the ClientHello reader behind
TLS-ALPN-01, the config's errors, the storage's whole-file writes and lock, and the
back-off of failed orders."""

from __future__ import annotations

import os
import ssl
import time
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from nestgate.certs.clienthello import NotClientHello, parse_client_hello
from nestgate.certs.manager import RETRY_FIRST, CertManager, Managed
from nestgate.certs.storage import CertStorage
from nestgate.config import ConfigError, parse_config


def client_hello(server_name: str | None, alpn: list[str]) -> bytes:
    """The first flight of Python's own TLS client."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if alpn:
        ctx.set_alpn_protocols(alpn)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname=server_name)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def test_client_hello_names_and_alpn_are_read():
    hello = client_hello("a.test", ["acme-tls/1"])
    assert parse_client_hello(hello) == ("a.test", ["acme-tls/1"])
    assert parse_client_hello(client_hello("b.test", ["h2", "http/1.1"])) == \
        ("b.test", ["h2", "http/1.1"])
    assert parse_client_hello(client_hello(None, [])) == (None, [])
    # Until the record is whole, nothing is decided.
    for cut in (0, 4, 5, 60, len(hello) - 1):
        assert parse_client_hello(hello[:cut]) is None


def test_what_is_not_a_client_hello_is_said_so():
    with pytest.raises(NotClientHello):
        parse_client_hello(b"GET / HTTP/1.1\r\n\r\n")
    with pytest.raises(NotClientHello):
        parse_client_hello(b"\x16\x03\x01\x00\x04\x02\x00\x00\x00")     # a ServerHello


@given(st.binary(max_size=600))
def test_any_bytes_give_an_answer_or_not_client_hello(data):
    try:
        result = parse_client_hello(b"\x16\x03\x01" + len(data).to_bytes(2, "big") + data)
    except NotClientHello:
        return
    assert result is None or isinstance(result, tuple)


BASE = """
[[listen]]
address = "127.0.0.1:0"
{listen}

[acme]
storage = "{storage}"
{acme}

[[site]]
hosts = {hosts}
"""


def _config(tmp_path, listen="", acme="", hosts='["a.test"]'):
    text = BASE.format(listen=listen, acme=acme, hosts=hosts, storage=tmp_path / "certs")
    import tomllib
    return parse_config(tomllib.loads(text), "site.toml", tmp_path)


def test_managed_certificates_take_the_sites_hosts(tmp_path):
    config = _config(tmp_path, listen='[[listen.certificate]]\nacme = true',
                     hosts='["a.test", "b.test", "*", "app.localhost"]')
    cert = config.listeners[0].certificates[0]
    assert cert.managed == "acme" and cert.names == ("a.test", "b.test")
    internal = _config(tmp_path, listen='tls = "internal"', hosts='["nas.home.arpa", "*.lan"]')
    assert internal.listeners[0].certificates[0].names == ("nas.home.arpa", "*.lan")


def test_directory_shorthands_and_defaults(tmp_path):
    from nestgate.certs.config import LETS_ENCRYPT, LETS_ENCRYPT_STAGING
    assert _config(tmp_path).acme.directory == LETS_ENCRYPT
    assert _config(tmp_path, acme='directory = "staging"').acme.directory == LETS_ENCRYPT_STAGING
    assert _config(tmp_path).acme.key_type == "p256"
    assert _config(tmp_path).acme.storage == str(tmp_path / "certs")


@pytest.mark.parametrize("listen, acme, expected", [
    ('[[listen.certificate]]\nacme = true\ncert = "x.pem"',
     "", "site.toml: listen[0].certificate[0].cert: expected no PEM files here"),
    ('[[listen.certificate]]\nacme = true\ninternal = true',
     "", "site.toml: listen[0].certificate[0].internal: expected one of acme = true"),
    ('[[listen.certificate]]\nacme = true\nnames = ["*.example.com"]',
     "", "listen[0].certificate[0].names: expected names without wildcards unless "
         "[acme.dns] is set (a CA proves a wildcard only by DNS-01), got '*.example.com'"),
    ('[[listen.certificate]]\nacme = true\nnames = ["a/../b"]',
     "", "listen[0].certificate[0].names: expected host names"),
    ('tls = "yes"', "", "site.toml: listen[0].tls: expected one of"),
    ("", 'directory = "http://ca.example/dir"',
     "site.toml: acme.directory: expected an https:// ACME directory URL"),
    ("", 'key_type = "dsa"', "site.toml: acme.key_type: expected one of"),
    ("", 'eab_kid = "kid-1"', "site.toml: acme.eab_hmac_key: expected eab_kid and "
                              "eab_hmac_key together"),
    ("", 'challenges = ["dns-01"]', "site.toml: acme.challenges: expected an [acme.dns] "
                                    "table when \"dns-01\" is listed"),
    ("", '[acme.dns]\nserver = "127.0.0.1"\nzone = "example.com"\ntsig_name = "k"\n'
         'tsig_secret = "not base64!"',
     "site.toml: acme.dns.tsig_secret: expected the TSIG key's base64 secret"),
])
def test_bad_certificate_config_names_file_key_and_expectation(tmp_path, listen, acme,
                                                               expected):
    with pytest.raises(ConfigError) as caught:
        _config(tmp_path, listen=listen, acme=acme)
    assert any(expected in problem for problem in caught.value.problems), caught.value.problems
    assert all("not base64!" not in problem for problem in caught.value.problems)


PROVIDER = '[acme.dns]\nzone = "example.com"\n'


@pytest.mark.parametrize("dns, env_file, expected", [
    ('provider = "cloudflair"', None,
     "site.toml: acme.dns.provider: expected \"rfc2136\" or a DNS provider dns-lexicon "
     "knows (did you mean 'cloudflare'?), got 'cloudflair'"),
    ('provider = "route53"\ncredentials_file = "missing.env"', None,
     "site.toml: acme.dns.provider: expected a provider whose libraries are installed "
     "(pip install 'dns-lexicon[route53]' in nestgate's environment), got 'route53'"),
    ('provider = "cloudflare"\ncredentials_file = "missing.env"', None,
     "site.toml: acme.dns.credentials_file: expected a path to a readable file, "
     "got 'missing.env'"),
    ('provider = "cloudflare"\ncredentials_file = "dns.env"', "# nothing yet\n",
     "site.toml: acme.dns.credentials_file: expected cloudflare's credentials "
     "(auth_token) in credentials_file or credentials"),
    ('provider = "cloudflare"\ncredentials_file = "dns.env"', "AUTH_TOKN=s3cret-value\n",
     "dns.env: line 1: a key cloudflare reads (auth_username, auth_token, zone_id; "
     "did you mean AUTH_TOKEN?)"),
    ('provider = "cloudflare"\ncredentials_file = "dns.env"', "#\nc2VjcmV0LXZhbHVl==\n",
     "dns.env: line 2: a key cloudflare reads (auth_username, auth_token, zone_id)"),
    ('provider = "porkbun"\ncredentials_file = "dns.env"', "auth_key s3cret-value\n",
     "dns.env: line 1: expected KEY=value"),
    ('provider = "duckdns"\ncredentials = { auth_token_env = "NESTGATE_UNSET_TOKEN" }', None,
     "site.toml: acme.dns.credentials.auth_token_env: expected the environment variable "
     "NESTGATE_UNSET_TOKEN set (it is not)"),
    ('provider = "duckdns"\ncredentials = { auth_token = "s3cret-value" }', None,
     "site.toml: acme.dns.credentials.auth_token: expected <option>_env = \"VARIABLE\", "
     "naming the environment variable that holds it (secrets are not kept in the config "
     "file)"),
    ('provider = "hetzner"\noptions = { auth_token = "s3cret-value" }', None,
     "site.toml: acme.dns.options.auth_token: expected no secret here: put it in "
     "credentials_file"),
    ('provider = "powerdns"\noptions = { pdns_srever = "http://ns1:8081" }', None,
     "acme.dns.options.pdns_srever: expected an option of this provider (auth_token, "
     "pdns_server, pdns_server_id, pdns_disable_notify) (did you mean 'pdns_server'?)"),
    ('provider = "powerdns"\ncredentials_file = "dns.env"', "AUTH_TOKEN=s3cret-value\n",
     "site.toml: acme.dns.credentials_file: expected settings powerdns accepts: it says "
     "PowerDNS API endpoint not defined (pdns_server)"),
    ('provider = "ovh"\ntsig_name = "k"\ncredentials_file = "dns.env"',
     "AUTH_APPLICATION_KEY=s3cret-value\n", "site.toml: acme.dns.tsig_name: unknown key"),
])
def test_bad_dns_provider_config_is_named_and_secrets_are_not_shown(tmp_path, dns, env_file,
                                                                     expected):
    if env_file is not None:
        (tmp_path / "dns.env").write_text(env_file)
    with pytest.raises(ConfigError) as caught:
        _config(tmp_path, acme=PROVIDER + dns)
    assert any(expected in problem for problem in caught.value.problems), caught.value.problems
    assert all("s3cret-value" not in problem and "c2vjcmv0" not in problem.lower()
               for problem in caught.value.problems)


def test_dns_provider_credentials_are_read_from_the_file_and_the_environment(tmp_path,
                                                                            monkeypatch):
    """Only where they are is kept in the config: the names, never the values."""
    (tmp_path / "dns.env").write_text('# OVH\nexport AUTH_APPLICATION_KEY="s3cret-1"\n'
                                      "auth_application_secret='s3cret-2'\n")
    monkeypatch.setenv("OVH_CONSUMER_KEY", "s3cret-3")
    config = _config(tmp_path, acme=PROVIDER + 'provider = "ovh"\ncredentials_file = "dns.env"'
                     '\ncredentials = { auth_consumer_key_env = "OVH_CONSUMER_KEY" }'
                     '\noptions = { auth_entrypoint = "ovh-eu" }')
    dns = config.acme.dns
    assert (dns.provider, dns.zone) == ("ovh", "example.com")
    assert dns.credentials_file == str(tmp_path / "dns.env")
    assert dns.credentials == (("auth_consumer_key", "OVH_CONSUMER_KEY"),)
    assert dns.options == (("auth_entrypoint", "ovh-eu"),)
    assert "s3cret" not in repr(config)
    from nestgate.certs.dnsprovider import gather
    values, problems = gather(dns, os.environ)
    assert problems == [] and values == {
        "auth_entrypoint": "ovh-eu", "auth_application_key": "s3cret-1",
        "auth_application_secret": "s3cret-2", "auth_consumer_key": "s3cret-3"}
    # Without `provider`, [acme.dns] is RFC 2136 as before.
    plain = _config(tmp_path, acme='[acme.dns]\nserver = "127.0.0.1:5353"\nzone = "example.com"'
                    '\ntsig_name = "k"\ntsig_secret = "c2VjcmV0"')
    assert (plain.acme.dns.provider, plain.acme.dns.port) == ("rfc2136", 5353)


def test_a_dns_provider_that_never_answers_fails_the_order_in_bounded_time(tmp_path,
                                                                          monkeypatch):
    """A provider's HTTP calls have no timeout of their own: an API that accepts the
    connection and says nothing would hold the certificate process (and every other
    renewal) for ever. Each call is given API_TIMEOUT."""
    import socket
    from nestgate.certs import dnsprovider
    from nestgate.certs.config import DnsProvider
    from nestgate.certs.dnsupdate import DnsUpdateError
    silent = socket.create_server(("127.0.0.1", 0))
    port = silent.getsockname()[1]
    monkeypatch.setattr(dnsprovider, "API_TIMEOUT", 1.0)
    monkeypatch.setenv("NESTGATE_TEST_PDNS_KEY", "s3cret-value")
    settings = DnsProvider(provider="powerdns", zone="example.test",
                           credentials=(("auth_token", "NESTGATE_TEST_PDNS_KEY"),),
                           options=(("pdns_server", f"http://127.0.0.1:{port}"),))
    started = time.monotonic()
    with pytest.raises(DnsUpdateError) as caught:
        dnsprovider.ProviderChallenge(settings).add("_acme-challenge.example.test", "v")
    assert time.monotonic() - started < 5
    assert str(caught.value) == "powerdns did not answer within 1s (add the TXT record " \
                                "_acme-challenge.example.test)"
    silent.close()


def test_a_credentials_file_others_can_read_is_warned_about(tmp_path):
    from nestgate.config import config_warnings
    credentials = tmp_path / "dns.env"
    credentials.write_text("AUTH_TOKEN=s3cret-value\n")
    credentials.chmod(0o644)
    config = _config(tmp_path, acme=PROVIDER + 'provider = "hetzner"\n'
                     'credentials_file = "dns.env"')
    assert config_warnings(config) == [
        f"site.toml: acme.dns.credentials_file: {credentials} can be read by other users "
        "of this machine (mode 0644); `chmod 600` it"]
    credentials.chmod(0o600)
    assert config_warnings(config) == []


def test_a_provider_error_quoting_a_credential_in_a_url_is_scrubbed():
    """DuckDNS and others take the token in the query string, so the HTTP error the
    provider raises quotes it, percent-encoded; it reaches logs and `last_error`."""
    from nestgate.certs.config import DnsProvider
    from nestgate.certs.dnsprovider import scrub
    settings = DnsProvider(provider="duckdns", zone="home.duckdns.org",
                           options=(("pdns_server", "http://ns1.lan"),))
    token = "tok+en/with=signs"
    error = ("400 Client Error for url: https://www.duckdns.org/update?domains=home&"
             "token=tok%2Ben%2Fwith%3Dsigns&txt=x (sent tok+en/with=signs to http://ns1.lan)")
    shown = scrub(error, {"auth_token": token, "pdns_server": "http://ns1.lan"}, settings)
    assert shown == ("400 Client Error for url: https://www.duckdns.org/update?domains=home&"
                     "token=<redacted>&txt=x (sent <redacted> to http://ns1.lan)")


def test_without_nameservers_the_zones_name_servers_are_found_by_the_resolver(
        tmp_path, monkeypatch):
    """The servers waited on are the NS of the zone holding [acme.dns] zone, as this
    machine's resolver finds them; here the resolver is PowerDNS itself. A name below
    the zone's apex (DuckDNS's home.duckdns.org) finds the apex's servers."""
    import dns.resolver
    from nestgate.certs.config import DnsProvider
    from nestgate.certs.dnsprovider import ProviderChallenge
    from nestgate.certs.dnsupdate import DnsUpdateError
    from pdns import PowerDNS
    pdns = PowerDNS(tmp_path / "pdns")
    try:
        resolver = dns.resolver.Resolver(configure=False)
        resolver.nameservers, resolver.port = ["127.0.0.1"], pdns.port
        monkeypatch.setattr(dns.resolver, "default_resolver", resolver)
        for zone in ("example.test", "home.example.test"):
            found = ProviderChallenge(DnsProvider(provider="powerdns", zone=zone)).servers()
            assert found == [("127.0.0.1", 53)], zone
        with pytest.raises(DnsUpdateError) as caught:
            ProviderChallenge(DnsProvider(provider="powerdns", zone="other.invalid")).servers()
        assert "could not find the name servers of other.invalid" in str(caught.value)
        assert "list them in [acme.dns] nameservers" in str(caught.value)
    finally:
        pdns.stop()


def test_a_failed_write_leaves_the_stored_certificate(tmp_path, monkeypatch):
    storage = CertStorage(str(tmp_path))
    storage.ensure()
    target = tmp_path / "certificates" / "acme" / "a.test" / "fullchain.pem"
    storage.write(target, b"old chain")

    def full_disk(fd, *_args):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError):
        storage.write(target, b"new chain")
    assert target.read_bytes() == b"old chain"
    assert [p.name for p in target.parent.iterdir()] == ["fullchain.pem"]   # no leftovers


def test_the_order_lock_is_held_across_processes(tmp_path):
    storage = CertStorage(str(tmp_path))
    with storage.lock("acme", "a.test") as mine:
        assert mine
        pid = os.fork()
        if pid == 0:
            with storage.lock("acme", "a.test", wait=0.3) as theirs:
                os._exit(0 if theirs is False else 1)
        assert os.waitpid(pid, 0)[1] == 0
    with storage.lock("acme", "a.test") as again:
        assert again


def test_failures_back_off_exponentially_and_keep_the_reason(tmp_path):
    config = _config(tmp_path, listen='[[listen.certificate]]\nacme = true',
                     acme='directory = "https://127.0.0.1:9/dir"')    # nothing listens there
    manager = CertManager(config, log=lambda _m: None)
    item = Managed("acme", "a.test")
    waits = []
    for _ in range(3):
        reason = manager.obtain(item, force=True)
        assert "Connection refused" in reason or "connection" in reason.lower()
        meta = manager.storage.meta("acme", "a.test")
        waits.append(meta["next_attempt"] - time.time())
    assert meta["failures"] == 3 and meta["last_error"] == reason
    for n, wait in enumerate(waits):
        assert RETRY_FIRST * 2 ** n * 0.75 < wait < RETRY_FIRST * 2 ** n * 1.25
    assert manager.storage.load("acme", "a.test") is None
    assert not Path(tmp_path / "certs" / "certificates" / "acme" / "a.test" /
                    "fullchain.pem").exists()


class SmallCA:
    """Just enough of an ACME server over real HTTPS for what Pebble cannot show:
    a directory (with `renewalInfo` when asked), nonces, accounts, and either a
    `rateLimited` refusal with Retry-After or a renewal window (RFC 9773)."""

    def __init__(self, certs, *, rate_limited: bool = False, window=None) -> None:
        import http.server
        import json
        import threading
        outer = self
        self.asked: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *_args):
                pass

            def _send(self, status, body, headers=()):
                data = json.dumps(body).encode()
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("Replay-Nonce", "bm9uY2U")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_HEAD(self):
                self.send_response(200)
                self.send_header("Replay-Nonce", "bm9uY2U")
                self.end_headers()

            def do_GET(self):
                outer.asked.append(self.path)
                base = f"https://127.0.0.1:{self.server.server_port}"
                if self.path.startswith("/renewal-info/"):
                    self._send(200, {"suggestedWindow": window},
                               [("Content-Type", "application/json"), ("Retry-After", "3600")])
                    return
                directory = {"newNonce": f"{base}/nonce", "newAccount": f"{base}/account",
                             "newOrder": f"{base}/order"}
                if window is not None:
                    directory["renewalInfo"] = f"{base}/renewal-info"
                self._send(200, directory, [("Content-Type", "application/json")])

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                if rate_limited:
                    self._send(429, {"type": "urn:ietf:params:acme:error:rateLimited",
                                     "detail": "too many new accounts from this address"},
                               [("Content-Type", "application/problem+json"),
                                ("Retry-After", "7200")])
                    return
                base = f"https://127.0.0.1:{self.server.server_port}"
                self._send(201, {"status": "valid"}, [("Content-Type", "application/json"),
                                                      ("Location", f"{base}/account/1")])

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*certs["local"])
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.acme = (f'directory = "https://127.0.0.1:{self.server.server_port}/dir"\n'
                     f'ca_root = "{certs["ca"]}"')

    def stop(self) -> None:
        self.server.shutdown()


def test_a_rate_limited_ca_is_waited_for_as_long_as_it_says(tmp_path, certs):
    """A CA answering `rateLimited` with Retry-After: the next attempt is no sooner."""
    ca = SmallCA(certs, rate_limited=True)
    try:
        config = _config(tmp_path, listen='[[listen.certificate]]\nacme = true', acme=ca.acme)
        manager = CertManager(config, log=lambda _m: None)
        reason = manager.obtain(Managed("acme", "a.test"))
        assert reason == "rateLimited: too many new accounts from this address"
        meta = manager.storage.meta("acme", "a.test")
        assert meta["next_attempt"] - time.time() > 7190      # not the first minute's retry
    finally:
        ca.stop()


@pytest.mark.parametrize("window, due", [
    ({"start": "2020-01-01T00:00:00Z", "end": "2020-01-02T00:00:00Z"}, True),
    ({"start": "2099-01-01T00:00:00Z", "end": "2099-01-02T00:00:00Z"}, False),
    (None, False),                                  # a CA without ARI
])
def test_renewal_information_decides_early_renewal(tmp_path, certs, window, due):
    import trustme
    ca = SmallCA(certs, window=window)
    try:
        config = _config(tmp_path, listen='[[listen.certificate]]\nacme = true', acme=ca.acme)
        manager = CertManager(config, log=lambda _m: None)
        issued = trustme.CA().issue_cert("a.test")     # fresh: far from two thirds
        manager.storage.save("acme", "a.test",
                             b"".join(p.bytes() for p in issued.cert_chain_pems),
                             issued.private_key_pem.bytes(), directory=config.acme.directory)
        reason = manager.due(Managed("acme", "a.test"), time.time())
        assert reason == ("the CA's renewal information (ARI) asks for it" if due else "")
        asked = [p for p in ca.asked if p.startswith("/renewal-info/")]
        assert len(asked) == (1 if window else 0)
        meta = manager.storage.meta("acme", "a.test")
        if window:
            assert 3500 < meta["ari_next_check"] - time.time() < 3700   # its Retry-After
        manager.due(Managed("acme", "a.test"), time.time())
        assert len([p for p in ca.asked if p.startswith("/renewal-info/")]) == len(asked)
    finally:
        ca.stop()
