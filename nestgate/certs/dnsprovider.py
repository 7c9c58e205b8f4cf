"""DNS-01 through a DNS provider's API (Cloudflare, deSEC, DuckDNS, OVH, Gandi, Hetzner,
Porkbun, PowerDNS and the others dns-lexicon speaks): the TXT record
`_acme-challenge.<name>` created with the provider's API, waited for on the zone's
authoritative servers, and deleted afterwards.

Credentials are read when a record is written, from `credentials_file` (KEY=value
lines) and the environment variables `credentials` names, so a rotated token is used
without a reload and no secret is ever part of the config object. Everything they are
mixed into on the way out (an error from the provider, which may quote a URL carrying
a token) has their values replaced first.

The provider's calls block (HTTP without a timeout of their own): they run in the
certificate process, which has no event loop, each in a thread given at most
`API_TIMEOUT`, so a provider that never answers fails the order instead of holding
every renewal behind it. lexicon's `Client` is not used: it guesses the zone from the
public suffix list, fetched from the network; the zone is configured instead.
"""

from __future__ import annotations

import argparse
import difflib
import os
import threading
import urllib.parse

import dns.exception
import dns.name
import dns.resolver
from lexicon._private.discovery import find_providers, load_provider_module
from lexicon.config import ConfigResolver

from nestgate.certs.dnsupdate import DnsUpdateError, address, in_zone, wait_answered

API_TIMEOUT = 60.0            # seconds for one call to the provider's API
REDACTED = "<redacted>"
SECRET_WORDS = ("token", "secret", "password", "key")
MIN_SECRET = 4                # characters


def provider_names() -> dict[str, bool]:
    """Every provider this dns-lexicon knows: whether the libraries it needs beyond
    lexicon's own (its "extra") are installed."""
    return find_providers()


def provider_options(provider: str) -> list[str]:
    """The settings the provider reads (`auth_token`, `pdns_server`...): the flags its
    module declares for lexicon's command line."""
    parser = argparse.ArgumentParser(add_help=False)
    load_provider_module(provider).Provider.configure_parser(parser)
    return [action.dest for action in parser._actions]


def looks_secret(option: str) -> bool:
    return any(word in option for word in SECRET_WORDS)


def read_credentials_file(path: str) -> tuple[list[tuple[int, str, str]], list[str]]:
    """KEY=value lines (systemd's EnvironmentFile form: `#` comments, optional quotes,
    optional `export `), keys case-insensitive: ((line, key, value) entries, problems).
    Problems name the line, never its value."""
    entries, problems = [], []
    with open(path, encoding="utf-8") as file:
        for number, line in enumerate(file, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, sep, value = line.removeprefix("export ").partition("=")
            key, value = key.strip().lower(), value.strip()
            if not sep or not key:
                problems.append(f"line {number}: expected KEY=value")
                continue
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
                value = value[1:-1]
            entries.append((number, key, value))
    return entries, problems


def gather(settings, environ) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """The provider's settings from the config's plain options, the credentials file
    and the environment, later ones winning: (values, problems as (key, message))."""
    values = dict(settings.options)
    problems = []
    if settings.credentials_file:
        try:
            entries, bad_lines = read_credentials_file(settings.credentials_file)
        except (OSError, UnicodeDecodeError) as exc:
            entries, bad_lines = [], [f"a readable file ({exc.__class__.__name__})"]
        accepted = provider_options(settings.provider)
        for number, key, value in entries:
            if key in accepted:
                values[key] = value
                continue
            # The key is not echoed: a file named by mistake may hold anything before
            # a "=" (the end of a base64 secret).
            close = difflib.get_close_matches(key, accepted, n=1, cutoff=0.75)
            hint = f"; did you mean {close[0].upper()}?" if close else ""
            bad_lines.append(f"line {number}: a key {settings.provider} reads "
                             f"({', '.join(accepted)}{hint})")
        problems += [("credentials_file", f"{settings.credentials_file}: {p}")
                     for p in bad_lines]
    for option, variable in settings.credentials:
        if environ.get(variable):
            values[option] = environ[variable]
        else:
            problems.append((f"credentials.{option}_env",
                             f"the environment variable {variable} set (it is not)"))
    return values, problems


def credential_problems(settings, environ) -> list[tuple[str, str]]:
    """What `check` says about the credentials: unreadable or unknown entries, none of
    the provider's secrets given, or the provider's own refusal of the settings (its
    constructor checks what it needs; it does not reach the network)."""
    values, problems = gather(settings, environ)
    if problems:
        return problems
    where = "credentials_file" if settings.credentials_file else "credentials"
    secrets = [o for o in provider_options(settings.provider) if looks_secret(o)]
    if secrets and not any(values.get(o) for o in secrets):
        return [(where, f"{settings.provider}'s credentials ({', '.join(secrets)}) in "
                        "credentials_file or credentials = { <option>_env = \"VARIABLE\" }")]
    try:
        _provider(settings, values)
    except Exception as exc:                  # noqa: BLE001 - the provider's own words
        return [(where, f"settings {settings.provider} accepts: it says "
                        f"{scrub(str(exc) or type(exc).__name__, values, settings)}")]
    return []


def scrub(text: str, values: dict[str, str], settings) -> str:
    """`text` with every value that came from the credentials file or the environment
    replaced, as written and as quoted in a URL: they are secrets, whatever their
    names (a flag such as "1" is too short to hide anything, and is left)."""
    plain = dict(settings.options)
    secrets = {form for option, value in values.items()
               if len(value) >= MIN_SECRET and plain.get(option) != value
               for form in (value, urllib.parse.quote(value, safe=""),
                            urllib.parse.quote_plus(value))}
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text


def _provider(settings, values: dict[str, str]):
    """A provider object for the zone (no request made yet)."""
    resolver = ConfigResolver().with_dict({
        "provider_name": settings.provider, "domain": settings.zone,
        "ttl": settings.ttl, settings.provider: values})
    return load_provider_module(settings.provider).Provider(resolver)


class ProviderChallenge:
    """The same three steps as nestgate.certs.dnsupdate.DnsChallenge, through the API."""

    def __init__(self, settings) -> None:
        self.settings = settings
        self.zone = dns.name.from_text(settings.zone)

    def _call(self, what: str, operation) -> None:
        """`operation(provider)` after authenticating (which finds the zone), in a
        thread bounded by API_TIMEOUT; failures as DnsUpdateError with no secret."""
        values, problems = gather(self.settings, os.environ)
        if problems:
            raise DnsUpdateError("; ".join(f"[acme.dns] {key}: expected {message}"
                                           for key, message in problems))
        outcome: dict = {}

        def run() -> None:
            try:
                provider = _provider(self.settings, values)
                provider.authenticate()
                try:
                    operation(provider)
                finally:
                    provider.cleanup()
            except BaseException as exc:        # noqa: BLE001 - handed to the caller
                outcome["error"] = exc
        worker = threading.Thread(target=run, name=f"dns-{what}", daemon=True)
        worker.start()
        worker.join(API_TIMEOUT)
        name = self.settings.provider
        if worker.is_alive():
            raise DnsUpdateError(f"{name} did not answer within {API_TIMEOUT:.0f}s "
                                 f"({what})")
        if "error" in outcome:
            exc = outcome["error"]
            reason = scrub(str(exc) or type(exc).__name__, values, self.settings)
            raise DnsUpdateError(f"{name} could not {what}: {reason}")

    def add(self, fqdn: str, value: str) -> None:
        name = in_zone(fqdn, self.zone).to_text(omit_final_dot=True)
        self._call(f"add the TXT record {name}",
                   lambda provider: provider.create_record("TXT", name, value))

    def remove(self, fqdn: str, value: str) -> None:
        name = in_zone(fqdn, self.zone).to_text(omit_final_dot=True)
        self._call(f"remove the TXT record {name}",
                   lambda provider: provider.delete_record(None, "TXT", name, value))

    def servers(self) -> list[tuple[str, int]]:
        """[acme.dns] nameservers, else the NS records of the zone holding `zone`
        through this machine's resolver (a DuckDNS name is no zone of its own): the
        servers the CA may ask."""
        if self.settings.nameservers:
            return [(address(host), port) for host, port in self.settings.nameservers]
        try:
            apex = dns.resolver.zone_for_name(self.zone, lifetime=10.0)
            answer = dns.resolver.resolve(apex, "NS", lifetime=10.0)
            found = [(next(iter(dns.resolver.resolve_name(r.target, lifetime=10.0)
                                .addresses())), 53) for r in answer]
        except (OSError, StopIteration, dns.exception.DNSException) as exc:
            raise DnsUpdateError(f"could not find the name servers of {self.settings.zone} "
                                 f"({exc}); list them in [acme.dns] nameservers") from None
        return found

    def wait_visible(self, fqdn: str, value: str) -> None:
        wait_answered(fqdn, value, self.servers(), self.settings.propagation_timeout)
