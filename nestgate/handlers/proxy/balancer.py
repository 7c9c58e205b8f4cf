"""Choosing a target: weighted round-robin or least connections, skipping the unhealthy.

Passive health: a target that fails `max_fails` times within `fail_timeout` is left
out for `fail_timeout` (a lone target never is: there would be nowhere else to go,
as in nginx). Active health: `GET health_path` every `health_interval`; anything
but 2xx/3xx, or no answer within `health_timeout`, marks the target down until a
check passes again.
"""

from __future__ import annotations

import asyncio

from nestgate.base.clock import CLOCK
from nestgate.base.handler import Periodic


class Balancer:
    def __init__(self, targets, opts) -> None:
        self.targets = list(targets)
        self.least = opts.balance == "least_conn"
        self.opts = opts
        # Active checks, a round every `health_interval`, started by the worker's tick.
        self.health = Periodic(opts.health_interval, self.check_all) \
            if opts.health_path else None

    def pick(self, excluded=()):
        """The next target to try, or None when none is left."""
        targets = self.targets
        if len(targets) == 1:
            t = targets[0]
            return t if t.healthy and t not in excluded else None
        now = CLOCK.now
        candidates = [t for t in targets if t not in excluded and t.available(now)]
        if not candidates:
            return None
        if self.least:
            return min(candidates, key=lambda t: t.active / t.weight)
        # Smooth weighted round-robin (nginx): evenly spread, weights respected.
        total = 0
        best = None
        for t in candidates:
            t.current += t.weight
            total += t.weight
            if best is None or t.current > best.current:
                best = t
        best.current -= total
        return best

    # ------------------------------------------------------ active checks
    def tick(self, now: float) -> None:
        if self.health is not None:
            self.health.tick(now)

    def stop(self) -> None:
        if self.health is not None:
            self.health.stop()

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(t) for t in self.targets))

    async def check(self, target) -> None:
        opts = self.opts
        try:
            ok = 200 <= await asyncio.wait_for(
                probe(target, opts.health_path), opts.health_timeout) < 400
        except (OSError, asyncio.TimeoutError, ValueError):
            ok = False
        target.checked_now(ok)


async def probe(target, path: str) -> int:
    """The status of `GET path` on `target`, on a connection of its own."""
    reader, writer = await asyncio.open_connection(
        target.host, target.port, ssl=target.ssl, server_hostname=target.server_hostname)
    try:
        writer.write(b"GET %s HTTP/1.1\r\nhost: %s\r\nuser-agent: nestgate-health\r\n"
                     b"connection: close\r\n\r\n" % (path.encode(), target.authority))
        line = await reader.readline()
        parts = line.split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise ValueError("not an HTTP response")
        return int(parts[1])
    finally:
        writer.close()
