"""The worker's coarse clock: the `Date` header line and a monotonic `now`.

Both change at most a few times a second and are read on every request, so they
are plain attributes updated by the worker's tick instead of being computed per
request (DESIGN.md: per request only the Date value changes, formatted once a second).
"""

import time
from email.utils import formatdate


class Clock:
    __slots__ = ("now", "second", "date", "date_line", "wall")

    def __init__(self) -> None:
        self.second = -1
        self.tick()

    def tick(self) -> None:
        self.now = time.monotonic()
        self.wall = time.time()
        second = int(self.wall)
        if second != self.second:
            self.second = second
            self.date = formatdate(second, usegmt=True).encode()
            self.date_line = b"date: " + self.date + b"\r\n"


CLOCK = Clock()
