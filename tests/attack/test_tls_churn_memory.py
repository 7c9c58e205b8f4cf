"""Many short TLS connections, one after another: the worker's memory must stay flat.

Each connection is a full handshake, one request, a close (h2load, 100 connections a
round). Before, the worker grew with every connection: the transport of a closed TLS
connection kept OpenSSL's state of it (tens of KiB) for as long as the connection's
objects lived, and they lived in reference cycles until the cyclic collector came by;
hundreds of closed connections were held at a time and freed in batches that left the
C heap in pieces (30 -> 60 MB in 2,000 connections, still rising after 7,000). Now the
transport lets go of OpenSSL's state and of its protocol as it closes. Over the event
loop's TLS the heap grew with each burst of handshakes and its free middle stayed
resident; the worker's tick now gives it back (nestgate.server.heap).

Measured here, RSS at start / after 1,500 / after 4,500 connections, in MB: h2 over the
socket's TLS 29.3 / 46.9 / 65.7 before, 29.4 / 37.1 / 37.7 after; HTTP/1.1 29.4 / 58.0 /
59.7 before, 29.4 / 36.3 / 38.3 after; HTTP/1.1 over the loop's TLS 29.5 / 44.4 / 49.3
before, 29.4 / 39.8 / 34.2 (after a heap check) after.
"""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest

from conftest import tls_hello_config
from nestgate.server.heap import CHECK_SECONDS

ROUND = 100                 # connections at once, one request each
CONNECTIONS = 4500          # per case; RSS is read after the first third and at the end
GROWTH_BOUND_KIB = 4 * 1024  # from the first third to the end
HELD_BOUND_KIB = 12 * 1024   # at the end, above the idle worker's RSS before the churn


def churn(port: int, connections: int, alpn: str) -> None:
    """`connections` TLS connections, ROUND at a time, each with one GET /hello."""
    url = f"https://127.0.0.1:{port}/hello"
    for _ in range(connections // ROUND):
        run = subprocess.run(["h2load", "-c", str(ROUND), "-n", str(ROUND),
                              f"--npn-list={alpn}", url],
                             capture_output=True, text=True, timeout=60)
        assert f"{ROUND} succeeded" in run.stdout, run.stdout + run.stderr
        assert f"Application protocol: {alpn}" in run.stdout


def settled_rss(server, wait: float) -> int:
    """The worker's RSS in KiB, lowest seen over `wait` seconds (0: read once)."""
    lowest = server.worker_rss_kib()
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        time.sleep(0.25)
        lowest = min(lowest, server.worker_rss_kib())
    return lowest


@pytest.mark.skipif(shutil.which("h2load") is None, reason="h2load is installed by make test")
@pytest.mark.parametrize("alpn,loop_tls", [("h2", False), ("http/1.1", False),
                                           ("http/1.1", True)],
                         ids=["h2-socket-tls", "http1-socket-tls", "http1-loop-tls"])
def test_rss_is_flat_under_tls_connection_churn(alpn, loop_tls, start_server, certs):
    server = start_server(tls_hello_config(certs),
                          env={"NESTGATE_LOOP_TLS": "1" if loop_tls else "0"})
    port = server.port("https")
    start = server.worker_rss_kib()
    churn(port, CONNECTIONS // 3, alpn)            # warm-up: buffers, caches, arenas
    third = server.worker_rss_kib()
    churn(port, CONNECTIONS - CONNECTIONS // 3, alpn)
    # The loop's TLS leaves a burst's worth of free heap until the worker's next heap
    # check gives it back: the last reading is taken once that has had its chance.
    end = settled_rss(server, CHECK_SECONDS + 1.5 if loop_tls else 0.0)
    assert end - third < GROWTH_BOUND_KIB, \
        f"worker grew {end - third} KiB from connection {CONNECTIONS // 3} " \
        f"to {CONNECTIONS} ({third} -> {end} KiB)"
    assert end - start < HELD_BOUND_KIB, \
        f"the worker keeps {end - start} KiB more than before the churn ({start} -> {end} KiB)"
