"""Wrong admin tokens: counted per client and over every client, and answered slowly.

A right token is always admitted at once, whatever came before it: a local user who
sends wrong tokens from 127.0.0.1 must not lock the operator's `nestgate ctl` out of the
same address. What is slowed is the answer to a wrong one:

- over every client (a guesser rotating its addresses), a GCRA bucket: GLOBAL_BURST
  wrong tokens are answered at once, then answers leave at GLOBAL_RATE a second, each
  held until its turn (at most MAX_HOLD seconds);
- per client, after MAX_FAILURES within FAILURE_WINDOW its wrong tokens are answered
  429 with Retry-After instead of 401 (held as the bucket says, like any other). The table keeps the CLIENTS_KEPT clients that failed
  last; a new one pushes out the one that failed longest ago (it is never emptied).

The generated token has 256 bits, so the pace is not what keeps it secret: it keeps a
guesser's noise (and the work of answering it) to a trickle.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque

MAX_FAILURES = 5             # per client within FAILURE_WINDOW, then 429 and held
FAILURE_WINDOW = 60.0
CLIENTS_KEPT = 4096
GLOBAL_BURST = 10            # wrong tokens answered at once, over every client
GLOBAL_RATE = 2.0            # then answers to wrong tokens a second, over every client
MAX_HOLD = 10.0              # seconds an answer to a wrong token is held at most


def given_token(headers) -> bytes:
    """The credential of `Authorization: Bearer <credential>`; b"" without one, and
    b" " (never a token) for another scheme."""
    for name, value in headers:
        if name == b"authorization":
            scheme, _, credential = value.partition(b" ")
            return credential.strip() if scheme.lower() == b"bearer" else b" "
    return b""


class Guesses:
    __slots__ = ("clients", "due")

    def __init__(self) -> None:
        self.clients: OrderedDict[str, deque] = OrderedDict()   # client -> failure times
        self.due = 0.0              # GCRA: when the bucket would be empty again

    def failed(self, client: str) -> tuple[float, bool]:
        """Count a wrong token from `client`: (seconds its answer is held, whether the
        client is past its own limit)."""
        now = time.monotonic()
        times = self.clients.pop(client, None)
        if times is None:
            times = deque(maxlen=MAX_FAILURES)
            if len(self.clients) >= CLIENTS_KEPT:
                self.clients.popitem(last=False)       # failed longest ago
        # Past its limit: MAX_FAILURES wrong tokens already within the window.
        over = len(times) == MAX_FAILURES and now - times[0] < FAILURE_WINDOW
        times.append(now)
        self.clients[client] = times
        # The bucket never fills beyond what MAX_HOLD lets it hold, so that a flood's
        # end is not followed by minutes of held answers.
        step = 1.0 / GLOBAL_RATE
        self.due = min(max(self.due, now) + step, now + GLOBAL_BURST * step + MAX_HOLD)
        hold = max(0.0, self.due - now - GLOBAL_BURST * step)
        return min(hold, MAX_HOLD), over

    def retry_after(self, client: str) -> int:
        times = self.clients.get(client)
        if not times:
            return 1
        return max(1, int(FAILURE_WINDOW - (time.monotonic() - times[0])) + 1)


class Held:
    """A ready refusal sent after `delay` seconds (the connection waits meanwhile)."""

    is_async = True
    __slots__ = ("answer", "delay")

    def __init__(self, answer, delay: float) -> None:
        self.answer = answer
        self.delay = delay

    async def handle(self, request) -> None:
        await asyncio.sleep(self.delay)
        await request.send_prebuilt(self.answer)
