"""HTTP/2 for a server (RFC 9113): bytes in, events and bytes out, no sockets.

Theory of operation
-------------------
`H2Engine` is one connection's state: `receive_data` slices what the client sent into
frames, checks each against the frame rules (section 6) and the stream states (5.1),
keeps both flow-control windows (5.2, 6.9), decodes header blocks with `hpack` and
returns what a server acts on as a list of small events. What it must answer itself
(SETTINGS and PING acknowledgements, RST_STREAM for a stream error, GOAWAY for a
connection error) it queues, with the frames the caller sends (`send_headers`,
`send_block`, `send_data`, ...), until `data_to_send` takes them. The caller
(`nestgate.wire.http2`) owns the socket, the requests and the limits per client.

Why not the h2 library on the request path: its state machine, event objects,
validation and HPACK encoder cost about ten times nginx's CPU for a small answer. Here
the common request costs a frame header unpacked, a header block decoded (or found in
a per-connection cache bounded in bytes, see `_decode`) and one event; a ready answer
is a header block encoded the first time the response is sent over HTTP/2 and kept
with it (`encode_fields`: literal fields without indexing never touch a connection's
HPACK table, so their bytes fit any connection) and two frame headers.

Errors: a connection error (5.4.1) queues GOAWAY with its code and raises
`ConnectionError_`; the engine then ignores whatever else arrives. A stream error
(5.4.2) queues RST_STREAM and returns a `StreamReset` event with `remote=False`, so
the caller drops the stream's work; the connection goes on. Whatever is sent on a
stream that is no longer open raises `StreamClosedError`.
"""

from __future__ import annotations

import struct

import hpack
from hpack.table import HeaderTable

# Error codes (RFC 9113 section 7).
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL = 0x5, 0x6, 0x7, 0x8
COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x9, 0xB

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS = 0x0, 0x1, 0x2, 0x3, 0x4
PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0x5, 0x6, 0x7, 0x8, 0x9
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
# SETTINGS parameters (6.5.2).
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS = 0x1, 0x2, 0x3
INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = 0x4, 0x5, 0x6

DEFAULT_WINDOW = 65535
DEFAULT_FRAME_SIZE = 16384
MAX_WINDOW = (1 << 31) - 1
_HEAD = struct.Struct(">IBI")        # length << 8 | type, flags, stream id (9 bytes)
_PACK_HEAD = _HEAD.pack
_UINT32 = struct.Struct(">I")
_SETTING = struct.Struct(">HI")
_GOAWAY = struct.Struct(">II")
# Streams we reset remembered, so that frames the client sent before it saw the
# RST_STREAM are dropped quietly (5.1, "closed") rather than taken as errors.
_RESET_MEMORY = 128
_DECODED_MEMORY = 64             # header blocks remembered per connection (`_decode`)
# ... and the bytes they may take, per connection (a worker's connections together are
# bounded by their shared `DecodedBudget`). Kept for a connection's life, 64 blocks of
# up to max_header_bytes made about 3.9 MB per idle connection; a browser's request
# costs about 3 KB here, a load tool's a few hundred bytes.
DECODED_CONNECTION_BYTES = 64 * 1024
# What one kept field and one kept block cost besides their bytes (CPython: two bytes
# objects and a tuple per field; a dict slot, the key and a list per block), roughly.
_FIELD_OVERHEAD = 130
_BLOCK_OVERHEAD = 200
# Runs of stream ids a client skipped, remembered (the latest) to tell a stream opened
# out of order from a closed one; clients open consecutive ids, so this stays empty.
_SKIPPED_MEMORY = 16
# Fields that are illegal in HTTP/2 because they belong to one connection (RFC 9113
# 8.2.2): a request carrying one is malformed.
CONNECTION_SPECIFIC = frozenset((b"connection", b"keep-alive", b"proxy-connection",
                                 b"transfer-encoding", b"upgrade"))
# Trailers are not forwarded, but a field that frames, routes or is specific to the
# connection has no meaning there (RFC 9110 6.5.1) and makes the request malformed, as
# a pseudo-field does (RFC 9113 8.1).
_TRAILER_REFUSED = CONNECTION_SPECIFIC | {b"content-length", b"host", b"te"}
# A content-length longer than this many digits is refused as malformed rather than
# read (no body that long is taken, and 18 digits always fit the int64 peers use).
_LENGTH_DIGITS = 18


class ConnectionError_(Exception):
    """A connection error: GOAWAY with `code` is queued, nothing more will be read."""

    def __init__(self, code: int, why: str) -> None:
        super().__init__(why)
        self.code = code


class StreamClosedError(ConnectionResetError):
    """A frame sent on a stream that is closed (or was never opened): for whoever was
    answering on it, the client's stream went away, as a connection reset would."""


# -------------------------------------------------------------------- events
class RequestReceived:
    """A request's header block. `ended`: no body follows (END_STREAM was set).
    `length`: the body's length as its one content-length field declares it, which
    its DATA frames are held to (-1: no such field, the body ends with the stream)."""
    __slots__ = ("stream_id", "headers", "ended", "length")

    def __init__(self, stream_id: int, headers: list, ended: bool, length: int = -1) -> None:
        self.stream_id, self.headers, self.ended = stream_id, headers, ended
        self.length = length


class DataReceived:
    """Request body bytes; `flow_length` (the frames' whole length, padding too) is
    what `acknowledge` must be told once the bytes are consumed. The DATA frames of
    one stream that follow each other in one read are one event: whoever handles it
    pays per read, not per frame (a body in 1-byte frames would cost it microseconds
    a byte)."""
    __slots__ = ("stream_id", "data", "flow_length", "pieces")

    def __init__(self, stream_id: int, data: bytes, flow_length: int) -> None:
        self.stream_id, self.data, self.flow_length = stream_id, data, flow_length
        self.pieces: list | None = None      # the frames' data while the read is parsed


class StreamEnded:
    """The client's half of the stream is done (after its body, or trailers)."""
    __slots__ = ("stream_id",)

    def __init__(self, stream_id: int) -> None:
        self.stream_id = stream_id


class StreamReset:
    """The stream is gone: reset by the client (`remote`) or by us for a stream error."""
    __slots__ = ("stream_id", "code", "remote")

    def __init__(self, stream_id: int, code: int, remote: bool) -> None:
        self.stream_id, self.code, self.remote = stream_id, code, remote


class WindowUpdated:
    """The client opened a window: of one stream, or of all (`stream_id` 0)."""
    __slots__ = ("stream_id",)

    def __init__(self, stream_id: int) -> None:
        self.stream_id = stream_id


class PingAcknowledged:
    """The client acknowledged a PING we sent (`H2Engine.ping`)."""
    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


class ConnectionTerminated:
    """The client sent GOAWAY."""
    __slots__ = ("code", "last_stream_id")

    def __init__(self, code: int, last_stream_id: int) -> None:
        self.code, self.last_stream_id = code, last_stream_id


# -------------------------------------------------------------------- encoding
def _integer(value: int, prefix_bits: int, first: int) -> bytes:
    """An HPACK integer (RFC 7541 5.1) with `first`'s high bits before the prefix."""
    top = (1 << prefix_bits) - 1
    if value < top:
        return bytes((first | value,))
    out = bytearray((first | top,))
    value -= top
    while value >= 0x80:
        out.append(0x80 | (value & 0x7F))
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(value: bytes) -> bytes:
    return _integer(len(value), 7, 0) + value          # not Huffman-coded


_STATIC = HeaderTable.STATIC_TABLE
_STATIC_FIELD = {field: i + 1 for i, field in reversed(list(enumerate(_STATIC)))}
_STATIC_NAME = {name: i + 1 for i, (name, _) in reversed(list(enumerate(_STATIC)))}
# The representation of a field name without its value, per name seen (bounded by
# the names nestgate and its upstreams send; a new one costs a few bytes once).
_NAME_PREFIX: dict[bytes, bytes] = {}


def encode_field(name: bytes, value: bytes) -> bytes:
    """One field as HPACK: the static table's entry if it holds the whole field, else
    a literal without indexing (RFC 7541 6.2.2), with the static table's name where it
    has one. No representation here adds to a dynamic table, so the bytes mean the
    same on every connection and can be encoded once and reused."""
    index = _STATIC_FIELD.get((name, value))
    if index is not None:
        return bytes((0x80 | index,))
    prefix = _NAME_PREFIX.get(name)
    if prefix is None:
        index = _STATIC_NAME.get(name)
        prefix = _integer(index, 4, 0) if index else b"\x00" + _string(name)
        if len(_NAME_PREFIX) < 4096:
            _NAME_PREFIX[name] = prefix
    return prefix + _string(value)


def encode_fields(fields) -> bytes:
    """A header block for `fields` ((name, value) bytes pairs, names lower-case)."""
    return b"".join([encode_field(name, value) for name, value in fields])


class DecodedBudget:
    """The bytes of decoded header blocks that all the HTTP/2 connections of a worker
    may keep together (see `H2Engine._decode`): each connection takes from it what
    it keeps and gives it back when it forgets them (its table changed, or it closed)."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, size: int) -> bool:
        if self.used + size > self.limit:
            return False
        self.used += size
        return True

    def give_back(self, size: int) -> None:
        self.used -= size


class _WatchedTable(HeaderTable):
    """An HPACK dynamic table that counts its changes (entries added, size changed)."""

    def __init__(self) -> None:
        super().__init__()
        self.changes = 0

    def add(self, name: bytes, value: bytes) -> None:
        self.changes += 1
        super().add(name, value)

    @HeaderTable.maxsize.setter
    def maxsize(self, newmax: int) -> None:
        self.changes += 1
        HeaderTable.maxsize.fset(self, newmax)


# -------------------------------------------------------------------- streams
class Stream:
    """What the engine keeps of one open stream."""
    __slots__ = ("sid", "reading", "writing", "send_window", "recv_window", "unacked",
                 "length", "received")

    def __init__(self, sid: int, send_window: int, ended: bool) -> None:
        self.sid = sid
        self.reading = not ended       # the client may send more (5.1 "open")
        self.writing = True            # we may send more
        self.send_window = send_window
        self.recv_window = DEFAULT_WINDOW
        self.unacked = 0               # bytes consumed, not yet given back by WINDOW_UPDATE
        self.length = -1               # content-length declared, -1 none
        self.received = 0              # body bytes received (padding not counted)


class H2Engine:
    """One server-side HTTP/2 connection's protocol state (see the module doc)."""

    def __init__(self, max_concurrent_streams: int, max_header_list_size: int,
                 decoded_list_limit: int, decoded_budget: DecodedBudget) -> None:
        self.max_concurrent_streams = max_concurrent_streams
        self.max_header_list_size = max_header_list_size
        self.streams: dict[int, Stream] = {}
        self._highest = -1                  # the highest stream the client opened
        self.closed = False                 # GOAWAY of a connection error, or ours final
        self.max_outbound_frame_size = DEFAULT_FRAME_SIZE
        self.send_window = DEFAULT_WINDOW   # the connection's window for what we send
        self.recv_window = DEFAULT_WINDOW   # ... and for what the client sends
        self._unacked = 0                   # connection bytes consumed, not yet reopened
        self._initial_send_window = DEFAULT_WINDOW
        self._out: list[bytes] = []
        self._joined: list[DataReceived] = []   # events of several frames, this read
        self._buffer = b""
        self._preface = True                # the client's preface is still expected
        self._settings_first = True         # then a SETTINGS frame (3.4)
        self._block: list[bytes] | None = None   # a header block under way
        self._block_stream = 0
        self._block_ended = False
        self._block_self_dependent = False   # its PRIORITY names the stream itself
        self.header_blocks = 0              # header blocks left open by their HEADERS
        self.peer_goaway = False            # the client sent GOAWAY
        self._block_size = 0
        self._reset_by_us: dict[int, None] = {}
        self._skipped: list[tuple[int, int]] = []   # (low, high): the ids between
        # The decoded list may run past what we advertised (a request over it gets 431
        # from the caller, with the connection intact) up to `decoded_list_limit`;
        # past that the block is a bomb and the connection ends (COMPRESSION_ERROR).
        self._decoder = hpack.Decoder(decoded_list_limit)
        self._table = self._decoder.header_table = _WatchedTable()
        self._decoded: dict[bytes, list] = {}
        self._decoded_bytes = 0             # what `_decoded` costs, taken from ...
        self._decoded_budget = decoded_budget   # ... the worker's budget

    # ---------------------------------------------------------------- out
    def initiate_connection(self) -> None:
        """Our SETTINGS, the first frame the server sends (3.4)."""
        payload = _SETTING.pack(MAX_CONCURRENT_STREAMS, self.max_concurrent_streams) + \
            _SETTING.pack(MAX_HEADER_LIST_SIZE, self.max_header_list_size) + \
            _SETTING.pack(ENABLE_PUSH, 0)
        self._out.append(_PACK_HEAD(len(payload) << 8 | SETTINGS, 0, 0) + payload)

    def data_to_send(self) -> bytes:
        out = self._out
        if not out:
            return b""
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        return data

    def _writable(self, stream_id: int) -> Stream:
        stream = self.streams.get(stream_id)
        if stream is None or not stream.writing or self.closed:
            raise StreamClosedError(f"stream {stream_id} is closed")
        return stream

    def send_headers(self, stream_id: int, headers, end_stream: bool = False) -> None:
        self.send_block(stream_id, encode_fields(headers), end_stream)

    def send_block(self, stream_id: int, block: bytes, end_stream: bool = False) -> None:
        """A header block already encoded (by `encode_fields`): HEADERS, and
        CONTINUATION frames where the client's frame size needs them."""
        stream = self._writable(stream_id)
        flags = END_STREAM if end_stream else 0
        limit = self.max_outbound_frame_size
        out = self._out
        if len(block) <= limit:
            out.append(_PACK_HEAD(len(block) << 8 | HEADERS, flags | END_HEADERS, stream_id))
            out.append(block)
        else:
            kind = HEADERS
            for start in range(0, len(block), limit):
                piece = block[start:start + limit]
                last = start + limit >= len(block)
                out.append(_PACK_HEAD(len(piece) << 8 | kind,
                                      flags | (END_HEADERS if last else 0), stream_id))
                out.append(piece)
                kind, flags = CONTINUATION, 0
        if end_stream:
            self._close_writing(stream)

    def send_answer(self, stream_id: int, block: bytes, body: bytes) -> bool:
        """A whole answer at once: its header block (by `encode_fields`) as HEADERS and
        its body as one DATA frame ending the stream (none when the body is empty).
        False when the body is more than the client's windows or frame size take now:
        then only the HEADERS went, and the body is the caller's to send."""
        stream = self._writable(stream_id)
        size = len(body)
        limit = self.max_outbound_frame_size
        if size and (size > limit or size > stream.send_window or size > self.send_window):
            self.send_block(stream_id, block)
            return False
        if len(block) > limit:                    # HEADERS and CONTINUATION frames
            self.send_block(stream_id, block, not size)
            if size:
                self.send_data(stream_id, body, True)
            return True
        if size:
            stream.send_window -= size
            self.send_window -= size
            self._out += (_PACK_HEAD(len(block) << 8 | HEADERS, END_HEADERS, stream_id),
                          block, _PACK_HEAD(size << 8 | DATA, END_STREAM, stream_id), body)
        else:
            self._out += (_PACK_HEAD(len(block) << 8 | HEADERS, END_STREAM | END_HEADERS,
                                     stream_id), block)
        stream.writing = False
        if not stream.reading:
            del self.streams[stream_id]
        return True

    def can_send(self, stream_id: int) -> bool:
        """Whether the stream is open for what we send (HEADERS, DATA, RST_STREAM)."""
        stream = self.streams.get(stream_id)
        return stream is not None and stream.writing and not self.closed

    def local_flow_control_window(self, stream_id: int) -> int:
        """How many body bytes the client lets us send on the stream now."""
        stream = self.streams.get(stream_id)
        if stream is None or not stream.writing:
            raise StreamClosedError(f"stream {stream_id} is closed")
        return min(stream.send_window, self.send_window)

    def send_data(self, stream_id: int, data: bytes, end_stream: bool = False) -> None:
        """One DATA frame; `data` must fit the window and the client's frame size."""
        stream = self._writable(stream_id)
        size = len(data)
        if size > stream.send_window or size > self.send_window or \
                size > self.max_outbound_frame_size:
            raise ValueError("DATA past the client's window or frame size")
        stream.send_window -= size
        self.send_window -= size
        self._out.append(_PACK_HEAD(size << 8 | DATA, END_STREAM if end_stream else 0,
                                    stream_id))
        if size:
            self._out.append(data)
        if end_stream:
            self._close_writing(stream)

    def end_stream(self, stream_id: int) -> None:
        self.send_data(stream_id, b"", True)

    def reset_stream(self, stream_id: int, code: int) -> None:
        if self.streams.pop(stream_id, None) is None:
            raise StreamClosedError(f"stream {stream_id} is closed")
        self._send_reset(stream_id, code)

    def _send_reset(self, stream_id: int, code: int) -> None:
        self._out.append(_PACK_HEAD(4 << 8 | RST_STREAM, 0, stream_id) + _UINT32.pack(code))
        reset = self._reset_by_us
        reset[stream_id] = None
        if len(reset) > _RESET_MEMORY:
            del reset[next(iter(reset))]

    def _close_writing(self, stream: Stream) -> None:
        stream.writing = False
        if not stream.reading:
            del self.streams[stream.sid]

    def acknowledge_received_data(self, length: int, stream_id: int) -> None:
        """`length` bytes of the stream's DATA are consumed: reopen the windows (in
        steps of half a window, as most servers do, to send fewer WINDOW_UPDATEs)."""
        if not length or self.closed:
            return
        self._unacked += length
        if self._unacked >= DEFAULT_WINDOW // 2:
            self._out.append(_PACK_HEAD(4 << 8 | WINDOW_UPDATE, 0, 0) +
                             _UINT32.pack(self._unacked))
            self.recv_window += self._unacked
            self._unacked = 0
        stream = self.streams.get(stream_id)
        if stream is None or not stream.reading:
            return
        stream.unacked += length
        if stream.unacked >= DEFAULT_WINDOW // 2:
            self._out.append(_PACK_HEAD(4 << 8 | WINDOW_UPDATE, 0, stream_id) +
                             _UINT32.pack(stream.unacked))
            stream.recv_window += stream.unacked
            stream.unacked = 0

    def ping(self, data: bytes) -> None:
        """A PING (8 bytes of `data`); its ACK comes back as PingAcknowledged."""
        self._out.append(_PACK_HEAD(8 << 8 | PING, 0, 0) + data)

    def goaway(self, last_stream_id: int, code: int = NO_ERROR) -> None:
        """GOAWAY naming the last stream we will answer (6.8). Streams up to it go on;
        the caller refuses newer ones. More than one may be sent, each lower."""
        self._out.append(_PACK_HEAD(8 << 8 | GOAWAY, 0, 0) +
                         _GOAWAY.pack(last_stream_id, code))

    def close_connection(self, code: int = NO_ERROR, last_stream_id: int | None = None) -> None:
        """The final GOAWAY: nothing more is read or sent after it."""
        if self.closed:
            return
        self.goaway(self.highest_inbound_stream_id if last_stream_id is None
                    else last_stream_id, code)
        self.closed = True

    @property
    def highest_inbound_stream_id(self) -> int:
        """The highest stream the client opened, 0 before any (for GOAWAY, 6.8)."""
        return self._highest if self._highest > 0 else 0

    @property
    def open_streams(self) -> int:
        return len(self.streams)

    @property
    def awaiting_headers(self) -> bool:
        """The client's preface and SETTINGS, or the rest of a header block, are due."""
        return self._settings_first or self._block is not None

    # ---------------------------------------------------------------- in
    def receive_data(self, data: bytes) -> list:
        """The events of `data`; raises ConnectionError_ on a connection error."""
        if self.closed:
            return []
        if self._buffer:
            data = self._buffer + data
            self._buffer = b""
        events: list = []
        self._joined.clear()          # (left by a read that ended in a connection error)
        pos, end = 0, len(data)
        if self._preface:
            if end < len(PREFACE):
                if not PREFACE.startswith(data):
                    self._fail(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                self._buffer = data
                return events
            if not data.startswith(PREFACE):
                self._fail(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
            self._preface = False
            pos = len(PREFACE)
        unpack = _HEAD.unpack_from
        while end - pos >= 9:
            head, flags, stream_id = unpack(data, pos)
            length = head >> 8
            if end - pos - 9 < length:
                if length > DEFAULT_FRAME_SIZE:
                    self._fail(FRAME_SIZE_ERROR, "frame larger than SETTINGS_MAX_FRAME_SIZE")
                break
            kind = head & 0xFF
            payload = data[pos + 9:pos + 9 + length]
            pos += 9 + length
            stream_id &= 0x7FFFFFFF
            if length > DEFAULT_FRAME_SIZE:
                self._fail(FRAME_SIZE_ERROR, "frame larger than SETTINGS_MAX_FRAME_SIZE")
            if self._settings_first:
                if kind != SETTINGS or flags & ACK:
                    self._fail(PROTOCOL_ERROR, "the preface is not followed by SETTINGS")
                self._settings_first = False
            if self._block is not None and (kind != CONTINUATION or
                                            stream_id != self._block_stream):
                self._fail(PROTOCOL_ERROR, "header block interrupted")       # 6.10
            if kind == DATA:
                if flags & (PADDED | END_STREAM):
                    self._data(stream_id, flags, payload, events)
                else:
                    pos = self._data_run(data, pos, end, stream_id, payload, events)
            elif kind == HEADERS:
                self._headers(stream_id, flags, payload, events)
            elif kind == CONTINUATION:
                self._continuation(stream_id, flags, payload, events)
            elif kind == WINDOW_UPDATE:
                self._window_update(stream_id, payload, events)
            elif kind == RST_STREAM:
                self._rst_stream(stream_id, payload, events)
            elif kind == SETTINGS:
                self._settings(stream_id, flags, payload, events)
            elif kind == PING:
                if stream_id:
                    self._fail(PROTOCOL_ERROR, "PING on a stream")
                if length != 8:
                    self._fail(FRAME_SIZE_ERROR, "PING of other than 8 bytes")
                if not flags & ACK:
                    self._out.append(_PACK_HEAD(8 << 8 | PING, ACK, 0) + payload)
                else:
                    events.append(PingAcknowledged(bytes(payload)))
            elif kind == PRIORITY:
                self._priority(stream_id, payload, events)
            elif kind == GOAWAY:
                if stream_id:
                    self._fail(PROTOCOL_ERROR, "GOAWAY on a stream")
                if length < 8:
                    self._fail(FRAME_SIZE_ERROR, "GOAWAY shorter than 8 bytes")
                last, code = _GOAWAY.unpack_from(payload)
                # The client opens no more streams; those it opened still get their
                # answers (its last_stream_id is about streams we would push).
                self.peer_goaway = True
                events.append(ConnectionTerminated(code, last & 0x7FFFFFFF))
            elif kind == PUSH_PROMISE:
                self._fail(PROTOCOL_ERROR, "PUSH_PROMISE from a client")      # 8.4
            # Frames of unknown types are ignored (5.5).
        if pos < end:
            self._buffer = data[pos:]
        if self._joined:
            for event in self._joined:
                event.data = b"".join(event.pieces)
                event.pieces = None
            self._joined.clear()
        return events

    def _fail(self, code: int, why: str):
        """A connection error: the final GOAWAY, then stop."""
        self.close_connection(code)
        raise ConnectionError_(code, why)

    def _stream_error(self, stream_id: int, code: int, events: list) -> None:
        self.streams.pop(stream_id, None)
        self._send_reset(stream_id, code)
        events.append(StreamReset(stream_id, code, False))

    def _unpad(self, flags: int, payload: bytes) -> bytes:
        if flags & PADDED:
            if not payload:
                self._fail(FRAME_SIZE_ERROR, "padded frame without a pad length")
            pad = payload[0]
            if pad >= len(payload):
                self._fail(PROTOCOL_ERROR, "padding as long as the frame")    # 6.1
            return payload[1:len(payload) - pad]
        return payload

    def _headers(self, stream_id: int, flags: int, payload: bytes, events: list) -> None:
        if not stream_id:
            self._fail(PROTOCOL_ERROR, "HEADERS on stream 0")
        block = self._unpad(flags, payload)
        self._block_self_dependent = False
        if flags & PRIORITY_FLAG:
            if len(block) < 5:
                self._fail(FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            # A stream error once the block is decoded (5.3.1).
            self._block_self_dependent = \
                _UINT32.unpack_from(block)[0] & 0x7FFFFFFF == stream_id
            block = block[5:]
        self._block_ended = bool(flags & END_STREAM)
        if flags & END_HEADERS:
            self._header_block(stream_id, block, events)
        else:
            self._block = [block]
            self._block_size = len(block)
            self._block_stream = stream_id
            self.header_blocks += 1

    def _continuation(self, stream_id: int, flags: int, payload: bytes, events: list) -> None:
        if self._block is None:
            self._fail(PROTOCOL_ERROR, "CONTINUATION without a header block")
        self._block.append(payload)
        self._block_size += len(payload)
        if self._block_size > 2 * self._decoder.max_header_list_size:
            # FrameGuard in front bounds a block by max_header_bytes; this keeps the
            # engine bounded on its own.
            self._fail(ENHANCE_YOUR_CALM, "header block too large")
        if flags & END_HEADERS:
            block = b"".join(self._block)
            self._block = None
            self._header_block(stream_id, block, events)

    def _decode(self, block: bytes) -> list:
        """The field list of a header block. Clients repeat requests whose blocks
        only refer to the tables or carry literals they do not index; such a block
        changes no table, so as long as no other block has changed the dynamic table
        since, it decodes to what it did last time (and is not decoded again)."""
        cached = self._decoded.get(block)
        if cached is not None:
            return cached
        changes = self._table.changes
        try:
            headers = self._decoder.decode(block, raw=True)
        except hpack.HPACKDecodingError as exc:
            self._fail(COMPRESSION_ERROR, f"header block does not decode: {exc}")
        if self._table.changes != changes:
            self.forget_decoded()           # what the others decode to may differ now
        elif len(self._decoded) < _DECODED_MEMORY:
            cost = len(block) + _BLOCK_OVERHEAD
            for name, value in headers:
                cost += len(name) + len(value) + _FIELD_OVERHEAD
            if self._decoded_bytes + cost <= DECODED_CONNECTION_BYTES and \
                    self._decoded_budget.take(cost):
                self._decoded[block] = headers
                self._decoded_bytes += cost
        return headers

    def forget_decoded(self) -> None:
        """Drop the decoded blocks kept (the caller does so when the connection ends,
        to give their bytes back to the worker's budget)."""
        self._decoded.clear()
        self._decoded_budget.give_back(self._decoded_bytes)
        self._decoded_bytes = 0

    def _header_block(self, stream_id: int, block: bytes, events: list) -> None:
        # Decoded whatever becomes of the stream: the HPACK table is the connection's.
        headers = self._decode(block)
        ended = self._block_ended
        stream = self.streams.get(stream_id)
        if stream is not None:                                   # trailers
            if not stream.reading:
                self._stream_error(stream_id, STREAM_CLOSED, events)
            elif not ended or any(name[:1] == b":" or name in _TRAILER_REFUSED
                                  for name, _ in headers):
                self._stream_error(stream_id, PROTOCOL_ERROR, events)    # 8.1
            else:
                self._end_of_body(stream, events)
            return
        # Clients open the next odd id (`_highest` is -1 before the first): one test
        # here, the rest is for streams closed, even-numbered or opened out of order.
        if stream_id - self._highest != 2 and self._unexpected_stream(stream_id):
            return                           # sent before the client saw our reset
        self._highest = stream_id
        if self._block_self_dependent:
            self._send_reset(stream_id, PROTOCOL_ERROR)
            return
        length = -1
        if not ended:
            # The body is framed by its DATA frames and held to this length; a proxy
            # frames it upstream by the same number. A second field, even alike, a
            # list, a sign, spaces or digits Python's int() reads but HTTP/1.1 does not
            # ("5_5", "+5") could be read otherwise on one side: malformed (8.1.1).
            for name, value in headers:
                if name == b"content-length":
                    if length >= 0 or not value.isdigit() or len(value) > _LENGTH_DIGITS:
                        self._send_reset(stream_id, PROTOCOL_ERROR)
                        return
                    length = int(value)
        if len(self.streams) >= self.max_concurrent_streams:
            self._send_reset(stream_id, REFUSED_STREAM)           # 5.1.2: this one only
            return
        stream = self.streams[stream_id] = Stream(stream_id, self._initial_send_window, ended)
        stream.length = length
        events.append(RequestReceived(stream_id, headers, ended, length))

    def _unexpected_stream(self, stream_id: int) -> bool:
        """HEADERS opening a stream other than the next odd one. True when the block
        is to be dropped (a stream we reset); an even or closed stream is a
        connection error. Ids a client skipped can no longer be opened (5.1.1): they
        are remembered, so that HEADERS for one later is PROTOCOL_ERROR rather than
        a closed stream's STREAM_CLOSED."""
        if not stream_id & 1:
            self._fail(PROTOCOL_ERROR, "a client opened an even-numbered stream")
        highest = self._highest
        if stream_id <= highest:
            if stream_id in self._reset_by_us:
                return True
            if any(low < stream_id < high for low, high in self._skipped):
                self._fail(PROTOCOL_ERROR, f"stream {stream_id} opened after a higher one")
            self._fail(STREAM_CLOSED, f"HEADERS on closed stream {stream_id}")
        skipped = self._skipped
        skipped.append((highest, stream_id))
        if len(skipped) > _SKIPPED_MEMORY:
            del skipped[0]
        return False

    def _data(self, stream_id: int, flags: int, payload: bytes, events: list) -> None:
        if not stream_id:
            self._fail(PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)
        if size > self.recv_window:
            self._fail(FLOW_CONTROL_ERROR, "DATA past the connection's window")
        self.recv_window -= size
        stream = self.streams.get(stream_id)
        if stream is None or not stream.reading:
            self._unpad(flags, payload)       # a bad frame is a connection error anywhere
            # Counted against the connection's window all the same, and given back.
            self.acknowledge_received_data(size, 0)
            if stream is not None:
                self._stream_error(stream_id, STREAM_CLOSED, events)
            elif stream_id > self._highest:
                self._fail(PROTOCOL_ERROR, f"DATA on idle stream {stream_id}")
            elif stream_id not in self._reset_by_us:
                # Closed by both END_STREAMs or by the client's own reset, so not sent
                # in good faith (6.1, 5.1 "closed"). A connection error, as for HEADERS:
                # a RST_STREAM for each such frame would be an answer without bound.
                self._fail(STREAM_CLOSED, f"DATA on closed stream {stream_id}")
            return
        if size > stream.recv_window:
            self.acknowledge_received_data(size, 0)
            self._stream_error(stream_id, FLOW_CONTROL_ERROR, events)
            return
        stream.recv_window -= size
        data = self._unpad(flags, payload)
        stream.received += len(data)
        if stream.length >= 0 and stream.received > stream.length:
            self.acknowledge_received_data(size, 0)
            self._stream_error(stream_id, PROTOCOL_ERROR, events)   # 8.1.1
            return
        if data or size:
            self._deliver(stream_id, data, size, events)
        if flags & END_STREAM:
            self._end_of_body(stream, events)

    def _data_run(self, data: bytes, pos: int, end: int, stream_id: int, payload: bytes,
                  events: list) -> int:
        """A DATA frame neither padded nor ending its stream (`payload`; the next frame
        begins at `pos`), and the frames like it on the same stream that follow it in
        this read: their windows and counts are settled once, as one event, so a body
        in tiny frames costs little more per frame than its frame header. When any of
        it would break a rule (a window, a declared length, a stream not open), the
        frames go one by one through `_data`, which knows which frame broke which.
        Returns where the run ended."""
        pieces = [payload]
        size = len(payload)
        unpack = _HEAD.unpack_from
        while end - pos >= 9:
            head, flags, sid = unpack(data, pos)
            length = head >> 8
            if head & 0xFF != DATA or flags & (PADDED | END_STREAM) or sid != stream_id \
                    or end - pos - 9 < length or length > DEFAULT_FRAME_SIZE:
                break                  # left to the frame loop
            pos += 9
            pieces.append(data[pos:pos + length])
            pos += length
            size += length
        stream = self.streams.get(stream_id)
        if stream is None or not stream.reading or size > self.recv_window \
                or size > stream.recv_window \
                or 0 <= stream.length < stream.received + size:
            for piece in pieces:
                self._data(stream_id, 0, piece, events)
            return pos
        self.recv_window -= size
        stream.recv_window -= size
        stream.received += size
        if size:
            self._deliver(stream_id, b"".join(pieces) if len(pieces) > 1 else payload,
                          size, events)
        return pos

    def _deliver(self, stream_id: int, data: bytes, size: int, events: list) -> None:
        """Body bytes of a stream as an event, joined to the one before when that is
        the same stream's (see DataReceived)."""
        last = events[-1] if events else None
        if type(last) is DataReceived and last.stream_id == stream_id:
            if last.pieces is None:
                last.pieces = [last.data]
                self._joined.append(last)
            last.pieces.append(data)
            last.flow_length += size
        else:
            events.append(DataReceived(stream_id, data, size))

    def _end_of_body(self, stream: Stream, events: list) -> None:
        if stream.length >= 0 and stream.received != stream.length:
            self._stream_error(stream.sid, PROTOCOL_ERROR, events)   # 8.1.1
            return
        stream.reading = False
        if not stream.writing:
            del self.streams[stream.sid]
        events.append(StreamEnded(stream.sid))

    def _window_update(self, stream_id: int, payload: bytes, events: list) -> None:
        if len(payload) != 4:
            self._fail(FRAME_SIZE_ERROR, "WINDOW_UPDATE of other than 4 bytes")
        increment = _UINT32.unpack(payload)[0] & 0x7FFFFFFF
        if not stream_id:
            if not increment:
                self._fail(PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                self._fail(FLOW_CONTROL_ERROR, "connection window past 2^31-1")
            events.append(WindowUpdated(0))
            return
        stream = self.streams.get(stream_id)
        if stream is None:
            if stream_id > self._highest:
                self._fail(PROTOCOL_ERROR, f"WINDOW_UPDATE on idle stream {stream_id}")
            return                                  # closed: allowed, ignored
        if not increment:
            self._stream_error(stream_id, PROTOCOL_ERROR, events)
            return
        stream.send_window += increment
        if stream.send_window > MAX_WINDOW:
            self._stream_error(stream_id, FLOW_CONTROL_ERROR, events)
            return
        events.append(WindowUpdated(stream_id))

    def _rst_stream(self, stream_id: int, payload: bytes, events: list) -> None:
        if not stream_id:
            self._fail(PROTOCOL_ERROR, "RST_STREAM on stream 0")
        if len(payload) != 4:
            self._fail(FRAME_SIZE_ERROR, "RST_STREAM of other than 4 bytes")
        if stream_id > self._highest:
            self._fail(PROTOCOL_ERROR, f"RST_STREAM on idle stream {stream_id}")
        if self.streams.pop(stream_id, None) is not None:
            events.append(StreamReset(stream_id, _UINT32.unpack(payload)[0], True))

    def _priority(self, stream_id: int, payload: bytes, events: list) -> None:
        if not stream_id:
            self._fail(PROTOCOL_ERROR, "PRIORITY on stream 0")
        if len(payload) != 5:
            self._stream_error(stream_id, FRAME_SIZE_ERROR, events)
            return
        if _UINT32.unpack_from(payload)[0] & 0x7FFFFFFF == stream_id:
            self._stream_error(stream_id, PROTOCOL_ERROR, events)   # depends on itself
        # Otherwise accepted and ignored: RFC 9113 deprecates the priority scheme.

    def _settings(self, stream_id: int, flags: int, payload: bytes, events: list) -> None:
        if stream_id:
            self._fail(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                self._fail(FRAME_SIZE_ERROR, "SETTINGS acknowledgement with a payload")
            return
        if len(payload) % 6:
            self._fail(FRAME_SIZE_ERROR, "SETTINGS length not a multiple of 6")
        # Each entry replaces the value before it (6.5.3), so only a frame's last
        # INITIAL_WINDOW_SIZE reaches the streams: walked once per frame, not once per
        # entry (a frame holds up to 2,730 entries; each walking every stream held a
        # worker). Every entry is still checked.
        window = -1
        for pos in range(0, len(payload), 6):
            key, value = _SETTING.unpack_from(payload, pos)
            if key == INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    self._fail(FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE past 2^31-1")
                window = value
            elif key == MAX_FRAME_SIZE:
                if not DEFAULT_FRAME_SIZE <= value <= (1 << 24) - 1:
                    self._fail(PROTOCOL_ERROR, "SETTINGS_MAX_FRAME_SIZE out of range")
                self.max_outbound_frame_size = value
            elif key == ENABLE_PUSH:
                if value > 1:
                    self._fail(PROTOCOL_ERROR, "SETTINGS_ENABLE_PUSH other than 0 or 1")
            # HEADER_TABLE_SIZE: our encoder adds nothing to a dynamic table, so any
            # size suits it. The others do not bind a server; unknown ones are ignored.
        delta = window - self._initial_send_window if window >= 0 else 0
        if delta:
            self._initial_send_window = window
            for stream in self.streams.values():                # 6.9.2
                stream.send_window += delta
                if stream.send_window > MAX_WINDOW:
                    self._fail(FLOW_CONTROL_ERROR, "a stream window past 2^31-1")
        self._out.append(_PACK_HEAD(SETTINGS, ACK, 0))
        if delta > 0:
            events.append(WindowUpdated(0))
