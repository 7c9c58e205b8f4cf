"""Tunnels through the proxy (WebSocket and other upgrades after `101`).

A WebSocket upgrade pipelined behind another request on a `websocket` proxy route
used to get its `101` while the connection stayed in its closing phase: the client's
frames were dropped, never reached the upstream, and the connection stayed open.
Now the upgrade waits its turn like any pipelined request, and the tunnel starts when
it is answered.

A tunnel nobody speaks on used to stay open for ever (420 s and counting in the
attack run; nginx closes one after `proxy_read_timeout`, 60 s). Now a route's
`tunnel_idle_timeout` closes both sides once no byte has gone either way for that
long; a tunnel in use stays open.
"""

from __future__ import annotations

import socket
import time

from conftest import WS_HANDSHAKE, WS_KEY, poll, read_all, websocket_accept
from rawupstream import proxy_toml

WS_REQUEST = (b"GET /ws HTTP/1.1\r\nHost: app.test\r\nConnection: Upgrade\r\n"
              b"Upgrade: websocket\r\n" + WS_HANDSHAKE + b"\r\n")
RSS_GROWTH_BOUND_KIB = 8 * 1024


def tunnel_gateway(url: str, extra: str = "") -> str:
    """The proxy gateway with `extra` keys on its one route."""
    return proxy_toml(url, routes=extra)


def read_until(sock: socket.socket, end: bytes, seconds: float = 5.0) -> bytes:
    """Bytes from `sock` until they end with `end`; AssertionError (with what came)
    if the connection closes or `seconds` pass first."""
    data = b""
    deadline = time.monotonic() + seconds
    while not data.endswith(end):
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            raise AssertionError(f"waited {seconds}s for {end!r}; got {data[-300:]!r}") from None
        assert chunk, f"closed before {end!r}; got {data[-300:]!r}"
        data += chunk
    return data


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """True when the peer ends the connection (EOF or reset) within `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            if sock.recv(65536) == b"":
                return True
        except socket.timeout:
            return False
        except ConnectionResetError:
            return True
    return False


def open_tunnel(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(WS_REQUEST)
    data = read_until(sock, b"hello")
    assert data.startswith(b"HTTP/1.1 101 "), data
    return sock


# ------------------------------------------------------------------ pipelined upgrade
def test_upgrade_pipelined_behind_a_request_is_tunnelled_in_its_turn(start_server, upstream):
    up = upstream()
    server = start_server(tunnel_gateway(up.url))
    port = server.port()
    start = server.worker_rss_kib()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET /echo HTTP/1.1\r\nHost: app.test\r\n\r\n" + WS_REQUEST + b"early")
        data = read_until(sock, b"helloEARLY")
        first, _, rest = data.partition(b"\r\n\r\n")
        assert first.startswith(b"HTTP/1.1 200 "), data[:300]
        length = int(first.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        switch, _, tunnel = rest[length:].partition(b"\r\n\r\n")
        assert switch.startswith(b"HTTP/1.1 101 "), rest[:300]
        assert tunnel == b"helloEARLY"
        # Frames both ways, after the tunnel began.
        for frame in (b"frame-one", b"frame-two" * 1000):
            sock.sendall(frame)
            assert read_until(sock, frame.upper()).endswith(frame.upper())
        assert [r["target"] for r in up.requests] == ["/echo", "/ws"]
        # The client leaves: the upstream side of the tunnel ends too.
        sock.shutdown(socket.SHUT_WR)
        assert closed_within(sock, 5), "the tunnel outlived the client's end"
    assert poll(lambda: up.tunnels_ended, lambda ends: ends == ["eof"], 5) == ["eof"]
    assert server.worker_rss_kib() - start < RSS_GROWTH_BOUND_KIB


def test_upgrade_pipelined_behind_a_refused_upgrade_is_not_read(start_server, upstream):
    # The first upgrade is answered without a 101 (426 from the upstream): the
    # connection ends after it, and the pipelined one never reaches the upstream.
    up = upstream()
    server = start_server(tunnel_gateway(up.url))
    with socket.create_connection(("127.0.0.1", server.port()), timeout=5) as sock:
        sock.sendall(WS_REQUEST.replace(b"/ws", b"/status/426") + WS_REQUEST)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 426 ") and data.count(b"HTTP/1.1 ") == 1, data[:300]
    assert [r["target"] for r in up.requests] == ["/status/426"]


def test_an_http1_0_upgrade_is_a_plain_request_and_nothing_after_it_is_read(start_server,
                                                                           upstream):
    # RFC 9110 7.8: an HTTP/1.0 request's Upgrade is ignored. A client or proxy that
    # speaks HTTP/1.0 knows no 101: tunnelled, its next request went to the upstream
    # as tunnel bytes, past every check. Before: 101, and "GET /SMUGGLED" echoed back.
    up = upstream()
    server = start_server(tunnel_gateway(up.url))
    old = (b"GET /ws HTTP/1.0\r\nHost: app.test\r\nConnection: Upgrade, keep-alive\r\n"
           b"Upgrade: websocket\r\n" + WS_HANDSHAKE + b"\r\n")
    with socket.create_connection(("127.0.0.1", server.port()), timeout=5) as sock:
        sock.sendall(old + b"GET /smuggled HTTP/1.0\r\nHost: app.test\r\n\r\n")
        data = b""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:       # until nestgate closes (or 5 s)
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = sock.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                break
            data += chunk
    assert data.startswith(b"HTTP/1.1 200 ") and data.count(b"HTTP/1.1 ") == 1, data[:300]
    assert b"SMUGGLED" not in data.upper(), data[-300:]
    assert [r["target"] for r in up.requests] == ["/ws"]
    assert "upgrade" not in dict(up.requests[0]["headers"])
    assert up.tunnels_ended == []


# ------------------------------------------------------------------ idle tunnels
def test_idle_tunnel_is_closed_on_both_sides(start_server, upstream):
    up = upstream()
    server = start_server(tunnel_gateway(up.url, 'tunnel_idle_timeout = "1s"'))
    start = server.worker_rss_kib()
    sock = open_tunnel(server.port())
    opened = time.monotonic()
    with sock:
        assert closed_within(sock, 4), "an idle tunnel stayed open"
        took = time.monotonic() - opened
    # The proxy's tick watches tunnels every quarter of the timeout, against the
    # worker's coarse clock: a close comes within a tick of the second.
    assert 0.7 <= took < 3.5, f"closed after {took:.2f}s"
    assert poll(lambda: up.tunnels_ended, lambda ends: ends == ["eof"], 5) == ["eof"]
    assert server.worker_rss_kib() - start < RSS_GROWTH_BOUND_KIB


def test_tunnel_in_use_outlives_the_idle_timeout(start_server, upstream):
    up = upstream()
    server = start_server(tunnel_gateway(up.url, 'tunnel_idle_timeout = "1s"'))
    with open_tunnel(server.port()) as sock:
        deadline = time.monotonic() + 3.0          # three idle timeouts, never idle
        n = 0
        while time.monotonic() < deadline:
            n += 1
            sock.sendall(b"ping%d;" % n)
            read_until(sock, b"PING%d;" % n)
            time.sleep(0.3)
        assert not closed_within(sock, 0.1)
        assert up.tunnels_ended == []


# ------------------------------------------------------------------ upgrade with a body
UPGRADES_WITH_A_BODY = [
    # curl --http2 -d in clear: an h2c offer with a form body.
    b"POST /a HTTP/1.1\r\nHost: app.test\r\nConnection: Upgrade, HTTP2-Settings\r\n"
    b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\nContent-Length: 5\r\n\r\nhello",
    b"POST /a HTTP/1.1\r\nHost: app.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
    b"Content-Length: 5\r\n\r\nhello",
    b"POST /a HTTP/1.1\r\nHost: app.test\r\nConnection: Upgrade\r\nUpgrade: foo\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
]


def test_an_upgrade_request_with_a_body_is_refused_at_once(start_server):
    """httptools reads no body after an upgrade request's head: the proxy sent the
    upstream `content-length: 5` and no body, and client and upstream waited (8 s and
    more, until a timeout) for bytes the parser had taken for the new protocol; a
    chunked body went as an empty one. Now such a request is a 400 before anything is
    sent upstream, and the connection ends, the bytes after it unread."""
    from rawupstream import RawUpstream
    up = RawUpstream()
    try:
        server = start_server(tunnel_gateway(up.url))
        port = server.port()
        start = server.worker_rss_kib()
        for round_ in range(50):
            for request in UPGRADES_WITH_A_BODY:
                with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                    sock.sendall(request + b"GET /admin/x HTTP/1.1\r\nHost: app.test\r\n\r\n")
                    began = time.monotonic()
                    answer = read_until(sock, b"</html>\n", seconds=2)
                    assert answer.startswith(b"HTTP/1.1 400 "), answer[:80]
                    assert closed_within(sock, 2), request
                    assert time.monotonic() - began < 2
        assert up.take() == []
        grown = server.worker_rss_kib() - start
        assert grown < RSS_GROWTH_BOUND_KIB, f"worker grew {grown} KiB"
        # The same requests without Upgrade are served with their bodies.
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"POST /a HTTP/1.1\r\nHost: app.test\r\nContent-Length: 5\r\n"
                         b"Connection: close\r\n\r\nhello")
            assert read_until(sock, b"/a").startswith(b"HTTP/1.1 200 ")
        assert [(r["target"], r["body"]) for r in up.take()] == [("/a", b"hello")]
    finally:
        up.stop()


# ------------------------------------------------------------------ the upstream's 101
def switching(accepts: list[bytes]) -> bytes:
    """A 101 to websocket with these Sec-WebSocket-Accept values, then a frame's worth
    of bytes (what would be tunnelled)."""
    return (b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n"
            + b"".join(b"sec-websocket-accept: %b\r\n" % a for a in accepts) + b"\r\nhello")


SWITCHES = {
    "/ws/answers-the-key": switching([websocket_accept(WS_KEY)]),
    "/ws/answers-another-key": switching([websocket_accept(b"x3JJHMbDL1EzLkh9GBhXDw==")]),
    "/ws/answers-nothing": switching([]),
    "/ws/answers-twice": switching([websocket_accept(WS_KEY)] * 2),
    "/ws/echoes-the-key": switching([WS_KEY]),
    "/plain": switching([websocket_accept(WS_KEY)]),
}


def ask_for_a_tunnel(port: int, target: bytes, handshake: bytes = WS_HANDSHAKE) -> bytes:
    """What a WebSocket client is sent for `target` until nestgate closes (5 s at most)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET %b HTTP/1.1\r\nHost: app.test\r\nConnection: Upgrade\r\n"
                     b"Upgrade: websocket\r\n%b\r\n" % (target, handshake))
        return read_all(sock)


def test_rfc_6455_sample_key_and_its_answer():
    # The test's own upstream and nestgate compute the answer apart; both must agree
    # with RFC 6455 1.3's example.
    from nestgate.handlers.proxy.handler import websocket_accept as nestgates
    assert websocket_accept(WS_KEY) == nestgates(WS_KEY) == b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo="


def test_a_101_that_does_not_answer_the_key_is_502(start_server):
    """RFC 6455 4.1: a client fails a WebSocket connection whose 101 lacks the
    `Sec-WebSocket-Accept` made from its key. nestgate passed any 101 on and tunnelled:
    a stale or confused upstream's 101 (or one meant for another handshake) opened a
    tunnel a browser would refuse and a plain client would trust. Now it is a 502,
    nothing tunnelled, the upstream connection closed."""
    from rawupstream import RawUpstream
    up = RawUpstream(SWITCHES)
    try:
        server = start_server(tunnel_gateway(up.url))
        port = server.port()
        good = ask_for_a_tunnel(port, b"/ws/answers-the-key")
        assert good.startswith(b"HTTP/1.1 101 ") and good.endswith(b"\r\n\r\nhello"), good
        assert b"\r\nsec-websocket-accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n" in good
        for target in (b"/ws/answers-another-key", b"/ws/answers-nothing",
                       b"/ws/answers-twice", b"/ws/echoes-the-key"):
            answer = ask_for_a_tunnel(port, target)
            assert answer.startswith(b"HTTP/1.1 502 "), (target, answer[:200])
            assert answer.count(b"HTTP/1.1 ") == 1 and b"hello" not in answer, target
        # A handshake without a key (or with two) cannot be answered: no tunnel either.
        for handshake in (b"Sec-WebSocket-Version: 13\r\n",
                          WS_HANDSHAKE + b"Sec-WebSocket-Key: x3JJHMbDL1EzLkh9GBhXDw==\r\n"):
            answer = ask_for_a_tunnel(port, b"/ws/answers-the-key", handshake)
            assert answer.startswith(b"HTTP/1.1 502 "), (handshake, answer[:200])
        assert len(up.take()) == 7
    finally:
        up.stop()


def test_a_101_to_a_request_that_did_not_ask_to_upgrade_is_502(start_server):
    # GET (answered from the parser's callbacks), POST with a body (in a task), and
    # over HTTP/2, where no request can upgrade: nothing tunnelled, and the next
    # request gets its own answer from another upstream connection.
    from h2client import H2Client
    from rawupstream import RawUpstream
    up = RawUpstream(SWITCHES)
    try:
        server = start_server(proxy_toml(up.url, listeners="http2_cleartext = true"))
        port = server.port()
        for request in (b"GET /plain HTTP/1.1\r\nHost: app.test\r\n\r\n",
                        b"POST /plain HTTP/1.1\r\nHost: app.test\r\nContent-Length: 2\r\n\r\nhi"):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(request + b"GET /after HTTP/1.1\r\nHost: app.test\r\n"
                             b"Connection: close\r\n\r\n")
                data = read_all(sock)
            assert data.startswith(b"HTTP/1.1 502 "), data[:200]
            assert b"hello" not in data and data.endswith(b"\r\n\r\n/after"), data[-200:]
        client = H2Client(port, None)
        try:
            assert client.request("GET", "/plain")[0] == 502
            assert client.request("POST", "/plain", body=b"hi")[0] == 502
            assert client.request("GET", "/after")[::2] == (200, b"/after")
        finally:
            client.close()
        taken = up.take()
        assert [r["target"] for r in taken] == ["/plain", "/after"] * 2 + \
            ["/plain", "/plain", "/after"]
        for index, record in enumerate(taken):      # nothing after a 101 on its connection
            if record["target"] == "/plain":
                assert all(later["conn"] != record["conn"] for later in taken[index + 1:])
    finally:
        up.stop()
