"""`GET /api/v1/health`: status, version, uptime and pid, rebuilt at most once a second."""

import json
import os

from nestgate import __version__
from nestgate.clock import CLOCK
from nestgate.responses import Prebuilt


class Health(Prebuilt):
    """A ready response like any other on the hot path; the clock rewrites it in place
    when the second changes (uptime is in whole seconds), never a request."""

    __slots__ = ("started", "pid", "__weakref__")

    def __init__(self) -> None:
        self.started = CLOCK.wall
        self.pid = os.getpid()
        self.refresh()
        CLOCK.call_each_second(self)

    def refresh(self) -> None:
        body = json.dumps({
            "status": "ok",
            "version": __version__,
            "uptime_s": int(CLOCK.wall - self.started),
            "pid": self.pid,
        }, separators=(",", ":")).encode()
        Prebuilt.__init__(self, 200, body, "application/json", [("cache-control", "no-store")])
