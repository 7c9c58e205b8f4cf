"""The abuse limits of HTTP/2, each bound named with the reason for its value, and
`FrameGuard`, which counts a client's frames before they are parsed. HTTP/3 holds its
clients to the same bounds where they apply (`too_many_resets`, HEADER_BLOCK_SLACK).

`FrameGuard` reads the frame headers of every read before the engine parses it and
ends the connection with GOAWAY(ENHANCE_YOUR_CALM) on a flood of frames that carry no
request (PING, SETTINGS, WINDOW_UPDATE, PRIORITY, empty DATA), a body in DATA frames
too small for what each costs (`body_chunk_allowance`, `min_body_chunk_average`) or a
header block past `max_header_bytes`. A stream costs work (a task, maybe an upstream
request) before the client can cancel it, so streams the client resets before they
were answered are counted and too many end the connection (rapid reset,
CVE-2023-44487).
"""

from __future__ import annotations

import struct

from nestgate.wire import h2engine as engine
from nestgate.base.tally import H2_PROTECTIONS

MAX_CONCURRENT_STREAMS = 128     # advertised; a stream past it is refused alone
# Rapid reset (CVE-2023-44487). A browser leaving a page cancels what it has in
# flight, at most MAX_CONCURRENT_STREAMS at a time, so a few hundred resets are
# ordinary. Past RESET_ALLOWANCE, a connection on which the client reset more than
# half of the streams it opened (before they were answered) is only making us work
# for nothing; RESET_CAP bounds the resets of any connection whatever its streams
# (it matters when `keepalive_requests` allows more than that many streams).
RESET_ALLOWANCE = 2 * MAX_CONCURRENT_STREAMS
RESET_CAP = 1000


def too_many_resets(wasted: int, opened: int) -> bool:
    """Whether a client that reset `wasted` of the `opened` streams before their answer
    only makes us work for nothing (HTTP/3 holds its clients to the same rule)."""
    return wasted >= RESET_CAP or (wasted > RESET_ALLOWANCE and 2 * wasted > opened)


# A decoded header list may exceed `max_header_bytes` (the request gets 431 and the
# connection goes on) up to this many times it; past that it is an HPACK bomb and the
# connection ends (COMPRESSION_ERROR).
DECODED_LIST_FACTOR = 4
# Decoded header blocks all the connections of this worker keep together (each at most
# h2engine.DECODED_CONNECTION_BYTES): 64 connections' worth, whatever max_connections
# allows. Past it a connection decodes every block, which costs CPU, not memory.
DECODED_BUDGET = engine.DecodedBudget(4 * 1024 * 1024)

# Frames a client may send that carry no request. Each costs us work, and PING and
# SETTINGS an answer, so a flood of them alone can hold a worker: each kind has a
# bound, passing it ends the connection with GOAWAY(ENHANCE_YOUR_CALM). The frame
# headers are counted as bytes arrive, before they are parsed, so a flood in one read
# is stopped before any of it is handled.
# PING and SETTINGS (each acknowledged): Envoy lets a client leave at most 1000
# control frames unread (max_outbound_control_frames); we allow that many at once,
# then 100 a second over the connection's life. A browser sends a handful. A SETTINGS
# frame counts as many as the entries it holds (up to 2,730 in one frame; a browser
# sends about six), each being work to check and apply.
CONTROL_FRAME_BURST = 1000
CONTROL_FRAMES_PER_SECOND = 100
# PRIORITY: Envoy's max_inbound_priority_frames_per_stream (100), per stream opened.
PRIORITY_FRAMES_PER_STREAM = 100
# WINDOW_UPDATE: Envoy's max_inbound_window_update_frames_per_data_frame_sent (10):
# a client opens windows for what we send it, so at most 5 + 2 x (streams opened +
# 10 x DATA frames sent) of them, as Envoy counts.
WINDOW_UPDATES_PER_DATA_FRAME = 10
# DATA, HEADERS and CONTINUATION frames with nothing in them and no END_STREAM move
# nothing forward: Envoy's max_consecutive_inbound_frames_with_empty_payload (1).
EMPTY_FRAMES_IN_A_ROW = 1
# One header block (HEADERS and its CONTINUATION frames) is held whole until it ends:
# it may take `max_header_bytes`, the SETTINGS_MAX_HEADER_LIST_SIZE we advertise (a
# list within it never encodes larger: each field counts 32 bytes more there than its
# literal costs), plus padding (256), a priority (5) and table-size updates.
HEADER_BLOCK_SLACK = 256 + 5 + 16

_PREFACE_BYTES = 24                # "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_FRAME_HEAD = struct.Struct(">IBI")   # length (24 bits) and type; flags; stream id
_DATA, _HEADERS, _PRIORITY, _SETTINGS = 0x0, 0x1, 0x2, 0x4        # frame types
_PING, _WINDOW_UPDATE, _CONTINUATION = 0x6, 0x8, 0x9
_END_STREAM = _ACK = 0x1
_END_HEADERS = 0x4


# Why a protection ended a connection or a stream: the key of its counter
# (nestgate.base.tally's H2_PROTECTIONS, the `nestgate_http2_protections` metric) and the
# words of its log line.
PROTECTIONS = {
    "control_flood": "PING/SETTINGS flood",
    "window_update_flood": "WINDOW_UPDATE flood",
    "priority_flood": "PRIORITY flood",
    "empty_frames": "empty frame flood",
    "small_data_frames": "DATA frames too small (min_body_chunk_average)",
    "header_block": "header block over max_header_bytes",
    "header_timeout": "preface or header block not complete within header_timeout",
    "rapid_reset": "streams reset before their answer (rapid reset)",
    "protocol_error": "protocol error",
    "send_timeout": "stream waited send_timeout for the client's window",
}
assert tuple(PROTECTIONS) == H2_PROTECTIONS


class FrameGuard:
    """Counts what a client's frames cost before they are parsed: bytes in, the
    reason to end the connection out (a key of PROTECTIONS, or None). It reads only the 9-byte frame
    headers, so it runs in front of any frame engine and costs a few operations per
    frame; the payloads are left to the engine."""

    __slots__ = ("skip", "partial", "born", "block_limit", "last_stream", "opened",
                 "data_sent", "control", "priorities", "window_updates", "empty", "block",
                 "pieces", "piece_bytes", "piece_stream", "piece_allowance",
                 "min_piece_average")

    def __init__(self, limits, now: float) -> None:
        self.skip = _PREFACE_BYTES     # payload bytes of the frame under way
        self.partial = b""             # a frame header split between reads
        self.born = now
        self.block_limit = limits.max_header_bytes + HEADER_BLOCK_SLACK
        # DATA frames that do not end their stream, and their bytes (padding too: it
        # is what the client sent per frame), held to the body chunk limits.
        self.pieces = self.piece_bytes = 0
        self.piece_stream = 0           # the stream of the last piece counted
        self.piece_allowance = limits.body_chunk_allowance
        self.min_piece_average = limits.min_body_chunk_average
        self.last_stream = self.opened = 0
        self.data_sent = 0             # DATA frames we sent (the connection counts)
        self.control = self.priorities = self.window_updates = self.empty = 0
        self.block = 0                 # bytes of the header block under way

    def feed(self, data: bytes, now: float) -> str | None:
        if self.partial:
            data, self.partial = self.partial + data, b""
        pos, end = self.skip, len(data)
        unpack = _FRAME_HEAD.unpack_from
        while pos + 9 <= end:
            head, flags, stream = unpack(data, pos)
            length, kind = head >> 8, head & 0xFF
            pos += 9 + length
            if kind == _DATA:               # the most frequent: handled inline
                if not length:
                    if flags & _END_STREAM:
                        self._body_ended(stream)
                    why = self._payload(0, flags & _END_STREAM)
                else:
                    self.empty = 0
                    if flags & _END_STREAM:
                        self.piece_bytes += length      # bytes of the body, not a piece
                        continue
                    # A piece of a body (a body's last frame is not counted: it comes
                    # once per request). Each costs the engine and the handler about
                    # what a few hundred bytes do, so past `body_chunk_allowance` of
                    # them their average must be `min_body_chunk_average` bytes.
                    pieces = self.pieces + 1
                    self.pieces = pieces
                    self.piece_bytes += length
                    self.piece_stream = stream
                    if pieces <= self.piece_allowance or \
                            self.piece_bytes >= pieces * self.min_piece_average:
                        continue
                    why = "small_data_frames"
            elif kind == _HEADERS and flags & _END_HEADERS:
                # A whole header block in one frame, as nearly every request comes:
                # `_header_frame`'s counting, inline.
                stream &= 0x7FFFFFFF
                if flags & _END_STREAM and stream == self.piece_stream:
                    self.pieces -= 1               # (`_body_ended`)
                    self.piece_stream = 0
                if stream > self.last_stream:
                    self.last_stream = stream
                    self.opened += 1
                if length > self.block_limit:
                    self.block = length
                    return "header_block"
                self.block = 0
                if length:
                    self.empty = 0
                continue
            elif kind == _HEADERS or kind == _CONTINUATION:
                why = self._header_frame(kind, flags, stream & 0x7FFFFFFF, length)
            elif kind == _PING:
                why = None if flags & _ACK else self._control(now, 1)
            elif kind == _SETTINGS:
                # Each entry is work (checked, maybe applied): entries are what counts.
                # (A frame past the frame size is the engine's FRAME_SIZE_ERROR.)
                why = None if flags & _ACK else self._control(
                    now, length // 6 if 6 <= length <= engine.DEFAULT_FRAME_SIZE else 1)
            elif kind == _WINDOW_UPDATE:
                self.window_updates += 1
                why = "window_update_flood" if self.window_updates > 5 + 2 * (
                    self.opened + WINDOW_UPDATES_PER_DATA_FRAME * self.data_sent) else None
            elif kind == _PRIORITY:
                self.priorities += 1
                why = "priority_flood" if self.priorities > \
                    PRIORITY_FRAMES_PER_STREAM * (1 + self.opened) else None
            else:
                continue
            if why is not None:
                return why
        if pos >= end:
            self.skip = pos - end
        else:
            self.skip, self.partial = 0, data[pos:]
        return None

    def _payload(self, length: int, ends: int) -> str | None:
        if length:
            self.empty = 0
        elif not ends:
            self.empty += 1
            if self.empty > EMPTY_FRAMES_IN_A_ROW:
                return "empty_frames"
        return None

    def _body_ended(self, stream: int) -> None:
        """An empty DATA frame or trailers ended `stream`'s body: when the frame before
        on the stream was the last piece counted, that piece was the body's last (curl,
        nghttp2 and Go send a body so, ending it with an empty frame), and is not
        counted either, so many small bodies on one connection are not tiny pieces."""
        if stream == self.piece_stream:
            self.pieces -= 1
            self.piece_stream = 0

    def _header_frame(self, kind: int, flags: int, stream: int, length: int) -> str | None:
        if kind == _HEADERS:
            if flags & _END_STREAM:
                self._body_ended(stream)
            self.block = 0
            if stream > self.last_stream:
                self.last_stream = stream
                self.opened += 1
        self.block += length
        if self.block > self.block_limit:
            return "header_block"
        if flags & _END_HEADERS:
            self.block = 0
            return self._payload(length, 1)
        return self._payload(length, flags & _END_STREAM and kind == _HEADERS)

    def _control(self, now: float, count: int) -> str | None:
        self.control += count
        if self.control > CONTROL_FRAME_BURST and self.control > \
                CONTROL_FRAME_BURST + CONTROL_FRAMES_PER_SECOND * (now - self.born):
            return "control_flood"
        return None
