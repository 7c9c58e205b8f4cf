"""nestgate as a forward-auth client: a site or route that asks another server first.

`forward_auth = { url = "...", copy_headers = [...] }` on a [[site]] or [[site.route]]
delegates the decision to Authelia, Authentik or another nestgate, as Caddy's
forward_auth does. Before the route answers, nestgate sends the auth server

  GET <url's path and query>, Host as the client sent it, X-Forwarded-Method, -Proto,
  -Host, -Uri and -For (the client as nestgate knows it), and the client's Cookie,
  Authorization, Accept and X-Requested-With (what the server tells a browser from a
  script by), nothing else, no body;

then a 2xx answer lets the request through with the `copy_headers` of that answer
added to what goes upstream (whatever the client sent under those names is removed
first, whatever the answer says), and anything else (a redirect to sign in, 401,
403) is relayed to the client: status, headers (hop-by-hop ones left out) and body.

A site's `forward_auth` wraps every handler its table is given, inside the site's gate
and rate limit (`delegating`, a guard like nestgate.pipeline.ratelimit.limiting); a route's
own replaces the site's. The sign-in pages of a protected site are never wrapped.
Sites and routes without it are as they were: no wrapper, no cost.

The auth server's connections are kept alive in a pool (the proxy's `Target`); a kept
connection the server closed as it was reused is replaced once. Failing to connect or
a broken answer is 502, no answer within `timeout` (connect and answer in all) 504:
the site's error pages, never the route let through.
"""

from __future__ import annotations

import asyncio

import httptools

from nestgate.handlers.auth.portal import answer_with
from nestgate.base.errors import HandlerError
from nestgate.base.grammar import with_cgi_spellings
from nestgate.base.handler import TellsIdentity
from nestgate.base.paths import forwarded_path
from nestgate.handlers.proxy.handler import client_ssl_context
from nestgate.handlers.proxy.options import ProxyOptions, parse_target
from nestgate.handlers.proxy.upstream import RESPONSE_DROP, UPSTREAM_HEAD_MAX, Target

# The client's headers the auth server sees (besides X-Forwarded-* and Host).
PASSED = frozenset((b"cookie", b"authorization", b"accept", b"x-requested-with"))
MAX_ANSWER_BODY = 64 * 1024       # an auth server's refusal page, relayed; more is 502


class _Stale(Exception):
    """A kept-alive connection closed under us before a byte of the answer came."""


class AuthAnswer:
    """The auth server's answer on one connection, read whole (status, headers and a
    bounded body): the connection's `exchange` while it comes."""

    __slots__ = ("conn", "parser", "status", "headers", "body", "head_bytes", "received",
                 "done", "keep_alive", "_name")

    def __init__(self, conn) -> None:
        self.conn = conn
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = bytearray()
        self.head_bytes = 0
        self.received = False
        self.keep_alive = False
        self.done = asyncio.get_running_loop().create_future()
        self._name = b""
        conn.exchange = self

    # the connection's calls
    def feed(self, data: bytes) -> None:
        self.received = True
        if not self.status:
            self.head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._end(HandlerError(502, "the auth server's answer is not HTTP"))
            return
        if not self.status and self.head_bytes > UPSTREAM_HEAD_MAX:
            self._end(HandlerError(502, "the auth server's answer head is too large"))

    def lost(self) -> None:
        self._end(_Stale() if not self.received else
                  HandlerError(502, "the auth server closed the connection mid-answer"))

    # the parser's calls
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status < 200:
            self.headers.clear()                # interim (100, 103): not the answer
            return
        self.status = status

    def on_body(self, chunk: bytes) -> None:
        self.body += chunk
        if len(self.body) > MAX_ANSWER_BODY:
            self._end(HandlerError(502, "the auth server's answer body is too large"))

    def on_message_complete(self) -> None:
        if self.status:
            self.keep_alive = self.parser.should_keep_alive()
            self._end(None)

    def _end(self, error: Exception | None) -> None:
        if self.done.done():
            return
        self.conn.exchange = None
        if error is None:
            self.done.set_result(self)
        else:
            self.conn.close()
            self.done.set_exception(error)


class AuthServer:
    """One `forward_auth` table's auth server: its connection pool and the question."""

    def __init__(self, options) -> None:
        self.options = options
        cfg = parse_target(options.authority)
        opts = ProxyOptions(targets=(cfg,), max_fails=0, connect_timeout=options.timeout)
        tls = client_ssl_context(opts) if cfg.scheme == "https" else None
        self.target = Target(cfg, opts, tls)
        self.names = frozenset(name.encode() for name in options.copy_headers)
        # A client's copies are removed under every spelling an upstream may read as
        # the same field (`Remote_User` is `HTTP_REMOTE_USER` to a CGI-style app).
        self.refused = with_cgi_spellings(self.names)

    def _head(self, req) -> bytes:
        parts = [b"GET ", self.options.target, b" HTTP/1.1\r\nhost: ",
                 req.host or self.target.authority,
                 b"\r\nx-forwarded-method: ", req.method,
                 b"\r\nx-forwarded-proto: ", req.scheme.encode(),
                 b"\r\nx-forwarded-host: ", req.host or self.target.authority,
                 b"\r\nx-forwarded-uri: ", forwarded_path(req.raw_target),
                 b"\r\nx-forwarded-for: ", req.client.encode(), b"\r\n"]
        cookies = []
        for name, value in req.headers:
            if name == b"cookie":
                cookies.append(value)
            elif name in PASSED:
                parts += (name, b": ", value, b"\r\n")
        if cookies:
            # One line, as HTTP/1.1 wants it: HTTP/2 clients may split it in pieces
            # (RFC 9113 8.2.3), and an auth server may read the first line only.
            parts += (b"cookie: ", b"; ".join(cookies), b"\r\n")
        parts.append(b"user-agent: nestgate-forward-auth\r\n\r\n")
        return b"".join(parts)

    async def ask(self, req) -> AuthAnswer:
        """The auth server's answer about `req`; HandlerError 502 or 504 without one."""
        head = self._head(req)
        try:
            async with asyncio.timeout(self.options.timeout):
                try:
                    return await self._exchange(head, reuse=True)
                except _Stale:
                    return await self._exchange(head, reuse=False)
        except TimeoutError:
            raise HandlerError(504, "the auth server did not answer in time") from None
        except (OSError, _Stale):
            raise HandlerError(502, "the auth server could not be reached") from None

    async def _exchange(self, head: bytes, reuse: bool) -> AuthAnswer:
        target = self.target
        conn = target.idle_connection() if reuse else None
        if conn is None:
            conn = await target.connect(self.options.timeout)
            conn.reused = False
        answer = AuthAnswer(conn)
        try:
            conn.transport.write(head)
            await answer.done
        except BaseException:
            conn.exchange = None
            conn.close()
            raise
        if answer.keep_alive and not conn.closed:
            target.release(conn)
        else:
            conn.close()
        return answer

    def copied(self, answer: AuthAnswer) -> list[tuple[bytes, bytes]]:
        """The answer's headers to copy upstream: those named, when not empty (an
        empty one is no value: a provider's yes without a user)."""
        names = self.names
        return [(name, value) for name, value in answer.headers if name in names and value]


class Delegated(TellsIdentity):
    """A route (or a site's page) that answers only once its auth server said yes."""

    is_async = True
    __slots__ = ("inner", "server", "upgrades")

    def __init__(self, inner, server: AuthServer) -> None:
        self.inner = inner
        self.server = server
        self.upgrades = getattr(inner, "upgrades", False)

    def with_identity(self, lines: bytes) -> Delegated:
        """On a protected site too: nestgate's own identity lines go with the copied ones."""
        inner = self.inner
        return Delegated(inner.with_identity(lines), self.server) \
            if isinstance(inner, TellsIdentity) else self

    async def handle(self, req) -> None:
        server = self.server
        answer = await server.ask(req)
        if not 200 <= answer.status < 300:
            relayed = [(name, value) for name, value in answer.headers
                       if name not in RESPONSE_DROP]
            await req.send(answer.status, relayed, bytes(answer.body))
            return
        refused = server.refused
        if any(name in refused for name, _ in req.headers):
            req.headers = [item for item in req.headers if item[0] not in refused]
        copied = server.copied(answer)
        handler = self.inner
        if copied:
            if isinstance(handler, TellsIdentity):
                # The proxy: as identity lines, which it sends whatever its list of
                # names no client may send.
                handler = handler.with_identity(b"".join(b"%s: %s\r\n" % pair
                                                         for pair in copied))
            else:
                req.headers = req.headers + copied
        await answer_with(handler, req)


def delegating(guard, site_config, servers: dict):
    """The site's guard with its `forward_auth` (or a route's own) inside it: every
    handler the table is given asks the auth server first, except the sign-in pages
    (`sign_in=False`) and handlers that already delegate (a route's own `forward_auth`,
    wrapped by `delegated` before it is added). Only for a site that has one."""
    server = server_for(site_config.forward_auth, servers)

    def delegating_guard(handler, access=None, sign_in=True, limit=None, label="",
                         policy=None):
        if sign_in and not isinstance(handler, Delegated):
            handler = Delegated(handler, server)
        return guard(handler, access, sign_in, limit, label, policy)
    return delegating_guard


def delegated(handler, route, servers: dict):
    """A configured route's handler, asking its own auth server first when it has one."""
    if route.forward_auth is None:
        return handler
    return Delegated(handler, server_for(route.forward_auth, servers))


def server_for(options, servers: dict) -> AuthServer:
    """The auth server of a `forward_auth` table, one per table value in `servers` (one
    dict per loaded config): the routes that name the same server share its pool."""
    server = servers.get(options)
    if server is None:
        server = servers[options] = AuthServer(options)
    return server
