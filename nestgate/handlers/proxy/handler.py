"""The proxy route handler: pick a target, forward the request, stream the answer.

The request head is built from the headers as parsed (no re-parsing, no dicts):
hop-by-hop headers are dropped, X-Forwarded-* set (a client's own Forwarded and
X-Real-IP dropped with them unless it is a trusted proxy), the Host kept or replaced.
A client's identity headers (Remote-User and the rest, under every name the config
gives them) are always dropped; on a protected site the signed-in user's own are
added (`Identified`: the route as one user reaches it).
The body's framing is always nestgate's own, written from the body it forwards (the
length the adapter holds the body to, `Body.length`), never from a client's field,
and a Connection header that would make a field the proxy relies on hop-by-hop is
refused (see `_hop_names`).
Retries go to another target only when nothing was sent upstream yet (the
connect failed) and only for idempotent methods. A kept-alive connection that
turns out to be closed by the upstream before it answered a byte is replaced
once, also only for idempotent requests without a body.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import ssl

from nestgate.base.later import LATER
from nestgate.base.paths import forwarded_path
from nestgate.base.clock import CLOCK
from nestgate.base.errors import HandlerError
from nestgate.base.flow import Reading, Signal, hold
from nestgate.base.grammar import TCHAR, with_cgi_spellings
from nestgate.base.handler import Service, TellsIdentity
from nestgate.handlers.proxy.balancer import Balancer
from nestgate.handlers.proxy.upstream import (PLAIN_CONNECTION, Exchange, Target, give_back,
                                              refuse_cookies)
from nestgate.base.tally import TALLY

IDEMPOTENT = frozenset((b"GET", b"HEAD", b"OPTIONS", b"PUT", b"DELETE", b"TRACE"))

# Request headers never forwarded as received.
# HTTP2-Settings belongs to the h2c upgrade, which is never passed (`NEVER_UPGRADE`).
HOP_BY_HOP = frozenset((b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer",
                        b"transfer-encoding", b"upgrade", b"expect", b"proxy-authorization",
                        b"http2-settings"))
FORWARDED = frozenset((b"x-forwarded-for", b"x-forwarded-proto", b"x-forwarded-host"))
# Other headers that tell the upstream who the client is: believed from trusted
# proxies only, as X-Forwarded-For is, whenever nestgate sets X-Forwarded-*.
ADDRESS_CLAIMS = frozenset((b"forwarded", b"x-real-ip"))
# ... and the rest of what a front proxy tells an app that trusts it: the client's
# address under other names (read by PHP apps and frameworks that look for a client
# address), the port, prefix and scheme it builds its links from (Werkzeug's ProxyFix,
# Spring's ForwardedHeaderFilter), and the path it routes by instead of the request
# line's (`X-Original-URL`, `X-Rewrite-URL`: IIS, Zend, older Symfony). From a client,
# each would make the app see another address, another site or another path than the
# one nestgate's access rules were checked against.
CLIENT_CLAIMS = ADDRESS_CLAIMS | frozenset((
    b"client-ip", b"x-client-ip", b"true-client-ip", b"cf-connecting-ip",
    b"x-cluster-client-ip", b"fastly-client-ip", b"x-forwarded-port",
    b"x-forwarded-prefix", b"x-forwarded-ssl", b"x-forwarded-scheme",
    b"x-forwarded-server", b"x-url-scheme", b"front-end-https", b"x-original-host",
    b"x-original-url", b"x-rewrite-url"))
# Fields a client's Connection header may not name (RFC 9110 7.6.1 lets a proxy
# refuse such a message): the ones the upstream frames, routes or attributes the
# request by. Obeying `Connection: content-length` while forwarding the body made
# the body a second request on a pooled upstream connection, past every access list.
NEVER_HOP_BY_HOP = frozenset((b"content-length", b"transfer-encoding", b"host")) \
    | FORWARDED | ADDRESS_CLAIMS
# Connection options that name no field to drop.
_PLAIN_OPTIONS = frozenset((b"close", b"keep-alive", b"upgrade", b""))
_NO_NAMES: frozenset[bytes] = frozenset()
# A connection option is a token (RFC 9110 7.6.1); anything else (":authority", a
# name with a space in it) is malformed.
_SCHEMES = {"http": b"http", "https": b"https"}
_FORWARDED_LIMIT = 4096       # (client, scheme) pairs whose X-Forwarded-* lines are kept
# Requests' header lines kept (`ProxyHandler._head`): how many, and the most bytes of
# one. A browser's usual request is well under 2 KB; a client that sends large fields
# that never repeat would otherwise fill the cache with them (the key holds the fields
# too): at most about 256 x 2 x 2 KB = 1 MB a route and worker.
_FIELDS_LIMIT = 256
_FIELDS_KEPT_BYTES = 2048


class _Stale(Exception):
    """A reused connection was closed by the upstream before it answered."""


def client_ssl_context(opts) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=opts.ca_file or None)
    if not opts.verify_tls:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


class ProxyHandler(Service, TellsIdentity):
    is_async = True

    def __init__(self, route, opts, session_cookie: str = "", private: bool = False,
                 claimed: frozenset[bytes] = frozenset(),
                 own_cookies: frozenset[bytes] = frozenset()) -> None:
        self.opts = opts
        refuse_cookies(own_cookies)             # no answer of an upstream sets them
        # nestgate's own sign-in cookie is never the upstream's business: an app (or
        # whoever compromises it) could replay it. Cookie lines lose it, keep the rest.
        self.session_cookie = session_cookie.encode()
        # Whether the route takes connections over at all (the engines ask), and which
        # Upgrade protocols it passes (matched by name, in lower case).
        self.upgrades = bool(opts.upgrade)
        self.upgrade_names = frozenset(name.encode() for name in opts.upgrade)
        tls = client_ssl_context(opts) if any(t.scheme == "https" for t in opts.targets) else None
        self.targets = [Target(t, opts, tls if t.scheme == "https" else None, private)
                        for t in opts.targets]
        self.balancer = Balancer(self.targets, opts)
        # A lone target is picked whenever it is healthy (see Balancer.pick).
        self.single = self.targets[0] if len(self.targets) == 1 else None
        self.strip = route.prefix.rstrip("/").encode() if opts.strip_prefix else b""
        for target in self.targets:
            target.redirect_prefix = self.strip     # what its own address stands for
        self.label = route.label
        TALLY.proxies.append(self)              # its targets' figures are published
        self.host_from_target = opts.host_header == "target"
        self.forwarded = opts.forwarded
        drop = set(HOP_BY_HOP)
        drop.add(b"host")                       # written first, kept or the target's
        drop.add(b"content-length")             # written last, from the parsed length
        drop |= claimed                         # identity headers: only ever nestgate's
        if opts.forwarded:
            drop |= FORWARDED | CLIENT_CLAIMS
        # Cookie lines are gathered and sent as one (without the session cookie on a
        # protected site): an HTTP/2 client may split its Cookie in pieces, which go to
        # an HTTP/1.1 upstream joined by "; " (RFC 9113 8.2.3); many read only one line.
        drop.add(b"cookie")
        # Also as `_` spellings, which CGI-style upstreams read as the same field.
        self.drop = with_cgi_spellings(drop)
        self._picked: dict = {}                 # request -> target `begin` chose for `handle`
        # (client, scheme) -> the X-Forwarded-For and -Proto lines and the start of
        # X-Forwarded-Host, made once per client rather than formatted per request.
        self._forwarded_lines: dict[tuple[str, str], bytes] = {}
        # (host, client, scheme, identity, the request's header fields) -> the header
        # lines that go upstream after Host: a client repeats its fields byte for byte.
        self._fields_made: dict[tuple, bytes] = {}
        self.running = False
        # The worker's tick drives the timeout watch (and, through the balancer, the
        # health checks): often enough to see the shortest timeout pass.
        shortest = min(opts.read_timeout, opts.request_timeout or opts.read_timeout,
                       opts.tunnel_idle_timeout if self.upgrades else opts.read_timeout)
        self.tick_every = max(0.05, min(1.0, shortest / 4))
        if self.balancer.health is not None:
            self.tick_every = min(self.tick_every, opts.health_interval)

    # ------------------------------------------------------ lifespan
    def start(self) -> None:
        self.running = True

    def stop(self) -> None:
        self.running = False
        self.balancer.stop()

    def tick(self, now: float) -> None:
        """Exchanges past `read_timeout` or `request_timeout` fail with 504; tunnels
        idle past `tunnel_idle_timeout` close; idle upstream connections past
        `idle_timeout` close; health checks fall due."""
        opts = self.opts
        for target in self.targets:
            # An exchange in flight (or a tunnel) is its connection's `exchange` until
            # it ends.
            for conn in list(target.conns):
                ex = conn.exchange
                if type(ex) is Pipe:
                    if now - ex.last > opts.tunnel_idle_timeout:
                        ex.lost()               # both sides close as the tunnel ends
                    continue
                if type(ex) is not Exchange or ex.complete or ex.error or conn.reading.paused:
                    continue
                if now - ex.last > opts.read_timeout or \
                        (opts.request_timeout and now - ex.t0 > opts.request_timeout):
                    ex.fail(504)
            if target.idle:
                target.close_idle(now - opts.idle_timeout)
        self.balancer.tick(now)

    def with_identity(self, lines: bytes) -> Identified:
        return Identified(self, lines)

    # ------------------------------------------------------ requests
    def begin(self, req, identity: bytes = b"") -> bool:
        """The common case without a coroutine: no body, no upgrade, an idle kept-alive
        connection ready, and room to answer at once (`relay.ready_now`). The exchange
        answers from its callbacks and `settled` tells the engine. Anything else
        (False) goes through `handle` in a task."""
        if req.body is not None or req.upgrade or not self.running:
            return False
        target = self.single
        if target is None or not target.healthy:
            target = self.balancer.pick(())
            if target is None:
                return False
        conn = target.idle_connection()
        if conn is None:
            if len(self._picked) > 4096:        # requests whose client left before `handle`
                self._picked.clear()
            self._picked[req] = target          # `handle` starts from this pick
            return False
        try:
            head = self._head(req, target, identity)
        except HandlerError:
            target.idle.append(conn)            # unused; `handle` answers the refusal
            return False
        ex = Exchange.on(conn, req)
        if not ex.relay.ready_now():
            conn.exchange = None                # no room yet: `handle` waits for it
            conn.spare = ex
            target.idle.append(conn)
            return False
        ex.fast = self
        ex.target = target
        ex.sent_all = True
        target.active += 1
        target.requests += 1
        req.cancel = ex.cancel
        # Sent after this batch of reads (nestgate.base.later): nothing else writes to
        # the connection before its answer, and a client that leaves closes it.
        LATER.append(conn.later, head, req.connection.loop)
        return True

    def settled(self, ex: Exchange) -> None:
        """A callback-driven exchange is over (or failed)."""
        target, conn, req = ex.target, ex.conn, ex.req
        target.active -= 1
        error = ex.error
        if not error:
            if target.fails:
                target.fails = 0
            if ex.reusable and not conn.closed and len(target.idle) < target.max_idle:
                # Back to the pool, with the exchange and its parser for the next request.
                conn.spare = ex if ex.parser is not None else None
                conn.idle_since = CLOCK.now
                target.idle.append(conn)
            else:
                conn.close()
            req.answered()
            return
        if conn.reused and not ex.received and error == 502 and not ex.started \
                and req.method in IDEMPOTENT:
            give_back(conn, ex)
            req.answer_in_task()                # a stale kept-alive connection
            return
        target.failed(CLOCK.now)
        give_back(conn, ex)
        req.answered(error)

    def abandon(self, ex: Exchange) -> None:
        """The client went away before a callback-driven exchange ended."""
        if ex.fast is None:
            return
        ex.fast = None
        ex.target.active -= 1
        ex.conn.exchange = None
        ex.conn.close()

    async def handle(self, req, identity: bytes = b"") -> None:
        if not self.running:
            self.start()
        opts = self.opts
        idempotent = req.method in IDEMPOTENT
        attempts = 1 + (opts.retries if idempotent else 0)
        stale_retry = idempotent and req.body is None
        excluded: list[Target] = []
        status = 502
        picked = self._picked.pop(req, None)
        while attempts > 0:
            target = picked or self.balancer.pick(excluded)
            picked = None
            if target is None:
                break
            if excluded:
                target.retries += 1             # another target failed this request first
            head = self._head(req, target, identity)   # a refused request costs no connection
            conn = target.idle_connection()
            if conn is None:
                attempts -= 1
                if target.full():
                    status = 503
                    excluded.append(target)
                    continue
                try:
                    conn = await target.connect(opts.connect_timeout)
                except asyncio.TimeoutError:
                    status = 504
                except OSError:
                    status = 502
                else:
                    status = 0
                if status:
                    target.failed(CLOCK.now)
                    excluded.append(target)
                    continue
            try:
                await self._exchange(req, target, conn, head)
                return
            except _Stale:
                if not stale_retry:
                    raise HandlerError(502) from None
                stale_retry = False
        raise HandlerError(status)

    def _head(self, req, target, identity: bytes = b"") -> bytes:
        """The request head for `target`: the request line and Host (the holes, per
        request), then the header lines `_fields` makes, kept in `_fields_made` for
        a request without a body from a client that repeats its headers.
        HandlerError(400) for a Connection header `_hop_names` refuses."""
        path = forwarded_path(req.raw_target)    # the path the route was chosen by
        if self.strip and path.startswith(self.strip):
            path = path[len(self.strip):]
            if not path.startswith(b"/"):
                path = b"/" + path
        host = req.host
        if req.body is not None:
            fields = self._fields(req, identity)[0]
        else:
            # The fields depend on nothing else (`_fields` says when they do not).
            key = (host, req.client, req.scheme, identity, tuple(req.headers))
            fields = self._fields_made.get(key)
            if fields is None:
                fields, kept = self._fields(req, identity)
                if kept and len(fields) <= _FIELDS_KEPT_BYTES:
                    if len(self._fields_made) >= _FIELDS_LIMIT:
                        self._fields_made.clear()
                    self._fields_made[key] = fields
        return b"".join((req.method, b" ", path, b" HTTP/1.1\r\nhost: ",
                         target.authority if self.host_from_target or not host else host,
                         b"\r\n", fields))

    def _fields(self, req, identity: bytes) -> tuple[bytes, bool]:
        """The header lines after Host: the headers as parsed, less the dropped ones,
        then the user's `identity` lines, X-Forwarded-* and the framing (and upgrade)
        lines nestgate writes itself; and whether they may be kept for the same
        request fields (False when they depend on the connection: a trusted proxy's
        X-Forwarded-*, Connection options)."""
        host = req.host
        parts = []
        drop = self.drop
        special = cookies = None
        for item in req.headers:
            name = item[0]
            if name in drop:
                if name == b"cookie":
                    # On a protected site: forwarded without the session (the usual
                    # request of a signed-in visitor, so not a reason to leave the
                    # quick way below).
                    kept = _without_cookie(item[1], self.session_cookie) \
                        if self.session_cookie else item[1]
                    if kept:
                        cookies = [kept] if cookies is None else cookies + [kept]
                elif name != b"host":
                    if special is None:
                        special = [item]
                    else:
                        special.append(item)
                continue
            parts += (name, b": ", item[1], b"\r\n")
        if special is None and self.forwarded and host and req.body is None:
            # The usual request: no header to reconsider, no body, X-Forwarded-* set.
            if cookies is not None:
                parts += (b"cookie: ", b"; ".join(cookies), b"\r\n")
            key = (req.client, req.scheme)
            lines = self._forwarded_lines.get(key) or self._learn_forwarded(key)
            parts += (identity, lines, host, b"\r\n\r\n")
            return b"".join(parts), True
        conn = req.connection
        upgrade = declared = None
        xff = proto = fhost = claims = None
        own = True              # the lines depend on the request alone (see the end)
        if special is not None:
            conn_tokens = None
            for name, value in special:
                if name == b"content-length":
                    declared = value
                elif name == b"connection":
                    # A list header: the names on every field line count (RFC 9110 7.6.1).
                    conn_tokens = value if conn_tokens is None else conn_tokens + b"," + value
                elif name == b"upgrade":
                    upgrade = value if upgrade is None else upgrade + b"," + value
                elif name == b"x-forwarded-for":
                    xff = [value] if xff is None else xff + [value]
                elif name == b"x-forwarded-proto":
                    proto = value
                elif name == b"x-forwarded-host":
                    fhost = value
                elif name in CLIENT_CLAIMS:
                    claims = [(name, value)] if claims is None else claims + [(name, value)]
            # What a client claims about who it is counts only from a trusted proxy:
            # with such claims the lines depend on the connection too.
            own = xff is None and proto is None and fhost is None and claims is None
            if conn_tokens is not None:
                # Headers the Connection header names are hop-by-hop too.
                names = _hop_names(req, conn_tokens)
                if names:
                    del parts[:]
                    for name, value in req.headers:
                        if name not in drop and name not in names:
                            parts += (name, b": ", value, b"\r\n")
                    if b"cookie" in names:
                        cookies = None
            if not conn.xff_trusted:
                xff = proto = fhost = None
            elif claims is not None:
                for name, value in claims:          # a trusted proxy's word, as its X-F-F
                    parts += (name, b": ", value, b"\r\n")
        if cookies is not None:
            parts += (b"cookie: ", b"; ".join(cookies), b"\r\n")
        parts.append(identity)
        if self.forwarded:
            parts += (b"x-forwarded-for: ",
                      b", ".join(xff) + b", " + conn.peer.encode() if xff
                      else req.client.encode(),
                      b"\r\nx-forwarded-proto: ", proto or _SCHEMES[req.scheme], b"\r\n")
            if host:
                parts += (b"x-forwarded-host: ", fhost or host, b"\r\n")
        # The framing of the bytes `_send_body` will send, whatever the client's own
        # lines said (a client's content-length is never copied: over HTTP/2 two of
        # them made the upstream read the body as two requests): the length the
        # adapter holds the body to, chunked when it has none; no body is length 0.
        body = req.body
        if body is not None:
            parts.append(b"transfer-encoding: chunked\r\n" if body.length is None
                         else b"content-length: %d\r\n" % body.length)
        elif declared is not None:
            parts.append(b"content-length: 0\r\n")
        if upgrade is not None and req.upgrade:
            # Only the protocols the route names; a request that offers none of them
            # goes as a plain request (as nginx sends one without its upgrade lines).
            offered = self._offered(upgrade)
            if offered:
                parts += (b"connection: upgrade\r\nupgrade: ", offered, b"\r\n")
        parts.append(b"\r\n")
        return b"".join(parts), own

    def _offered(self, upgrade: bytes) -> bytes:
        """Of a request's Upgrade list (`protocol[/version]` items), the items whose
        protocol the route passes, as they go upstream; b"" for none."""
        names = self.upgrade_names
        if not names:
            return b""
        return b", ".join(item for item in (i.strip(b" \t") for i in upgrade.split(b","))
                          if item.partition(b"/")[0].lower() in names)

    def _switched_to_offered(self, req, ex: Exchange) -> bool:
        """The upstream's 101 names protocols, and only ones this request was
        forwarded with (RFC 9110 7.8): anything else is never tunnelled."""
        offered = self._offered(b",".join(v for n, v in req.headers if n == b"upgrade"))
        if not offered or not ex.upgrade_value:
            return False
        asked = {item.partition(b"/")[0].lower() for item in offered.split(b", ")}
        return all(item.strip(b" \t").partition(b"/")[0].lower() in asked
                   for item in ex.upgrade_value.split(b","))

    def _learn_forwarded(self, key: tuple[str, str]) -> bytes:
        client, scheme = key
        lines = b"x-forwarded-for: %b\r\nx-forwarded-proto: %b\r\nx-forwarded-host: " % (
            client.encode(), _SCHEMES[scheme])
        if len(self._forwarded_lines) >= _FORWARDED_LIMIT:
            self._forwarded_lines.clear()
        self._forwarded_lines[key] = lines
        return lines

    async def _exchange(self, req, target: Target, conn, head: bytes) -> None:
        ex = Exchange.on(conn, req)
        target.active += 1
        target.requests += 1
        try:
            await ex.relay.ready()
            conn.transport.write(head)
            if req.body is not None:
                await self._send_body(req, conn, ex)
            ex.sent_all = True
            ex.last = CLOCK.now
            await ex.wait()
            if ex.upgrade_tail is not None:
                target.active -= 1
                target = None
                await self._tunnel(req, conn, ex)
                return
            if ex.error:
                if conn.reused and not ex.received and ex.error == 502:
                    raise _Stale()
                target.failed(CLOCK.now)
                raise HandlerError(ex.error)
            target.succeeded()
        finally:
            if target is not None:
                target.active -= 1
            if ex.upgrade_tail is None:
                if not ex.complete:
                    conn.exchange = None
                give_back(conn, ex)

    async def _send_body(self, req, conn, ex: Exchange) -> None:
        chunked = req.body.length is None          # as `_head` announced it
        read = req.body.read
        transport = conn.transport
        while chunk := await read():
            if conn.closed or ex.error:
                return
            transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunked else chunk)
            ex.last = CLOCK.now
            if conn.write_paused:
                await conn.wait_writable()
        if chunked and not conn.closed:
            transport.write(b"0\r\n\r\n")

    async def _tunnel(self, req, conn, ex: Exchange) -> None:
        if not req.upgrade or not self._switched_to_offered(req, ex):
            conn.close()
            raise HandlerError(502, "upstream switched to a protocol not asked for")
        if not _accepts_key(req, ex):
            conn.close()
            raise HandlerError(502, "upstream's Sec-WebSocket-Accept does not answer the key")
        head = (b"HTTP/1.1 101 Switching Protocols\r\n" + ex.block
                + b"connection: upgrade\r\nupgrade: " + ex.upgrade_value + b"\r\n\r\n")
        client = req.connection
        tail = req.take_over(head)
        pipe = Pipe(client, conn)
        conn.exchange = pipe
        if ex.upgrade_tail:
            client.write(ex.upgrade_tail)
        if tail:
            conn.transport.write(tail)
        client.set_sink(pipe.from_client)
        conn.reading.resume()
        await pipe.run()


# RFC 6455 1.3: the server proves it read the handshake by hashing the client's key
# with this GUID.
_WEBSOCKET_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def websocket_accept(key: bytes) -> bytes:
    """The `Sec-WebSocket-Accept` value that answers `key` (RFC 6455 4.2.2)."""
    return base64.b64encode(hashlib.sha1(key.strip(b" \t") + _WEBSOCKET_GUID).digest())


def _accepts_key(req, ex: Exchange) -> bool:
    """A 101 to `websocket` answers the client's one `Sec-WebSocket-Key` with the one
    `Sec-WebSocket-Accept` it makes (RFC 6455 4.1: a client fails a connection
    without it). Checked here too, so that what switched is the upstream that read
    this handshake (not a cache's or a confused upstream's stale 101) and a client that
    does not check gets no tunnel a browser would refuse. Other protocols: True."""
    if not any(item.strip(b" \t").partition(b"/")[0].lower() == b"websocket"
               for item in ex.upgrade_value.split(b",")):
        return True
    keys = [value for name, value in req.headers if name == b"sec-websocket-key"]
    accepts = [line.partition(b":")[2].strip(b" \t") for line in ex.block.split(b"\r\n")
               if line.partition(b":")[0].strip().lower() == b"sec-websocket-accept"]
    return len(keys) == 1 and len(accepts) == 1 and accepts[0] == websocket_accept(keys[0])


class Identified:
    """A proxy route as one signed-in user reaches it: the same route (its targets,
    pool and figures), its requests carrying the user's identity header lines. Made
    once per user and route at load, so a request allocates nothing for it."""

    is_async = True
    __slots__ = ("proxy", "lines", "upgrades")

    def __init__(self, proxy: ProxyHandler, lines: bytes) -> None:
        self.proxy = proxy
        self.lines = lines
        self.upgrades = proxy.upgrades

    def begin(self, req) -> bool:
        return self.proxy.begin(req, self.lines)

    async def handle(self, req) -> None:
        await self.proxy.handle(req, self.lines)


_COOKIES_KEPT: dict[tuple[bytes, bytes], bytes] = {}   # (value, name) -> what is forwarded
_COOKIES_KEPT_LIMIT = 4096


def _without_cookie(value: bytes, name: bytes) -> bytes:
    """A Cookie field value without the pairs named `name` (RFC 6265 5.4: pairs
    separated by "; "). A browser repeats its Cookie value: kept, bounded."""
    if value.find(name) < 0:                   # not `in`: see nestgate/base/paths.py
        return value
    kept = _COOKIES_KEPT.get((value, name))
    if kept is None:
        kept = b";".join(pair for pair in value.split(b";")
                         if pair.strip().partition(b"=")[0] != name).strip()
        if len(_COOKIES_KEPT) >= _COOKIES_KEPT_LIMIT:
            _COOKIES_KEPT.clear()
        _COOKIES_KEPT[(value, name)] = kept
    return kept


def _hop_names(req, tokens: bytes) -> frozenset[bytes] | set[bytes]:
    """The fields a request's Connection options (`tokens`, its field lines joined by
    commas) make hop-by-hop. HandlerError(400), and the client connection closed
    after it, when an option is not a token or names a field in NEVER_HOP_BY_HOP."""
    if tokens in PLAIN_CONNECTION:
        return _NO_NAMES                        # the usual values, without splitting
    names = {t.strip(b" \t").lower() for t in tokens.split(b",")}
    if not names.isdisjoint(NEVER_HOP_BY_HOP) or b"".join(names).translate(None, TCHAR):
        req.keep_alive = False
        raise HandlerError(400, "Connection option refused")
    return names - _PLAIN_OPTIONS


class Pipe:
    """After 101: bytes both ways, each side's reading paused while the other side's
    buffer is full (`flow.hold`)."""

    __slots__ = ("client", "upstream", "closed", "signal", "last", "client_reading")

    def __init__(self, client, upstream) -> None:
        self.client = client
        self.upstream = upstream
        self.closed = False
        self.last = CLOCK.now           # when a byte last went either way (the tick's view)
        self.signal = Signal()
        self.client_reading = Reading(client.transport)

    def feed(self, data: bytes) -> None:            # upstream -> client
        self.last = CLOCK.now
        client = self.client
        client.bytes_out += len(data)
        client.write(data)
        if client.write_paused and not self.upstream.reading.paused:
            self.upstream.reading.pause()
            self.signal.wake()

    def from_client(self, data: bytes) -> None:     # client -> upstream
        self.last = CLOCK.now
        upstream = self.upstream
        if upstream.closed:
            return
        upstream.transport.write(data)
        if upstream.write_paused and not self.client_reading.paused:
            self.client_reading.pause()
            self.signal.wake()

    def lost(self) -> None:
        self.closed = True
        self.signal.wake()

    async def run(self) -> None:
        upstream_reading = self.upstream.reading
        try:
            while not self.closed:
                if upstream_reading.paused:
                    await hold(upstream_reading, self.client.wait_writable)
                elif self.client_reading.paused:
                    await hold(self.client_reading, self.upstream.wait_writable)
                else:
                    await self.signal.wait()
        finally:
            self.upstream.close()
