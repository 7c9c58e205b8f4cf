"""HTTP/3 clients that make the server work for nothing: streams cancelled before their
answer (rapid reset, CVE-2023-44487 carried over to QUIC) and request heads past the
header limit, bodies in one-byte DATA frames. Each ends its connection with
H3_EXCESSIVE_LOAD, reaches the upstream
no more than the limit allows, leaves the worker's memory where it was, and another
client is answered meanwhile."""

from __future__ import annotations

import asyncio
import random
import string
import time

import pytest

import h3client
from nestgate.wire.h2guard import RESET_ALLOWANCE

pytestmark = pytest.mark.attack

EXCESSIVE_LOAD = 0x107
RSS_GROWTH_KIB = 16 * 1024


class _SlowUpstream(h3client.RecordingUpstream):
    seen: list = []

    def do_GET(self):
        self.seen.append(self.path)
        time.sleep(0.5)                # long enough that a reset comes before the answer
        body = b"slow"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, certs):
    yield from h3client.serve_with_upstream(tmp_path_factory.mktemp("h3flood"), certs,
                                            _SlowUpstream, 1, h3client.HELLO_AND_APP)


def _still_answered(server, certs) -> None:
    reply = h3client.fetch(server.port("https"), certs["ca"], "/hello")
    assert (reply.status, reply.body) == (200, b"hello")


async def _reset_each(port: int, ca: str, streams: int) -> int | None:
    """Open `streams` requests, each reset right behind its head; the code the server
    closed the connection with (None: it did not within the time)."""
    async with await h3client.session(port, ca) as client:
        quic = client._quic
        deadline = time.monotonic() + 20
        for n in range(streams):
            if client.closed_with is not None:
                break
            stream_id = quic.get_next_available_stream_id()
            # A stream past the server's grant would wait, and its reset would drop
            # its head: wait for the grant (MAX_STREAMS) as a real client's send does.
            while stream_id // 4 >= quic._remote_max_streams_bidi and \
                    client.closed_with is None and time.monotonic() < deadline:
                await asyncio.sleep(0.005)
            client.http.send_headers(stream_id, [
                (b":method", b"GET"), (b":scheme", b"https"), (b":authority", b"localhost"),
                (b":path", f"/app/r{n}".encode())], end_stream=True)
            client.transmit()                 # the head leaves before its reset would drop it
            # A request sent in full is cancelled by STOP_SENDING (H3_REQUEST_CANCELLED):
            # a browser leaving a page does so.
            quic.stop_stream(stream_id, 0x10C)
            client.transmit()
        deadline = min(deadline, time.monotonic() + 10)
        while client.closed_with is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return client.closed_with


def test_rapid_reset_ends_the_connection(gateway, certs):
    before = gateway.worker_rss_kib()
    _SlowUpstream.seen.clear()
    port = gateway.port("https")
    for _round in range(3):
        assert asyncio.run(_reset_each(port, certs["ca"], 4 * RESET_ALLOWANCE)) == \
            EXCESSIVE_LOAD
        _still_answered(gateway, certs)
    # Each round is cut after RESET_ALLOWANCE-odd resets: nowhere near every stream
    # it sent became an upstream request.
    assert len(_SlowUpstream.seen) < 3 * 2 * RESET_ALLOWANCE, len(_SlowUpstream.seen)
    assert gateway.worker_rss_kib() - before < RSS_GROWTH_KIB


def _letters(count: int) -> str:
    return "".join(random.choices(string.ascii_lowercase, k=count))


async def _big_head(port: int, ca: str, field_bytes: int, fields: int = 1):
    async with await h3client.session(port, ca) as client:
        done = client.send_request("GET", "/hello", "localhost",
                                   [(f"x-big-{n}", _letters(field_bytes)) for n in range(fields)])
        try:
            reply = await asyncio.wait_for(done, 10)
        except ConnectionError:
            return None, client.closed_with
        return reply, client.closed_with


def test_a_head_past_the_header_limit_ends_the_connection(gateway, certs):
    # max_header_bytes is 32 KiB: 200 KiB of fields (some 125 KiB once QPACK's Huffman
    # code packs them) are held back as they arrive, never decoded.
    before = gateway.worker_rss_kib()
    for _round in range(5):
        reply, closed = asyncio.run(_big_head(gateway.port("https"), certs["ca"], 2048, 100))
        assert reply is None and closed == EXCESSIVE_LOAD
    _still_answered(gateway, certs)
    assert gateway.worker_rss_kib() - before < RSS_GROWTH_KIB


async def _big_head_behind_a_higher_stream(port: int, ca: str):
    """A small request on stream 4, then the head past the limit on stream 0, which
    reaches the server after stream 4 opened it (a client may send in any order; a lost
    and resent datagram does it too). aioquic's client sends streams in order, so its
    next stream id is moved by hand."""
    async with await h3client.session(port, ca) as client:
        quic = client._quic
        quic._local_next_stream_id_bidi = 4
        first = client.send_request("GET", "/hello", "localhost")
        quic._local_next_stream_id_bidi = 0
        late = client.send_request("GET", "/hello", "localhost",
                                   [(f"x-big-{n}", _letters(2048)) for n in range(100)])
        quic._local_next_stream_id_bidi = 8
        try:
            await asyncio.wait_for(asyncio.gather(first, late), 10)
        except (ConnectionError, asyncio.TimeoutError):
            pass
        return client.closed_with


def test_a_head_past_the_limit_behind_a_higher_stream_ends_the_connection(gateway, certs):
    # The bytes of a stream that a higher one opened are counted as any other's. Without
    # that, this head went uncounted, was held whole and never answered, and the
    # connection stayed open.
    before = gateway.worker_rss_kib()
    for _round in range(5):
        assert asyncio.run(_big_head_behind_a_higher_stream(gateway.port("https"),
                                                            certs["ca"])) == EXCESSIVE_LOAD
    _still_answered(gateway, certs)
    assert gateway.worker_rss_kib() - before < RSS_GROWTH_KIB


def test_a_decoded_head_over_the_limit_is_431_on_its_stream(gateway, certs):
    # Within the encoded bound but over max_header_bytes once decoded: the stream's
    # answer is 431, as on HTTP/2, and the connection goes on.
    reply, closed = asyncio.run(_big_head(gateway.port("https"), certs["ca"], 33 * 1024))
    assert closed is None and reply.status == 431


async def _put_in_frames(port: int, ca: str, path: str, pieces: list[bytes]):
    """PUT `path` with a body sent as one DATA frame per piece: the answer's status (0
    for none) and the code the server closed the connection with (None: it did not)."""
    async with await h3client.session(port, ca) as client:
        stream_id = client._quic.get_next_available_stream_id()
        reply, done = h3client.Reply(), asyncio.get_running_loop().create_future()
        client.replies[stream_id] = (reply, done)
        client.http.send_headers(stream_id, [
            (b":method", b"PUT"), (b":scheme", b"https"), (b":authority", b"localhost"),
            (b":path", path.encode())], end_stream=False)
        for piece in pieces:
            client.http.send_data(stream_id, piece, end_stream=False)
        client.http.send_data(stream_id, b"", end_stream=True)
        client.transmit()
        try:
            await asyncio.wait_for(done, 10)
        except (ConnectionError, asyncio.TimeoutError):
            pass
        return reply.status, client.closed_with


def test_a_body_in_one_byte_data_frames_ends_the_connection(gateway, certs):
    """6,000 DATA frames of one byte (3 bytes each on the wire): past
    body_chunk_allowance (4,096) they average under min_body_chunk_average, so the
    connection ends with H3_EXCESSIVE_LOAD and the upstream never gets the whole body;
    a body in frames of a few KB, and 5,000 frames of 100 bytes, pass whole."""
    before = gateway.worker_rss_kib()
    _SlowUpstream.seen.clear()
    port = gateway.port("https")
    assert asyncio.run(_put_in_frames(port, certs["ca"], "/app/tiny", [b"x"] * 6000)) \
        == (0, EXCESSIVE_LOAD)
    _still_answered(gateway, certs)
    ordinary = [b"y" * 3000] * 20
    lines = [b"%099d\n" % n for n in range(5000)]
    assert asyncio.run(_put_in_frames(port, certs["ca"], "/app/big", ordinary)) == (200, None)
    assert asyncio.run(_put_in_frames(port, certs["ca"], "/app/lines", lines)) == (200, None)
    assert _SlowUpstream.seen == [("PUT", "/app/big", 60000), ("PUT", "/app/lines", 500000)]
    assert gateway.worker_rss_kib() - before < RSS_GROWTH_KIB


@pytest.fixture(scope="module")
def small_allowance_gateway(tmp_path_factory, certs):
    yield from h3client.serve_with_upstream(tmp_path_factory.mktemp("h3pieces"), certs,
                                            _SlowUpstream, 1, """
[[site.route]]
prefix = "/app/"
type = "proxy"
upstream = "{upstream}"

[limits]
body_chunk_allowance = 100
""")


async def _small_bodies(port: int, ca: str, batches: int, each: int, body: bytes):
    """`batches` x `each` PUTs on one connection, each body one DATA frame ended by a
    FIN of its own or by trailers: the statuses, and the code the server closed the
    connection with (None: it did not)."""
    statuses = []
    async with await h3client.session(port, ca) as client:
        for batch in range(batches):
            waiting = []
            for n in range(each):
                stream_id = client._quic.get_next_available_stream_id()
                reply, done = h3client.Reply(), asyncio.get_running_loop().create_future()
                client.replies[stream_id] = (reply, done)
                client.http.send_headers(stream_id, [
                    (b":method", b"PUT"), (b":scheme", b"https"),
                    (b":authority", b"localhost"), (b":path", b"/app/small")],
                    end_stream=False)
                client.http.send_data(stream_id, body, end_stream=False)
                if (batch + n) % 2:
                    client.http.send_data(stream_id, b"", end_stream=True)
                else:
                    client.http.send_headers(stream_id, [(b"x-sum", b"1")], end_stream=True)
                waiting.append((reply, done))
            client.transmit()
            try:
                await asyncio.wait_for(asyncio.gather(*(done for _, done in waiting)), 10)
            except (ConnectionError, asyncio.TimeoutError):
                pass
            statuses += [reply.status for reply, _ in waiting]
            if client.closed_with is not None or 0 in statuses:
                break
        return statuses, client.closed_with


def test_many_small_bodies_on_one_connection_are_not_tiny_pieces(small_allowance_gateway,
                                                                 certs):
    """Small bodies each in one DATA frame, ended by a FIN of its own or by trailers:
    the frame is its body's last and is not counted, so a long-lived connection of
    small uploads (300 of 30 bytes, past an allowance of 100 and under the 64-byte
    average) is served on. Five at a time: the test upstream's listen queue is
    http.server's five."""
    _SlowUpstream.seen.clear()
    statuses, closed_with = asyncio.run(_small_bodies(
        small_allowance_gateway.port("https"), certs["ca"], 60, 5, b"j" * 30))
    assert closed_with is None
    assert statuses == [200] * 300
    assert _SlowUpstream.seen == [("PUT", "/app/small", 30)] * 300
