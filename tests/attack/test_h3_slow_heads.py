"""Slow HTTP/3 heads (slowloris over QUIC): a client that begins request heads and
trickles their bytes, a few at a time, so that the connection is never idle.

HTTP/1.1 has `header_timeout` for a request head, HTTP/2 for each header block; HTTP/3
had none: the heads and the connection were held for as long as the client went on
trickling (up to 128 streams' worth of head bytes per connection). Now a head not whole
`header_timeout` after its first byte ends the connection with H3_EXCESSIVE_LOAD,
counted as `header_timeout`, while another client is answered."""

from __future__ import annotations

import asyncio
import time

import pytest
from aioquic.buffer import encode_uint_var

import h3client

pytestmark = pytest.mark.attack

EXCESSIVE_LOAD = 0x107
HEADER_TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, certs):
    routes = h3client.HELLO_AND_APP + f'\n[limits]\nheader_timeout = "{HEADER_TIMEOUT_S:g}s"\n'
    yield from h3client.serve_with_upstream(tmp_path_factory.mktemp("h3slow"), certs,
                                            h3client.RecordingUpstream, 1, routes)


def test_a_head_trickled_past_header_timeout_ends_the_connection(gateway, certs):
    async def attack() -> tuple[int | None, float]:
        async with await h3client.session(gateway.port("https"), certs["ca"]) as client:
            quic = client._quic
            streams = []
            for _ in range(8):                # eight heads begun, 4,000 bytes announced
                stream_id = quic.get_next_available_stream_id()
                quic.send_stream_data(stream_id, encode_uint_var(1) + encode_uint_var(4000))
                streams.append(stream_id)
            client.transmit()
            began = time.monotonic()
            reply = await asyncio.wait_for(client.send_request("GET", "/hello", "localhost"), 5)
            assert reply.status == 200            # the connection's other streams work
            while client.closed_with is None and time.monotonic() - began < 4 * HEADER_TIMEOUT_S:
                for stream_id in streams:
                    quic.send_stream_data(stream_id, b"\x00")    # never the whole head
                client.transmit()
                await asyncio.sleep(0.2)
            return client.closed_with, time.monotonic() - began

    closed_with, after = asyncio.run(attack())
    assert closed_with == EXCESSIVE_LOAD, f"not closed after {after:.1f} s"
    reply = h3client.fetch(gateway.port("https"), certs["ca"], "/hello")
    assert (reply.status, reply.body) == (200, b"hello")
    assert "request head not whole within header_timeout" in "\n".join(gateway.lines)
