"""A raw HTTP/2 client for the attack suite: frames built and read by hand.

It speaks to a real server over TLS and checks nothing it sends, so it can send what
a conforming client library refuses to (floods, malformed fields, frames in odd
orders). Frames are serialised with hyperframe and header blocks with hpack; what
the server answers is gathered per stream, whatever engine the server runs.
"""

from __future__ import annotations

import select
import socket
import ssl
import struct
import time

import hpack
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS_INITIAL_WINDOW_SIZE = 0x4


def get(path: bytes = b"/hello", authority: bytes = b"localhost", method: bytes = b"GET"):
    return [(b":method", method), (b":scheme", b"https"), (b":path", path),
            (b":authority", authority)]


class Stream:
    __slots__ = ("data", "ended", "reset", "status")

    def __init__(self) -> None:
        self.status = 0
        self.data = bytearray()
        self.ended = False
        self.reset = None           # the RST_STREAM error code, if any

    @property
    def done(self) -> bool:
        return self.ended or self.reset is not None


TCP_CLOSE, TCP_CLOSE_WAIT = 7, 8      # tcp_info.tcpi_state (linux/tcp_states.h)


class RawH2:
    """One connection speaking HTTP/2 frame by frame: over TLS (ALPN h2), or in clear
    with prior knowledge (h2c) when `cafile` is None."""

    def __init__(self, port: int, cafile: str | None, settings: dict | None = None,
                 timeout: float = 10, preface: bool = True, record: bool = False) -> None:
        raw = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        if cafile is None:
            self.sock = raw
        else:
            ctx = ssl.create_default_context(cafile=cafile)
            ctx.set_alpn_protocols(["h2"])
            self.sock = ctx.wrap_socket(raw, server_hostname="localhost")
            assert self.sock.selected_alpn_protocol() == "h2"
        self.encoder, self.decoder = hpack.Encoder(), hpack.Decoder()
        self.decoder.max_header_list_size = 1 << 20
        self.streams: dict[int, Stream] = {}
        self.goaway: GoAwayFrame | None = None
        self.closed = False
        self.next_id = 1
        self.received = 0               # frames read
        # Every frame read, in order, when `record` (off by default: floods read many).
        self.frames: list[Frame] | None = [] if record else None
        self._buf = bytearray()
        if preface:     # without it, the test writes its own (or a wrong) preface
            frame = SettingsFrame(0, settings=settings or {})
            self.sock.sendall(PREFACE + frame.serialize())

    # ------------------------------------------------------------ sending
    def block(self, headers) -> bytes:
        return self.encoder.encode(headers)

    def headers_frame(self, stream_id: int, headers, end: bool = True) -> HeadersFrame:
        flags = {"END_HEADERS", "END_STREAM"} if end else {"END_HEADERS"}
        return HeadersFrame(stream_id, self.block(headers), flags=flags)

    def new_stream(self) -> int:
        stream_id, self.next_id = self.next_id, self.next_id + 2
        self.streams[stream_id] = Stream()
        return stream_id

    def request(self, headers, end: bool = True) -> int:
        stream_id = self.new_stream()
        self.send(self.headers_frame(stream_id, headers, end))
        return stream_id

    def send(self, *frames) -> None:
        """Send the frames in one write; a server that closed makes `closed` true."""
        try:
            self.sock.sendall(b"".join(f if isinstance(f, bytes) else f.serialize()
                                       for f in frames))
        except OSError:
            self.closed = True

    # ------------------------------------------------------------ reading
    def pump(self, timeout: float = 0.0) -> bool:
        """Read what arrives within `timeout`; False once the server closed."""
        if self.closed:
            return False
        self.sock.settimeout(timeout if timeout > 0 else 0.001)
        try:
            chunk = self.sock.recv(1 << 20)
        except (TimeoutError, ssl.SSLWantReadError, BlockingIOError):
            return True
        except OSError:
            chunk = b""
        if not chunk:
            self.closed = True
            return False
        self._buf += chunk
        self._parse()
        return True

    def _parse(self) -> None:
        buf = self._buf
        while len(buf) >= 9:
            frame, length = Frame.parse_frame_header(memoryview(buf[:9]))
            if len(buf) < 9 + length:
                break
            frame.parse_body(memoryview(bytes(buf[9:9 + length])))
            del buf[:9 + length]
            self.received += 1
            if self.frames is not None:
                self.frames.append(frame)
            self._on_frame(frame)

    def _on_frame(self, frame) -> None:
        stream = self.streams.setdefault(frame.stream_id, Stream()) if frame.stream_id else None
        if isinstance(frame, HeadersFrame):
            fields = dict(self.decoder.decode(frame.data, raw=True))
            if b":status" in fields and int(fields[b":status"]) >= 200:
                stream.status = int(fields[b":status"])
            stream.ended = stream.ended or "END_STREAM" in frame.flags
        elif isinstance(frame, DataFrame):
            stream.data += frame.data
            stream.ended = stream.ended or "END_STREAM" in frame.flags
        elif isinstance(frame, RstStreamFrame):
            stream.reset = frame.error_code
        elif isinstance(frame, GoAwayFrame):
            self.goaway = frame
        elif isinstance(frame, SettingsFrame) and "ACK" not in frame.flags:
            self.send(SettingsFrame(0, flags={"ACK"}))

    def wait(self, done, timeout: float = 10) -> bool:
        """Read until `done()` or the server closes or `timeout` passes."""
        deadline = time.monotonic() + timeout
        while not done():
            left = deadline - time.monotonic()
            if left <= 0 or not self.pump(min(left, 0.2)):
                return done()
        return True

    def answers(self, stream_ids, timeout: float = 10) -> dict[int, Stream]:
        self.wait(lambda: all(self.streams[s].done for s in stream_ids), timeout)
        return {s: self.streams[s] for s in stream_ids}

    def wait_closed(self, timeout: float = 3) -> bool:
        """Read (and parse) until the server closes the connection; False if it is still
        open after `timeout`."""
        return self.wait(lambda: self.closed, timeout)

    def ended_by_server(self) -> bool:
        """Whether the server has closed or reset the connection, read from the kernel's
        TCP state without reading: reading would drain what the server has sent and let
        it go on."""
        state = self.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]
        return state in (TCP_CLOSE, TCP_CLOSE_WAIT)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def flood(conn: RawH2, chunk: bytes, seconds: float) -> float | None:
    """Send `chunk` over and over, reading (and dropping) what comes back, until the
    server closes or `seconds` pass. The seconds until the connection ended, or None."""
    sock = conn.sock
    sock.setblocking(False)
    start = time.monotonic()
    pending = memoryview(chunk)
    while time.monotonic() - start < seconds:
        readable, writable, _ = select.select([sock], [sock], [], 0.05)
        if readable or (isinstance(sock, ssl.SSLSocket) and sock.pending()):
            try:
                data = sock.recv(1 << 20)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                data = None
            except OSError:
                data = b""
            if data == b"":
                conn.closed = True
                return time.monotonic() - start
            if data:
                conn._buf += data
                conn._parse()
                if conn.goaway is not None:
                    return time.monotonic() - start
        if writable:
            try:
                sent = sock.send(pending)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                continue
            except OSError:
                conn.closed = True
                return time.monotonic() - start
            pending = pending[sent:] or memoryview(chunk)
    return None


def unindexed_block(fields) -> bytes:
    """A header block that changes no HPACK table (literals never indexed, no
    Huffman coding): the kind a server may remember decoded (see h2engine `_decode`)."""
    return hpack.Encoder().encode([hpack.NeverIndexedHeaderTuple(n, v) for n, v in fields],
                                  huffman=False)


def frames(frame, count: int) -> bytes:
    return frame.serialize() * count


def raw_frame(kind: int, flags: int, stream_id: int, payload: bytes = b"",
              length: int | None = None) -> bytes:
    """A frame as bytes, whatever its fields say: any type, flags, reserved bit or
    stream, and a `length` in its header other than the payload's if given."""
    size = len(payload) if length is None else length
    return struct.pack(">I", size)[1:] + struct.pack(">BBI", kind, flags, stream_id) + payload


__all__ = [
    "SETTINGS_INITIAL_WINDOW_SIZE",
    "ContinuationFrame",
    "DataFrame",
    "GoAwayFrame",
    "HeadersFrame",
    "PingFrame",
    "RawH2",
    "RstStreamFrame",
    "SettingsFrame",
    "Stream",
    "WindowUpdateFrame",
    "flood",
    "frames",
    "get",
    "raw_frame",
    "unindexed_block",
]


def open_streams(conns: list[RawH2], count: int, path: bytes) -> list[list[int]]:
    """`count` GET streams for `path` on each connection, sent in one write each."""
    streams = []
    for conn in conns:
        ids = [conn.new_stream() for _ in range(count)]
        conn.send(*(conn.headers_frame(s, get(path)) for s in ids))
        streams.append(ids)
    return streams


def wait_all_reset(conns: list[RawH2], streams: list[list[int]], timeout: float,
                   code: int) -> tuple[int, float]:
    """Wait until every stream has been reset; how many with `code`, and how long it took."""
    start = time.monotonic()
    for conn, ids in zip(conns, streams):
        conn.wait(lambda conn=conn, ids=ids: all(conn.streams[s].reset is not None for s in ids),
                  timeout=timeout)
    matching = sum(1 for conn, ids in zip(conns, streams) for s in ids
                   if conn.streams[s].reset == code)
    return matching, time.monotonic() - start
