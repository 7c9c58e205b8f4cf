"""Header blocks kept decoded: the engine remembers what a header block decoded to
(a client repeats its requests), up to 64 blocks a connection for the connection's
life. Large distinct blocks that change no HPACK table made that about 3.9 MB per
idle connection: 40 connections took a worker from 30 to 186 MB, not returned after
they closed. The blocks kept are bounded in bytes per connection and per worker, and
given back when a connection closes."""

from __future__ import annotations

from conftest import tls_hello_config
from h2raw import HeadersFrame, RawH2, get, unindexed_block

CONNECTIONS = 48
REQUESTS = 64                   # as many blocks as a connection kept
VALUE_BYTES = 12 * 1024         # a block fits one frame, and max_header_bytes
RSS_GROWTH_KIB = 16 * 1024      # before: about 75 MiB for these connections


def block(conn_no: int, request_no: int) -> bytes:
    """A header block that changes no table and differs from every other one, so each
    is decoded and may be kept."""
    fill = (b"%04d-%04d-" % (conn_no, request_no)) * (VALUE_BYTES // 10)
    return unindexed_block(get() + [(b"x-fill", fill)])


def fill(conn: RawH2, conn_no: int) -> None:
    streams = [conn.new_stream() for _ in range(REQUESTS)]
    conn.send(*(HeadersFrame(s, block(conn_no, i), flags={"END_HEADERS", "END_STREAM"})
                for i, s in enumerate(streams)))
    answers = conn.answers(streams, timeout=20)
    assert all(answers[s].status == 200 for s in streams)


def test_kept_header_blocks_are_bounded_per_connection_and_worker(start_server, certs):
    server = start_server(tls_hello_config(certs))
    port = server.port("https")
    warm = RawH2(port, certs["ca"])              # imports, TLS, the allocator's first arenas
    fill(warm, 9999)
    warm.close()
    before = server.worker_rss_kib()
    conns = []
    for n in range(CONNECTIONS):
        conn = RawH2(port, certs["ca"])
        fill(conn, n)
        conns.append(conn)
    open_growth = server.worker_rss_kib() - before
    for conn in conns:
        conn.close()
    probe = RawH2(port, certs["ca"])             # the worker has seen the closes by now
    stream = probe.request(get())
    assert probe.answers([stream])[stream].status == 200
    probe.close()
    closed_growth = server.worker_rss_kib() - before
    print(f"worker RSS +{open_growth} KiB with {CONNECTIONS} idle connections, "
          f"+{closed_growth} KiB after they closed")
    assert open_growth < RSS_GROWTH_KIB
    assert closed_growth < RSS_GROWTH_KIB
