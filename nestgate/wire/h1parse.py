"""Reading HTTP/1 requests: the httptools callbacks of a connection (`RequestReader`,
mixed into `nestgate.wire.http1.HTTP1Connection`), from the first byte of a request target to
the end of its body.

httptools (llhttp, strict: no lenient flag is ever set) calls back as bytes arrive.
The callbacks fill a handful of attributes for the request being read and check its
limits and framing (one Host, only a single `chunked`, no Transfer-Encoding in
HTTP/1.0, absolute-form naming the Host). At `on_headers_complete` the route is looked
up and resolved (`dispatch.resolve`'s steps, written out there: a call costs more than
a dozen bytecodes) and a ready response is written straight from the callback (at
`on_message_complete` when a body comes first). Only asynchronous handlers
(they wait on disk, an upstream or a request body) get an `HTTP1Request` and a turn in
the answer queue (`nestgate.wire.h1queue`), started at `on_headers_complete` so they can
stream the body.
"""

from __future__ import annotations

import time

from nestgate.base.later import LATER, WAITING as _WAITING
from nestgate.pipeline.dispatch import GATED, PEEK, refresh_client
from nestgate.base.errors import RequestError
from nestgate.wire.h1phases import BODY, CLOSING, HEAD, IDLE, LAST
from nestgate.wire.h1request import HTTP1Request
from nestgate.pipeline.request import Body

# `_header_bytes` while a body is read: any trailer field goes past the limit check.
_TRAILERS = 1 << 62

# Request header fields the engine reads itself, by lower-case name.
_HOST, _TRANSFER_ENCODING, _CONTENT_LENGTH, _CONNECTION = range(4)
_HEAD_FIELDS = {b"host": _HOST, b"transfer-encoding": _TRANSFER_ENCODING,
                b"content-length": _CONTENT_LENGTH, b"connection": _CONNECTION}
# Field names as clients spell them (they repeat): (lower-case name, _HEAD_FIELDS
# kind or None), so a known spelling costs one lookup and no new bytes.
_SPELLED: dict[bytes, tuple[bytes, int | None]] = {}
_SPELLED_LIMIT = 4096


def _learn_spelling(name: bytes) -> tuple[bytes, int | None]:
    lower = name.lower()
    known = _SPELLED.get(lower) or (lower, _HEAD_FIELDS.get(lower))
    if len(_SPELLED) >= _SPELLED_LIMIT:
        _SPELLED.clear()                # many odd names: start over rather than grow
    _SPELLED[name] = known
    return known


_flush_later = LATER.flush


class AfterLast(Exception):
    """Raised from `on_url` to stop parsing after the request that ends the connection."""


class RequestReader:
    """The parser's callbacks and the checks of the request they read."""

    def _unfinished(self, size: int) -> None:
        """A read ended inside a request. httptools holds a header or trailer line
        until it ends, so one line without an end would grow without limit.
        In a head, the reads after the one that began it may bring
        `max_url + max_header_bytes` bytes in all (the first read is bounded by the
        transport's buffer and left uncounted, since it may begin with pipelined
        requests ahead of this one). In a body, reads that bring no body bytes (chunk
        sizes, trailers) may bring `max_header_bytes` in a row."""
        if self.state == BODY:
            if self._body_size != self._body_seen:
                self._body_seen = self._body_size
                self._trailer_stray = 0
                if self._pass_body():
                    self._fail(400)
                return
            self._trailer_stray += size
            if self._trailer_stray > self._max_header_bytes:
                self._fail(431)
            return
        taken = self._head_taken
        if taken is None:
            self._head_taken = 0
            return
        taken += size
        self._head_taken = taken
        if taken > self._max_url + self._max_header_bytes:
            self._fail(431)
    # The callbacks below run for every request: each callback and each attribute
    # touched costs, so there is no on_message_begin (the first piece of the target
    # starts a request) and what a request rarely sets (_chunked, _content_length,
    # _unusual) is put back by on_headers_complete only when it was set.
    def on_url(self, url: bytes) -> None:
        if self.state == IDLE:
            if self.phase:                 # not OPEN: the last request was read
                raise AfterLast()
            self.state = HEAD
            self._headers = []
            self._header_bytes = 0
            self._head_taken = None
            if self._timing:
                self._t0 = time.perf_counter()
                if self.xff_trusted:
                    # Until its head names a client, a request is its peer's: one
                    # refused before that (408, 414, 431) is not logged for the client
                    # of the request before it.
                    self.client, self.logging = self.peer, self._peer_logged
        else:
            url = self._url + url
        if len(url) > self._max_url:
            raise RequestError(414)
        self._url = url

    def on_header(self, name: bytes, value: bytes, _spelled=_SPELLED.get) -> None:
        size = self._header_bytes + len(name) + len(value) + 4
        self._header_bytes = size
        if size > self._max_header_bytes:
            return self._over_limit(name, value)
        # The header count is checked once the head is complete: the byte limit
        # already bounds how many fields can arrive before that.
        known = _spelled(name)
        if known is None:
            known = _learn_spelling(name)
        lower, kind = known
        self._headers.append((lower, value))
        if kind is None:
            return
        if kind == _HOST:
            # The characters of a Host value are checked once per distinct value, by
            # the router (Router.site_for); here only repeats and emptiness.
            if self._host is not None or not value:
                raise RequestError(400, "repeated or empty Host")
            self._host = value
            return
        # The rest make the request unusual: on_headers_complete then asks its version
        # and checks its framing.
        self._unusual = True
        if kind == _TRANSFER_ENCODING:
            # Only a single `chunked`: anything else is a smuggling shape.
            if self._chunked or value.lower() != b"chunked":
                raise RequestError(400, "Transfer-Encoding other than a single chunked")
            self._chunked = True
        elif kind == _CONTENT_LENGTH:
            self._content_length = int(value)      # llhttp has checked: digits, no repeat

    def _over_limit(self, name: bytes, value: bytes) -> None:
        """Past a header limit, or a trailer field: once a body follows, `_framing`
        puts `_header_bytes` out of reach so that trailers come here instead of
        costing the usual path a check. Trailer fields are never merged into the
        header section (RFC 9110 6.5.1): they are counted against the header limit
        and dropped."""
        if self.state != BODY:
            raise RequestError(431)
        self._trailer_bytes += len(name) + len(value) + 4
        if self._trailer_bytes > self._max_header_bytes:
            raise RequestError(431)

    def _framing(self, version: str) -> bool:
        """Checks a request that declared a body; True when a body follows."""
        chunked, length = self._chunked, self._content_length
        self._chunked = False
        self._content_length = None
        if chunked and version == "1.0":
            raise RequestError(400, "Transfer-Encoding in HTTP/1.0")   # RFC 9112 6.1
        if length is not None and length > self._max_body:
            raise RequestError(413)
        if chunked or length:
            if self.parser.should_upgrade():
                # httptools takes everything after an upgrade request's head as the
                # new protocol's bytes, never as its body: the body would never come,
                # and the request (an upstream's connection with it) would wait for it
                # until a timeout (`curl --http2 -d` in clear offers h2c so).
                raise RequestError(400, "an upgrade request with a body")
            self._body_length = None if chunked else length
            self._body = None
            self._body_size = self._body_seen = 0
            self._pieces.clear()           # any left by a body refused mid-read
            self._header_bytes = _TRAILERS
            self._trailer_bytes = self._trailer_stray = 0
            return True
        return False

    def _checked_version(self) -> str:
        version = self.parser.get_http_version()
        if version != "1.1" and version != "1.0":
            # llhttp reports a request line without a version as 0.9: malformed here.
            raise RequestError(400 if version == "0.9" else 505)
        return version

    def _unusual_head(self, host: bytes | None) -> tuple[bytes, str, bool]:
        """A request without Host or keep-alive, with a Connection header or with a
        body: its version, its Host (b"" for HTTP/1.0 without one) and whether a body
        follows."""
        self._host = None
        self._unusual = False
        version = self._checked_version()
        if host is None:
            if version == "1.1":
                raise RequestError(400, "HTTP/1.1 needs a Host")
            host = b""
        has_body = (self._chunked or self._content_length is not None) and self._framing(version)
        return host, version, has_body

    def on_headers_complete(self) -> None:
        headers = self._headers
        if len(headers) > self._max_headers:
            raise RequestError(431)
        if self.xff_trusted:
            routed = refresh_client(self, headers)   # (the request's own router, or None)
        else:
            routed = None
        parser = self.parser
        host = self._host
        keep_alive = parser.should_keep_alive()
        if host is None or self._unusual or not keep_alive:
            host, version, has_body = self._unusual_head(host)
            self.state = BODY if has_body else IDLE
        else:
            # Kept alive without a Connection header is HTTP/1.1 (HTTP/1.0 needs
            # `Connection: keep-alive`, other versions are not kept alive), so the
            # version is not asked of httptools (a str.format there).
            self._host = None
            self.state = IDLE
            version = "1.1"
            has_body = False
        self._requests += 1
        if keep_alive and self._requests >= self._keepalive_requests:
            keep_alive = False          # (finish_and_close() makes this every request's case)
        if not keep_alive:
            self._enter(LAST)                # nothing after this request is parsed

        if routed is None:
            site = self._known_site(host) or self.ctx.router.site_for(host)
        else:
            site = routed.site_for(host)
        url = self._url
        # An exact route is looked up with the target as it came: a key never holds
        # "?" or "#" and always begins with "/", so a hit needs no splitting.
        route = site.exact_raw.get(url)
        if route is not None:
            qmark = -1
        else:
            if url[0] != 47:                               # not "/"
                url = self._absolute_form(url, host)
            if 63 in url:                                  # "?"
                qmark = url.find(b"?")
                raw_path = url[:qmark]
                if 35 in url:                              # "#"
                    raise RequestError(400, "fragment in request target")
            else:
                qmark = -1
                raw_path = url
            # A path routed before by prefix or to the 404 (the site's memo, as
            # `SiteRoutes.route` asks it after the exact table) costs no call.
            route = site.found.get(raw_path) or site.route(raw_path)
        handler = route.handler
        path = route.path
        method = parser.get_method()
        if method == b"CONNECT":
            raise RequestError(400, "CONNECT: nestgate is not a forward proxy")
        kind = handler.is_async
        if kind:
            # dispatch.resolve, inline: a site's gate, then the route's own choice,
            # then a ready answer the handler may have (a cached file or page).
            while kind is GATED:
                handler = handler.admit(self, headers)
                kind = handler.is_async
            if kind is PEEK:
                handler = handler.peek(path, method, headers) or handler
                kind = handler.is_async

        if not kind and not has_body and keep_alive and not self.logging \
                and self._active is None and not self._queue and not self.write_paused:
            # The common case, answered from here: a ready response, nothing ahead of it,
            # written after the batch of reads (write_ready's usual case, inline).
            later = self._later
            if later.parts:
                self.write_ready(handler, self.keep_alive_mode, method == b"HEAD")
            else:
                if not _WAITING:
                    self.loop.call_soon(_flush_later)
                _WAITING.append(later)
                self.bytes_out += handler.write_to(later, self.keep_alive_mode, method == b"HEAD")
            route.tally.codes[handler.status] += 1     # RouteTally.count, inline
            return

        if not kind:                             # a ready response
            expect = has_body and self._expect_continue(version)
            if expect:
                keep_alive = False   # the client may or may not send the body now
                self._enter(CLOSING)
            mode = self.keep_alive_mode if keep_alive else self.close_mode
            if has_body and not expect:
                self._sync = (handler, mode, method, path, host, route)  # after the body
            else:
                # Nothing more belongs to this request: answer now, from the callback.
                self._answer_sync(handler, mode, method, path, host, route)
            return

        req = HTTP1Request(self, handler, route, method, url, qmark, version, headers, host,
                           keep_alive, self._t0)
        req.body = self._body = Body(self, self._expect_continue(version), self._body_length) \
            if has_body else None
        # An HTTP/1.0 request's Upgrade is ignored (RFC 9110 7.8): a client or proxy in
        # front that speaks HTTP/1.0 knows no 101 and would go on sending requests on
        # the connection, which a tunnel would carry to the upstream unchecked. It is
        # answered as a plain request, and the connection ends after it (httptools
        # reads no further once it has seen an upgrade).
        req.upgrade = parser.should_upgrade() and version != "1.0"
        self._sync = None
        self._parsing = req if has_body else None
        if self._active is None and not self._queue:
            self.start_answer(req)
        else:
            self._queue.append(req)

    def _expect_continue(self, version: str) -> bool:
        """Whether the client waits for `100 Continue` before its body; 417 for an
        expectation other than 100-continue. An HTTP/1.0 client's is ignored (RFC 9110
        10.1.1): it may not know 1xx answers and would take the 100 for its answer,
        reading the real one as the next request's."""
        if version == "1.0":
            return False
        for name, value in self._headers:
            if name == b"expect":
                if value.lower() != b"100-continue":
                    raise RequestError(417)
                return True
        return False

    def _absolute_form(self, url: bytes, host: bytes) -> bytes:
        # RFC 9112 3.2.2: servers accept absolute-form. Its authority must name the
        # same host as the Host header (a disagreement is how requests get smuggled
        # past a front end); the path is what routes. Authority-form and "*" are not
        # served here.
        for scheme, default_port in ((b"http://", b":80"), (b"https://", b":443")):
            if url[:len(scheme)].lower() == scheme:
                slash = url.find(b"/", len(scheme))
                authority = url[len(scheme):slash if slash > 0 else len(url)].lower()
                host = host.lower()
                if 64 in authority or authority.removesuffix(default_port) != \
                        host.removesuffix(default_port):
                    raise RequestError(400, "absolute-form target and Host disagree")
                return url[slash:] if slash > 0 else b"/"
        raise RequestError(400, "request target must be a path")

    def on_body(self, chunk: bytes) -> None:
        # Called for every chunk of a chunked body (and every piece of one that a read
        # ends inside), so it only counts and keeps the piece: the pieces of a read go
        # to the handler together (`_pass_body`), and a body of many tiny chunks costs
        # one append per chunk.
        size = self._body_size + len(chunk)
        self._body_size = size
        if size > self._max_body:
            raise RequestError(413)
        self._pieces.append(chunk)

    def _pass_body(self) -> bool:
        """Hands the body pieces of this read to the handler (dropped when no handler
        reads the body) and counts them; True when the connection's bodies have come
        in too many pieces too small (`body_chunk_allowance`, `min_body_chunk_average`):
        each piece costs the interpreter about a microsecond, which nginx spends on a
        whole read, so a client could make a worker busy for little bandwidth."""
        pieces = self._pieces
        count = len(pieces)
        if not count:
            return False
        body = self._body
        if body is not None:
            body.feed(pieces[0] if count == 1 else b"".join(pieces))
        pieces.clear()
        self._body_progress = True
        # The first piece is not counted: it may be the rest of a chunk that the read
        # before cut in two, and a body in one piece is no more work than its request.
        count += self._chunks_counted - 1
        self._chunks_counted = count
        return count > self._chunk_allowance and \
            self._chunk_bytes + self._body_size < count * self._min_chunk_average

    def on_message_complete(self) -> None:
        # Only a request with a body has anything left to do here.
        if self.state == BODY:
            if self._pass_body():
                raise RequestError(400, "request bodies in too many tiny chunks")
            self._chunk_bytes += self._body_size
            self.state = IDLE
            if self._sync is not None:
                self._answer_sync(*self._sync)
                self._sync = None
            elif self._body is not None:
                self._body.finish()
                self._body = None
                self._parsing = None
