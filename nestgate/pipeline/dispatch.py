"""The stream sequence: from a request head to its recorded answer, written once and
driven by every protocol adapter (HTTP/1.1, HTTP/2, HTTP/3) and by the tests' handler
harness.

An adapter turns bytes into a request head, a body and its end (or a reset), and
answers back into bytes; everything between is here:

1. `take_peer` / `refresh_client`: who the client is (the socket peer, or for a
   trusted proxy each request's X-Forwarded-For), the scheme it used (the listener's,
   or a trusted proxy's X-Forwarded-Proto) and whether its requests are logged;
   on a listener keeping bans, a banned client named by the proxy is routed by the ban
   page's router (the adapter closes or pages a banned peer when it connects), and on
   one that sends visitors to HTTPS, a request the proxy says came over HTTPS by the
   sites' router.
2. Route (the router's `route`; HTTP/1.1 looks the raw target up in
   `SiteRoutes.exact_raw` first, the same table) then `resolve`: the route's handler
   settles what answers. A GATED handler (a site's access control, compiled into the
   route by `routing.SiteRoutes`) admits the client or returns a ready refusal; a PEEK
   handler returns its ready answer when it has one (a cached file or page).
3. A ready answer (`Prebuilt`) is written by the adapter at once, from its event
   callback: no request object, no task; `ready` counts and logs it.
4. Anything else gets the adapter's `Request` subclass. `start` lets a handler that can
   answer from callbacks take it (the proxy's relay on HTTP/1.1, `begin`); otherwise a
   task runs `answer`, which awaits the handler and translates its outcome once: nothing
   wrong (0), a status from a `NestgateError` or 500 for anything else (logged), or GONE
   when the client or its stream went away.
5. The adapter's `conclude(req, status)` decides whether the stream is still there to
   answer, and calls `conclude` here: the response is ended, the site's error page sent
   (`Request.answer_ready`), or the response cut (`Request.cut`) if bytes were already
   out, as the protocol says; then `record` counts and logs it.

`open_stream` is 2-4 for a protocol whose requests each have their own stream (HTTP/2,
HTTP/3, the harness): the adapter gives `send_ready(key, response, head_only)` (the body
bytes it sent) and `new_request(key, handler, route, method, raw_target, qmark, headers,
authority, t0)`; `protocol` names it in the request log.

Nothing here calls an adapter except through those named methods: the adapter calls
in, and acts on what comes back. HTTP/1.1 keeps its own inline path for the common ready
answer (an exact route, keep-alive, nothing queued), which costs no call at all.
"""

from __future__ import annotations

import asyncio
import logging
import time

from nestgate.bans.watch import BANS
from nestgate.base.clientip import forwarded_client, forwarded_scheme
from nestgate.base.errorpages import ERRORS
from nestgate.base.errors import HandlerError, NestgateError, RequestError
from nestgate.base.handler import GATED, PEEK
from nestgate.base.tally import UNROUTED

__all__ = ["GATED", "PEEK", "GONE", "take_peer", "refresh_client", "resolve",
           "open_stream", "refuse", "ready", "log_ready", "start", "run", "begin", "answer", "failure_status",
           "conclude", "record"]

log = logging.getLogger("nestgate.dispatch")

GONE = -1          # `conclude`'s status when the client (or its stream) went away


def take_peer(conn, address: str) -> None:
    """The connection's client is `address` (the socket peer, or what a PROXY header
    said): whether its requests are logged, and whether it may name the client in
    X-Forwarded-For and the scheme in X-Forwarded-Proto, are decided here once per
    connection.

    `conn.scheme` is the scheme the client used, the listener's unless a trusted proxy
    says otherwise (`refresh_client`, per request). `conn.known_plain`: the client is
    known to have come over plain HTTP, so a protected site may send it to HTTPS
    (nestgate.pipeline.access): a plain listener's own client, not one behind a
    PROXY-protocol sender or a trusted proxy, which may have TLS in front of us."""
    ctx = conn.ctx
    conn.client = conn.peer = address
    conn.logging = ctx.access_log is not None and ctx.should_log(address)
    conn.xff_trusted = bool(ctx.trusted_proxies) and address in ctx.trusted_proxies
    conn.scheme = ctx.scheme
    conn.known_plain = ctx.scheme == "http" and not conn.xff_trusted \
        and not ctx.proxy_protocol_from


def refresh_client(conn, headers):
    """A request from a trusted proxy: its client is the one X-Forwarded-For names, and
    that client decides whether the request is logged (the proxy's own address, often
    loopback, would decide for all of them). Called before any check can refuse the
    request, so a refusal is logged (or not) for that client too. Its scheme is the one
    X-Forwarded-Proto names (one valid value), else the listener's; only a proxy that
    said "http" has a client known to be on plain HTTP.

    Returns the router this request is routed by when it is not the connection's (the
    proxy's connection carries many clients: it is never closed or given another router
    for one): the ban page's when that client is banned (nestgate.bans); on a
    `redirect_https` listener, the sites' when the proxy said "https", since it ended
    TLS in front of us and a redirect to HTTPS would come back through it for ever (one
    that said "http" or nothing is redirected); else None."""
    ctx = conn.ctx
    conn.client = forwarded_client(
        conn.peer, [v for n, v in headers if n == b"x-forwarded-for"], ctx.trusted_proxies)
    conn.logging = ctx.access_log is not None and ctx.should_log(conn.client)
    told = forwarded_scheme(headers)
    conn.scheme = told or ctx.scheme
    conn.known_plain = told == "http"
    bans = ctx.bans            # None on a listener without bans
    if bans is not None:
        banned = bans.forwarded(conn.client)
        if banned is not None:
            return banned
    return ctx.https_router if told == "https" else None


def resolve(handler, conn, path: str, method: bytes, headers):
    """The handler that answers after GATED and PEEK are resolved: a synchronous
    one (falsy `is_async`, a ready answer) or an asynchronous one."""
    while handler.is_async is GATED:        # a site's gate, then the route's own choice
        handler = handler.admit(conn, headers)
    if handler.is_async is PEEK:
        ready_answer = handler.peek(path, method, headers)
        if ready_answer is not None:
            return ready_answer
    return handler


def open_stream(conn, key, method: bytes, raw_target: bytes, authority: bytes, headers,
                router=None):
    """Route and resolve a request on its own stream `key`: a ready answer (or the
    error page of a head that cannot be routed) is sent and recorded here and None
    returned; otherwise the adapter's new `Request`, for it to give a body and `start`.
    The connection's `router` routes it (a banned client's page router once the
    connection was given one, nestgate.bans), or `router` (`refresh_client`'s) if set."""
    qmark = raw_target.find(b"?")
    try:
        # The router checks the characters of the authority once per distinct value
        # (Router.site_for); a Host or path it cannot route is a RequestError.
        route = (router or conn.router).route(
            authority, raw_target if qmark < 0 else raw_target[:qmark])
        handler = resolve(route.handler, conn, route.path, method, headers)
    except RequestError as exc:
        refuse(conn, key, exc.status, method, authority, headers)
        return None
    t0 = time.perf_counter() if conn.logging else 0.0
    if not handler.is_async:
        ready(conn, route.tally, handler, conn.send_ready(key, handler, method == b"HEAD"),
              method, authority, route.path, route.label, headers, t0)
        return None
    return conn.new_request(key, handler, route, method, raw_target, qmark, headers,
                            authority, t0)


def refuse(conn, key, status: int, method: bytes, authority: bytes, headers) -> None:
    """A head that cannot be served: the error page of `status` on stream `key`, counted
    with the answers no route gave (a 400 is told to [[ban]] rules on = "malformed")."""
    if status == 400:
        BANS.note("malformed", conn.client)
    response = ERRORS.get(status) or ERRORS[400]
    ready(conn, UNROUTED, response, conn.send_ready(key, response, method == b"HEAD"),
          method, authority, "-", "", headers, time.perf_counter())


def ready(conn, tally, response, sent: int, method: bytes, host: bytes, path: str,
          label: str, headers, t0: float) -> None:
    """Count a ready answer in `tally` and, if the connection's client is logged, log it
    (`sent`: its body bytes)."""
    tally.count(response.status)
    if conn.logging:
        log_ready(conn, response.status, sent, method, host, path, label, headers, t0)


def log_ready(conn, status: int, sent: int, method: bytes, host: bytes, path: str,
              label: str, headers, t0: float) -> None:
    """The request-log record of a ready answer, for the connection's current client.
    (HTTP/1.1 counts its ready answers inline and calls this only when it logs, so an
    unlogged answer costs no call.)"""
    conn.ctx.access_log.record(conn.client, method, host, path, status, sent, t0, headers,
                               label, conn.protocol)


def start(req) -> None:
    """`req`'s turn: its handler takes it to answer from callbacks, or a task answers it.
    A handler with a `begin` that returns True took it (it then calls `req.answered()`
    or `req.answer_in_task()`); with False, or none, a task answers it."""
    if req.answers_from_callbacks:
        take = getattr(req.handler, "begin", None)
        if take is not None and take(req):
            return
    req.task = req.connection.loop.create_task(run(req))


async def run(req) -> None:
    req.connection.conclude(req, await answer(req))


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


def conclude(req, status: int) -> None:
    """The handler is done (`status` as `answer` gives it, GONE made 500 by an adapter
    whose stream is still there): end the response, send the error page if nothing was
    sent, or cut the response if bytes of it are out; then count and log it."""
    if not status:
        if not req.finished:
            req.end()
    elif req.started:
        req.cut()            # a second response must never follow bytes of the first
    else:
        req.answer_ready(req.errors.answer(status, req.headers))
    record(req, req.logged)


def record(req, logged: bool) -> None:
    """Count a request that was answered (or failed) and, if `logged`, log it."""
    req.tally.timed(req.status, time.perf_counter() - req._t0)
    if req.status in BANS.statuses:          # an empty set unless a [[ban]] rule counts it
        BANS.answered(req.client, req.tally.site, req.route, req.path, req.status,
                      req.connection)
    if logged:
        req.connection.ctx.access_log.record(
            req.client, req.method, req.host, req.path, req.status, req.sent, req._t0,
            req.headers, req.route, req.protocol)
