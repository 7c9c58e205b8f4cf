"""The CrowdSec bouncer: the Local API's ban decisions refused at accept like nestgate's
own bans, and nestgate's own bans sent to the Local API as alerts.

Theory of operation
-------------------
`[crowdsec]` names a Local API (`url`) and a bouncer key (`api_key` or `api_key_file`,
from `cscli bouncers add`). One process talks to it, the bouncer process the supervisor
forks beside the workers (nestgate.server.sideprocess), never a worker: in stream mode, the
first call (and the first after any failure) `GET /v1/decisions/stream?startup=true`
answers every decision in force; each later one, `update_interval` apart, only what
was added and deleted since. The process keeps the decisions by id with their expiry
(two scenarios may ban one address: lifting one leaves the other).

Enforcing: this process is the one writer of CrowdSec's entries in the ban table every
process shares (nestgate.bans.table, origin "crowdsec"), so a decision is refused at
accept by every worker, before TLS, exactly as a [[ban]] rule's ban (or answered the
ban page with `ban_answer = "403"`); a range stays one range. Each round writes only
what changed: a decision deleted in CrowdSec is lifted at the next round, within one
`update_interval`. The set in force is also kept in a file in the state folder
(nestgate.bans.decisions): a restarted bouncer puts it back in the table before its first
call, so the decisions hold through a restart while the Local API cannot be reached.

What is refused: `ban` decisions, and `captcha` ones unless `captcha = "ignore"`
(nestgate shows no captcha; a client CrowdSec wants challenged is refused instead),
for scopes `Ip` and `Range`. Other types and scopes (`Country`, `AS`, `Username`) are
left out, counted in the log line of each change.

The Local API down (refused, timing out, answering an error): the last decisions stay
in force (expiries still lift decisions as they pass), the failure is said once, and
its end too.

Reporting (nestgate.bans.crowdsecalerts): with `machine_id` and a password, the bans
nestgate made itself (a [[ban]] rule's, the operator's), read from the ban store, are
sent as alerts with a ban decision, so every other bouncer of the Local API refuses
them too. They come back in the decision stream (origin "nestgate"); a decision of
origin "nestgate" on a network this server's ban store holds is its own ban's echo
and is not written again as a CrowdSec entry: one ban stays one entry, origin "rule"
or "operator". Once the store's ban is over (or lifted), the echo is refused like
any other decision for as long as CrowdSec keeps it.
"""

from __future__ import annotations

import json
import re
import signal
import sys
import time
from dataclasses import dataclass

from nestgate.bans.table import FED, network_key

SNAPSHOT_NAME = "crowdsec-decisions"
BOUNCER_PROCESS_NAME = "nestgate-bouncer"   # what ps shows
USER_AGENT = "nestgate-bouncer/1"
REQUEST_TIMEOUT = 10.0       # seconds a call to the Local API may take
RESPONSE_MAX = 256 << 20     # bytes of a stream answer (50k decisions are ~10 MB)
REFUSED_SCOPES = ("ip", "range")
OWN_ORIGIN = "nestgate"      # the origin of the decisions nestgate's alerts carry
# What a decision's fields may be: the Local API sends an id that is a number and
# short strings. Anything else (a list, an object, null, a string of megabytes) is a
# decision that is skipped, named once in the log; the others are applied.
MAX_ID_CHARS = 64
MAX_FIELD_CHARS = 1024
TEXT_FIELDS = ("type", "scope", "value", "duration", "scenario", "origin")
NAMED_MAX = 1000             # malformed decisions remembered as named (not named again)


@dataclass(frozen=True)
class CrowdSecConfig:
    url: str                          # the Local API, e.g. http://127.0.0.1:8080
    api_key: str                      # the bouncer's key (never logged)
    update_interval: float = 10.0     # seconds between polls
    captcha: str = "ban"              # "ban": refused like a ban; "ignore"
    snapshot: str = ""                # the decisions last enforced (restarts)
    ban_answer: str = "close"         # "close" at accept, or "403": the ban page
    machine_id: str = ""              # a machine login: nestgate's bans sent as alerts
    machine_password: str = ""        # (never logged)

    def __repr__(self) -> str:        # the secrets stay out of tracebacks and logs
        return f"CrowdSecConfig(url={self.url!r}, update_interval={self.update_interval})"


def read_crowdsec(s, bans) -> CrowdSecConfig | None:
    """`[crowdsec]` (a config `_Section`); None when the table is absent. `bans` is the
    config's `BansConfig`: alerts are read from its store."""
    if not s.data:
        return None
    url = s.str("url").rstrip("/")
    if not url.startswith(("http://", "https://")):
        s.fail("url", "the Local API's http:// or https:// address, like "
               "\"http://127.0.0.1:8080\"", url or None)
    key = _secret(s, "api_key", "the bouncer key `cscli bouncers add NAME` printed")
    if key is None:
        s.fail("api_key", "the bouncer key `cscli bouncers add NAME` printed (or "
               "api_key_file, a file holding it)")
    interval_s = s.positive_duration("update_interval", CrowdSecConfig.update_interval)
    captcha = s.choice("captcha", CrowdSecConfig.captcha, ("ban", "ignore"))
    answer = s.choice("ban_answer", CrowdSecConfig.ban_answer, ("close", "403"))
    machine = s.str("machine_id")
    password = _secret(s, "machine_password", "the password of `cscli machines add NAME "
                       "--password ...`")
    if machine and password is None:
        s.fail("machine_password", "the machine's password (or machine_password_file) "
               "with machine_id")
    if password is not None and not machine:
        s.fail("machine_id", "the machine name `cscli machines add` was given, with "
               "machine_password")
    if machine and not bans.enabled:
        s.fail("machine_id", "[[ban]] rules or a [bans] table with it: the bans sent as "
               "alerts are read from the ban store")
    s.check_unknown()
    return CrowdSecConfig(url, key or "", interval_s, captcha,
                          str(s.state_base / SNAPSHOT_NAME), answer, machine, password or "")


def _secret(s, name: str, what: str) -> str | None:
    """`name` or what the file `name_file` holds (stripped); None when neither is
    given ("" and a problem when the file holds nothing or cannot be read)."""
    value = s.str(name)
    before = len(s.problems)
    held = s.file_bytes(name + "_file", secret=True)
    if value and held is not None:
        s.fail(name + "_file", f"{name} or {name}_file, not both")
    elif held is not None:
        value = held.decode("utf-8", "replace").strip()
        if not value and len(s.problems) == before:
            s.fail(name + "_file", f"a file holding {what}")
    elif not value:
        return None
    return value


_GO_DURATION = re.compile(r"(\d+(?:\.\d*)?)(h|ms|m|s|us|µs|ns)")
_GO_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6,
             "ns": 1e-9}


def go_duration(text: str) -> float:
    """Seconds in a Go duration as the Local API writes them ("3h59m58.9s", "-24ms")."""
    sign = -1.0 if text.startswith("-") else 1.0
    return sign * sum(float(n) * _GO_UNITS[u] for n, u in _GO_DURATION.findall(text))


def _simple(name: str, decision: dict) -> bool:
    """`decision[name]` is what the Local API sends: an id is a number or a short
    string (never missing); another field is a short string, or absent."""
    value = decision.get(name)
    if name == "id":
        return (isinstance(value, int) and not isinstance(value, bool)) or \
            (isinstance(value, str) and 0 < len(value) <= MAX_ID_CHARS)
    return value is None or isinstance(value, str) and len(value) <= MAX_FIELD_CHARS


def _shown(value) -> str:
    """What a malformed value is, for the log: its kind and size, never all of it."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return f"a string of {len(value)} characters" if len(value) > 40 else repr(value)
    if isinstance(value, (list, dict)):
        return f"{'a list' if isinstance(value, list) else 'an object'} of {len(value)} items"
    return f"{type(value).__name__} {str(value)[:40]}"


class Decision:
    __slots__ = ("network", "until", "scenario", "own")

    def __init__(self, network: str, until: float, scenario: str, own: bool) -> None:
        self.network = network       # canonical CIDR text, as the ban table keeps it
        self.until = until
        self.scenario = scenario
        self.own = own               # from an alert of nestgate's (origin OWN_ORIGIN)


class Decisions:
    """The decisions in force, by id: what the stream said, less what has expired."""

    def __init__(self, captcha: str = "ban") -> None:
        self.refused_types = ("ban", "captcha") if captcha == "ban" else ("ban",)
        self.by_id: dict[int | str, Decision] = {}
        self.skipped = 0                   # decisions of a type or scope not enforced
        self.to_name: list[str] = []       # malformed decisions not yet said (`named`)
        self._named: set[str] = set()

    def apply(self, answer: dict, now: float, startup: bool) -> None:
        """One stream answer: on startup it replaces everything held. A malformed
        decision is skipped and kept in `to_name`, the first time it is met."""
        if startup:
            self.by_id.clear()
            self.skipped = 0
        for decision in self._listed(answer, "deleted"):
            if self._well_formed(decision, "deleted", ("id",)):
                self.by_id.pop(decision["id"], None)
        for decision in self._listed(answer, "new"):
            if not self._well_formed(decision, "new", ("id", *TEXT_FIELDS)):
                continue
            kept = self._refusal(decision, now)
            if kept is None:
                self.skipped += 1
                continue
            self.by_id[decision["id"]] = kept

    def _listed(self, answer: dict, part: str) -> list:
        found = answer.get(part)
        if found is None or isinstance(found, list):
            return found or []
        self._name(f"the answer's {part!r} is {_shown(found)}, not a list; left out")
        return []

    def _well_formed(self, decision, part: str, fields: tuple[str, ...]) -> bool:
        """The decision is an object whose `fields` are what the Local API sends; if
        not, it is named (once) to be said."""
        if not isinstance(decision, dict):
            wrong = f"is {_shown(decision)}, not an object"
        else:
            wrong = next((f"has an id that is {_shown(decision.get(name))}" if name == "id"
                          else f"has a {name} that is {_shown(decision.get(name))}"
                          for name in fields if not _simple(name, decision)), "")
        if not wrong:
            return True
        ident = decision.get("id") if isinstance(decision, dict) else None
        shown = f"decision {ident}" if _simple("id", {"id": ident}) else "a decision"
        self._name(f"{shown} in {part!r} {wrong}; skipped")
        return False

    def _name(self, what: str) -> None:
        if what not in self._named and len(self._named) < NAMED_MAX:
            self._named.add(what)
            self.to_name.append(what)

    def named(self) -> list[str]:
        """The malformed decisions met since the last call, each said once."""
        found, self.to_name = self.to_name, []
        return found

    def _refusal(self, decision, now: float) -> Decision | None:
        if not isinstance(decision, dict):
            return None
        kind = str(decision.get("type", "")).lower()
        scope = str(decision.get("scope", "")).lower()
        value = decision.get("value")
        if kind not in self.refused_types or scope not in REFUSED_SCOPES \
                or not isinstance(value, str):
            return None
        try:
            network = network_key(value)[3]
        except ValueError:
            return None
        seconds = go_duration(str(decision.get("duration", "")))
        if seconds <= 0:
            return None
        return Decision(network, now + seconds, decision.get("scenario") or "",
                        decision.get("origin") == OWN_ORIGIN)

    def expire(self, now: float) -> None:
        for key in [k for k, d in self.by_id.items() if d.until <= now]:
            del self.by_id[key]

    def refused(self, ours=frozenset()) -> dict[str, tuple[float, str]]:
        """network -> (until, scenario) of what to refuse: each network once, for its
        longest decision, leaving out the echoes of bans in `ours` (the networks this
        server's ban store holds)."""
        found: dict[str, tuple[float, str]] = {}
        for d in self.by_id.values():
            if d.own and d.network in ours:
                continue
            held = found.get(d.network)
            if held is None or d.until > held[0]:
                found[d.network] = (d.until, d.scenario)
        return found

    def own(self) -> dict[str, float]:
        """network -> when the Local API's decisions from nestgate's alerts on it end."""
        found: dict[str, float] = {}
        for d in self.by_id.values():
            if d.own and d.until > found.get(d.network, 0.0):
                found[d.network] = d.until
        return found

    def values(self) -> frozenset[str]:
        return frozenset(self.refused())


class LocalApi:
    """Calls to the Local API: JSON in and out, bounded in time and size."""

    def __init__(self, url: str) -> None:
        self.url = url

    def call(self, method: str, path: str, headers: dict, body=None):
        # urllib.request (http.client, email: 4 MB) in the bouncer's process only: every
        # config imports this module, to read its [crowdsec] table.
        import urllib.request
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path, data=data, method=method,
            headers={"User-Agent": USER_AGENT, "Content-Type": "application/json",
                     **headers})
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT) as answer:
            raw = answer.read(RESPONSE_MAX + 1)
        if len(raw) > RESPONSE_MAX:
            raise ValueError(f"an answer over {RESPONSE_MAX >> 20} MB")
        return json.loads(raw) if raw.strip() else None

    @staticmethod
    def reason(exc: Exception, refused: str) -> str:
        """What a failed call to the Local API says in the log; `refused` is what a 401 or
        403 means for that call (which credentials it did not take)."""
        import urllib.error
        if isinstance(exc, urllib.error.HTTPError):
            if exc.code in (401, 403):
                return f"HTTP {exc.code}: {refused}"
            return f"HTTP {exc.code}"
        if isinstance(exc, urllib.error.URLError):
            return str(exc.reason)
        return str(exc) or type(exc).__name__


class Bouncer:
    """The bouncer process's loop: poll, keep, bring the ban table in step."""

    def __init__(self, config, table=None, say=None) -> None:
        from nestgate.bans.table import ban_table
        self.config = config.crowdsec
        self.table = table if table is not None else ban_table()
        self.say = say or (lambda m: print(f"nestgate: crowdsec: {m}", file=sys.stderr,
                                           flush=True))
        self.api = LocalApi(self.config.url)
        self.decisions = Decisions(self.config.captcha)
        self.own = OwnBans(config.bans.store if config.bans.enabled else "", self.say)
        self.reporter = None
        if self.config.machine_id:
            from nestgate.bans.crowdsecalerts import Reporter
            self.reporter = Reporter(self.config, self.api, self.say)
        self.synced = False                # a startup answer is in: later ones are changes
        self.down = ""                     # why the last call failed, "" when it worked
        self.written: dict[str, tuple[float, str]] | None = None   # in the table now
        self.unwritable = False            # the last write of the file failed (said once)
        self.announced = False             # the set in force has been said since start
        self.stopping = False

    def restore(self) -> None:
        """Before the first call: the decisions enforced before a restart, back in the
        table (and what an earlier bouncer process left in it, so it can be lifted)."""
        from nestgate.bans.decisions import read_snapshot
        held = {ban.network: (ban.until, ban.reason) for ban in self.table.entries()
                if ban.origin == FED}
        self.written = held
        saved = read_snapshot(self.config.snapshot, self.say)
        if saved is not None:
            self._enforce({n: v for n, v in saved.items() if v[0] > time.time()})

    def fetch(self, startup: bool) -> dict:
        found = self.api.call("GET", "/v1/decisions/stream" + (
            "?startup=true" if startup else ""), {"X-Api-Key": self.config.api_key})
        if not isinstance(found, dict):
            raise ValueError("an answer that is not a JSON object")
        return found

    def poll(self) -> None:
        """One round: ask, keep what was said (or say the API is down), enforce, and
        send nestgate's own new bans."""
        now = time.time()
        startup = not self.synced
        try:
            answer = self.fetch(startup)
        except (OSError, ValueError) as exc:      # URLError, HTTPError, timeouts, JSON
            self._failed(exc)
        else:
            self.decisions.apply(answer, now, startup)
            for what in self.decisions.named():
                self.say(f"Local API at {self.config.url}: {what}")
            self.synced = True
            if self.down:
                self.say(f"Local API at {self.config.url} answers again")
            self.down = ""
        self.decisions.expire(now)
        rows = self.own.live()
        if self.synced:
            self._enforce(self.decisions.refused(frozenset(r.network for r in rows)))
        elif self.written:
            # Down since this process started (or restored a file): what is in force
            # stays, less what has ended.
            self._enforce({n: held for n, held in self.written.items() if held[0] > now})
        if self.reporter is not None and self.synced:
            self.reporter.report(rows, self.decisions, now)

    def _failed(self, exc: Exception) -> None:
        # After a failure the next answer is a full one: whatever happened meanwhile
        # (a restarted Local API, a lost answer) it replaces what is held.
        self.synced = False
        reason = self.api.reason(exc, "the api_key is not a bouncer key it knows")
        if not self.down:
            self.say(f"Local API at {self.config.url} cannot be used ({reason}); "
                     f"the last {len(self.written or ())} decisions stay in force until "
                     "it answers")
        self.down = reason

    def _enforce(self, refused: dict[str, tuple[float, str]]) -> None:
        """Bring the table's CrowdSec entries to `refused`, changing only what changed,
        then keep the set in the file for a restart."""
        written = self.written if self.written is not None else {}
        if refused == written and self.announced:
            return
        table, answer = self.table, self.config.ban_answer
        for network in written.keys() - refused.keys():
            table.remove(network, FED)
        for network, (until, scenario) in refused.items():
            if written.get(network) != (until, scenario):
                table.add(network, until, FED, scenario, answer)
        self.written = refused
        self.announced = True
        skipped = f", {self.decisions.skipped} of other types or scopes left out" \
            if self.decisions.skipped else ""
        self.say(f"{len(refused)} addresses and ranges refused{skipped}")
        self._save(refused)

    def _save(self, refused) -> None:
        from nestgate.bans.decisions import write_snapshot
        try:
            write_snapshot(self.config.snapshot, refused)
        except OSError as exc:
            # A full disk or a folder taken away: the table is in force; the file is
            # for a restart, and the next change tries again (said once until it works).
            if not self.unwritable:
                self.say(f"cannot write {self.config.snapshot} ({exc.strerror or exc}); "
                         "the decisions are in force but would not outlive a restart")
            self.unwritable = True
            return
        self.unwritable = False

    def run(self) -> None:
        """Poll until SIGTERM; started by the supervisor in its own process."""
        signal.signal(signal.SIGTERM, self._stop)
        self.restore()
        while not self.stopping:
            self.poll()
            deadline = time.monotonic() + self.config.update_interval
            while not self.stopping and time.monotonic() < deadline:
                time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))

    def _stop(self, _sig, _frame) -> None:
        self.stopping = True


class OwnBans:
    """The bans in force in this server's ban store (none without one), read once a
    round; the store unreadable: the last read stands, said once."""

    def __init__(self, locator: str, say) -> None:
        self.locator = locator
        self.say = say
        self.rows: list = []
        self._bans = None
        self._down = False

    def live(self) -> list:
        if not self.locator:
            return []
        try:
            if self._bans is None:
                from nestgate.bans.store import open_bans
                self._bans = open_bans(self.locator)
            self.rows = self._bans.live()
        except Exception as exc:  # noqa: BLE001 - any store failure: the last read stands
            if not self._down:
                self.say(f"the ban store cannot be read ({exc}); its last bans are used")
            self._down = True
            return self.rows
        if self._down:
            self.say("the ban store is read again")
        self._down = False
        return self.rows


def run_bouncer(config) -> None:
    """The bouncer process's body."""
    Bouncer(config).run()


def lift_decisions() -> None:
    """A reload without `[crowdsec]`, once the bouncer process has exited: its
    decisions are lifted (the one writer of them is gone, and none follows)."""
    from nestgate.bans.table import ban_table
    ban_table().lift_origin(FED)

