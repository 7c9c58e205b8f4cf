"""PROXY protocol on TLS listeners: the header in clear, then the TLS handshake.

On a real server, the client address the header names is seen through an access
list (/lan allows 10.0.0.0/8 only) and the access log (loopback is not logged).
Then the adapter alone, in process, on uvloop and on asyncio."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import time
from types import SimpleNamespace

import pytest
import uvloop

from conftest import read_all, tls_block, v1, v2
from h2client import H2Client
from nestgate.base.clientip import V2_SIGNATURE, Networks
from nestgate.wire.proxytls import ProxyThenTLS
from nestgate.server.worker import ServerContext

CONFIG = """
[server]
workers = 1

[limits]
header_timeout = "1s"

[log]
flush_interval = "100ms"

[[listen]]
address = "127.0.0.1:0"
proxy_protocol_from = {trusted}
{tls}

[[site]]
hosts = ["*"]

[[site.route]]
path = "/hello"
type = "return"
body = "hello"

[[site.route]]
path = "/lan"
type = "return"
body = "lan"
allow = ["10.0.0.0/8"]
"""


@pytest.fixture
def tls_server(start_server, certs):
    """A TLS listener that takes PROXY headers from 127.0.0.1, the tests' address."""
    server = start_server(CONFIG.format(trusted='["127.0.0.1/32"]', tls=tls_block(certs)))
    yield server
    assert_quiet(server)


def assert_quiet(server) -> None:
    """No traceback or logged exception on the server's stderr."""
    noisy = [line for line in server.lines if "Traceback" in line or "xception" in line]
    assert not noisy, "\n".join(server.lines)


def get_request(path: str) -> bytes:
    return b"GET %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n" % path.encode()


def h1_get(port: int, ca: str, path: str, preamble: bytes = b"") -> int:
    """The status of GET `path` over HTTP/1.1 on TLS, `preamble` sent in clear first."""
    ctx = ssl.create_default_context(cafile=ca)
    ctx.set_alpn_protocols(["http/1.1"])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        raw.sendall(preamble)
        with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
            assert tls.selected_alpn_protocol() == "http/1.1"
            tls.sendall(get_request(path))
            data = read_all(tls)
    return int(data.split(b" ", 2)[1])


def h2_get(port: int, ca: str, path: str, preamble: bytes = b"") -> int:
    """The same over HTTP/2 (ALPN h2)."""
    client = H2Client(port, ca, preamble=preamble)
    try:
        return client.request("GET", path)[0]
    finally:
        client.close()


def one_send_get(port: int, ca: str, path: str, preamble: bytes) -> int:
    """GET over HTTP/1.1 on TLS, the PROXY header and the ClientHello in one send (as an
    AWS NLB sends them)."""
    return int(one_send_exchange(port, ca, preamble, get_request(path)).split(b" ", 2)[1])


def one_send_exchange(port: int, ca: str, preamble: bytes, request: bytes) -> bytes:
    """What the server answers to `request`, sent over TLS driven through memory BIOs:
    `preamble` and the ClientHello leave in one send, the client's last handshake
    message and `request` in another."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ssl.create_default_context(cafile=ca).wrap_bio(incoming, outgoing,
                                                          server_hostname="localhost")
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                sock.sendall(preamble + outgoing.read())
                preamble = b""
                reply = sock.recv(65536)
                if not reply:
                    raise ConnectionError("closed during the handshake")
                incoming.write(reply)
        tls.write(request)
        sock.sendall(outgoing.read())
        data = b""
        while chunk := sock.recv(65536):
            incoming.write(chunk)
            try:
                while piece := tls.read(65536):
                    data += piece
                break                                   # b"": the server's close_notify
            except ssl.SSLWantReadError:
                pass
    return data


def reply_to(port: int, data: bytes) -> bytes:
    """Everything the server sends back to `data`, until it closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        try:
            return read_all(sock)
        except socket.timeout:
            raise AssertionError("the server kept the connection open") from None


@pytest.fixture(params=["http/1.1", "h2"])
def get(request):
    return h1_get if request.param == "http/1.1" else h2_get


@pytest.mark.parametrize("header", [v1, v2], ids=["v1", "v2"])
def test_the_proxy_source_is_the_client(tls_server, certs, get, header):
    port, ca = tls_server.port("https"), certs["ca"]
    assert get(port, ca, "/lan", header("10.1.2.3")) == 200
    assert get(port, ca, "/lan", header("198.51.100.1")) == 403
    logged = tls_server.wait_stdout(lambda lines: len(lan_records(lines)) >= 2)
    assert [r["client"] for r in lan_records(logged)] == ["10.1.2.3", "198.51.100.1"]


def lan_records(lines) -> list[dict]:
    return [r for r in map(json.loads, lines) if r["path"] == "/lan"]


def test_the_header_is_optional_for_a_trusted_peer(tls_server, certs, get):
    port, ca = tls_server.port("https"), certs["ca"]
    assert get(port, ca, "/hello") == 200
    assert get(port, ca, "/lan") == 403                    # the client is 127.0.0.1
    assert get(port, ca, "/hello", b"PROXY UNKNOWN\r\n") == 200


def test_header_and_client_hello_in_one_send(tls_server, certs):
    port, ca = tls_server.port("https"), certs["ca"]
    assert one_send_get(port, ca, "/lan", v1("10.1.2.3")) == 200
    assert one_send_get(port, ca, "/lan", v2("10.1.2.3")) == 200
    assert one_send_get(port, ca, "/lan", v1("2001:db8::7")) == 403
    assert one_send_get(port, ca, "/lan", b"") == 403       # no header, ClientHello first


def test_header_split_over_several_reads(tls_server, certs):
    header = v2("10.1.2.3")
    ctx = ssl.create_default_context(cafile=certs["ca"])
    with socket.create_connection(("127.0.0.1", tls_server.port("https")), timeout=5) as raw:
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for part in (header[:3], header[3:14], header[14:20], header[20:]):
            raw.sendall(part)
            time.sleep(0.02)
        with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
            tls.sendall(get_request("/lan"))
            assert read_all(tls).startswith(b"HTTP/1.1 200 ")


def test_a_header_from_an_untrusted_peer_is_refused(start_server, certs):
    server = start_server(CONFIG.format(trusted='["10.9.9.9"]', tls=tls_block(certs)))
    port, ca = server.port("https"), certs["ca"]
    for header in (v1("10.1.2.3"), v2("10.1.2.3")):
        assert reply_to(port, header) == b""                  # closed, nothing said
        with pytest.raises(OSError):                          # ssl.SSLError or a reset
            h1_get(port, ca, "/lan", header)
    assert h1_get(port, ca, "/hello") == 200                  # TLS without one is served
    assert h2_get(port, ca, "/hello") == 200
    assert_quiet(server)


def test_a_bad_header_is_refused(tls_server):
    port = tls_server.port("https")
    for garbage in (b"PROXY TCP4 192.0.2.999 127.0.0.1 5000 443\r\n",
                    b"PROXY " + b"x" * 120,
                    V2_SIGNATURE + b"\x31\x11\x00\x0c" + b"\x00" * 12,    # version 3
                    V2_SIGNATURE + b"\x21\x11\x04\x00" + b"\x00" * 1024):  # too long
        assert reply_to(port, garbage) == b""


def test_a_failed_handshake_closes_the_connection(tls_server, certs):
    port = tls_server.port("https")
    reply = reply_to(port, v1("10.1.2.3") + b"GET /lan HTTP/1.1\r\nHost: x\r\n\r\n")
    assert not reply.startswith(b"HTTP/")
    assert h1_get(port, certs["ca"], "/lan", v1("10.1.2.3")) == 200   # the next one is fine


def test_silent_peers_are_closed_after_header_timeout(tls_server):
    port = tls_server.port("https")
    for opening in (b"", b"PROX", v1("10.1.2.3"), v1("10.1.2.3") + b"\x16\x03\x01"):
        started = time.monotonic()
        assert reply_to(port, opening) == b""
        assert time.monotonic() - started < 3                  # 1 s and a tick or two


def test_graceful_stop_with_handshakes_pending(tls_server, certs):
    port = tls_server.port("https")
    with socket.create_connection(("127.0.0.1", port)) as silent, \
            socket.create_connection(("127.0.0.1", port)) as halfway:
        halfway.sendall(v1("10.1.2.3"))
        assert h1_get(port, certs["ca"], "/hello", v2("10.1.2.3")) == 200
        started = time.monotonic()
        assert tls_server.stop() == 0
        assert time.monotonic() - started < 5
        assert read_all(silent) == b"" and read_all(halfway) == b""


# ------------------------------------------------------------ the adapter, in process
# uvloop (what workers run) hands the first application data to the protocol only after
# start_tls has returned; asyncio hands it to the protocol start_tls was given at once.


class Echo(asyncio.Protocol):
    """Stands for the listener's usual protocol: answers with the client it was told."""

    client = "-"

    def connection_made(self, transport) -> None:
        self.transport = transport

    def set_client(self, address: str) -> None:
        self.client = address

    def data_received(self, data: bytes) -> None:
        self.transport.write(b"%s %s" % (self.client.encode(), data))
        self.transport.close()


@pytest.mark.parametrize("run", [uvloop.run, asyncio.run], ids=["uvloop", "asyncio"])
def test_hand_over_with_data_right_after_the_handshake(run, certs):
    server_ssl = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ssl.load_cert_chain(*certs["local"])

    async def exchange(preamble: bytes) -> tuple[bytes, set]:
        loop = asyncio.get_running_loop()
        ctx = SimpleNamespace(loop=loop, connections=set(), proxy_protocol_from=Networks(
            ["127.0.0.1/32"]), limits=SimpleNamespace(header_timeout=5.0, max_connections=16),
            client_address=ServerContext.client_address, certificate_book=None,
            alpn_protocols=("h2", "http/1.1"), bans=None)
        server = await loop.create_server(lambda: ProxyThenTLS(ctx, server_ssl, Echo),
                                          "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            answer = await asyncio.to_thread(one_send_exchange, port, certs["ca"], preamble,
                                             b"ping")
        return answer, ctx.connections

    for preamble, client in ((v1("10.1.2.3"), b"10.1.2.3"), (v2("10.1.2.3"), b"10.1.2.3"),
                             (b"", b"-")):
        answer, connections = run(exchange(preamble))
        assert answer == client + b" ping"
        assert not connections                  # handed over: no longer the worker's
