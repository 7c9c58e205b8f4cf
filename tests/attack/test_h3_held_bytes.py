"""HTTP/3 clients that make aioquic hold bytes it cannot pass on: a stream whose first
byte never comes while its far end does (QUIC flow control), and a frame HTTP/3 reads
only whole, announced at 64 MiB (trailers, a control stream's MAX_PUSH_ID).

aioquic doubled a stream's and a connection's receive window whenever the client sent
past half of it, counting the highest offset seen rather than the bytes delivered: one
byte at the end of each window, with the first byte left out, and the worker held a
zero-filled hole that doubled each round trip (+890 MB from about ten one-byte frames). Now
the windows move with what was delivered in order. A frame read whole was held, and
copied again with each datagram, for as long as it kept coming; now past the header
limit the connection ends with H3_EXCESSIVE_LOAD."""

from __future__ import annotations

import asyncio
import time

import pytest
from aioquic.buffer import encode_uint_var
from aioquic.quic.packet import QuicStreamFrame

import h3client

pytestmark = pytest.mark.attack

EXCESSIVE_LOAD = 0x107
RSS_GROWTH_KIB = 16 * 1024
HOLE_TARGET = 128 << 20          # where the hole attack stops, granted or not
FRAME_HEADERS, FRAME_MAX_PUSH_ID = 0x1, 0xD


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, certs):
    yield from h3client.serve_with_upstream(tmp_path_factory.mktemp("h3held"), certs,
                                            h3client.RecordingUpstream, 1,
                                            h3client.HELLO_AND_APP)


class _FarEnds:
    """A stream's sender for aioquic's client that never sends the first byte, and sends
    one byte at the far end of each window the server grants (up to `target`)."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.highest_offset = self.next_offset = 0
        self.reset_pending = self.is_finished = self.buffer_is_empty = False

    def get_frame(self, max_size: int, max_offset: int | None = None):
        if max_offset is None or max_offset - 1 <= self.highest_offset or \
                self.highest_offset >= self.target:
            return None
        self.highest_offset = self.next_offset = max_offset
        return QuicStreamFrame(data=b"x", offset=max_offset - 1)

    def on_data_delivery(self, *args) -> None:
        pass


def test_a_stream_whose_first_byte_never_comes_holds_one_window(gateway, certs):
    """Before: the windows doubled to 128 MiB in about ten round trips and the worker
    grew by as much; now the client is granted one window, and held to it (the
    connection's window too, which the hole fills: that connection can send no more)."""
    rss_before = gateway.worker_rss_kib()

    async def attack() -> int:
        async with await h3client.session(gateway.port("https"), certs["ca"]) as client:
            quic = client._quic
            stream = quic._get_or_create_stream_for_send(quic.get_next_available_stream_id())
            stream.sender = _FarEnds(HOLE_TARGET)
            client.transmit()
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline and stream.sender.highest_offset < HOLE_TARGET:
                await asyncio.sleep(0.1)
            return stream.sender.highest_offset

    reached = asyncio.run(attack())
    assert reached <= 2 << 20, reached
    assert gateway.worker_rss_kib() - rss_before < RSS_GROWTH_KIB
    reply = h3client.fetch(gateway.port("https"), certs["ca"], "/hello")
    assert (reply.status, reply.body) == (200, b"hello")


async def _announce_and_send(client, stream_id: int, frame_type: int, sent: int) -> None:
    """A frame of `frame_type` announced at 64 MiB on `stream_id`, then `sent` bytes of it,
    as fast as the windows let them go; returns when the server closed the connection
    (or once all are sent)."""
    quic = client._quic
    quic.send_stream_data(stream_id, encode_uint_var(frame_type) + encode_uint_var(64 << 20))
    piece = b"a" * 16384
    for _ in range(sent // len(piece)):
        if client.closed_with is not None:
            return
        quic.send_stream_data(stream_id, piece)
        client.transmit()
        while len(quic._streams[stream_id].sender._buffer) > 256 * 1024 \
                and client.closed_with is None:
            await asyncio.sleep(0.01)
    await asyncio.sleep(1)


@pytest.mark.parametrize("where", ["trailers", "control stream"])
def test_a_frame_read_whole_past_the_header_limit_ends_the_connection(gateway, certs, where):
    """Trailers after a body, or a MAX_PUSH_ID frame on the client's control stream,
    announced at 64 MiB: H3_EXCESSIVE_LOAD once the bytes held pass the header limit.
    Before: 4 MiB of it held, copied again with each datagram (seconds of CPU), and the
    connection kept."""
    rss_before = gateway.worker_rss_kib()

    async def attack() -> int | None:
        async with await h3client.session(gateway.port("https"), certs["ca"]) as client:
            if where == "trailers":
                stream_id = client._quic.get_next_available_stream_id()
                client.send_request("PUT", "/app/held", "localhost", body=b"body", end=False)
            else:
                stream_id = client.http._local_control_stream_id
            frame_type = FRAME_HEADERS if where == "trailers" else FRAME_MAX_PUSH_ID
            await asyncio.wait_for(_announce_and_send(client, stream_id, frame_type, 4 << 20), 30)
            return client.closed_with

    assert asyncio.run(attack()) == EXCESSIVE_LOAD
    assert gateway.worker_rss_kib() - rss_before < RSS_GROWTH_KIB
    reply = h3client.fetch(gateway.port("https"), certs["ca"], "/hello")
    assert (reply.status, reply.body) == (200, b"hello")
