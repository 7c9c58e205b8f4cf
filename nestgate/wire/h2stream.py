"""The HTTP/2 stream adapter: `H2Request`, the protocol-neutral `request.Request` whose
answer goes out as HEADERS and DATA frames on one stream, and `_StreamFlow`, what a
request `Body` needs from its stream (flow control: body data is acknowledged as the
handler consumes it). The header blocks of answers are encoded once and kept: a
ready answer's (`h2_block`), a proxied head's (`_RAW_BLOCKS`) and the Date field, once
a second (`date_field`). The frames themselves are the connection's to send
(`nestgate.wire.h2send`).
"""

from __future__ import annotations

from nestgate.base.clock import CLOCK
from nestgate.base.errors import HandlerError
from nestgate.wire.fieldhead import pairs_of, ready_fields, response_fields
from nestgate.wire.h2engine import INTERNAL_ERROR, encode_field, encode_fields
from nestgate.pipeline.dispatch import run
from nestgate.pipeline.request import Request
from nestgate.base.responses import SERVER, alt_svc_value


def h2_block(response) -> bytes:
    """The header block of a `Prebuilt` without its Date, encoded once and kept."""
    block = response.h2_cache
    if block is not None:
        return block
    block = response.h2_cache = encode_fields(ready_fields(response))
    return block


class _DateField:
    """The Date field as HPACK bytes, encoded again only when the clock's date moves;
    on a listener that also serves HTTP/3, its Alt-Svc field follows (`extra`), so the
    answers there carry it at no cost of their own."""

    __slots__ = ("date", "field", "extra")

    def __init__(self, extra: bytes = b"") -> None:
        self.date = None
        self.field = b""
        self.extra = extra

    def current(self) -> bytes:
        date = CLOCK.date
        if date is not self.date:
            self.date, self.field = date, encode_field(b"date", date) + self.extra
        return self.field


DATE_FIELD = _DateField()


def date_field(ctx) -> _DateField:
    """The Date field of the answers on `ctx`'s listener (see _DateField)."""
    if not ctx.alt_svc:
        return DATE_FIELD
    value = alt_svc_value()
    found = _ALT_SVC_DATES.get(value)
    if found is None:
        found = _ALT_SVC_DATES[value] = _DateField(encode_field(b"alt-svc", value))
    return found


_ALT_SVC_DATES: dict[bytes, _DateField] = {}

# (status, header lines, length, Server) -> the encoded fields of a proxied head (`start_raw`),
# cleared when full rather than grown by an upstream that varies its headers; only heads
# of up to _RAW_BLOCK_MAX bytes, so it holds about 1 MB at most.
_RAW_BLOCKS: dict[tuple, bytes] = {}
_RAW_BLOCKS_LIMIT = 256
_RAW_BLOCK_MAX = 2048

class _StreamFlow:
    """What `Body` needs from its connection, for one stream."""

    __slots__ = ("conn", "stream_id", "paused", "unacked", "loop", "_active",
                 "ended", "seen", "stalled")

    def __init__(self, conn, stream_id: int) -> None:
        self.conn = conn
        self.stream_id = stream_id
        self.loop = conn.loop
        self.paused = False
        self.unacked = 0
        self.ended = False         # the client sent the whole body
        self.seen = 0              # body bytes received at the last tick
        self.stalled = 0.0         # seconds since the body last grew (tick's view)

    def pause_reading_for_body(self) -> None:
        self.paused = True

    def resume_reading_for_body(self) -> None:
        if self.paused:
            self.paused = False
            if self.unacked:
                self.conn.acknowledge(self.stream_id, self.unacked)
                self.unacked = 0

    def send_continue(self) -> None:
        pass                   # HTTP/2 clients do not wait for 100 on their own


class H2Request(Request):
    """A Request whose answer goes out as HEADERS and DATA frames on one stream."""

    __slots__ = ("stream_id", "flow", "granted")

    protocol = "HTTP/2"
    answers_from_callbacks = True

    def answered(self, status: int = 0) -> None:
        """For a handler whose `begin` took the stream: it is answered, or failed with
        `status` (the error page if nothing was sent, else RST_STREAM)."""
        self.cancel = None
        self.connection.conclude(self, status)

    def answer_in_task(self) -> None:
        """For a handler whose `begin` took the stream but cannot answer it from
        callbacks after all (nothing was sent): `handle` answers it in a task."""
        self.cancel = None
        conn = self.connection
        if conn._streams.get(self.stream_id) is self:
            self.task = conn.loop.create_task(run(self))

    def start(self, status: int, headers, content_length: int | None = None) -> None:
        pairs = [(n.encode("latin-1") if isinstance(n, str) else n,
                  v.encode("latin-1") if isinstance(v, str) else v) for n, v in headers]
        self._start_pairs(status, pairs, content_length)

    def start_raw(self, status: int, block: bytes, content_length: int | None = None) -> None:
        self._send_head(status, self._raw_block(status, block, content_length))

    def answer_now(self, status: int, block: bytes, content_length: int | None,
                   body: bytes) -> bool:
        # The usual proxied answer: its HEADERS and DATA by one engine call.
        conn = self.connection
        if self.head_only or not body or self.started or conn.write_paused:
            return Request.answer_now(self, status, block, content_length, body)
        self.started = True
        self.status = status
        if not conn.h2.send_answer(self.stream_id,
                                   self._raw_block(status, block, content_length), body):
            conn._flush_soon()           # the HEADERS alone: the window is too small
            return False
        self.sent += len(body)
        self.finished = True
        conn._guard.data_sent += 1
        conn._flush_soon(len(body))
        if self.granted:
            conn.release(self, len(body))
        return True

    def _raw_block(self, status: int, block: bytes, content_length: int | None) -> bytes:
        """A proxied response's head as HPACK, its Date included. The same few heads
        come back from an upstream again and again, so each is encoded once (without
        its Date) and kept."""
        kept = len(block) <= _RAW_BLOCK_MAX
        key = (status, block, content_length, SERVER.value)
        encoded = _RAW_BLOCKS.get(key) if kept else None
        if encoded is None:
            encoded = encode_fields(response_fields(status, pairs_of(block), content_length))
            if kept:
                if len(_RAW_BLOCKS) >= _RAW_BLOCKS_LIMIT:
                    _RAW_BLOCKS.clear()
                _RAW_BLOCKS[key] = encoded
        return encoded + self.connection.date_field.current()

    def _start_pairs(self, status, pairs, content_length) -> None:
        self._send_head(status, encode_fields(response_fields(status, pairs, content_length))
                        + self.connection.date_field.current())

    def _send_head(self, status: int, block: bytes) -> None:
        if self.started:
            raise RuntimeError("response already started")
        self.started = True
        self.status = status
        self.connection.send_block(self.stream_id, block, end_stream=self.head_only)
        if self.head_only:
            self.finished = True

    async def write(self, data: bytes) -> None:
        if not self.started:
            raise RuntimeError("write before start")
        if self.head_only or not data:
            return
        self.sent += len(data)
        conn = self.connection
        if self.stream_id in conn.outboxes:          # behind pushed data: keep the order
            conn.queue_data(self.stream_id, data)
            await conn.wait_sent(self.stream_id)
        else:
            await conn.send_data(self.stream_id, data)
        if self.granted:
            conn.release(self, len(data))

    async def room(self, wanted: int) -> int:
        # Nothing is read ahead of the client's window (beyond ROOM_MIN) nor past the
        # connection's OUTPUT_BUDGET: a client that grants no window holds no data.
        granted = await self.connection.room(self.stream_id, wanted)
        self.granted += granted
        return granted

    def room_now(self, wanted: int) -> int:
        granted = self.connection.grant(self.stream_id, wanted)
        self.granted += granted
        return granted

    def write_now(self, data: bytes, last: bool = False) -> bool:
        # One DATA frame, when nothing of the stream is queued and its window takes it;
        # `last` puts END_STREAM on it rather than on an empty frame after it.
        if self.head_only or not data:
            return not last
        conn = self.connection
        if not conn.send_now(self.stream_id, data, last):
            return False
        self.sent += len(data)
        if last:
            self.finished = True
        if self.granted:
            conn.release(self, len(data))
        return True

    def push(self, data: bytes) -> bool:
        # Frames need the client's window: queue them (in order) and tell the caller
        # to wait with `connection.wait_writable()`.
        if self.head_only or not data:
            return False
        self.sent += len(data)
        self.connection.queue_data(self.stream_id, data)
        return True

    async def send_prebuilt(self, response) -> None:
        self.started = True
        self.status = response.status
        body = b"" if self.head_only else response.body
        conn = self.connection
        conn.send_block(self.stream_id, h2_block(response) + conn.date_field.current(),
                        end_stream=not body)
        if body:
            self.sent += len(body)
            await self.connection.send_data(self.stream_id, body, end=True)
        self.finished = True

    def answer_ready(self, response) -> None:
        """The whole answer from a ready response (an error page), without waiting."""
        conn = self.connection
        if conn.transport.is_closing():
            return
        self.started = self.finished = True
        self.status = response.status
        self.sent = conn.send_ready(self.stream_id, response, self.head_only)
        conn._flush_soon()

    def cut(self) -> None:
        self.connection._reset(self.stream_id, INTERNAL_ERROR)

    def take_over(self, head: bytes) -> bytes:
        raise HandlerError(501, "HTTP/2 has no protocol upgrade")   # RFC 9113 8.6

    def end(self) -> None:
        if self.finished:
            return
        self.finished = True
        self.connection.end_stream(self.stream_id)
