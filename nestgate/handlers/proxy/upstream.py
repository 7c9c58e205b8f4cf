"""Upstream connections: one target's keep-alive pool, and one exchange on a connection.

Theory of operation
-------------------
An `Exchange` is the httptools response parser's callback object for one request:
the upstream side. What it reads it hands to its relay (`relay.py`), which owns the
client side: the status and the kept headers at `on_headers_complete`, body chunks
as they arrive, the end at `on_message_complete`, which also hands the connection
back to the pool. The exchange never writes to a client; the relay decides when the
upstream must stop being read for a slow client (the connection's `flow.Reading`).
A handler coroutine, when there is one, sleeps on the exchange's `signal` and wakes
only when the exchange is over, failed, upgraded, or its relay has work to do.

Response heads are not read a header at a time: at `on_headers_complete` the
head's bytes (llhttp has checked them) are looked up in `_HEADS`, and only a head
not seen before is split into lines in Python. An upstream repeats its heads byte
for byte (the Date line turns over once a second), so once a head is known, a
response that begins with it and is framed by Content-Length does not go through
the parser at all (`_remembered`), over HTTP/1.1 and HTTP/2 alike: the parser would
read the same head the same way, so the memo answers and the body is counted to its
length. Bytes past that
length are the upstream framing differently from us: the response stands, the
connection is not reused.

A response that breaks before its headers reached the client becomes 502 or 504;
after that, the only honest thing left is to cut the client connection.
"""

from __future__ import annotations

import asyncio
import select
import time

import httptools

from nestgate.base.later import LaterOutput
from nestgate.base import compress
from nestgate.base.clock import CLOCK
from nestgate.base.flow import Reading, Signal, Writable
from nestgate.handlers.proxy.relay import HeldRelay, relay_for
from nestgate.base.responses import SERVER, STATUS_LINES, status_line

WRITE_HIGH_WATER = 64 * 1024
# Bytes of response head an upstream may send, interim responses and the blank line
# included; past it the answer is 502 (nginx answers so, "upstream sent too big
# header", past proxy_buffer_size, 4-8 KiB; apps with large cookies need more).
# Checked while a head arrives (httptools holds an unfinished header line, so this
# bounds it) and again when it is complete, since a head can arrive in one read.
UPSTREAM_HEAD_MAX = 64 * 1024

# Response headers never forwarded: hop-by-hop ones, and those the engine writes itself.
RESPONSE_DROP = frozenset((b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer",
                           b"transfer-encoding", b"upgrade", b"content-length", b"date",
                           b"server", b"proxy-authenticate"))

# What is done with a response header, by name: keep it, or read and drop it.
KEEP, LENGTH, CHUNKED, CONNECTION, UPGRADE, DROP, REDIRECT, SET_COOKIE = range(8)
_KIND_BY_LOWER = {name: DROP for name in RESPONSE_DROP}
_KIND_BY_LOWER.update({b"content-length": LENGTH, b"transfer-encoding": CHUNKED,
                       b"connection": CONNECTION, b"upgrade": UPGRADE,
                       b"location": REDIRECT, b"refresh": REDIRECT,
                       b"set-cookie": SET_COOKIE})
# The same, keyed by names as upstreams spell them (they repeat): one lookup per header.
_KINDS: dict[bytes, int] = {}
_KINDS_LIMIT = 1024
# Connection header values, as usually spelt, that name no header to drop.
PLAIN_CONNECTION = frozenset((b"keep-alive", b"close", b"Keep-Alive", b"Close"))

# nestgate's own cookie names (`sites.routetypes._own_cookies`): an upstream's
# `Set-Cookie` of one of them is dropped (`refuse_cookies`, as the routes are built).
_OWN_COOKIES: set[bytes] = set()

# Response heads as read (status line and header lines, without the blank line) ->
# what `_read_head` made of them. An upstream repeats its heads byte for byte (a
# Date line makes a new one each second), so the usual response costs one lookup
# instead of a Python call per header line; misses are read the same way, once.
_HEADS: dict[bytes, tuple] = {}
# The same for the routes of a protected site, whose heads gain `cache-control:
# private` when the upstream sent no Cache-Control (a shared cache must not keep a
# page only a signed-in visitor may see).
_PRIVATE_HEADS: dict[bytes, tuple] = {}
PRIVATE_LINE = b"cache-control: private"
_HEADS_LIMIT = 512
_HEAD_MEMO_MAX = 2048             # longer heads (large cookies) are read every time


class UpstreamOverrun(Exception):
    """The upstream sent bytes after the response it owed."""


class UpstreamHeadTooLarge(Exception):
    """The upstream's response head is longer than UPSTREAM_HEAD_MAX."""


class UpstreamUnknownCoding(Exception):
    """The upstream's Transfer-Encoding is not `chunked` alone."""


class UpstreamBadStatus(Exception):
    """The upstream's status is under 100, which llhttp reads as a final response."""


# How an exchange ended badly: a status while nothing went to the client yet.
BAD_GATEWAY, GATEWAY_TIMEOUT = 502, 504


class UpstreamConnection(asyncio.Protocol):
    """A connection to one target; `exchange` receives its bytes while it is in use.

    Between exchanges nothing is owed on it: a byte that arrives then (an answer to a
    request nestgate never sent, what an upstream that reads a hidden request writes)
    closes it (`data_received`), and a connection taken from the pool with anything
    still to read, bytes or its end, is closed instead of used (`unasked`): in the
    socket when the next request takes it, those bytes would be read as its answer.
    nginx closes a kept-alive upstream connection that becomes readable while idle."""

    __slots__ = ("target", "transport", "exchange", "closed", "write_paused", "_writable",
                 "reading", "idle_since", "reused", "spare", "later", "_readable")

    def __init__(self, target) -> None:
        self.target = target
        self.transport = None
        self.exchange = None
        self.closed = False
        self.write_paused = False
        self._writable = Writable()
        self.reading = Reading()        # paused while a client cannot take more
        self.idle_since = 0.0
        self.reused = False
        self.spare: Exchange | None = None      # reused for the next request
        self.later: LaterOutput | None = None   # a request sent after the batch (base.later)
        self._readable: select.poll | None = None   # its socket, asked by `unasked`

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.later = LaterOutput(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            self._readable = select.poll()
            self._readable.register(sock.fileno(), select.POLLIN)
        self.reading.transport = transport
        transport.set_write_buffer_limits(WRITE_HIGH_WATER)
        self.target.conns.add(self)

    def data_received(self, data: bytes) -> None:
        exchange = self.exchange
        if exchange is None:
            self.close()                    # bytes nobody asked for: never reused
            return
        exchange.feed(data)

    def unasked(self) -> bool:
        """Whether the socket has something to read before a request was sent on it
        (bytes nobody asked for, or the upstream's end); such a connection is closed."""
        readable = self._readable
        if readable is None or not readable.poll(0):
            return False
        self.close()
        return True

    def eof_received(self):
        return False                        # close our side too

    def connection_lost(self, exc) -> None:
        self.closed = True
        self._readable = None               # its descriptor may soon be another's
        self.target.forget(self)
        exchange, self.exchange = self.exchange, None
        if exchange is not None:
            exchange.lost()
        self._writable.close()              # a waiting writer sees `closed`

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._writable.wake()

    async def wait_writable(self) -> None:
        """Until the upstream socket takes more, or the connection is gone."""
        while self.write_paused and not self.closed:
            await self._writable.wait()

    def close(self) -> None:
        self.closed = True
        self._readable = None
        if self.transport is not None:
            self.transport.close()


class Exchange:
    """One request/response on an upstream connection, streaming to `request`."""

    __slots__ = ("conn", "req", "relay", "signal", "parser", "block", "status", "length",
                 "chunked", "started", "complete", "error", "last", "t0", "sent_all",
                 "upgrade_value", "upgrade_tail", "received", "head_buf", "head_start",
                 "last_head", "last_known", "owed", "keep_alive", "heads", "private",
                 "reusable", "fast", "target", "cancel", "compress", "encoder")

    @classmethod
    def on(cls, conn: UpstreamConnection, req) -> Exchange:
        """The exchange for `req` on `conn`: the connection's previous one (and its
        parser) when it ended cleanly, else a new one."""
        ex = conn.spare
        if ex is None:
            return cls(conn, req)
        conn.spare = None
        ex._reset(req)
        return ex

    def __init__(self, conn: UpstreamConnection, req) -> None:
        self.conn = conn
        self.parser = httptools.HttpResponseParser(self)
        self.cancel = self.abandon    # for `Request.cancel`, made once per connection
        # What an exchange that ended cleanly leaves as it found it (and `_reset`
        # does not touch: the exchange is reused only after a clean end).
        self.error = 0                # 502/504 when the exchange failed
        self.signal = Signal()        # the handler's coroutine waits on it (`wait`)
        self.upgrade_tail: bytes | None = None
        self.relay = relay_for(self, conn.reading, req)
        self.head_buf = b""           # the response head's bytes while it arrives
        self.head_start = 0           # where it begins in them (after interim responses)
        self.last_head: bytes | None = None     # the last remembered head on this
        self.last_known: tuple | None = None    # connection, and its `_HEADS` entry
        self.owed = 0                 # body bytes still to come, counted (see `_remembered`)
        self.keep_alive = False       # ... and whether the connection is kept after them
        self.private = conn.target.private      # a protected site's route
        self.heads = _PRIVATE_HEADS if self.private else _HEADS
        # A compressing route reads every head (its coding depends on the request),
        # so only other routes answer remembered heads (`_remembered`).
        self.compress = conn.target.compress
        self._reset(req)

    def _reset(self, req) -> None:
        self.req = req
        relay = self.relay
        if relay.relays_bytes is not req.relays_bytes:
            # A client of the other kind than this connection's last one.
            relay = self.relay = relay_for(self, self.conn.reading, req)
        relay.req = req
        self.block = b""              # the kept header lines, each ending in CRLF
        self.status = 0
        self.length = None
        self.chunked = False
        self.started = False          # response bytes went to the client
        self.complete = False
        self.last = self.t0 = CLOCK.now
        self.sent_all = False         # the whole request went upstream
        self.upgrade_value = b""
        self.received = False
        self.reusable = False         # ended cleanly: the handler gives the connection back
        self.fast = None              # the handler, when no coroutine waits (see `settle`)
        self.target = None
        self.encoder = None           # a StreamEncoder when this response is compressed
        self.conn.exchange = self

    # ------------------------------------------------------ from the socket
    def feed(self, data: bytes) -> None:
        self.received = True
        self.last = CLOCK.now
        if self.owed:
            self._count(data)
        elif self.started or self.head_buf or self.compress or not self._remembered(data):
            if not self._parse(data):
                return
        relay = self.relay
        if relay.out:
            relay.flush()               # what this read made, to the client
        if self.complete and self.fast is not None:
            handler, self.fast = self.fast, None
            handler.settled(self)

    def _remembered(self, data: bytes) -> bool:
        """A response whose head is, byte for byte, one llhttp has read before (see
        `_HEADS`) and whose body is framed by Content-Length: the parser would find
        the same again, so the head is answered from the memo and the body counted;
        the parser stays between messages. False for anything else."""
        head = self.last_head
        if head is not None and data.startswith(head) and \
                data.startswith(b"\r\n\r\n", len(head)):
            # The same head as the last response on this connection (no slice, no hash).
            known = self.last_known
            end = len(head)
        else:
            end = data.find(b"\r\n\r\n")
            if end < 0:
                return False
            head = data[:end]
            known = self.heads.get(head)
            if known is None or not known[5]:
                return False
            self.last_head = head
            self.last_known = known
        req = self.req
        if req.head_only:
            return False
        # Such a head is never chunked nor an upgrade: `chunked` and `upgrade_value`
        # stay as `_reset` left them, and its lines go out without `block`.
        block, length, _, _, lines, status, keep_alive, _ = known
        self.length = length
        self.status = status
        self.started = True
        start = end + 4
        got = len(data) - start
        try:
            self.relay.start_counted(status, block, lines, length,
                                     data[start:start + length] if got else b"", got >= length)
        except ConnectionResetError:
            # The client's stream was reset in this same turn of the loop, before
            # its task was cancelled: as in the parser's callback (`_parse`).
            self.fail(BAD_GATEWAY)
            return True
        if got < length:
            self.owed = length - got
            self.keep_alive = keep_alive
        else:
            # Bytes past the response: it stands, the connection is not reused (`_parse`).
            self._finish(keep_alive and got == length)
        return True

    def _count(self, data: bytes) -> None:
        """Body bytes of a response `_remembered` began, up to its Content-Length."""
        owed = self.owed
        size = len(data)
        if size >= owed:
            self.owed = 0
            if size > owed:
                data = data[:owed]
        else:
            self.owed = owed - size
        self.relay.counted(data)
        if not self.owed:
            self._finish(self.keep_alive and size == owed)

    def _parse(self, data: bytes) -> bool:
        """`data` through the parser; False when that ended the exchange in failure.
        While the head has not been read, what this read makes for the client is held
        (`HeldRelay`) until the read parsed cleanly: a read that fails sent nothing,
        and its answer is a 502."""
        held = None
        if not self.started:
            # Kept until the head is complete: `on_headers_complete` reads it from here.
            buf = self.head_buf
            if not buf:
                self.head_buf = data
            else:
                if type(buf) is bytes:
                    self.head_buf = buf = bytearray(buf)
                buf += data
            held = self.relay = HeldRelay(self.relay)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            if held is not None:
                self._release()
            if self.status == 101 and self.fast is None:
                self.upgrade_tail = data[exc.args[0]:]
                self.conn.exchange = None
                self.conn.reading.pause()             # the tunnel resumes it
                self.signal.wake()
            else:
                self.fail(BAD_GATEWAY)
            return False
        except httptools.HttpParserError:
            if not self.complete:
                if self.relay is held:
                    self.relay = held.relay         # its calls dropped: nothing went out
                self.fail(BAD_GATEWAY)
                return False
            # Bytes followed the whole response (a second response, a body after a
            # HEAD or 204 answer, garbage): the upstream frames messages differently
            # from us, so the response stands but the connection is never reused,
            # or the next client would read what is left (RFC 9112 9.3).
            self.reusable = False
            self.conn.close()
        if held is not None:
            self._release()
        if not self.started and len(self.head_buf) > UPSTREAM_HEAD_MAX and not self.complete:
            self.fail(BAD_GATEWAY)
            return False
        return True

    def _release(self) -> None:
        """The relay's calls `_parse` held, made now (see `HeldRelay`)."""
        held = self.relay
        if type(held) is HeldRelay:
            self.relay = held.relay
            held.release()

    def _settle(self) -> None:
        handler, self.fast = self.fast, None
        handler.settled(self)

    def abandon(self) -> None:
        """The client went away (`Request.cancel`) before a callback-driven exchange ended."""
        if self.fast is not None:
            self.fast.abandon(self)

    def lost(self) -> None:
        if self.complete:
            return
        if self.started and self.length is None and not self.chunked and self.status != 101:
            self._finish(False)                 # a body delimited by the connection closing
            if self.relay.out:
                self.relay.flush()
            if self.fast is not None:
                self._settle()
        else:
            self.fail(BAD_GATEWAY)

    # ------------------------------------------------------ parser callbacks
    def on_message_begin(self) -> None:
        if self.complete:
            raise UpstreamOverrun       # a message after ours: see `feed`

    def on_headers_complete(self) -> None:
        # llhttp has checked the head (CRLF line ends, no folding, field syntax), so
        # it ends at the first blank line after where it began.
        status = self.parser.get_status_code()
        buf = self.head_buf
        start = self.head_start
        end = buf.find(b"\r\n\r\n", start)
        if end + 4 > UPSTREAM_HEAD_MAX:
            raise UpstreamHeadTooLarge       # before a byte of it went out: 502 (`_parse`)
        self.status = status
        if status < 200 and status != 101:
            if status < 100:
                # No such status (RFC 9110 15): llhttp takes it for a final response
                # and reads its body, which would reach the client ahead of any head
                # of ours (raw bytes on an HTTP/1.1 connection, DATA before HEADERS on
                # HTTP/2). Before a byte of it went out: 502 (`_parse`).
                raise UpstreamBadStatus
            self.head_start = end + 4           # interim (100, 103): not forwarded
            return
        head = buf[start:end]
        if type(head) is not bytes:
            head = bytes(head)
        self.head_buf = b""
        self.head_start = 0
        read = self.heads.get(head) or _read_head(head, status, self.parser.should_keep_alive(),
                                                  self.private)
        self.block, self.length, self.chunked, self.upgrade_value, lines = read[:5]
        if read[7]:
            self.block = _redirected(self.block, self.conn.target)
        if status == 101:
            return                              # `feed` hands over to the tunnel
        req = self.req
        if self.compress:
            recoded = compress.recode_head(self.block, status, self.length,
                                           req.header(b"accept-encoding"))
            if recoded is not None:
                coding, self.block = recoded
                if coding:
                    # Its length is not known until the last byte: chunked, or HTTP/2 DATA.
                    self.length = lines = None
                    if not req.head_only:
                        self.encoder = compress.StreamEncoder(coding)
                else:
                    lines = None                # Vary added, the body as it is
        self.relay.start(status, self.block, self.length, lines)
        self.started = True
        if req.head_only:
            # No body follows a HEAD response whatever its headers say; the parser
            # cannot be told, so this exchange ends here (and the parser with it). The
            # connection is not reused: an upstream that sends a body anyway (RFC 9110
            # 9.3.2 says it must not) would have it read as the next client's response.
            self.parser = None
            self._finish(False)

    def on_body(self, chunk: bytes) -> None:
        if self.complete:
            raise UpstreamOverrun       # a body after a HEAD answer: see `feed`
        if self.encoder is not None:
            chunk = self.encoder.feed(chunk)
            if not chunk:
                return
        self.relay.body(chunk)

    def on_message_complete(self) -> None:
        if self.status < 200 or self.complete:
            return
        self._finish(self.parser.should_keep_alive())

    # ------------------------------------------------------ endings
    def _finish(self, reusable: bool) -> None:
        self._release()                 # a whole response stands, whatever follows it
        self.complete = True
        if self.encoder is not None:
            encoder, self.encoder = self.encoder, None
            tail = encoder.finish()
            if tail:
                self.relay.body(tail)
        if not self.req.finished:
            self.relay.end()
        conn = self.conn
        conn.exchange = None
        # Done: what is left is with the relay or in the client's buffer, and the
        # connection is read again (for its next exchange, or to see it close).
        if conn.reading.paused:
            conn.reading.resume()
        if reusable and self.sent_all and not conn.closed:
            self.reusable = True
        else:
            conn.close()
        if self.fast is None:
            self.signal.wake()

    def fail(self, status: int) -> None:
        if self.complete or self.error:
            return
        self.error = status
        self.conn.exchange = None
        self.conn.close()
        if self.fast is not None:
            self._settle()
        self.signal.wake()

    async def wait(self) -> None:
        """Until the exchange is over, failed or upgraded; meanwhile the relay writes
        what it holds and waits for the client (`relay.drain`)."""
        relay = self.relay
        while True:
            if not self.error and relay.due():
                await relay.drain()
                self.last = CLOCK.now
                continue
            if self.complete or self.error or self.upgrade_tail is not None:
                return
            await self.signal.wait()


def refuse_cookies(names: frozenset[bytes]) -> None:
    """Drop `Set-Cookie` lines of these cookie names from every upstream answer."""
    if not names <= _OWN_COOKIES:
        _OWN_COOKIES.update(names)
        _HEADS.clear()                      # heads read before were read without them
        _PRIVATE_HEADS.clear()


def _kind(name: bytes) -> int:
    """What to do with a response header called `name` (then remembered as spelt)."""
    kind = _KIND_BY_LOWER.get(name.lower(), KEEP)
    if len(_KINDS) >= _KINDS_LIMIT:
        _KINDS.clear()
    _KINDS[name] = kind
    return kind


def _read_head(head: bytes, status: int, keep_alive: bool, private: bool = False) -> tuple:
    """A final response head (checked by llhttp, without its blank line; `status` and
    `keep_alive` as llhttp read them) as a tuple of
      the header lines to forward, Content-Length or None, chunked, the Upgrade value,
      the forwarded head's status and header lines when its length is known (else
      None), the status when `Exchange._remembered` may count the body (else 0),
      whether the upstream keeps the connection after such a response, and whether a
      `Location` or `Refresh` names an absolute URL (`_redirected` looks at it for
      each response, so such a head is never forwarded or counted from the memo),
    remembered in `_HEADS` (`_PRIVATE_HEADS`) when short. Hop-by-hop lines are
    dropped, and those the Connection header names (RFC 9110 7.6.1); `private` adds
    `cache-control: private` when the upstream sent no Cache-Control."""
    kept = []
    length = None
    chunked = False
    tokens = None
    upgrade = b""
    absolute = False
    kinds = _KINDS.get
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        kind = kinds(name)
        if kind is None:
            kind = _kind(name)
        if not kind:
            kept.append(line)
            continue
        value = value.strip(b" \t")
        if kind == LENGTH:
            # Never on a 204 (RFC 9110 8.6, as nginx drops it): llhttp reads no body
            # after one, and a client that believed the length would read the next
            # response as this one's body (HTTP/2 clients reset the stream).
            length = int(value) if status != 204 else None
        elif kind == CHUNKED:
            if value.lower() != b"chunked":
                # `gzip`, `chunked, gzip`, `xchunked`: llhttp reads such a body to the
                # connection's end, and nothing here can undo the coding; nginx answers
                # 502 ("upstream sent unknown Transfer-Encoding"), and so does this.
                raise UpstreamUnknownCoding
            chunked = True
        elif kind == CONNECTION:
            # A list header: the names on every field line count.
            tokens = value if tokens is None else tokens + b"," + value
        elif kind == UPGRADE:
            upgrade = value
        elif kind == REDIRECT:
            kept.append(line)
            absolute = absolute or b"://" in value
        elif kind == SET_COOKIE:
            # Browsers trim the name; it is matched as they would store it.
            if value.partition(b"=")[0].strip(b" \t") not in _OWN_COOKIES:
                kept.append(line)
    if tokens is not None and tokens not in PLAIN_CONNECTION:
        names = {t.strip().lower() for t in tokens.split(b",")} - {b"close", b"keep-alive", b""}
        if names:
            kept = [line for line in kept if line.partition(b":")[0].lower() not in names]
    if private and not any(line.partition(b":")[0].strip().lower() == b"cache-control"
                           for line in kept):
        kept.append(PRIVATE_LINE)
    kept.append(b"")                        # each line ends in CRLF
    block = b"\r\n".join(kept)
    lines = None
    counted = 0
    if length is not None and status >= 200 and not absolute:
        lines = b"".join((STATUS_LINES.get(status) or status_line(status), SERVER.line, block,
                          b"content-length: %d\r\n" % length))
        if status != 204 and status != 304 and not chunked:
            counted = status
    read = (block, length, chunked, upgrade, lines, counted, keep_alive, absolute)
    if len(head) <= _HEAD_MEMO_MAX:
        memo = _PRIVATE_HEADS if private else _HEADS
        if len(memo) >= _HEADS_LIMIT:
            memo.clear()                    # stale Date lines, or an upstream whose heads vary
        memo[head] = read
    return read


# What may follow an origin in a URL (else it is a longer name or port).
_URL_ENDS = (b"", b"/", b"?", b"#", b"'", b'"')


def _redirected(block: bytes, target) -> bytes:
    """`block` with the URLs of its `Location` and `Refresh` lines that point at the
    upstream's own address (`Target.origins`: a client cannot reach it, or should not
    be sent round nestgate) made paths through nestgate: the route's stripped prefix
    (`Target.redirect_prefix`) and the rest, as nginx's `proxy_redirect default`
    does. A URL of any other host is left as it is."""
    lines = block.split(b"\r\n")
    for index, line in enumerate(lines):
        name, sep, value = line.partition(b":")
        lower_name = name.lower()
        if not sep or _KIND_BY_LOWER.get(lower_name) != REDIRECT:
            continue
        lower = value.lower()
        at = len(value) - len(value.lstrip(b" \t"))        # Location: the whole value
        if lower_name == b"refresh":                        # Refresh: `5; url=...`
            at = lower.find(b"url=")
            if at < 0:
                continue
            at += 4
            if lower[at:at + 1] in (b"'", b'"'):
                at += 1
        for origin in target.origins:
            end = at + len(origin)
            if not lower.startswith(origin, at) or lower[end:end + 1] not in _URL_ENDS:
                continue
            rest = value[end:]
            if not rest.startswith(b"/"):
                rest = b"/" + rest
            lines[index] = b"%b:%b%b%b" % (name, value[:at], target.redirect_prefix, rest)
            break
    return b"\r\n".join(lines)


def give_back(conn: UpstreamConnection, ex: Exchange) -> None:
    """After the handler is done with `ex`: its connection back to the pool (with the
    exchange and its parser for the next request), or closed."""
    if ex.reusable and not conn.closed:
        conn.spare = ex if ex.parser is not None else None
        conn.target.release(conn)
    else:
        conn.close()


class Target:
    """One upstream server: its kept-alive connections and its health."""

    __slots__ = ("cfg", "host", "port", "ssl", "server_hostname", "authority", "weight",
                 "idle", "open", "active", "max_idle", "max_connections", "fails",
                 "fail_since", "down_until", "healthy", "current", "max_fails", "fail_timeout",
                 "name", "conns", "private", "compress", "requests", "errors", "retries",
                 "checked", "check_ok", "drained", "origins", "redirect_prefix")

    def __init__(self, cfg, opts, ssl_context, private: bool = False) -> None:
        self.cfg = cfg
        self.private = private        # a protected site's: see `_PRIVATE_HEADS`
        self.compress = opts.compress     # a route with `compress = true`
        self.name = cfg.url
        self.host = cfg.host
        self.port = cfg.port
        self.ssl = ssl_context
        self.server_hostname = (opts.server_name or cfg.host) if ssl_context else None
        self.authority = cfg.authority
        # How the upstream may name itself in a redirect (`_redirected`): its URL with
        # and without the default port, in lower case; and what stands for it.
        host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
        self.origins = tuple(dict.fromkeys(
            (f"{cfg.scheme}://{cfg.authority.decode()}".lower().encode(),
             f"{cfg.scheme}://{host}:{cfg.port}".lower().encode())))
        self.redirect_prefix = b""    # the route's prefix, when it is stripped
        self.weight = cfg.weight
        self.idle: list[UpstreamConnection] = []
        self.open = 0                 # connections, idle or in use
        self.conns: set[UpstreamConnection] = set()     # the same, for the timeout watch
        self.active = 0               # exchanges in flight (least_conn)
        self.max_idle = opts.max_idle
        self.max_connections = opts.max_connections
        self.max_fails = opts.max_fails
        self.fail_timeout = opts.fail_timeout
        self.fails = 0
        self.fail_since = 0.0
        self.down_until = 0.0
        # `healthy` is what picking reads: the active check passes (`check_ok`) and the
        # operator has not drained the target by hand (`drained`, the admin API).
        self.healthy = True
        self.check_ok = True
        self.drained = False
        self.current = 0              # smooth weighted round-robin state
        # Figures for the admin process (published with the worker's tally).
        self.requests = 0             # exchanges begun
        self.errors = 0               # failures counted by passive health
        self.retries = 0              # attempts that came here after another failed
        self.checked = 0.0            # wall clock of the last active health check

    # ------------------------------------------------------ pool
    def idle_connection(self) -> UpstreamConnection | None:
        """A pooled connection to send a request on (`UpstreamConnection.unasked`)."""
        idle = self.idle
        while idle:
            conn = idle.pop()
            if not conn.closed and not conn.unasked():
                conn.reused = True
                return conn
        return None

    def full(self) -> bool:
        return bool(self.max_connections) and self.open >= self.max_connections

    async def connect(self, timeout: float) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        self.open += 1
        try:
            _transport, conn = await asyncio.wait_for(loop.create_connection(
                lambda: UpstreamConnection(self), self.host, self.port, ssl=self.ssl,
                server_hostname=self.server_hostname), timeout)
        except BaseException:
            self.open -= 1
            raise
        return conn

    def release(self, conn: UpstreamConnection) -> None:
        if len(self.idle) < self.max_idle:
            conn.idle_since = CLOCK.now
            self.idle.append(conn)
        else:
            conn.close()

    def forget(self, conn: UpstreamConnection) -> None:
        self.open -= 1
        self.conns.discard(conn)

    def close_idle(self, older_than: float) -> None:
        keep = []
        for conn in self.idle:
            if conn.closed:
                continue
            if conn.idle_since < older_than:
                conn.close()
            else:
                keep.append(conn)
        self.idle = keep

    def checked_now(self, ok: bool) -> None:
        self.check_ok = ok
        self.healthy = ok and not self.drained
        self.checked = time.time()

    def drain(self, drained: bool) -> None:
        """Taken out of (or put back into) picking by hand: requests under way finish."""
        self.drained = drained
        self.healthy = self.check_ok and not drained

    # ------------------------------------------------------ passive health
    def available(self, now: float) -> bool:
        return self.healthy and now >= self.down_until

    def failed(self, now: float) -> None:
        self.errors += 1
        if now - self.fail_since > self.fail_timeout:
            self.fail_since, self.fails = now, 0
        self.fails += 1
        if self.max_fails and self.fails >= self.max_fails:
            self.down_until = now + self.fail_timeout
            self.fails = 0

    def succeeded(self) -> None:
        if self.fails:
            self.fails = 0
