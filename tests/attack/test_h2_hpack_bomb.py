"""HPACK bomb: a client puts one large field into the connection's dynamic table,
then sends header blocks that name it again and again, one byte per copy. A few
hundred bytes on the wire would decode to megabytes. The decoded list is bounded
(four times `max_header_bytes`): past it the connection ends with
GOAWAY(COMPRESSION_ERROR), counted, the worker's memory stays flat over many such
connections, and other clients are served."""

from __future__ import annotations

import pytest

from conftest import h2_protections, poll, tls_hello_config
from h2raw import HeadersFrame, RawH2, get

pytestmark = pytest.mark.attack

COMPRESSION_ERROR = 0x9
ATTACKS = 60
RSS_GROWTH_BOUND_KIB = 16 * 1024
BIG = b"b" * 4000                   # one table entry: 4,032 bytes counted
COPIES = 400                        # 1.6 MB decoded from 400 bytes



def bomb(conn: RawH2) -> None:
    """The large field goes into the table with an ordinary request (answered: it is
    within the limits), then a request naming it COPIES times."""
    first = conn.new_stream()
    conn.send(HeadersFrame(first, conn.block(get() + [(b"x-big", BIG)]),
                           flags={"END_HEADERS", "END_STREAM"}))
    assert conn.answers([first])[first].status == 200
    # GET https "/" from the static table (indexes 2, 7, 4: nothing added, nothing
    # evicted), then index 62, the newest entry of the dynamic table (RFC 7541
    # 2.3.3): the large field.
    block = bytes((0x82, 0x87, 0x84)) + bytes((0x80 | 62,)) * COPIES
    conn.send(HeadersFrame(conn.new_stream(), block, flags={"END_HEADERS", "END_STREAM"}))


def test_an_hpack_bomb_ends_the_connection_and_memory_stays_flat(start_server, certs):
    server = start_server(tls_hello_config(certs))
    port = server.port("https")
    conn = RawH2(port, certs["ca"])
    bomb(conn)                                      # the first: one-time costs
    assert conn.wait_closed() and conn.goaway.error_code == COMPRESSION_ERROR
    conn.close()
    before = server.worker_rss_kib()
    for _ in range(ATTACKS):
        conn = RawH2(port, certs["ca"])
        bomb(conn)
        assert conn.wait_closed(), "the connection outlived its bomb"
        assert conn.goaway is not None and conn.goaway.error_code == COMPRESSION_ERROR
        conn.close()
    grown = server.worker_rss_kib() - before
    assert grown < RSS_GROWTH_BOUND_KIB, f"{grown} KiB after {ATTACKS} bombs"
    other = RawH2(port, certs["ca"])
    stream = other.request(get(b"/hello"))
    answer = other.answers([stream])[stream]
    assert (answer.status, bytes(answer.data)) == (200, b"hello\n")
    other.close()
    counted = poll(lambda: h2_protections(server),
                   lambda c: c.get("protocol_error", 0) >= ATTACKS + 1)
    assert counted["protocol_error"] >= ATTACKS + 1
    assert "Traceback" not in "\n".join(server.lines)
