"""nestgate's own bans sent to CrowdSec's Local API as alerts, so that one server's
scanner is refused by every bouncer of that Local API (the user's other servers).

Runs in the bouncer process (nestgate.bans.crowdsec), never in a worker: each round, after
the decision stream was read, the bans in force in the ban store that a [[ban]] rule
or the operator made are compared with the decisions of origin "nestgate" the stream
holds; a ban the Local API does not have yet (or has for a shorter time: a repeat
offender's longer ban) is sent, `POST /v1/alerts`, with one decision: type ban, scope
Ip (a single address) or Range, the ban's remaining duration, scenario
"nestgate/<rule>" (or "nestgate/operator"), origin "nestgate". The machine logs in
first (`POST /v1/watchers/login`, machine_id and password: a JWT, used until it is
refused or an hour has passed).

Nothing is sent twice: a ban sent is remembered until the stream shows it, and the
stream (read in full at every start) is what says the Local API has it, so a restarted
process, or another instance sharing the store, sends nothing again. The Local API
down or refusing: the next try waits twice as long each time, from one round up to
MOST_BACKOFF; said once, and when it works again.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

SENT_ORIGINS = ("rule", "operator")   # bans nestgate made (not the store's copies of others)
SLACK = 60.0                 # seconds: a decision ending this much before a ban still has it
TOKEN_LIFETIME = 3600.0      # seconds a login is used (the Local API's own are longer)
MOST_BACKOFF = 300.0         # seconds between tries while the Local API refuses alerts
BATCH = 100                  # alerts in one POST


class Reporter:
    def __init__(self, config, api, say) -> None:
        self.config = config
        self.api = api                 # nestgate.bans.crowdsec.LocalApi
        self.say = say
        self.token = ""
        self.token_until = 0.0
        self.sent: dict[str, float] = {}     # network -> until sent, not yet in the stream
        self.retry_at = 0.0
        self.backoff = 0.0
        self.down = ""

    def due(self, rows, decisions, now: float) -> list:
        """The bans of `rows` (the store's, in force) the Local API does not have."""
        found = []
        own = decisions.own()
        for row in rows:
            if row.origin not in SENT_ORIGINS or row.until - now < 1:
                continue
            held = own.get(row.network, 0.0)
            if held >= row.until - SLACK:
                self.sent.pop(row.network, None)      # in the stream: nothing to wait on
                continue
            if self.sent.get(row.network, 0.0) >= row.until - SLACK:
                continue
            found.append(row)
        return found

    def report(self, rows, decisions, now: float) -> None:
        """Send what is due (see the module docstring); never raises."""
        live = {row.network for row in rows}
        self.sent = {n: u for n, u in self.sent.items() if n in live and u > now}
        if now < self.retry_at:
            return
        due = self.due(rows, decisions, now)
        if not due:
            return
        try:
            for start in range(0, len(due), BATCH):
                batch = due[start:start + BATCH]
                self._post([alert(row, now) for row in batch], now)
                for row in batch:
                    self.sent[row.network] = row.until
        except (OSError, ValueError) as exc:
            self._failed(exc, now)
            return
        if self.down:
            self.say("the Local API takes nestgate's alerts again")
        self.down = ""
        self.backoff = 0.0
        self.say(f"{len(due)} of nestgate's bans sent as alerts")

    def _post(self, alerts: list, now: float) -> None:
        import urllib.error
        if not self.token or now >= self.token_until:
            self._login(now)
        try:
            self.api.call("POST", "/v1/alerts", self._auth(), alerts)
        except urllib.error.HTTPError as exc:
            if exc.code != 401:
                raise
            self._login(now)                       # the token ended early: once more
            self.api.call("POST", "/v1/alerts", self._auth(), alerts)

    def _auth(self) -> dict:
        return {"Authorization": f"Bearer {self.token}"}

    def _login(self, now: float) -> None:
        self.token = ""
        answer = self.api.call("POST", "/v1/watchers/login", {}, {
            "machine_id": self.config.machine_id, "password": self.config.machine_password,
            "scenarios": []})
        token = answer.get("token") if isinstance(answer, dict) else None
        if not isinstance(token, str) or not token:
            raise ValueError("a login answer without a token")
        self.token, self.token_until = token, now + TOKEN_LIFETIME

    def _failed(self, exc: Exception, now: float) -> None:
        self.backoff = min(MOST_BACKOFF, max(self.config.update_interval, self.backoff * 2))
        self.retry_at = now + self.backoff
        reason = self.api.reason(exc, "the machine_id and password are not a machine's it knows")
        if not self.down:
            self.say(f"cannot send nestgate's bans as alerts ({reason}); trying again, "
                     "less and less often")
        self.down = reason


def alert(row, now: float) -> dict:
    """The alert for the store's ban `row`: one ban decision on its network."""
    single = row.network.endswith(("/32", "/128"))
    scope = "Ip" if single else "Range"
    value = row.network.rsplit("/", 1)[0] if single else row.network
    scenario = f"nestgate/{row.rule or row.origin}"
    seconds = max(1, int(row.until - now))
    stamp = datetime.fromtimestamp(now, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "scenario": scenario, "scenario_hash": "", "scenario_version": "",
        "message": f"nestgate banned {row.network} ({row.reason or row.rule or row.origin})",
        "events_count": 1, "start_at": stamp, "stop_at": stamp, "capacity": 0,
        "leakspeed": "0", "simulated": False, "remediation": True, "events": [],
        "source": {"scope": scope, "value": value, ("ip" if single else "range"): value},
        "decisions": [{"type": "ban", "scope": scope, "value": value,
                       "duration": f"{seconds}s", "origin": "nestgate",
                       "scenario": scenario}],
    }
