"""`GET /api/v1/health`: status and uptime, and to local clients the version and pid;
rebuilt at most once a second.

`[server] health_details` says who sees the version and pid: "local" (loopback,
private, link-local and CGNAT addresses, the default), "all" or "none". The version
tells an outsider which known faults to try, the pid nothing they need.
"""

import json
import os

from nestgate import __version__
from nestgate.base.clientip import LOCAL
from nestgate.base.clock import CLOCK
from nestgate.base.handler import GATED
from nestgate.base.responses import Prebuilt

_MEMO_LIMIT = 4096         # client addresses remembered as local or not


class HealthAnswer(Prebuilt):
    """A ready response like any other on the hot path; the clock rewrites it in place
    when the second changes (uptime is in whole seconds), never a request."""

    __slots__ = ("started", "details", "__weakref__")

    def __init__(self, started: float, details: bool) -> None:
        self.started = started
        self.details = details
        self.refresh()
        CLOCK.call_each_second(self)

    def begin(self) -> None:
        """The uptime and pid are the worker's that answers, wherever this was built."""
        self.started = CLOCK.wall
        self.refresh()

    def refresh(self) -> None:
        answer = {"status": "ok", "uptime_s": int(CLOCK.wall - self.started)}
        if self.details:
            answer.update(version=__version__, pid=os.getpid())
        body = json.dumps(answer, separators=(",", ":")).encode()
        Prebuilt.__init__(self, 200, body, "application/json", [("cache-control", "no-store")])


def health_handler(details: str):
    """The health route's handler: one ready answer, or for "local" a choice of two by
    the client's address (remembered, so a busy client costs one dict lookup)."""
    started = CLOCK.wall
    if details != "local":
        return HealthAnswer(started, details == "all")
    return HealthByClient(HealthAnswer(started, True), HealthAnswer(started, False))


class HealthByClient:
    is_async = GATED
    __slots__ = ("detailed", "brief", "memo")

    def __init__(self, detailed: HealthAnswer, brief: HealthAnswer) -> None:
        self.detailed = detailed
        self.brief = brief
        self.memo: dict[str, HealthAnswer] = {}

    def admit(self, conn, headers) -> HealthAnswer:
        client = conn.client
        answer = self.memo.get(client)
        if answer is None:
            if len(self.memo) >= _MEMO_LIMIT:
                self.memo.clear()
            answer = self.memo[client] = self.detailed if client in LOCAL else self.brief
        return answer
