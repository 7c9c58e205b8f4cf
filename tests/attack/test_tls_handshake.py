"""Connections that never finish their TLS handshake.

A client can open a TCP connection to a TLS listener and then send nothing, or
trickle its ClientHello a byte at a time. Such a connection must end within
`header_timeout` (as nginx bounds its handshake by `client_header_timeout`), and it
must count toward `max_connections` like any other, so a flood of them is refused
past the limit instead of piling up until the event loop's own 60 s deadline.
"""

from __future__ import annotations

import errno
import socket
import ssl
import time

import pytest

from conftest import read_all, tls_block

CONFIG = """
[server]
workers = 1

[limits]
header_timeout = "{header_timeout}"
max_connections = {max_connections}

[[listen]]
address = "127.0.0.1:0"
http2 = {http2}
{tls}

[[site]]
hosts = ["*"]

[[site.route]]
path = "/hello"
type = "return"
body = "hello"
"""


def client_hello() -> bytes:
    """The first flight of a real TLS client, to trickle."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    ctx = ssl.create_default_context()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname="localhost")
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


def closed_by_server(sock: socket.socket) -> bool:
    """True when the server closed or reset the connection (no wait)."""
    sock.setblocking(False)
    try:
        return sock.recv(4096) == b""
    except BlockingIOError:
        return False
    except OSError as exc:
        return exc.errno == errno.ECONNRESET


def served(port: int, ca: str) -> bool:
    """A normal HTTPS client completes its handshake and gets its answer."""
    ctx = ssl.create_default_context(cafile=ca)
    ctx.set_alpn_protocols(["http/1.1"])
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
                ctx.wrap_socket(raw, server_hostname="localhost") as tls:
            tls.sendall(b"GET /hello HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            return read_all(tls).endswith(b"hello")
    except (ssl.SSLError, OSError):
        return False


def wait_all_closed(socks, hello: bytes, seconds: float) -> float | None:
    """Trickle `hello` into the odd sockets (one byte each 0.1 s) until every socket was
    closed by the server; the seconds that took, or None past `seconds`."""
    t0 = time.monotonic()
    open_ = set(range(len(socks)))
    sent = 0
    while open_ and time.monotonic() - t0 < seconds:
        for i in list(open_):
            sock = socks[i]
            if closed_by_server(sock):
                open_.discard(i)
            elif i % 2 and sent < len(hello):
                try:
                    sock.send(hello[sent:sent + 1])
                except OSError:
                    open_.discard(i)
        sent += 1
        time.sleep(0.1)
    return None if open_ else time.monotonic() - t0


def connect_many(port: int, count: int) -> list[socket.socket]:
    return [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(count)]


@pytest.mark.parametrize("http2", ["true", "false"])
def test_silent_and_trickling_handshakes_end_at_header_timeout(http2, start_server, certs):
    server = start_server(CONFIG.format(header_timeout="1s", max_connections=1024,
                                        http2=http2, tls=tls_block(certs)))
    port = server.port("https")
    socks = connect_many(port, 40)
    try:
        took = wait_all_closed(socks, client_hello(), seconds=4.0)
        assert took is not None, "handshaking connections outlived header_timeout"
        assert took < 1.0 + 1.5           # header_timeout + the tick + a loaded machine
        assert served(port, certs["ca"])
    finally:
        for sock in socks:
            sock.close()


def test_handshaking_connections_count_toward_max_connections(start_server, certs):
    # header_timeout is long enough that nothing below is closed by it until the end,
    # even on a loaded machine; every wait polls instead of sleeping a guessed time.
    server = start_server(CONFIG.format(header_timeout="6s", max_connections=8,
                                        http2="true", tls=tls_block(certs)))
    port = server.port("https")
    socks = connect_many(port, 7)
    extra = []
    try:
        assert served(port, certs["ca"])            # the 8th of 8: under the limit
        time.sleep(1.0)                              # its close is counted by the worker
        socks += connect_many(port, 1)               # 8 handshaking: at the limit
        extra = connect_many(port, 4)
        assert wait_all_closed(extra, b"", seconds=3.0) is not None, \
            "connections past max_connections were kept while handshaking"
        assert not any(closed_by_server(sock) for sock in socks)
        assert not served(port, certs["ca"])
        assert wait_all_closed(socks, b"", seconds=10.0) is not None
        assert served(port, certs["ca"])            # room again once they timed out
    finally:
        for sock in socks + extra:
            sock.close()
