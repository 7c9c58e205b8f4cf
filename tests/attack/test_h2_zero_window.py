"""Clients that open many streams for a large file and grant no flow-control window:
the server reads nothing ahead of the window, so the worker's memory stays flat,
and `send_timeout` resets the stalled streams."""

from __future__ import annotations

import time

from conftest import STATIC_SITE
from h2raw import (
    SETTINGS_INITIAL_WINDOW_SIZE,
    RawH2,
    WindowUpdateFrame,
    get,
    open_streams,
    wait_all_reset,
)

CONNECTIONS, STREAMS = 10, 100    # 1,000 abusive streams
FILE_BYTES = 4 << 20
RSS_GROWTH_BOUND_KIB = 48 * 1024     # 1,000 streams; 256 KiB read ahead each was 250 MiB
SEND_TIMEOUT_S = 3
CANCEL = 0x8


def big_file_server(start_server, certs, tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    (root / "big.bin").write_bytes(b"x" * FILE_BYTES)
    tls = (f'[[listen.certificate]]\ncert = "{certs["local"][0]}"\n'
           f'key = "{certs["local"][1]}"\nnames = ["localhost"]\n')
    config = STATIC_SITE.format(root=root, extra="", recheck="1s", workers=1, tls=tls) + (
        f'\n[limits]\nsend_timeout = "{SEND_TIMEOUT_S}s"\nkeepalive_timeout = "60s"\n')
    return start_server(config)


def test_zero_window_streams_hold_no_file_data_and_time_out(start_server, certs, tmp_path):
    server = big_file_server(start_server, certs, tmp_path)
    port = server.port("https")
    base = server.worker_rss_kib()
    conns = [RawH2(port, certs["ca"], settings={SETTINGS_INITIAL_WINDOW_SIZE: 0})
             for _ in range(CONNECTIONS)]
    streams = open_streams(conns, STREAMS, b"/big.bin")
    for conn, ids in zip(conns, streams):
        conn.wait(lambda conn=conn, ids=ids: all(conn.streams[s].status for s in ids), timeout=10)
    peak, until = base, time.monotonic() + 1.5
    while time.monotonic() < until:               # the reads behind the heads
        peak = max(peak, server.worker_rss_kib())
        for conn in conns:
            conn.pump(0.01)
    answered = sum(1 for conn, ids in zip(conns, streams) for s in ids
                   if conn.streams[s].status == 200)
    print(f"zero window: {answered} streams answered 200, worker RSS {base} -> {peak} KiB "
          f"(+{(peak - base) / 1024:.1f} MiB)")
    assert answered == CONNECTIONS * STREAMS
    assert peak - base < RSS_GROWTH_BOUND_KIB
    cancelled, took = wait_all_reset(conns, streams, SEND_TIMEOUT_S + 5, CANCEL)
    print(f"zero window: {cancelled} streams reset (CANCEL) {took:.1f} s later")
    assert cancelled == CONNECTIONS * STREAMS
    for conn in conns:
        conn.close()


UNREAD_CONNECTIONS = 4
UNREAD_RSS_BOUND_KIB = 64 * 1024     # 400 streams; 256 KiB read ahead each was 100 MiB


def test_a_client_that_opens_its_windows_but_reads_nothing_holds_a_bounded_amount(
        start_server, certs, tmp_path):
    server = big_file_server(start_server, certs, tmp_path)
    port = server.port("https")
    base = server.worker_rss_kib()
    conns = [RawH2(port, certs["ca"], settings={SETTINGS_INITIAL_WINDOW_SIZE: 2**31 - 1})
             for _ in range(UNREAD_CONNECTIONS)]
    for conn in conns:
        ids = [conn.new_stream() for _ in range(STREAMS)]
        conn.send(WindowUpdateFrame(0, window_increment=2**31 - 1 - 65535),
                  *(conn.headers_frame(s, get(b"/big.bin")) for s in ids))
    peak, until = base, time.monotonic() + SEND_TIMEOUT_S + 2.0
    while time.monotonic() < until:               # the client reads nothing
        peak = max(peak, server.worker_rss_kib())
        time.sleep(0.05)
    print(f"unread: worker RSS {base} -> {peak} KiB (+{(peak - base) / 1024:.1f} MiB)")
    assert peak - base < UNREAD_RSS_BOUND_KIB
    for conn in conns:               # send_timeout has cut them off: what came, then EOF
        conn.wait(lambda conn=conn: conn.closed, timeout=5)
    print(f"unread: {sum(c.closed for c in conns)} connections cut by send_timeout")
    assert all(conn.closed for conn in conns)
