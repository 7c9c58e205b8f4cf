"""Debian's PowerDNS Authoritative Server (`pdns_server`, SQLite backend) on loopback:
a DNS provider with a real HTTP API, the one nestgate's `provider = "powerdns"` writes
the DNS-01 record through (dns-lexicon's PowerDNS provider), and the DNS server Pebble
asks when it validates. Run as the current user in a temporary folder, never as the
system service."""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import subprocess
import time
import urllib.request
from pathlib import Path

import dns.message
import dns.query
import dns.rdatatype

from pebble import free_port, free_udp_port

PDNS = "/usr/sbin/pdns_server"
SCHEMA = "/usr/share/doc/pdns-backend-sqlite3/schema.sqlite3.sql"


class PowerDNS:
    def __init__(self, folder: Path, zone: str = "example.test") -> None:
        assert os.path.exists(PDNS) and os.path.exists(SCHEMA), \
            "pdns-server and pdns-backend-sqlite3 are installed by `make test` (debian-deps)"
        folder.mkdir(parents=True, exist_ok=True)
        self.folder, self.zone = folder, zone
        self.port, self.api_port = free_udp_port(), free_port()
        self.api_key = secrets.token_urlsafe(24)
        self.url = f"http://127.0.0.1:{self.api_port}"
        database = folder / "pdns.sqlite3"
        with sqlite3.connect(database) as db:
            db.executescript(Path(SCHEMA).read_text())
        settings = {
            "launch": "gsqlite3", "gsqlite3-database": str(database),
            "local-address": "127.0.0.1", "local-port": self.port,
            "api": "yes", "api-key": self.api_key, "webserver": "yes",
            "webserver-address": "127.0.0.1", "webserver-port": self.api_port,
            "webserver-allow-from": "127.0.0.1/32",
            "socket-dir": str(folder), "guardian": "no", "daemon": "no",
            "disable-syslog": "yes", "write-pid": "no", "loglevel": 6,
            "security-poll-suffix": "",            # no look-up of its own version outside
        }
        (folder / "pdns.conf").write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        self.proc = subprocess.Popen([PDNS, f"--config-dir={folder}"],
                                     stdout=open(folder / "pdns.log", "wb"),
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while True:
            try:
                self.api("GET", "/servers/localhost")
                break
            except OSError:
                assert self.proc.poll() is None and time.monotonic() < deadline, self.log()
                time.sleep(0.2)
        self.api("POST", "/servers/localhost/zones", {
            "name": f"{zone}.", "kind": "Native", "nameservers": [f"ns.{zone}."],
            "rrsets": [{"name": f"{n}{zone}.", "type": "A", "ttl": 60, "changetype": "REPLACE",
                        "records": [{"content": "127.0.0.1", "disabled": False}]}
                       for n in ("", "ns.", "*.")]})
        assert self.txt(f"ns.{zone}") == set()         # answers on its DNS port

    def api(self, method: str, path: str, body: dict | None = None):
        request = urllib.request.Request(
            f"{self.url}/api/v1{path}", method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"X-API-Key": self.api_key, "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=5) as answer:
            data = answer.read()
        return json.loads(data) if data else None

    def txt(self, name: str) -> set[str]:
        """The TXT values pdns answers on its DNS port (what Pebble sees)."""
        answer = dns.query.udp(dns.message.make_query(name, dns.rdatatype.TXT),
                               "127.0.0.1", port=self.port, timeout=2)
        return {b"".join(r.strings).decode() for rrset in answer.answer for r in rrset
                if rrset.rdtype == dns.rdatatype.TXT}

    def log(self) -> str:
        return (self.folder / "pdns.log").read_text(errors="replace")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
