"""A request body sent in very many tiny pieces: HTTP/1.1 chunks of one byte (6 bytes on
the wire each), HTTP/2 DATA frames of one byte (10 bytes each).

Each piece costs the interpreter work that nginx, in C, hardly notices, so a client on
a modest link could keep a worker busy. The pieces of one read reach the handler (and
the upstream) together, so a piece costs about a parser callback; past
`body_chunk_allowance` pieces on a connection, pieces averaging under
`min_body_chunk_average` bytes end it (HTTP/1.1: 400 and close; HTTP/2:
GOAWAY(ENHANCE_YOUR_CALM)). The worker's CPU time is read from /proc and held to a
multiple of what the same bytes cost in big pieces: generous, so a slow machine
cannot fail it, yet far below what one write per piece cost.
"""

from __future__ import annotations

import hashlib
import random
import socket
import threading
import time

import pytest
from conftest import cpu_seconds, h2_protections, poll, rss_kib
from h2raw import DataFrame, HeadersFrame, RawH2, raw_frame
from rawupstream import RawUpstream, proxy_toml

ENHANCE_YOUR_CALM = 0xB
CHUNKS = 100_000
RSS_GROWTH_BOUND_KIB = 16 * 1024
# The worker's CPU for a body of CHUNKS one-byte chunks, over its CPU for a body of as
# many bytes on the wire in one chunk. Measured on 2 shared cores: about 10 with the
# pieces of a read passed on together, about 150 with a write upstream per chunk.
FORWARDED_COST_RATIO = 50
# HTTP/2: 60,000 one-byte DATA frames over the same body in 8,000-byte frames.
H2_FORWARDED_COST_RATIO = 60
# The same, when the connection is refused after body_chunk_allowance chunks: 1 to 3.
REFUSED_COST_RATIO = 25


@pytest.fixture
def upstream():
    up = RawUpstream()
    yield up
    up.stop()


def gateway(start_server, up: RawUpstream, limits: str = ""):
    server = start_server(proxy_toml(up.url, listeners="http2_cleartext = true\n",
                                     routes=f"\n[limits]\n{limits}\n"))
    return server, server.worker_pids()[0]


def chunked_put(port: int, target: str, body_chunks: list[bytes], trailers: bytes = b""):
    """PUT `target` with a chunked body of `body_chunks`, sent in one write while the
    answer is read: (status line, the whole answer, whether the server closed)."""
    wire = b"".join(b"%x\r\n%b\r\n" % (len(c), c) for c in body_chunks)
    data = (b"PUT %b HTTP/1.1\r\nhost: app.test\r\ntransfer-encoding: chunked\r\n\r\n"
            % target.encode()) + wire + b"0\r\n" + trailers + b"\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sender = threading.Thread(target=_send, args=(sock, data))
        sender.start()
        answer, closed = b"", False
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            head, _, rest = answer.partition(b"\r\n\r\n")
            if b"content-length: %d" % len(rest) in head.lower() and \
                    b"connection: close" not in head.lower():
                break                            # whole, and the connection goes on
            try:
                got = sock.recv(65536)
            except ConnectionResetError:
                got = b""
            if not got:
                closed = True
                break
            answer += got
        sender.join(30)
        return answer.split(b"\r\n", 1)[0], answer, closed


def _send(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
    except OSError:
        pass                 # the server refused the body and closed


def cost(pid: int, send) -> float:
    """The worker's CPU seconds while `send()` runs."""
    before = cpu_seconds(pid)
    send()
    return cpu_seconds(pid) - before


def test_a_body_in_tiny_chunks_costs_a_multiple_of_its_bytes_not_a_write_each(
        start_server, upstream):
    """With the chunk check off, 100,000 one-byte chunks reach the upstream whole, and
    the worker spends on them a bounded multiple of what as many bytes on the wire
    cost in one chunk (a write upstream per chunk cost about 150 times that)."""
    server, pid = gateway(start_server, upstream, "min_body_chunk_average = 0")
    port = server.port()
    assert chunked_put(port, "/warm", [b"w"])[0] == b"HTTP/1.1 200 OK"   # pool connection
    assert upstream.take()[0]["body"] == b"w"
    rss_before = rss_kib(pid)
    tiny = [b"x"] * CHUNKS
    wire_bytes = len(b"".join(b"%x\r\n%b\r\n" % (len(c), c) for c in tiny))
    whole = cost(pid, lambda: chunked_put(port, "/whole", [b"y" * wire_bytes]))
    many = cost(pid, lambda: chunked_put(port, "/tiny", tiny))
    got = {r["target"]: r["body"] for r in upstream.take()}
    assert got == {"/whole": b"y" * wire_bytes, "/tiny": b"x" * CHUNKS}
    assert many < FORWARDED_COST_RATIO * whole, (many, whole)
    assert rss_kib(pid) - rss_before < RSS_GROWTH_BOUND_KIB


def test_a_connection_of_tiny_chunks_is_refused(start_server, upstream):
    """Under the default limits, a body of one-byte chunks gets 400 and the
    connection closes once it passes body_chunk_allowance chunks; the upstream never
    sees a whole request, and the worker spends about what the bytes cost."""
    server, pid = gateway(start_server, upstream)
    port = server.port()
    assert chunked_put(port, "/warm", [b"w"])[0] == b"HTTP/1.1 200 OK"
    upstream.take()
    rss_before = rss_kib(pid)
    tiny = [b"x"] * CHUNKS
    whole = cost(pid, lambda: chunked_put(port, "/whole", [b"y" * CHUNKS]))
    answers = []
    spent = cost(pid, lambda: answers.append(chunked_put(port, "/tiny", tiny)))
    status, _answer, closed = answers[0]
    assert status == b"HTTP/1.1 400 Bad Request" and closed
    assert [r["target"] for r in upstream.take()] == ["/whole"]   # /tiny never whole
    assert spent < REFUSED_COST_RATIO * whole, (spent, whole)
    assert rss_kib(pid) - rss_before < RSS_GROWTH_BOUND_KIB
    assert chunked_put(port, "/after", [b"z"])[0] == b"HTTP/1.1 200 OK"  # others served


def test_tiny_chunks_are_counted_over_the_requests_of_a_connection(start_server, upstream):
    """Requests of 2,000 one-byte chunks each, one after another on one connection:
    the count runs over the connection, so the third passes the allowance and gets
    400 (its body whole in one read or not); the first two were forwarded."""
    server, _pid = gateway(start_server, upstream)
    body = b"".join(b"1\r\nx\r\n" for _ in range(2000)) + b"0\r\n\r\n"
    head = b"PUT /r%d HTTP/1.1\r\nhost: app.test\r\ntransfer-encoding: chunked\r\n\r\n"
    answers = []
    with socket.create_connection(("127.0.0.1", server.port()), timeout=10) as sock:
        reader = sock.makefile("rb")
        for number in range(3):
            sock.sendall(head % number + body)
            status = reader.readline()
            answers.append(status.strip())
            fields = {}
            while (line := reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode().partition(":")
                fields[name.lower()] = value.strip()
            reader.read(int(fields.get("content-length", 0)))
        assert reader.read() == b""                       # closed after the 400
    assert answers == [b"HTTP/1.1 200 OK"] * 2 + [b"HTTP/1.1 400 Bad Request"]
    assert [r["target"] for r in upstream.take()] == ["/r0", "/r1"]


def test_tiny_data_frames_end_the_connection_with_goaway(start_server, upstream):
    """HTTP/2: one-byte DATA frames past body_chunk_allowance end the connection with
    GOAWAY(ENHANCE_YOUR_CALM), counted as small_data_frames; the upstream never sees a
    whole request, and the worker spends about what the bytes cost."""
    server, pid = gateway(start_server, upstream)
    port = server.port()
    rss_before = rss_kib(pid)

    def big_frames() -> None:
        conn = RawH2(port, None)
        stream = conn.request(put(b"/whole"), end=False)
        conn.send(*(DataFrame(stream, b"y" * 8000) for _ in range(7)),
                  DataFrame(stream, b"y" * 4000, flags={"END_STREAM"}))
        assert conn.answers([stream])[stream].status == 200
        conn.close()
    whole = cost(pid, big_frames)

    conn = RawH2(port, None)
    stream = conn.request(put(b"/tiny"), end=False)
    # 6,000 frames of one byte: within the stream's 65,535-byte window, past the
    # allowance of 4,096.
    flood = raw_frame(0, 0, stream, b"x") * 6000
    spent = cost(pid, lambda: (conn.send(flood), conn.wait_closed(10)))
    assert conn.goaway is not None and conn.goaway.error_code == ENHANCE_YOUR_CALM
    conn.close()
    assert [r["target"] for r in upstream.take()] == ["/whole"]
    assert poll(lambda: h2_protections(server),
                lambda c: c.get("small_data_frames") == 1).get("small_data_frames") == 1
    assert spent < REFUSED_COST_RATIO * whole, (spent, whole)
    assert rss_kib(pid) - rss_before < RSS_GROWTH_BOUND_KIB


def test_a_body_in_tiny_data_frames_costs_a_multiple_of_its_bytes(start_server, upstream):
    """HTTP/2 with the chunk check off: 60,000 one-byte DATA frames (within the
    stream's first window) reach the upstream whole, for a bounded multiple of what the
    same body costs in 8,000-byte frames: about 25 (a frame at a time cost 140-200 times it)."""
    server, pid = gateway(start_server, upstream, "min_body_chunk_average = 0")
    port = server.port()
    rss_before = rss_kib(pid)

    def send(path: bytes, frames_: bytes) -> None:
        conn = RawH2(port, None)
        stream = conn.request(put(path), end=False)
        conn.send(frames_, raw_frame(0, 1, stream))              # then END_STREAM
        assert conn.answers([stream])[stream].status == 200
        conn.close()
    whole = cost(pid, lambda: send(b"/whole", raw_frame(0, 0, 1, b"y" * 8000) * 7
                                   + raw_frame(0, 0, 1, b"y" * 4000)))
    many = cost(pid, lambda: send(b"/tiny", raw_frame(0, 0, 1, b"x") * 60_000))
    got = {r["target"]: r["body"] for r in upstream.take()}
    assert got == {"/whole": b"y" * 60_000, "/tiny": b"x" * 60_000}
    assert many < H2_FORWARDED_COST_RATIO * whole, (many, whole)
    assert rss_kib(pid) - rss_before < RSS_GROWTH_BOUND_KIB


def test_many_small_bodies_on_one_connection_are_not_tiny_pieces(start_server, upstream):
    """HTTP/2 clients that end a body with an empty DATA frame (curl, nghttp2, Go) or
    with trailers make each small body's one frame a piece followed by its end: those
    pieces are not counted, so a long-lived connection of small uploads (here past an
    allowance of 100, each body 30 bytes, under the 64-byte average) is served on."""
    server, _pid = gateway(start_server, upstream, "body_chunk_allowance = 100")
    conn = RawH2(server.port(), None)
    body = b"j" * 30
    for batch in range(6):
        streams = []
        for n in range(50):
            stream = conn.request(put(b"/small"), end=False)
            if (batch + n) % 2:
                ending = DataFrame(stream, b"", flags={"END_STREAM"})
            else:
                ending = HeadersFrame(stream, conn.block([(b"x-sum", b"1")]),
                                      flags={"END_HEADERS", "END_STREAM"})
            conn.send(DataFrame(stream, body), ending)
            streams.append(stream)
        answers = conn.answers(streams)
        assert [answers[s].status for s in streams] == [200] * 50, conn.goaway
    assert conn.goaway is None
    conn.close()
    seen = upstream.take()
    assert len(seen) == 300 and all(r["body"] == body for r in seen)


def put(path: bytes):
    return [(b":method", b"PUT"), (b":scheme", b"http"), (b":path", path),
            (b":authority", b"app.test")]


def mixed_chunks(total: int, seed: int) -> list[bytes]:
    """A body of about `total` bytes in chunks of a few KB, a few of them tiny, as a
    streaming upload sends them."""
    rng = random.Random(seed)
    chunks, size = [], 0
    while size < total:
        n = rng.choice((1, 7, 100)) if rng.random() < 0.1 else rng.randint(1000, 8000)
        chunks.append(bytes(rng.getrandbits(8) for _ in range(n)))
        size += n
    return chunks


def test_ordinary_chunked_uploads_reach_the_upstream_byte_for_byte(start_server, upstream):
    """Under the default limits: a chunked upload of mixed sizes with trailers, one of
    8,000 chunks of 100 bytes (a log streamed line by line), and an HTTP/2 upload in
    DATA frames of mixed sizes with trailers all reach the upstream whole."""
    server, _pid = gateway(start_server, upstream)
    port = server.port()
    body = mixed_chunks(200_000, 1)
    status, _, _ = chunked_put(port, "/mixed", body, trailers=b"x-checksum: abc\r\n")
    assert status == b"HTTP/1.1 200 OK"
    lines = [b"%099d\n" % i for i in range(8_000)]
    assert chunked_put(port, "/lines", lines)[0] == b"HTTP/1.1 200 OK"

    frames_body = mixed_chunks(60_000, 2)        # within the stream's first window
    conn = RawH2(port, None)
    stream = conn.request(put(b"/h2"), end=False)
    conn.send(*(DataFrame(stream, piece) for piece in frames_body),
              HeadersFrame(stream, conn.block([(b"x-checksum", b"abc")]),
                           flags={"END_HEADERS", "END_STREAM"}))
    assert conn.answers([stream])[stream].status == 200
    conn.close()

    got = {r["target"]: hashlib.sha256(r["body"]).hexdigest() for r in upstream.take()}
    assert got == {"/mixed": hashlib.sha256(b"".join(body)).hexdigest(),
                   "/lines": hashlib.sha256(b"".join(lines)).hexdigest(),
                   "/h2": hashlib.sha256(b"".join(frames_body)).hexdigest()}
