"""Keeping every managed certificate valid: issue what is missing, renew at two thirds
of the lifetime, retry failures with exponential back-off and jitter.

One process in the tree runs `CertManager.run` (the supervisor forks it, see
`supervisor.side_processes`); `nestgate cert renew` runs the same steps in its own
process. Both take the storage's per-name lock, and look at the stored certificate
again once they hold it, so whoever comes second finds the work done and orders
nothing. Workers never talk to the CA: they load what lands in storage
(nestgate.certs.book).

A failed renewal keeps the old certificate serving; why it failed is kept in the
name's meta.json (`last_error`) for `nestgate cert list`, the admin API and the log.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time
from dataclasses import dataclass

from nestgate.certs.storage import CertStorage, StoredCertificate

RETRY_FIRST = 60.0             # seconds before the first retry of a failed order
RETRY_MAX = 24 * 3600.0
CHECK_EVERY = 60.0             # seconds between looks when nothing is due
PULL_EVERY = 1.0               # seconds between looks at what other instances shared


@dataclass(frozen=True)
class Managed:
    kind: str                  # "acme" | "internal"
    name: str


def managed_certificates(config) -> list[Managed]:
    seen: dict[tuple[str, str], None] = {}
    for listener in config.listeners:
        for cert in listener.certificates:
            if cert.managed:
                for name in cert.names:
                    seen[(cert.managed, name)] = None
    return [Managed(kind, name) for kind, name in seen]


def challenge_types(config) -> tuple[str, ...]:
    """The challenges this config can answer, most preferred first: the [acme]
    `challenges` list, else DNS-01 when [acme.dns] is set, HTTP-01 when a plain
    listener exists (the CA comes on port 80, so it must reach one), TLS-ALPN-01
    on the TLS listeners."""
    acme = config.acme
    if acme.challenges:
        return acme.challenges
    kinds = []
    if acme.dns is not None:
        kinds.append("dns-01")
    if any(not listener.tls for listener in config.listeners):
        kinds.append("http-01")
    if any(c.managed == "acme" for listener in config.listeners
           for c in listener.certificates):
        kinds.append("tls-alpn-01")
    return tuple(kinds)


def storage_of(config) -> CertStorage:
    """The config's storage folder; shared with the other instances through Redis
    when the state is there (nestgate.certs.shared)."""
    share = None
    if config.state.backend == "redis":
        from nestgate.certs.shared import RedisShare
        share = RedisShare(config.state)
    return CertStorage(config.acme.storage, share)


class StorageUnwritable(Exception):
    """A failed order whose cause is the storage folder, not the CA."""


class CertManager:
    def __init__(self, config, log=None) -> None:
        self.config = config
        self.storage = storage_of(config)
        self.log = log or (lambda message: print(f"nestgate: certificates: {message}",
                                                 file=sys.stderr, flush=True))
        self._issuer = None
        self._local_ca = None
        self._share_down = False
        # Failures that could not be written to storage (a full or read-only disk):
        # (kind, name) -> the meta fields `_failed` would have written.
        self.unrecorded: dict[tuple[str, str], dict] = {}

    # ------------------------------------------------------------ issuers
    def issuer(self):
        if self._issuer is None:
            from nestgate.certs.acme_issuer import AcmeIssuer
            self._issuer = AcmeIssuer(self.config.acme, self.storage,
                                      challenge_types(self.config), self.log)
        return self._issuer

    def local_ca(self):
        if self._local_ca is None:
            from nestgate.certs.localca import LocalCA
            self._local_ca = LocalCA(self.storage)
        return self._local_ca

    # ------------------------------------------------------------ decisions
    def usable(self, item: Managed, stored: StoredCertificate | None, now: float) -> bool:
        """A stored certificate this config can serve: for the name, unexpired, and
        from the configured CA."""
        if stored is None or not stored.covers(item.name) or stored.not_after <= now:
            return False
        if item.kind == "acme":
            return self.storage.meta(item.kind, item.name).get("directory") == \
                self.config.acme.directory
        return True

    def due(self, item: Managed, now: float) -> str:
        """Why `item` needs ordering now ("" when it does not)."""
        stored = self.storage.load(item.kind, item.name)
        if not self.usable(item, stored, now):
            return "no valid certificate"
        if now >= stored.renew_at(self.config.acme.renew_after):
            return "two thirds of its lifetime have passed"
        if item.kind == "acme":
            suggested = self.renewal_information(item, stored, now)
            if suggested is not None and now >= suggested:
                return "the CA's renewal information (ARI) asks for it"
        return ""

    def renewal_information(self, item: Managed, stored: StoredCertificate,
                            now: float) -> float | None:
        """When the CA's ACME Renewal Information says to renew (None: it does not
        say); asked again no sooner than the CA's Retry-After (6 hours by default)."""
        meta = self.storage.meta(item.kind, item.name)
        if now >= meta.get("ari_next_check", 0.0) or \
                meta.get("ari_serial") != stored.serial:
            suggested, ask_again = self.issuer().renewal_window(stored.chain_pem)
            meta = self.storage.set_meta(item.kind, item.name, ari_renew_at=suggested,
                                         ari_next_check=ask_again, ari_serial=stored.serial)
        return meta.get("ari_renew_at")

    def next_look(self, item: Managed, now: float) -> float:
        """When `item` next needs attention (Unix time)."""
        meta = self.storage.meta(item.kind, item.name)
        stored = self.storage.load(item.kind, item.name)
        if self.usable(item, stored, now):
            at = stored.renew_at(self.config.acme.renew_after)
            for ari in ("ari_renew_at", "ari_next_check"):
                if item.kind == "acme" and meta.get(ari):
                    at = min(at, meta[ari])
        else:
            at = now
        return max(at, self.next_attempt(item, meta))

    def next_attempt(self, item: Managed, meta: dict) -> float:
        """When a failed order may be tried again: as stored, or as kept here when the
        storage could not be written."""
        held = self.unrecorded.get((item.kind, item.name), {})
        return max(meta.get("next_attempt", 0.0), held.get("next_attempt", 0.0))

    # ------------------------------------------------------------ work
    def obtain(self, item: Managed, force: bool = False, wait: float = 0.0) -> str:
        """Issue or renew one certificate if due (always when `force`); "" on success
        or when nothing was needed, else why it failed. Failures are recorded with
        the time of the next attempt."""
        if item.kind == "installed":
            return "" if not force else "installed with `nestgate cert install`: the " \
                "tool that obtained it renews it"
        share_errors = self.storage.share.errors if self.storage.share else ()
        try:
            return self._obtain(item, force, wait)
        except share_errors as exc:           # Redis away: try again later
            return self._failed(item, exc)
        except OSError as exc:
            # The storage cannot be written (a full or read-only disk): the current
            # certificate keeps serving, and this process must not die of it (the
            # supervisor would start it again, and the next pass would fail the same
            # way, with a traceback in the log each time).
            return self._failed(item, StorageUnwritable(
                f"the certificate storage {self.storage.root} cannot be written: "
                f"{exc.strerror or exc}"))

    def _obtain(self, item: Managed, force: bool, wait: float) -> str:
        now = time.time()
        if not force and not self.due(item, now):
            return ""
        with self.storage.lock(item.kind, item.name, wait=wait) as mine:
            if not mine:
                return "another process is ordering this certificate"
            if not force and not self.due(item, time.time()):
                return ""                     # done by the other holder of the lock
            self.storage.set_meta(item.kind, item.name, last_attempt=time.time())
            try:
                if item.kind == "internal":
                    chain, key = self.local_ca().issue(item.name)
                    issued_by, proven_by = "", []
                else:
                    self.log(f"ordering a certificate for {item.name} from "
                             f"{self.config.acme.directory}")
                    chain, key = self.issuer().issue(item.name)
                    issued_by = self.config.acme.directory
                    proven_by = self.issuer().last_challenges
            except Exception as exc:          # noqa: BLE001 - any failure is recorded
                return self._failed(item, exc)
            self.storage.save(item.kind, item.name, chain, key, directory=issued_by,
                              challenges=proven_by)
            stored = self.storage.load(item.kind, item.name)
            self.log(f"{item.name}: new certificate from {stored.issuer}, valid until "
                     f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(stored.not_after))}")
            return ""

    def _failed(self, item: Managed, exc: Exception) -> str:
        meta = self.storage.meta(item.kind, item.name)
        key = (item.kind, item.name)
        failures = max(meta.get("failures", 0),
                       self.unrecorded.get(key, {}).get("failures", 0)) + 1
        wait = min(RETRY_FIRST * 2 ** (failures - 1), RETRY_MAX)
        wait = max(wait * random.uniform(0.8, 1.2), getattr(exc, "retry_after", 0.0))
        reason = str(exc) or type(exc).__name__
        record = {"last_error": reason, "failures": failures,
                  "next_attempt": time.time() + wait}
        try:
            self.storage.set_meta(item.kind, item.name, **record)
            self.storage.changed()            # the admin API shows the reason
            self.unrecorded.pop(key, None)
        except OSError:
            self.unrecorded[key] = record     # the back-off holds all the same
        kept = self.storage.load(item.kind, item.name)
        still = " (the current certificate keeps serving)" if kept is not None else ""
        self.log(f"{item.name}: could not obtain a certificate: {reason}; next try in "
                 f"{wait:.0f}s{still}")
        return reason

    def run_once(self) -> float:
        """One pass over every managed certificate; seconds until the next is due."""
        now = time.time()
        soonest = now + CHECK_EVERY
        for item in managed_certificates(self.config):
            if item.kind == "installed":
                continue
            meta = self.storage.meta(item.kind, item.name)
            if now >= self.next_attempt(item, meta):
                self.obtain(item)
            soonest = min(soonest, self.next_look(item, time.time()))
        return max(1.0, soonest - time.time())

    def run(self) -> None:
        """The certificate process: until SIGTERM."""
        stopping = []
        signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
        self.storage.ensure()
        while not stopping:
            self.pull()
            wait = self.run_once()
            deadline = time.monotonic() + wait
            while not stopping and time.monotonic() < deadline:
                time.sleep(min(PULL_EVERY, max(0.0, deadline - time.monotonic())))
                self.pull()

    def pull(self) -> None:
        """What the other instances published (certificates, challenge answers)."""
        share = self.storage.share
        if share is None:
            return
        try:
            for name in share.pull(self.storage, managed_certificates(self.config)):
                self.log(f"{name}: certificate from another instance")
            if self._share_down:
                self._share_down = False
                self.log("shared state reachable again")
        except share.errors as exc:
            if not self._share_down:
                self._share_down = True
                self.log(f"shared state unreachable ({exc}); serving what is stored here")


def run_certificates(config) -> None:
    """The certificate process's body (forked, restarted and replaced on reload by the
    supervisor, nestgate.server.sideprocess)."""
    CertManager(config).run()


def prepare_certificates(config, say) -> CertStorage | None:
    """Before a generation forks: the storage folder made, and certificates from the
    local CA issued at once (milliseconds; ACME ones are the certificate process's
    job, and names without one are served as soon as it lands)."""
    managed = managed_certificates(config)
    if not managed:
        return None
    storage = storage_of(config)
    storage.ensure()
    manager = CertManager(config, lambda message: say(f"certificates: {message}"))
    internal = [item for item in managed if item.kind == "internal"]
    new_root = internal and not manager.local_ca().root_file.exists()
    for item in internal:
        manager.obtain(item)
    if new_root and manager.local_ca().root_file.exists():
        say(f"certificates: made the local CA; its root certificate is "
            f"{manager.local_ca().root_file}: devices trust the LAN names once they trust "
            f"it (`nestgate trust --config {config.source}` says how, per system)")
    return storage

