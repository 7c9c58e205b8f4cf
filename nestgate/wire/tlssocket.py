"""TLS on the socket itself: an `ssl.SSLSocket` driven by the loop's reader and writer
callbacks, as the transport of a TLS connection's HTTP/1.1 or HTTP/2 protocol.

Why: the event loop's own TLS transport (uvloop's, like asyncio's) runs OpenSSL on
memory buffers: each read is copied from the socket into a buffer, fed to OpenSSL,
decrypted out of it; each write is encrypted into a buffer, copied out and written.
On a small answer that bookkeeping costs as much as the cryptography. Here OpenSSL
reads and writes the descriptor itself (one `recv` into the caller's bytes, one
`send` of whole records), which measured ~7-10 % less CPU per HTTPS request.

The connection is accepted in clear by the loop's server (nestgate.wire.proxytls); when
its handshake can start with no byte read yet, which is every connection except those
after a PROXY header or while a TLS-ALPN-01 validation looks at ClientHellos, the
descriptor is taken from the loop's TCP transport (duplicated, then that transport
is dropped without a byte read or written) and wrapped here.

Before the handshake, the first record of the ClientHello is peeked at (left in the
socket for OpenSSL) and shown to the stage's `check_hello`, which may answer it with an
alert instead (nestgate.wire.tls: an ALPN offer with nothing in common).

The asyncio transport contract, as the protocols use it: `write` sends at once and
keeps what the socket does not take, in order (`pause_writing` past the high-water
mark, `resume_writing` below the low one); `pause_reading`/`resume_reading` stop and
restart the reader callback (bytes already decrypted are delivered on resume); `close`
sends what is kept, then close_notify, then closes; `abort` closes now. An OpenSSL
write that could not finish is retried with the same bytes, as it must be.
"""

from __future__ import annotations

import os
import socket
import ssl

from nestgate.certs.clienthello import MAX_HELLO

READ_SIZE = 64 * 1024         # a recv gives at most one TLS record (16 KiB) anyway
# After our close_notify and FIN, what the client still sends is read and dropped for
# at most this long before the descriptor is closed (nginx's lingering close): closed
# with unread bytes, the kernel would answer with a reset, and the client could lose
# the last thing we said (an HTTP/2 GOAWAY, a 400) before reading it.
LINGER_SECONDS = 2.0
# OpenSSL writes each TLS record (16 KiB at most) to the socket by itself: a larger
# write would leave as that many small segments (on loopback, as many packets for the
# kernel to carry). The socket is corked around it, so they leave together, as the
# loop's TLS, which encrypts into a buffer and writes that once, would send them.
CORK_ABOVE = 16 * 1024
_CORK = (socket.IPPROTO_TCP, getattr(socket, "TCP_CORK", 3))
_WANT_READ = ssl.SSLWantReadError
_HANDSHAKE_RECORD = b"\x16"
_WANT_WRITE = ssl.SSLWantWriteError


def adopt(loop, tcp_transport, sslcontext) -> ssl.SSLSocket | None:
    """Take the descriptor of `tcp_transport` (nothing read or written on it yet) as
    a non-blocking server-side SSLSocket; the transport is closed. None when the
    transport has no socket to give (the caller keeps the loop's TLS then)."""
    raw = tcp_transport.get_extra_info("socket")
    if raw is None:
        return None
    fd = os.dup(raw.fileno())
    # The loop's transport closes its own descriptor; the connection lives on in ours
    # (the kernel ends it when the last descriptor of it is closed).
    tcp_transport.pause_reading()
    tcp_transport.abort()
    sock = socket.socket(fileno=fd)
    sock.setblocking(False)
    return sslcontext.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)


class TLSSocketTransport:
    """The transport of one TLS connection over an SSLSocket (see the module text)."""

    __slots__ = ("_loop", "_sock", "_fd", "_stage", "_protocol", "_peername", "_reading",
                 "_reader_on", "_writer_on", "_closing", "_closed", "_handshaking",
                 "_inflight", "_queue", "_queued", "_high", "_low", "_write_paused",
                 "_read_wants_write", "_write_wants_read", "_linger_timer", "_tls", "_lowat")

    def __init__(self, loop, sock: ssl.SSLSocket, stage) -> None:
        self._loop = loop
        self._sock = sock
        # The SSL object under the SSLSocket (`ssl.SSLSocket._sslobj`): its read, write
        # and pending are what the SSLSocket methods end in, called without the two
        # Python frames each of those adds, on every request.
        self._tls = sock._sslobj
        self._fd = sock.fileno()
        self._stage = stage            # told `handshake_done(self)` or `handshake_failed()`
        self._protocol = None
        try:
            self._peername = sock.getpeername()
        except OSError:
            self._peername = None
        self._reading = False          # the protocol wants bytes
        self._reader_on = False        # the loop watches the descriptor for reading
        self._writer_on = False
        self._closing = False
        self._closed = False
        self._handshaking = True
        self._inflight = None          # bytes an SSL write must be retried with
        self._queue: list[bytes] = []  # written after them
        self._queued = 0               # bytes not yet taken by the socket
        self._high = 64 * 1024
        self._low = 16 * 1024
        self._write_paused = False     # the protocol was told `pause_writing`
        # OpenSSL may need the other direction to move on (TLS 1.3 key updates,
        # renegotiation): a read that must write first, a write that must read first.
        self._read_wants_write = False
        self._write_wants_read = False
        self._linger_timer = None
        self._lowat = False            # SO_RCVLOWAT raised while a ClientHello comes in
        self._peek_hello()

    # ---------------------------------------------------------------- handshake
    def _peek_hello(self) -> None:
        """Show the stage the ClientHello's first record before OpenSSL reads it (so it
        may refuse it with an alert), then start the handshake."""
        try:
            hello = socket.socket.recv(self._sock, MAX_HELLO, socket.MSG_PEEK)
        except BlockingIOError:
            self._set_watch(True, False, self._peek_hello, None)
            return
        except OSError:
            hello = b""                # the handshake meets the error and closes
        wanted = min(5 + int.from_bytes(hello[3:5], "big") if len(hello) >= 5 else 5,
                     MAX_HELLO)
        if hello[:1] == _HANDSHAKE_RECORD and len(hello) < wanted:
            # The rest of the record is on its way. A peek leaves the bytes readable,
            # so the descriptor is made to report readiness only once it is all there.
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, wanted)
            self._lowat = True
            self._set_watch(True, False, self._peek_hello, None)
            return
        if self._lowat:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
            self._lowat = False
        alert = self._stage.check_hello(hello) if hello else None
        if alert is None:
            self._step_handshake()
            return
        try:
            socket.socket.send(self._sock, alert)
        except OSError:
            pass
        self._close_now(linger=True)       # the ClientHello stays unread

    def _step_handshake(self) -> None:
        try:
            self._sock.do_handshake()
        except _WANT_READ:
            self._set_watch(True, False, self._step_handshake, None)
            return
        except _WANT_WRITE:
            self._set_watch(False, True, None, self._step_handshake)
            return
        except (OSError, ValueError):      # ssl.SSLError is an OSError
            self._close_now(linger=True)   # the rest of what it sent stays unread
            return
        self._handshaking = False
        self._set_watch(False, False)
        self._stage.handshake_done(self)
        if not self._closing and not self._closed and self._protocol is not None:
            self._reading = True
            self._update_watch()
            if self._tls.pending():
                self._loop.call_soon(self._on_readable)

    def _set_watch(self, read: bool, write: bool, reader=None, writer=None) -> None:
        loop, fd = self._loop, self._fd
        if read:
            loop.add_reader(fd, reader or self._on_readable)
        elif self._reader_on:
            loop.remove_reader(fd)
        self._reader_on = read
        if write:
            loop.add_writer(fd, writer or self._on_writable)
        elif self._writer_on:
            loop.remove_writer(fd)
        self._writer_on = write

    def _update_watch(self) -> None:
        if self._closed or self._handshaking:
            return
        read = (self._reading and not self._read_wants_write) or self._write_wants_read
        write = (self._inflight is not None and not self._write_wants_read) \
            or self._read_wants_write
        if read != self._reader_on or write != self._writer_on:
            self._set_watch(read, write)

    def _on_writable(self) -> None:
        if self._read_wants_write:
            self._read_wants_write = False
            self._update_watch()
            self._on_readable()
        if not self._closed:
            self._flush()

    # ---------------------------------------------------------------- reading
    def _on_readable(self) -> None:
        """The socket has bytes (or a write waits for them): the records there are
        read, decrypted and handed to the protocol, one per recv."""
        if self._write_wants_read:
            self._write_wants_read = False
            self._flush()
        if not self._reading or self._closed:
            return
        tls, protocol = self._tls, self._protocol
        while True:
            try:
                data = tls.read(READ_SIZE)
            except _WANT_READ:
                return
            except _WANT_WRITE:
                self._read_wants_write = True
                self._update_watch()
                return
            except ssl.SSLZeroReturnError:
                data = b""
            except (OSError, ValueError) as exc:
                self._fatal(exc)
                return
            if not data:
                self._eof()
                return
            protocol.data_received(data)
            # One record per recv; a record already decrypted in part gives no
            # readiness, the socket's next one does.
            if self._closed or not self._reading or not tls.pending():
                return

    def _eof(self) -> None:
        self._reading = False
        self._update_watch()
        if not self._protocol.eof_received():
            self.close()

    def pause_reading(self) -> None:
        if self._reading:
            self._reading = False
            self._update_watch()

    def resume_reading(self) -> None:
        if not self._reading and not self._closing and not self._closed:
            self._reading = True
            self._update_watch()
            if self._tls.pending():        # decrypted already: no readiness will say so
                self._loop.call_soon(self._on_readable)

    def is_reading(self) -> bool:
        return self._reading

    # ---------------------------------------------------------------- writing
    def write(self, data) -> None:
        if self._closing or not data:        # (_closed is never set without _closing)
            return
        if self._inflight is not None:
            self._queue.append(bytes(data))
            self._queued += len(data)
            self._check_high()
            return
        try:
            sent = self._tls.write(data) if len(data) <= CORK_ABOVE else self._corked(data)
        except _WANT_WRITE:
            sent = 0
        except _WANT_READ:
            sent = 0
            self._write_wants_read = True
        except (OSError, ValueError) as exc:
            self._fatal(exc)
            return
        if sent < len(data):
            # The retry must be with the same bytes (or their rest after a partial write).
            self._inflight = bytes(data[sent:]) if sent else bytes(data)
            self._queued += len(self._inflight)
            self._update_watch()
            self._check_high()

    def writelines(self, parts) -> None:
        self.write(b"".join(parts))

    def _flush(self) -> None:
        if self._closed:
            return
        tls = self._tls
        while self._inflight is not None:
            data = self._inflight
            try:
                sent = tls.write(data) if len(data) <= CORK_ABOVE else self._corked(data)
            except _WANT_WRITE:
                self._update_watch()
                return
            except _WANT_READ:
                self._write_wants_read = True
                self._update_watch()
                return
            except (OSError, ValueError) as exc:
                self._fatal(exc)
                return
            self._queued -= sent
            if sent < len(data):
                self._inflight = data[sent:]
                continue
            if self._queue:
                queue, self._queue = self._queue, []
                self._inflight = b"".join(queue)
            else:
                self._inflight = None
        self._update_watch()
        if self._write_paused and self._queued <= self._low:
            self._write_paused = False
            self._protocol.resume_writing()
        if self._closing and not self._closed and self._inflight is None:
            self._close_now(notify=True)

    def _corked(self, data) -> int:
        sock = self._sock
        sock.setsockopt(*_CORK, 1)
        try:
            return self._tls.write(data)
        finally:
            sock.setsockopt(*_CORK, 0)

    def _check_high(self) -> None:
        if not self._write_paused and self._queued > self._high:
            self._write_paused = True
            self._protocol.pause_writing()

    def get_write_buffer_size(self) -> int:
        return self._queued

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        if high is None:
            high = 64 * 1024 if low is None else 4 * low
        if low is None:
            low = high // 4
        self._high, self._low = high, low

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._low, self._high

    def can_write_eof(self) -> bool:
        return False

    # ---------------------------------------------------------------- ending
    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if self._closing or self._closed:
            return
        self._closing = True
        self._reading = False
        if self._inflight is None:
            self._close_now(notify=True)
        else:
            self._update_watch()            # write what is kept, then close

    def abort(self) -> None:
        self._closing = True
        self._close_now()

    def _fatal(self, exc: BaseException) -> None:
        self._closing = True
        self._close_now(exc=exc)

    def _close_now(self, notify: bool = False, exc: BaseException | None = None,
                   linger: bool = False) -> None:
        if self._closed:
            return
        self._closed = self._closing = True
        if self._reader_on or self._writer_on:
            self._set_watch(False, False)
        self._inflight = None
        self._queue = []
        self._queued = 0
        if notify and not self._handshaking:
            try:
                self._sock.unwrap()         # close_notify; the peer's is not waited for
            except (OSError, ValueError):
                pass
            linger = True
        if linger:
            self._linger()
        else:
            self._sock.close()
        # OpenSSL's state of the connection (its record buffers, handshake keys: tens
        # of KiB) goes now. Left to this object, it would live as long as whatever
        # still refers to the transport, a protocol in a reference cycle say, until
        # the cyclic collector reaches it: hundreds of closed connections' worth at
        # a time under churn, freed in batches that leave the heap in pieces.
        self._tls = None
        stage, self._stage = self._stage, None
        if self._handshaking:
            stage.handshake_failed()
        elif self._protocol is not None:
            self._loop.call_soon(self._lost, exc)

    def _lost(self, exc: BaseException | None) -> None:
        protocol, self._protocol = self._protocol, None   # the transport's end of the cycle
        protocol.connection_lost(exc)

    def _linger(self) -> None:
        try:
            socket.socket.shutdown(self._sock, socket.SHUT_WR)    # FIN, under TLS
        except OSError:
            self._sock.close()
            return
        self._loop.add_reader(self._fd, self._linger_read)
        self._linger_timer = self._loop.call_later(LINGER_SECONDS, self._linger_end)

    def _linger_read(self) -> None:
        try:
            data = os.read(self._fd, READ_SIZE)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._linger_end()

    def _linger_end(self) -> None:
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
            self._loop.remove_reader(self._fd)
            self._sock.close()

    # ---------------------------------------------------------------- the rest
    def get_extra_info(self, name: str, default=None):
        if name == "peername":
            return self._peername
        if name == "ssl_object":
            return self._sock
        if name == "sslcontext":
            return self._sock.context
        if name == "sockname":
            try:
                return self._sock.getsockname()
            except OSError:
                return default
        if name == "socket":
            return None if self._closed else self._sock
        if name == "cipher":
            return self._sock.cipher()
        if name == "peercert":
            return self._sock.getpeercert()
        return default

    def set_protocol(self, protocol) -> None:
        self._protocol = protocol

    def get_protocol(self):
        return self._protocol
