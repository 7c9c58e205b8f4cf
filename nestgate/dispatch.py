"""From a routed request to its answer, the same for every protocol.

A protocol adapter (`http1`, `http2`) turns bytes into a request head, asks the
router for its `Route` (`routing.Router.route`; HTTP/1.1 looks the raw target up in
`SiteRoutes.exact_raw` first, the same table), and then:

1. `resolve`: the route's handler settles what answers. A GATED handler (a site's
   access control, compiled into the route by `routing.SiteRoutes`) admits the
   client or returns a ready refusal; a PEEK handler returns its ready answer when it
   has one (a cached file or page).
2. A ready answer (`Prebuilt`) is written by the adapter at once, from its parser
   callback: no request object, no task.
3. Anything else gets the adapter's `Request` subclass. `begin` lets a handler that
   can answer from callbacks take it (the proxy's relay on HTTP/1.1); otherwise the
   adapter starts a task that awaits `answer`.
4. `answer` awaits the handler and translates its outcome once: nothing wrong (0), a
   status from a `NestgateError` or 500 for anything else (logged), or GONE when the
   client or its stream went away. The adapter's `conclude(req, status)` ends the
   response, sends the site's error page, or cuts the stream or connection if bytes
   were already out, as its protocol says; then `record` counts and logs it.

Nothing here calls an adapter: the adapter calls in, and acts on what comes back.
"""

from __future__ import annotations

import asyncio
import logging
import time

from nestgate.errors import HandlerError, NestgateError
from nestgate.handlers import GATED, PEEK

__all__ = ["GATED", "PEEK", "GONE", "resolve", "begin", "answer", "failure_status", "record"]

log = logging.getLogger("nestgate.dispatch")

GONE = -1          # `conclude`'s status when the client (or its stream) went away


def resolve(handler, conn, path: str, method: bytes, headers):
    """The handler that answers after GATED and PEEK are resolved: a synchronous
    one (falsy `is_async`, a ready answer) or an asynchronous one."""
    while handler.is_async is GATED:        # a site's gate, then the route's own choice
        handler = handler.admit(conn, headers)
    if handler.is_async is PEEK:
        ready = handler.peek(path, method, headers)
        if ready is not None:
            return ready
    return handler


def begin(req) -> bool:
    """True when `req`'s handler took it to answer from callbacks (it then calls
    `req.answered()` or `req.answer_in_task()`); False: answer it in a task."""
    if req.relays_bytes:
        take = getattr(req.handler, "begin", None)
        if take is not None:
            return take(req)
    return False


async def answer(req) -> int:
    """Let `req`'s handler answer it; the outcome as `conclude` takes it."""
    try:
        await req.handler.handle(req)
        if req.started:
            return 0
        return failure_status(HandlerError(500, "handler sent no response"), req)
    except asyncio.CancelledError:
        return GONE              # the adapter cancelled it: the client went away
    except ConnectionResetError:
        return GONE              # the client or its stream went away while it sent
    except Exception as exc:
        return failure_status(exc, req)


def failure_status(exc: Exception, req) -> int:
    """The status a handler's exception answers with; unexpected ones are logged."""
    if isinstance(exc, NestgateError):
        return exc.status
    log.error("handler for %s failed", req.route, exc_info=exc)
    return 500


def record(req, logged: bool) -> None:
    """Count a request that was answered (or failed) and, if `logged`, log it."""
    req.tally.timed(req.status, time.perf_counter() - req._t0)
    if logged:
        req.connection.ctx.access_log.record(
            req.client, req.method, req.host, req.path, req.status, req.sent, req._t0,
            req.headers, req.route, req.protocol)
