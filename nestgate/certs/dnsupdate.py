"""DNS-01 by RFC 2136 dynamic update, signed with TSIG (`dnspython`): the TXT record
`_acme-challenge.<name>` added on the zone's primary, waited for until every server
of the zone answers it (the CA may ask any of them), and removed afterwards. BIND,
Knot, PowerDNS and most self-hosted DNS accept these updates.
"""

from __future__ import annotations

import socket
import time

import dns.exception
import dns.message
import dns.name
import dns.query
import dns.rcode
import dns.rdatatype
import dns.tsigkeyring
import dns.update

QUERY_TIMEOUT = 5.0


class DnsUpdateError(Exception):
    pass


class DnsChallenge:
    def __init__(self, settings) -> None:
        self.settings = settings
        self.zone = dns.name.from_text(settings.zone)
        self.keyring = dns.tsigkeyring.from_text({settings.tsig_name: settings.tsig_secret})
        self.algorithm = dns.name.from_text(settings.tsig_algorithm)
        self.primary = address(settings.server)

    def _update(self, change) -> None:
        update = dns.update.Update(self.zone, keyring=self.keyring,
                                   keyname=dns.name.from_text(self.settings.tsig_name),
                                   keyalgorithm=self.algorithm)
        change(update)
        try:
            answer = dns.query.tcp(update, self.primary, port=self.settings.port,
                                   timeout=QUERY_TIMEOUT)
        except (OSError, dns.exception.DNSException) as exc:
            raise DnsUpdateError(f"DNS update at {self.settings.server}:"
                                 f"{self.settings.port} failed: {exc}") from None
        if answer.rcode() != dns.rcode.NOERROR:
            raise DnsUpdateError(f"DNS update refused by {self.settings.server}: "
                                 f"{dns.rcode.to_text(answer.rcode())} (is the TSIG key "
                                 f"allowed to update {self.settings.zone}?)")

    def _relative(self, fqdn: str) -> dns.name.Name:
        return in_zone(fqdn, self.zone).relativize(self.zone)

    def add(self, fqdn: str, value: str) -> None:
        name = self._relative(fqdn)
        self._update(lambda u: u.add(name, self.settings.ttl, "TXT", f'"{value}"'))

    def remove(self, fqdn: str, value: str) -> None:
        name = self._relative(fqdn)
        self._update(lambda u: u.delete(name, "TXT", f'"{value}"'))

    def servers(self) -> list[str]:
        """The addresses of the zone's name servers (its NS records, asked of the
        primary); the primary alone when it names none that resolve."""
        found = []
        try:
            answer = dns.query.udp(dns.message.make_query(self.zone, dns.rdatatype.NS),
                                   self.primary, port=self.settings.port,
                                   timeout=QUERY_TIMEOUT)
            for rrset in answer.answer:
                for record in rrset:
                    try:
                        found.append(address(record.target.to_text(omit_final_dot=True)))
                    except OSError:
                        continue
        except (OSError, dns.exception.DNSException):
            pass
        return list(dict.fromkeys(found)) or [self.primary]

    def wait_visible(self, fqdn: str, value: str) -> None:
        """Until every server of the zone answers the TXT value (or the timeout)."""
        wait_answered(fqdn, value, [(server, self.settings.port) for server in self.servers()],
                      self.settings.propagation_timeout)


def wait_answered(fqdn: str, value: str, servers: list[tuple[str, int]],
                  timeout: float) -> None:
    """Until each (address, port) answers the TXT `value` for `fqdn`: the CA may ask
    any server of the zone, and a secondary may lag behind the primary."""
    deadline = time.monotonic() + timeout
    pending = list(dict.fromkeys(servers))
    query = dns.message.make_query(fqdn, dns.rdatatype.TXT)
    while pending:
        for server in list(pending):
            try:
                answer = dns.query.udp(query, server[0], port=server[1],
                                       timeout=QUERY_TIMEOUT)
            except (OSError, dns.exception.DNSException):
                continue
            texts = {b"".join(r.strings).decode() for rrset in answer.answer
                     for r in rrset if rrset.rdtype == dns.rdatatype.TXT}
            if value in texts:
                pending.remove(server)
        if not pending:
            return
        if time.monotonic() >= deadline:
            raise DnsUpdateError(f"the TXT record {fqdn} was not seen on "
                                 f"{', '.join(f'{a}:{p}' for a, p in pending)} within "
                                 f"{timeout:.0f}s")
        time.sleep(1.0)


def in_zone(fqdn: str, zone: dns.name.Name) -> dns.name.Name:
    name = dns.name.from_text(fqdn)
    if not name.is_subdomain(zone):
        raise DnsUpdateError(f"{fqdn} is not in the zone {zone.to_text(omit_final_dot=True)} "
                             "([acme.dns] zone)")
    return name


def address(host: str) -> str:
    return socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0]
