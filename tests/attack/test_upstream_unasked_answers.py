"""An answer nobody asked for, waiting on an idle pooled upstream connection.

An upstream (or whoever speaks for it: a hidden request it read, a desynchronised
framing) writes a complete answer on a kept-alive connection that nestgate holds idle
in its pool. When those bytes are still in the socket as the next client request takes
that connection, they were read as that request's answer: the next client, whoever
it is, got the planted page. The race is made certain here by stopping the worker
(SIGSTOP) while the client's request and the planted answer both arrive, the
client's first, so the worker reads the request before it sees the upstream's
socket. Now a pooled connection that has anything to read (bytes, or its end) when
it is taken is closed and not used, as nginx closes a kept-alive upstream
connection that becomes readable while idle; the request goes on a new connection.
"""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest

from conftest import read_all
from h2client import H2Client
from rawupstream import RawUpstream, cleartext_gateway

PLANTED = b"HTTP/1.1 200 OK\r\ncontent-length: 8\r\n\r\n/planted"
ARRIVED_S = 0.2         # for bytes written on loopback to be in the stopped worker's sockets


@pytest.fixture(scope="module")
def gateway(request, tmp_path_factory):
    up = RawUpstream()
    server = cleartext_gateway(request, tmp_path_factory, up)
    yield server, up
    server.stop()
    up.stop()


def while_stopped(server, up: RawUpstream, send_request) -> None:
    """With the worker stopped: the client's request (`send_request`), then the
    planted answer on the upstream connection the first request used."""
    [worker] = server.worker_pids()
    os.kill(worker, signal.SIGSTOP)
    try:
        send_request()
        time.sleep(ARRIVED_S)
        up.plant(up.connections, PLANTED)
        time.sleep(ARRIVED_S)
    finally:
        os.kill(worker, signal.SIGCONT)


def the_second_went_on_its_own_connection(up: RawUpstream) -> None:
    first, second = up.take()
    assert [first["target"], second["target"]] == ["/first", "/second"]
    assert first["conn"] != second["conn"], "the connection with the planted answer was reused"


def test_an_http1_client_never_gets_an_answer_planted_on_an_idle_connection(gateway):
    server, up = gateway
    up.take()
    with socket.create_connection(("127.0.0.1", server.port()), timeout=5) as sock:
        sock.sendall(b"GET /first HTTP/1.1\r\nHost: a\r\n\r\n")
        first = sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200 ") and first.endswith(b"/first")
        while_stopped(server, up, lambda: sock.sendall(
            b"GET /second HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"))
        second = read_all(sock)
    assert second.startswith(b"HTTP/1.1 200 "), second
    assert second.endswith(b"\r\n\r\n/second"), second
    the_second_went_on_its_own_connection(up)


def test_an_http2_client_never_gets_an_answer_planted_on_an_idle_connection(gateway):
    server, up = gateway
    up.take()
    client = H2Client(server.port(), None)
    try:
        assert client.request("GET", "/first")[::2] == (200, b"/first")
        stream = client.h2.get_next_available_stream_id()
        client.h2.send_headers(stream, [(b":method", b"GET"), (b":path", b"/second"),
                                        (b":scheme", b"http"), (b":authority", b"a")],
                               end_stream=True)
        while_stopped(server, up, lambda: client.send(client.h2.data_to_send()))
        status, _headers, body = client.read(stream)
    finally:
        client.close()
    assert (status, body) == (200, b"/second")
    the_second_went_on_its_own_connection(up)
