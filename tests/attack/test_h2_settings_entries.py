"""SETTINGS frames full of entries: one frame may carry 2,730 INITIAL_WINDOW_SIZE
entries, and each entry walked every open stream while the flood guard counted
frames, so 887 such frames held a worker for 9 s of CPU. Entries are what the guard
counts now, and a frame's settings are applied once: the connection gets
GOAWAY(ENHANCE_YOUR_CALM) at once and the worker spends next to no CPU on it."""

from __future__ import annotations

import struct

from conftest import tls_hello_config
from h2raw import SETTINGS_INITIAL_WINDOW_SIZE, RawH2, flood, get, raw_frame

from nestgate.bench.procstat import cpu_seconds

ENHANCE_YOUR_CALM = 0xB
SETTINGS = 0x4
ENTRIES = 2730                  # 16,380 bytes: all a frame of the default size holds
STREAMS = 100                   # open, each waiting for a window the client never grants
FRAMES_PER_WRITE = 20
FLOOD_SECONDS = 5.0
GOAWAY_WITHIN_S = 1.0
CPU_BUDGET_S = 0.5              # the worker's CPU for the whole attack
RSS_GROWTH_KIB = 16 * 1024


def entries_frame() -> bytes:
    """A SETTINGS frame whose INITIAL_WINDOW_SIZE entries go 1, 0, 1, 0, ... 0: each
    one changes every stream's window, and the last leaves them all closed."""
    payload = b"".join(struct.pack(">HI", SETTINGS_INITIAL_WINDOW_SIZE, (i + 1) & 1)
                       for i in range(ENTRIES))
    return raw_frame(SETTINGS, 0, 0, payload)


def test_settings_entries_flood_ends_the_connection_at_little_cost(start_server, certs):
    server = start_server(tls_hello_config(certs))
    worker = server.worker_pids()[0]
    # No window for our answers: every stream stays open, its answer waiting.
    conn = RawH2(server.port("https"), certs["ca"], settings={SETTINGS_INITIAL_WINDOW_SIZE: 0})
    streams = [conn.new_stream() for _ in range(STREAMS)]
    conn.send(*(conn.headers_frame(s, get()) for s in streams))
    assert conn.wait(lambda: all(conn.streams[s].status == 200 for s in streams), 10)
    assert not any(conn.streams[s].done for s in streams)
    rss_before, cpu_before = server.worker_rss_kib(), cpu_seconds(worker)

    took = flood(conn, entries_frame() * FRAMES_PER_WRITE, FLOOD_SECONDS)
    cpu = cpu_seconds(worker) - cpu_before
    grown = server.worker_rss_kib() - rss_before
    conn.close()
    print(f"ended after {took} s, worker CPU {cpu:.2f} s, RSS +{grown} KiB")
    assert took is not None and took < GOAWAY_WITHIN_S, f"no GOAWAY within {FLOOD_SECONDS} s"
    assert conn.goaway is not None and conn.goaway.error_code == ENHANCE_YOUR_CALM
    assert cpu < CPU_BUDGET_S
    assert grown < RSS_GROWTH_KIB
    # The worker is free for others.
    other = RawH2(server.port("https"), certs["ca"])
    stream = other.request(get())
    assert other.answers([stream], timeout=5)[stream].status == 200
    other.close()
