"""The worker's coarse clock: the `Date` header line and a monotonic `now`.

Both change at most a few times a second and are read on every request, so they
are plain attributes updated by the worker's tick instead of being computed per
request (DESIGN.md: per request only the Date value changes, formatted once a second).
"""

import time
import weakref
from nestgate.base.httpdate import http_date


class Clock:
    __slots__ = ("now", "second", "date", "date_line", "wall", "_each_second")

    def __init__(self) -> None:
        self.second = -1
        self._each_second = weakref.WeakSet()
        self.tick()

    def call_each_second(self, obj) -> None:
        """`obj.refresh()` runs whenever the second changes, for as long as `obj` lives:
        responses that depend on the time are rebuilt here instead of on a request.
        `obj.begin()` runs when a process forked to serve begins (see `begin`)."""
        self._each_second.add(obj)

    def begin(self) -> None:
        """In a worker, before it answers anything: the clock read, and each object it
        refreshes begun for this process. A router the supervisor built before forking
        the worker (nestgate.sites.shared) holds answers made there, with the
        supervisor's pid and start time."""
        self.tick()
        for obj in list(self._each_second):
            obj.begin()

    def tick(self) -> None:
        self.now = time.monotonic()
        self.wall = time.time()
        second = int(self.wall)
        if second != self.second:
            self.second = second
            self.date = http_date(second).encode()
            self.date_line = b"date: " + self.date + b"\r\n"
            for obj in list(self._each_second):
                obj.refresh()


CLOCK = Clock()
