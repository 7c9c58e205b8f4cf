"""Debian's Pebble (a real RFC 8555 server) and pebble-challtestsrv (its DNS), on
loopback, for the certificate tests.

challtestsrv answers every name with 127.0.0.1, so Pebble validates HTTP-01 on
`http_port` and TLS-ALPN-01 on `tls_port` of this machine: the ports a nestgate
under test listens on. Pebble's own HTTPS listener uses a trustme certificate
(`ca_file`, what nestgate's `[acme] ca_root` names). Nonce rejection stays at
Pebble's default (5 % of requests), so the client's retries are exercised.

Pebble hands a new order an authorization its account already proved, so that the
order needs no challenge, whenever `rand.Intn(100) > PEBBLE_AUTHZREUSE` is false: with
the lowest value it takes, 0, one order in a hundred (11 of 1000 measured against
Debian's 2.4.0). A test whose later order must answer a challenge (or fail one) makes
it as a new account: `order_as_a_new_account`.
"""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path

from conftest import free_port


def free_udp_port() -> int:
    while True:
        port = free_port()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port


class Pebble:
    # Pebble's own example keys (base64url HMAC keys by key id).
    EAB_KEYS = {"kid-1": "zWNDZM6eQGHWpSRTPal5eIUYFTu7EajVIoguysqZ9wG44nMEtx3MUAsUDkMTQ12W"}

    def __init__(self, folder: Path, ca, http_port: int, tls_port: int,
                 dns_server: str | None = None, eab: bool = False) -> None:
        assert shutil.which("pebble"), "pebble is installed by `make test` (debian-deps)"
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        cert = ca.issue_cert("localhost", "127.0.0.1")
        cert.private_key_pem.write_to_path(str(folder / "pebble.key"))
        cert.cert_chain_pems[0].write_to_path(str(folder / "pebble.pem"))
        self.ca_file = str(folder / "pebble-ca.pem")
        ca.cert_pem.write_to_path(self.ca_file)
        self.port, self.management_port = free_port(), free_port()
        self.dns_port, self.challtest_port = free_udp_port(), free_port()
        (folder / "pebble.json").write_text(json.dumps({"pebble": {
            "listenAddress": f"127.0.0.1:{self.port}",
            "managementListenAddress": f"127.0.0.1:{self.management_port}",
            "certificate": str(folder / "pebble.pem"),
            "privateKey": str(folder / "pebble.key"),
            "httpPort": http_port, "tlsPort": tls_port,
            "ocspResponderURL": "", "externalAccountBindingRequired": eab,
            **({"externalAccountMACKeys": self.EAB_KEYS} if eab else {}),
        }}))
        self.procs = []
        if dns_server is None:
            self.procs.append(subprocess.Popen(
                ["pebble-challtestsrv", "-defaultIPv4", "127.0.0.1", "-defaultIPv6", "",
                 "-dns01", f"127.0.0.1:{self.dns_port}", "-http01", "", "-https01", "",
                 "-tlsalpn01", "", "-management", f"127.0.0.1:{self.challtest_port}"],
                stdout=open(folder / "challtestsrv.log", "wb"), stderr=subprocess.STDOUT))
            dns_server = f"127.0.0.1:{self.dns_port}"
        # Authorizations are reused as little as Pebble allows: 1 order in 100 all the
        # same (see `order_as_a_new_account`).
        env = {"PEBBLE_VA_NOSLEEP": "1", "PEBBLE_AUTHZREUSE": "0", "PATH": "/usr/bin:/bin"}
        self.procs.append(subprocess.Popen(
            ["pebble", "-config", str(folder / "pebble.json"), "-dnsserver", dns_server],
            stdout=open(folder / "pebble.log", "wb"), stderr=subprocess.STDOUT, env=env))
        self.directory = f"https://127.0.0.1:{self.port}/dir"
        self._tls = ssl.create_default_context(cafile=self.ca_file)
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(self.directory, context=self._tls, timeout=2).read()
                break
            except OSError:
                assert time.monotonic() < deadline, (folder / "pebble.log").read_text()
                time.sleep(0.1)

    def root_pem(self) -> bytes:
        """The root Pebble signs with (made anew at each start), from its management
        port: what a client trusts to verify the certificates nestgate serves."""
        url = f"https://127.0.0.1:{self.management_port}/roots/0"
        return urllib.request.urlopen(url, context=self._tls, timeout=5).read()

    def intermediate_pem(self) -> bytes:
        url = f"https://127.0.0.1:{self.management_port}/intermediates/0"
        return urllib.request.urlopen(url, context=self._tls, timeout=5).read()

    def point_names_at(self, ip: str) -> None:
        """Make challtestsrv answer every name with `ip` (a failing validation)."""
        body = json.dumps({"ip": ip}).encode()
        urllib.request.urlopen(f"http://127.0.0.1:{self.challtest_port}/set-default-ipv4",
                               data=body, timeout=5).read()
        # Not done until its DNS answers so (what Pebble asks when it validates).
        import dns.message
        import dns.query
        import dns.rdatatype
        query = dns.message.make_query("a.test", dns.rdatatype.A)
        deadline = time.monotonic() + 5
        while True:
            answer = dns.query.udp(query, "127.0.0.1", port=self.dns_port, timeout=2)
            if [r.address for rrset in answer.answer for r in rrset] == [ip]:
                return
            assert time.monotonic() < deadline, f"challtestsrv still answers {answer.answer}"
            time.sleep(0.1)

    def log(self) -> str:
        return (self.folder / "pebble.log").read_text(errors="replace")

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()


def order_as_a_new_account(storage: Path) -> None:
    """Make the next order from `storage` (a `nestgate cert renew`: a new process) come
    from a new ACME account, which has proved nothing yet, so Pebble cannot hand it an
    authorization that is already valid: its challenge is answered (or fails) every
    time, not 99 times in 100. A running server's certificate process keeps the
    account it holds in memory."""
    shutil.rmtree(storage / "accounts")
