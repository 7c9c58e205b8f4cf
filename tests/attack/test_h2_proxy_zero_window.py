"""HTTP/2 clients of a proxied route that grant no flow-control window, or open their
windows and then read nothing: the proxy reads the upstream's body only as far as the
client's stream window and its connection's output budget let it, so the worker's
memory stays flat however large the upstream's answer, and `send_timeout` resets the
stalled streams."""

from __future__ import annotations

import time

from h2raw import (
    SETTINGS_INITIAL_WINDOW_SIZE,
    RawH2,
    WindowUpdateFrame,
    get,
    open_streams,
    wait_all_reset,
)

CONNECTIONS, STREAMS = 4, 100
BODY_BYTES = 8 << 20
SEND_TIMEOUT_S = 3
CANCEL = 0x8
# 400 streams of an 8 MiB answer; 256 KiB read ahead for each was 100 MiB.
RSS_GROWTH_BOUND_KIB = 48 * 1024
# OUTPUT_BUDGET / CLIENT_ROOM streams read at a time, and a few whose room was granted
# as others finished their part.
UPSTREAM_REQUESTS_PER_CONNECTION = 24


def proxy_server(start_server, certs, up):
    return start_server(f"""
[server]
workers = 1

[[listen]]
address = "127.0.0.1:0"
[[listen.certificate]]
cert = "{certs["local"][0]}"
key = "{certs["local"][1]}"
names = ["localhost"]

[limits]
send_timeout = "{SEND_TIMEOUT_S}s"
keepalive_timeout = "60s"

[[site]]
hosts = ["*"]

[[site.route]]
prefix = "/"
type = "proxy"
upstream = "{up.url}"
""")


def watch_rss(server, conns, seconds: float, base: int) -> int:
    peak, until = base, time.monotonic() + seconds
    while time.monotonic() < until:
        peak = max(peak, server.worker_rss_kib())
        for conn in conns:
            conn.pump(0.01)
    return peak


def test_zero_window_streams_read_nothing_from_the_upstream(start_server, certs, upstream):
    up = upstream()
    server = proxy_server(start_server, certs, up)
    base = server.worker_rss_kib()
    conns = [RawH2(server.port("https"), certs["ca"],
                   settings={SETTINGS_INITIAL_WINDOW_SIZE: 0}) for _ in range(CONNECTIONS)]
    streams = open_streams(conns, STREAMS, b"/big?n=%d" % BODY_BYTES)
    peak = watch_rss(server, conns, 2.0, base)
    body = sum(len(conn.streams[s].data) for conn, ids in zip(conns, streams) for s in ids)
    print(f"proxy zero window: {len(up.requests)} upstream requests, {body} body bytes sent, "
          f"worker RSS {base} -> {peak} KiB (+{(peak - base) / 1024:.1f} MiB)")
    assert body == 0
    assert peak - base < RSS_GROWTH_BOUND_KIB
    cancelled, took = wait_all_reset(conns, streams, SEND_TIMEOUT_S + 5, CANCEL)
    print(f"proxy zero window: {cancelled} streams reset (CANCEL) {took:.1f} s later")
    assert cancelled == CONNECTIONS * STREAMS
    for conn in conns:
        conn.close()
    # The worker still proxies for a client that reads.
    reader = RawH2(server.port("https"), certs["ca"])
    sid = reader.request(get(b"/big?n=%d" % (1 << 20)))
    reader.send(WindowUpdateFrame(0, window_increment=8 << 20),
                WindowUpdateFrame(sid, window_increment=8 << 20))
    reader.wait(lambda: reader.streams[sid].done, timeout=10)
    assert reader.streams[sid].status == 200 and len(reader.streams[sid].data) == 1 << 20
    reader.close()


def test_open_windows_and_no_reading_hold_a_bounded_amount(start_server, certs, upstream):
    up = upstream()
    server = proxy_server(start_server, certs, up)
    base = server.worker_rss_kib()
    conns = [RawH2(server.port("https"), certs["ca"],
                   settings={SETTINGS_INITIAL_WINDOW_SIZE: 2**31 - 1})
             for _ in range(CONNECTIONS)]
    for conn in conns:
        ids = [conn.new_stream() for _ in range(STREAMS)]
        conn.send(WindowUpdateFrame(0, window_increment=2**31 - 1 - 65535),
                  *(conn.headers_frame(s, get(b"/big?n=%d" % BODY_BYTES)) for s in ids))
    peak, until = base, time.monotonic() + SEND_TIMEOUT_S + 2.0
    while time.monotonic() < until:               # the clients read nothing
        peak = max(peak, server.worker_rss_kib())
        time.sleep(0.05)
    print(f"proxy unread: {len(up.requests)} upstream requests, "
          f"worker RSS {base} -> {peak} KiB (+{(peak - base) / 1024:.1f} MiB)")
    assert peak - base < RSS_GROWTH_BOUND_KIB
    # Each connection asked the upstream only for what its output budget had room for
    # (1 MiB / 64 KiB = 16 streams at a time), not for all 100 of its streams.
    assert len(up.requests) <= CONNECTIONS * UPSTREAM_REQUESTS_PER_CONNECTION
    # send_timeout cuts a connection once nothing of its has moved for that long. The
    # kernel may go on taking a trickle of bytes for a while after a client stops
    # reading (it compacts the client's receive queue and reopens the window), and each
    # trickle is progress, as for nginx's send_timeout: at least one is cut in the time.
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not all(c.ended_by_server() for c in conns):
        time.sleep(0.05)
    cut = sum(c.ended_by_server() for c in conns)
    print(f"proxy unread: {cut} of {CONNECTIONS} connections cut by send_timeout")
    assert cut >= 1
