"""Debian's BIND (`named`) on loopback as the primary of a test zone, accepting RFC 2136
updates signed with a TSIG key: the DNS server DNS-01 talks to, and the one Pebble
asks when it validates."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import time
from pathlib import Path

import dns.message
import dns.query
import dns.rdatatype

from pebble import free_udp_port

TSIG_NAME = "nestgate-test"


class Bind:
    def __init__(self, folder: Path, zone: str = "example.test") -> None:
        named = shutil.which("named") or "/usr/sbin/named"
        assert os.path.exists(named), "bind9 is installed by `make test` (debian-deps)"
        folder.mkdir(parents=True, exist_ok=True)
        self.folder, self.zone = folder, zone
        self.port = free_udp_port()
        self.secret = base64.b64encode(os.urandom(32)).decode()
        (folder / f"{zone}.zone").write_text(f"""\
$TTL 60
@   IN SOA ns.{zone}. admin.{zone}. 1 60 60 600 60
@   IN NS  ns.{zone}.
ns  IN A   127.0.0.1
@   IN A   127.0.0.1
*   IN A   127.0.0.1
""")
        (folder / "named.conf").write_text(f"""\
options {{
    directory "{folder}";
    pid-file "{folder}/named.pid";
    listen-on port {self.port} {{ 127.0.0.1; }};
    listen-on-v6 {{ none; }};
    recursion no;
    dnssec-validation no;
    allow-query {{ any; }};
}};
controls {{ }};
key "{TSIG_NAME}" {{ algorithm hmac-sha256; secret "{self.secret}"; }};
zone "{zone}" {{
    type primary;
    file "{folder}/{zone}.zone";
    update-policy {{ grant {TSIG_NAME} zonesub TXT; }};
}};
""")
        user = ["-u", "root"] if os.getuid() == 0 else []
        self.proc = subprocess.Popen([named, "-g", "-c", str(folder / "named.conf"), *user],
                                     stdout=open(folder / "named.log", "wb"),
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        query = dns.message.make_query(f"ns.{zone}", dns.rdatatype.A)
        while True:
            try:
                dns.query.udp(query, "127.0.0.1", port=self.port, timeout=1)
                break
            except Exception:   # noqa: BLE001 - not up yet
                assert self.proc.poll() is None and time.monotonic() < deadline, \
                    (folder / "named.log").read_text()
                time.sleep(0.2)

    def txt(self, name: str) -> set[str]:
        answer = dns.query.udp(dns.message.make_query(name, dns.rdatatype.TXT),
                               "127.0.0.1", port=self.port, timeout=2)
        return {b"".join(r.strings).decode() for rrset in answer.answer for r in rrset
                if rrset.rdtype == dns.rdatatype.TXT}

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
