"""`GET /api/v1/health`: status, version, uptime and pid, rebuilt at most once a second."""

import json
import os

from nestgate import __version__
from nestgate.clock import CLOCK
from nestgate.responses import Prebuilt


class Health:
    is_async = False

    def __init__(self) -> None:
        self.started = CLOCK.wall
        self.pid = os.getpid()
        self._second = None
        self._response = None

    def current(self) -> Prebuilt:
        if CLOCK.second != self._second:
            self._second = CLOCK.second
            body = json.dumps({
                "status": "ok",
                "version": __version__,
                "uptime_s": int(CLOCK.wall - self.started),
                "pid": self.pid,
            }, separators=(",", ":")).encode()
            self._response = Prebuilt(200, body, "application/json",
                                      [("cache-control", "no-store")])
        return self._response
