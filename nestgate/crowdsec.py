"""The CrowdSec bouncer: the Local API's ban decisions, refused by every site.

Theory of operation
-------------------
`[crowdsec]` names a Local API (`url`) and a bouncer key (`api_key` or `api_key_file`,
from `cscli bouncers add`). One process polls it, the bouncer process the supervisor
forks beside the workers (nestgate.sideprocess), never a worker: in stream mode, the
first call (and the first after any failure) `GET /v1/decisions/stream?startup=true`
answers every decision in force; each later one, `update_interval` apart, only what
was added and deleted since. The process keeps the decisions by id with their expiry
(two scenarios may ban one address: lifting one leaves the other), and whenever the
set of refused addresses changes writes it as a decision table (nestgate.decisions)
into the state folder, where every worker picks it up within a second and its guards
refuse those clients with the site's 403 page.

What is refused: `ban` decisions, and `captcha` ones unless `captcha = "ignore"`
(nestgate shows no captcha; a client CrowdSec wants challenged is refused instead),
for scopes `Ip` and `Range` (a range stays one range). Other types and scopes
(`Country`, `AS`, `Username`) are left out, counted in the log line of each change.

The Local API down (refused, timing out, answering an error): the last decisions stay
in force (the file is not touched; expiries still lift decisions as they pass), the
failure is said once, and its end too.
"""

from __future__ import annotations

import json
import re
import signal
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from nestgate.decisions import DecisionTable, interval, write_table

SNAPSHOT_NAME = "crowdsec-decisions"
BOUNCER_PROCESS_NAME = "nestgate-bouncer"   # what ps shows
USER_AGENT = "nestgate-bouncer/1"
REQUEST_TIMEOUT = 10.0       # seconds a call to the Local API may take
RESPONSE_MAX = 256 << 20     # bytes of a stream answer (50k decisions are ~10 MB)
REFUSED_SCOPES = ("ip", "range")


@dataclass(frozen=True)
class CrowdSecConfig:
    url: str                          # the Local API, e.g. http://127.0.0.1:8080
    api_key: str                      # the bouncer's key (never logged)
    update_interval: float = 10.0     # seconds between polls
    captcha: str = "ban"              # "ban": refused like a ban; "ignore"
    snapshot: str = ""                # the decision table the workers read

    def __repr__(self) -> str:        # the key stays out of tracebacks and logs
        return f"CrowdSecConfig(url={self.url!r}, update_interval={self.update_interval})"


def read_crowdsec(s) -> CrowdSecConfig | None:
    """`[crowdsec]` (a config `_Section`); None when the table is absent."""
    if not s.data:
        return None
    url = s.str("url").rstrip("/")
    if not url.startswith(("http://", "https://")):
        s.fail("url", "the Local API's http:// or https:// address, like "
               "\"http://127.0.0.1:8080\"", url or None)
    key = s.str("api_key")
    before = len(s.problems)
    key_file = s.file_bytes("api_key_file")
    if key and key_file is not None:
        s.fail("api_key_file", "api_key or api_key_file, not both")
    elif key_file is not None:
        key = key_file.decode("utf-8", "replace").strip()
        if not key and len(s.problems) == before:
            s.fail("api_key_file", "a file holding the bouncer key (`cscli bouncers add`)")
    elif not key:
        s.fail("api_key", "the bouncer key `cscli bouncers add NAME` printed (or "
               "api_key_file, a file holding it)")
    interval_s = s.positive_duration("update_interval", CrowdSecConfig.update_interval)
    captcha = s.choice("captcha", CrowdSecConfig.captcha, ("ban", "ignore"))
    s.check_unknown()
    return CrowdSecConfig(url, key, interval_s, captcha,
                          str(s.state_base / SNAPSHOT_NAME))


_GO_DURATION = re.compile(r"(\d+(?:\.\d*)?)(h|ms|m|s|us|µs|ns)")
_GO_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6,
             "ns": 1e-9}


def go_duration(text: str) -> float:
    """Seconds in a Go duration as the Local API writes them ("3h59m58.9s", "-24ms")."""
    sign = -1.0 if text.startswith("-") else 1.0
    return sign * sum(float(n) * _GO_UNITS[u] for n, u in _GO_DURATION.findall(text))


class Decisions:
    """The decisions in force, by id: what the stream said, less what has expired."""

    def __init__(self, captcha: str = "ban") -> None:
        self.refused_types = ("ban", "captcha") if captcha == "ban" else ("ban",)
        self.by_id: dict[object, tuple[str, float]] = {}   # id -> (value, expires)
        self.skipped = 0                   # decisions of a type or scope not enforced

    def apply(self, answer: dict, now: float, startup: bool) -> None:
        """One stream answer: on startup it replaces everything held."""
        if startup:
            self.by_id.clear()
            self.skipped = 0
        for decision in answer.get("deleted") or ():
            if isinstance(decision, dict):
                self.by_id.pop(decision.get("id"), None)
        for decision in answer.get("new") or ():
            kept = self._refusal(decision)
            if kept is None:
                self.skipped += 1
                continue
            value, seconds = kept
            self.by_id[decision.get("id", value)] = (value, now + seconds)

    def _refusal(self, decision) -> tuple[str, float] | None:
        if not isinstance(decision, dict):
            return None
        kind = str(decision.get("type", "")).lower()
        scope = str(decision.get("scope", "")).lower()
        value = decision.get("value")
        if kind not in self.refused_types or scope not in REFUSED_SCOPES \
                or not isinstance(value, str):
            return None
        try:
            interval(value)
        except ValueError:
            return None
        seconds = go_duration(str(decision.get("duration", "")))
        return (value, seconds) if seconds > 0 else None

    def expire(self, now: float) -> None:
        for key in [k for k, (_v, until) in self.by_id.items() if until <= now]:
            del self.by_id[key]

    def values(self) -> frozenset[str]:
        return frozenset(value for value, _until in self.by_id.values())


class Bouncer:
    """The bouncer process's loop: poll, keep, publish the refused set when it changes.

    `publish(values)` is where the set goes: by default the decision table file the
    workers read (`publish_to_file`). It is the one seam between the Local API and
    enforcement: any table that takes the whole set of addresses and ranges in force
    can stand in for the file."""

    def __init__(self, config: CrowdSecConfig, publish=None, say=None) -> None:
        self.config = config
        self.publish = publish or (lambda values: publish_to_file(config.snapshot, values))
        self.say = say or (lambda m: print(f"nestgate: crowdsec: {m}", file=sys.stderr,
                                           flush=True))
        self.decisions = Decisions(config.captcha)
        self.synced = False                # a startup answer is in: later ones are changes
        self.down = ""                     # why the last call failed, "" when it worked
        self.written: frozenset[str] | None = None
        self.unwritable = False            # the last write failed (said once)
        self.stopping = False

    def fetch(self, startup: bool) -> dict:
        url = self.config.url + "/v1/decisions/stream" + ("?startup=true" if startup else "")
        request = urllib.request.Request(url, headers={"X-Api-Key": self.config.api_key,
                                                       "User-Agent": USER_AGENT})
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT) as answer:
            data = answer.read(RESPONSE_MAX + 1)
        if len(data) > RESPONSE_MAX:
            raise ValueError(f"an answer over {RESPONSE_MAX >> 20} MB")
        found = json.loads(data)
        if not isinstance(found, dict):
            raise ValueError("an answer that is not a JSON object")
        return found

    def poll(self) -> None:
        """One round: ask, keep what was said (or say the API is down), write."""
        now = time.time()
        startup = not self.synced
        try:
            answer = self.fetch(startup)
        except (OSError, ValueError) as exc:      # URLError, HTTPError, timeouts, JSON
            self._failed(exc)
        else:
            self.decisions.apply(answer, now, startup)
            self.synced = True
            if self.down:
                self.say(f"Local API at {self.config.url} answers again")
            self.down = ""
        self.decisions.expire(now)
        if self.synced or self.written is not None:
            self.write()

    def _failed(self, exc: Exception) -> None:
        # After a failure the next answer is a full one: whatever happened meanwhile
        # (a restarted Local API, a lost answer) it replaces what is held.
        self.synced = False
        reason = _reason(exc)
        if not self.down:
            kept = f"the last {len(self.written)} decisions" if self.written is not None \
                else "the decisions written before"
            self.say(f"Local API at {self.config.url} cannot be used ({reason}); "
                     f"{kept} stay in force until it answers")
        self.down = reason

    def write(self) -> None:
        values = self.decisions.values()
        if values == self.written:
            return
        try:
            self.publish(values)
        except OSError as exc:
            # A full disk or a folder taken away: the workers keep the table they
            # have; the next round tries again (said once until it works).
            if not self.unwritable:
                self.say(f"cannot write {self.config.snapshot} ({exc.strerror or exc}); "
                         f"the workers keep the decisions they have")
            self.unwritable = True
            return
        self.unwritable = False
        skipped = f", {self.decisions.skipped} of other types or scopes left out" \
            if self.decisions.skipped else ""
        self.say(f"{len(values)} addresses and ranges refused{skipped}")
        self.written = values

    def run(self) -> None:
        """Poll until SIGTERM; started by the supervisor in its own process."""
        signal.signal(signal.SIGTERM, self._stop)
        while not self.stopping:
            self.poll()
            deadline = time.monotonic() + self.config.update_interval
            while not self.stopping and time.monotonic() < deadline:
                time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))

    def _stop(self, _sig, _frame) -> None:
        self.stopping = True


def publish_to_file(path: str, values) -> None:
    """The refused addresses and ranges as the decision table every worker reads."""
    write_table(path, DecisionTable(values))


def _reason(exc: Exception) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        if exc.code == 403:
            return "HTTP 403: the api_key is not a bouncer key it knows"
        return f"HTTP {exc.code}"
    if isinstance(exc, urllib.error.URLError):
        return str(exc.reason)
    return str(exc) or type(exc).__name__


def run_bouncer(config) -> None:
    """The bouncer process's body."""
    from nestgate.admin.process import name_process
    name_process(BOUNCER_PROCESS_NAME)
    Bouncer(config.crowdsec).run()


def bouncer_keeper():
    """The supervisor's side of the bouncer process (nestgate.sideprocess)."""
    from nestgate.sideprocess import SideProcess
    return SideProcess("crowdsec bouncer", lambda config: config.crowdsec is not None,
                       run_bouncer)
