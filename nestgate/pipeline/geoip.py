"""Countries and networks by name: which country and autonomous system an address is in.

Theory of operation
-------------------
`[geoip] database` names a MaxMind-format file (GeoLite2-Country or -City, DB-IP's and
IPinfo's lite files use the same format), `asn_database` one that names autonomous
systems (GeoLite2-ASN); a file that holds both (IPinfo lite) may be named once. Sites
and routes refuse or admit by them (`deny_countries`, `allow_asn`, ...: nestgate.pipeline.access
compiles them into the site's guard with the CIDR lists).

An address is looked up once: the answer (country code, AS number) is kept in a bounded
memo per worker, and the guard keeps its verdict on the connection besides. The files
are watched: every `CHECK_EVERY` seconds a worker stats them off its loop, and a file
that changed (updated by geoipupdate, which renames a new file into place) is opened
again and the memo emptied; the guards' cached verdicts follow through `on_change`.
A file that cannot be opened while serving leaves the last one in use, said once.

Each worker reads a file whole into memory (a country file is a few MB) rather than
mapping it: a file rewritten in place instead of renamed would otherwise change, or be
cut short, under a reader that maps it, and a mapped page past the new end of a file
kills the process that touches it (SIGBUS). A file that is not what it was is the next
reload's problem, never a lookup's.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass

from nestgate.base.filewatch import file_stamp
from nestgate.base.handler import Periodic, Service

CHECK_EVERY = 5.0            # seconds between looks at the files' stamps
MEMO_MAX = 16384             # addresses whose country and AS are kept per worker (~2 MB)
UNKNOWN = ("", 0)            # an address the databases do not place


@dataclass(frozen=True)
class GeoConfig:
    database: str = ""       # countries (and AS numbers, if the file holds them)
    asn_database: str = ""   # AS numbers, when another file holds them


def read_geoip(s) -> GeoConfig | None:
    """`[geoip]` (a config `_Section`); None when the table is absent or empty. Each
    named file must be readable and a MaxMind DB: a problem names the key otherwise."""
    database = _database(s, "database")
    asn_database = _database(s, "asn_database")
    s.check_unknown()
    if not database and not asn_database:
        if s.data and not any(k in s.data for k in ("database", "asn_database")):
            s.fail("database", "a path to a MaxMind-format .mmdb file")
        return None
    return GeoConfig(database, asn_database)


def _database(s, key: str) -> str:
    path = s.readable_file(key)
    if path:
        problem = database_problem(path)
        if problem:
            s.fail(key, f"a MaxMind-format .mmdb file ({problem})", s.data[key])
            return ""
    return path


def database_problem(path: str) -> str:
    """What is wrong with `path` as a MaxMind DB, or ""."""
    import maxminddb             # only for a config with [geoip]: see GeoLookup
    try:
        reader = maxminddb.open_database(path)
    except (OSError, ValueError, maxminddb.InvalidDatabaseError) as exc:
        return str(exc) or type(exc).__name__
    reader.close()
    return ""


def country_of(record) -> str:
    """The ISO code in a record of any of the usual layouts: MaxMind's and DB-IP's
    (`country.iso_code`, else `registered_country`), IPinfo's (`country_code`)."""
    if not isinstance(record, dict):
        return ""
    for key in ("country", "registered_country"):
        place = record.get(key)
        if isinstance(place, dict) and isinstance(place.get("iso_code"), str):
            return place["iso_code"].upper()
    code = record.get("country_code")
    return code.upper() if isinstance(code, str) else ""


def asn_of(record) -> int:
    """The AS number in a record: MaxMind's `autonomous_system_number`, or IPinfo's
    `asn` ("AS64500")."""
    if not isinstance(record, dict):
        return 0
    number = record.get("autonomous_system_number")
    if isinstance(number, int):
        return number
    text = record.get("asn")
    if isinstance(text, str) and text[:2].upper() == "AS" and text[2:].isdigit():
        return int(text[2:])
    return number if isinstance(text, int) else 0



class GeoLookup(Service):
    """A worker's view of the databases: `place(address)` -> (country, AS number)."""

    tick_every = CHECK_EVERY

    def __init__(self, config: GeoConfig) -> None:
        # maxminddb (and the importlib.metadata, zipfile and email it loads, 5 MB) is
        # imported by the configs that have a [geoip] table, when they are read.
        import maxminddb
        self._maxminddb = maxminddb
        self._bad_record = (ValueError, maxminddb.InvalidDatabaseError)
        self.config = config
        self.memo: dict[str, tuple[str, int]] = {}
        # The few distinct answers, each held once however many addresses share it.
        self._answers: dict[tuple[str, int], tuple[str, int]] = {}
        self.on_change = None          # called after a reload (the guards' verdicts)
        self._paths = tuple(p for p in (config.database, config.asn_database) if p)
        self._readers: dict[str, object] = {}
        self._stamps: dict[str, object] = {}
        self._failed: set[str] = set()
        self._watch = Periodic(CHECK_EVERY, self._look)
        for path in self._paths:
            self._open(path, file_stamp(path))

    # ------------------------------------------------------------ lookups
    def place(self, address: str) -> tuple[str, int]:
        found = self.memo.get(address)
        if found is None:
            if len(self.memo) >= MEMO_MAX:
                self.memo.clear()
            found = self._look_up(address)
            found = self.memo[address] = self._answers.setdefault(found, found)
        return found

    def country(self, address: str) -> str:
        return self.place(address)[0]

    def _look_up(self, address: str) -> tuple[str, int]:
        config = self.config
        country = asn = None
        try:
            if config.database:
                record = self._get(config.database, address)
                country = country_of(record)
                asn = asn_of(record)
            if config.asn_database:
                asn = asn_of(self._get(config.asn_database, address))
        except self._bad_record:
            return UNKNOWN           # not an address (a PROXY header's UNKNOWN: "")
        return country or "", asn or 0

    def _get(self, path: str, address: str):
        reader = self._readers.get(path)
        return reader.get(address) if reader is not None else None

    # ------------------------------------------------------------ reloads
    def start(self) -> None:
        pass

    def tick(self, now: float) -> None:
        self._watch.tick(now)

    def stop(self) -> None:
        self._watch.stop()
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()

    async def _look(self) -> None:
        loop = asyncio.get_running_loop()
        stamps = await loop.run_in_executor(
            None, lambda: {p: file_stamp(p) for p in self._paths})
        changed = [p for p in self._paths if stamps[p] is not None
                   and stamps[p] != self._stamps.get(p)]
        if not changed:
            return
        # Opened off the loop; swapped in on it, where lookups run.
        opened = await loop.run_in_executor(None, lambda: [self._read(p) for p in changed])
        for path, reader in zip(changed, opened):
            self._stamps[path] = stamps[path]
            if reader is not None:
                self._swap(path, reader)
        if any(reader is not None for reader in opened):
            self.memo.clear()
            self._answers.clear()
            if self.on_change is not None:
                self.on_change()

    def _open(self, path: str, stamp) -> None:
        self._stamps[path] = stamp
        reader = self._read(path)
        if reader is not None:
            self._swap(path, reader)

    def _swap(self, path: str, reader) -> None:
        old, self._readers[path] = self._readers.get(path), reader
        if old is not None:
            old.close()

    def _read(self, path: str):
        """A reader of `path`; None when it cannot be opened (said once; the reader in
        use stays)."""
        maxminddb = self._maxminddb
        try:
            reader = maxminddb.open_database(path, maxminddb.MODE_MEMORY)
        except (OSError, *self._bad_record) as exc:
            if path not in self._failed:
                self._failed.add(path)
                print(f"nestgate: geoip: cannot open {path} ({exc}); the last one read "
                      f"stays in use", file=sys.stderr, flush=True)
            return None
        if path in self._failed:
            self._failed.discard(path)
            print(f"nestgate: geoip: {path} read again", file=sys.stderr, flush=True)
        return reader
