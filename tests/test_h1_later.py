"""Ready answers written after the batch of reads (nestgate.base.later): whatever
follows one on its connection, in the same read or at once after it, comes after it,
and a close never loses it. Real server, raw sockets."""

import socket

from conftest import BASIC_SITE, read_all

# Beside BASIC_SITE's "/hello": a second ready answer and a proxied one.
SITE = BASIC_SITE + """
[[site.route]]
path = "/bye"
type = "return"
body = "bye\\n"

[[site.route]]
prefix = "/up/"
type = "proxy"
strip_prefix = true
upstream = "{upstream}"
"""

HELLO = b"GET /hello HTTP/1.1\r\nHost: a\r\n\r\n"


def _server(start_server, upstream):
    return start_server(SITE.format(upstream=upstream().url)).port()


def _connect(port):
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def test_a_malformed_request_after_a_ready_answer_is_refused_after_it(start_server, upstream):
    port = _server(start_server, upstream)
    with _connect(port) as sock:
        sock.sendall(HELLO + b"GET /hello HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
        data = read_all(sock)               # the 400 closes the connection
    assert data.startswith(b"HTTP/1.1 200 OK\r\n")
    assert data.index(b"hello\n") < data.index(b"HTTP/1.1 400 ")
    assert data.count(b"HTTP/1.1 ") == 2


def test_ready_answers_reach_clients_that_half_close_at_once(start_server, upstream):
    port = _server(start_server, upstream)
    # 64 clients send their request and the end of their input together, so most of
    # them are read (request and end) in the same batch as the others' answers wait.
    socks = [_connect(port) for _ in range(64)]
    try:
        for sock in socks:
            sock.sendall(HELLO)
            sock.shutdown(socket.SHUT_WR)
        for sock in socks:
            data = read_all(sock)
            assert data.startswith(b"HTTP/1.1 200 OK\r\n") and data.endswith(b"hello\n")
    finally:
        for sock in socks:
            sock.close()


def test_an_answer_after_a_request_body_comes_after_the_ready_one_ahead(start_server,
                                                                          upstream):
    port = _server(start_server, upstream)
    with _connect(port) as sock:
        sock.sendall(HELLO + b"POST /bye HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n"
                             b"abcde" + HELLO.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
        data = read_all(sock)
    bodies = [part.split(b"\r\n\r\n", 1)[1] for part in data.split(b"HTTP/1.1 200 OK")[1:]]
    assert bodies == [b"hello\n", b"bye\n", b"hello\n"]


def test_a_proxied_answer_after_a_ready_one_comes_after_it(start_server, upstream):
    port = _server(start_server, upstream)
    with _connect(port) as sock:
        sock.sendall(HELLO + b"GET /up/hi HTTP/1.1\r\nHost: a\r\n\r\n" + HELLO +
                     b"GET /hello HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        data = read_all(sock)
    bodies = [part.split(b"\r\n\r\n", 1)[1] for part in data.split(b"HTTP/1.1 200 OK")[1:]]
    assert bodies == [b"hello\n", b"hi", b"hello\n", b"hello\n"]


def test_ready_answers_to_many_connections_read_together_all_arrive(start_server, upstream):
    port = _server(start_server, upstream)
    socks = [_connect(port) for _ in range(64)]
    try:
        for _ in range(3):              # three rounds, each a batch of 64 reads
            for sock in socks:
                sock.sendall(HELLO)
            for sock in socks:
                got = b""
                while not got.endswith(b"hello\n"):
                    chunk = sock.recv(4096)
                    assert chunk, "connection closed before its answer"
                    got += chunk
                assert got.startswith(b"HTTP/1.1 200 OK\r\n") and got.count(b"HTTP/1.1") == 1
    finally:
        for sock in socks:
            sock.close()
