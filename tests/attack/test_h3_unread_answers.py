"""HTTP/3 clients that ask for large ready answers (a cached file) on every stream and
acknowledge none of them.

aioquic copies what it is given to send into the stream and keeps it until the client
acknowledges it. A ready answer went in whole: four connections of 120 streams each
asking for a cached 900 KiB file, read by nobody, grew the worker by 211 MiB, for as
long as the client kept its connections alive. Now a connection's streams hold at most
about 1 MiB unacknowledged (HTTP/2's output budget): a larger ready answer that does
not fit goes out in pieces as the client takes them, and `send_timeout` resets a stream
that waits that long."""

from __future__ import annotations

import asyncio
import os

import pytest

import h3client

pytestmark = pytest.mark.attack

SIZE = 900 * 1024                      # under the static cache's 1 MiB `cache_file_max`
CONNECTIONS, STREAMS = 4, 120
RSS_GROWTH_KIB = 48 * 1024             # before: 211 MiB (4 x 120 x 900 KiB, in part)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, certs):
    folder = tmp_path_factory.mktemp("h3unread")
    (folder / "www").mkdir()
    (folder / "www" / "big.bin").write_bytes(os.urandom(SIZE))
    routes = h3client.HELLO_AND_APP + f"""
[[site.route]]
prefix = "/files/"
type = "static"
root = "{folder / 'www'}"
warm = true
"""
    for server in h3client.serve_with_upstream(folder, certs, h3client.RecordingUpstream, 1,
                                               routes):
        server.big = (folder / "www" / "big.bin").read_bytes()
        yield server


def test_ready_answers_nobody_acknowledges_hold_a_bounded_amount(gateway, certs):
    rss_before = gateway.worker_rss_kib()

    async def attack():
        entered = []
        for _ in range(CONNECTIONS):
            opened = await h3client.session(gateway.port("https"), certs["ca"])
            client = await opened.__aenter__()
            entered.append((opened, client))
            reply = await asyncio.wait_for(
                client.send_request("GET", "/files/big.bin", "localhost"), 10)
            assert (reply.status, len(reply.body)) == (200, SIZE)     # cached now
            client.datagram_received = lambda data, addr: None     # reads (acks) no more
            for _ in range(STREAMS):
                unread = client.send_request("GET", "/files/big.bin", "localhost")
                unread.add_done_callback(lambda done: done.exception())   # never read
            client.transmit()
        for _ in range(20):                   # the requests are resent until the server
            await asyncio.sleep(0.1)          # has them all (their acks go unread too)
            for _opened, client in entered:
                client.transmit()
        grown = gateway.worker_rss_kib() - rss_before
        for _opened, client in entered:
            client.close()
        return grown

    grown = asyncio.run(attack())
    assert grown < RSS_GROWTH_KIB, f"worker grew {grown} KiB"
    reply = h3client.fetch(gateway.port("https"), certs["ca"], "/hello")
    assert (reply.status, reply.body) == (200, b"hello")


def test_large_ready_answers_come_whole_to_a_client_that_reads(gateway, certs):
    """Thirty streams of the cached file at once on one connection: more than the
    connection may hold, so most go out in pieces; each arrives whole."""
    replies = asyncio.run(h3client.requests(
        gateway.port("https"), certs["ca"],
        [("GET", "/files/big.bin", (), None)] * 30 + [("HEAD", "/files/big.bin", (), None)],
        timeout=60))
    assert all(r.status == 200 and r.body == gateway.big for r in replies[:-1])
    assert (replies[-1].status, replies[-1].body) == (200, b"")
