"""An upstream's response head is bounded: 64 KiB (UPSTREAM_HEAD_MAX), else 502.

The bound must not depend on how the head is cut into reads: a head that arrives
whole in one read is held to it as one that trickles in (it was not, so the bound
was whatever one socket read brought, 128 KiB and more).
"""

from __future__ import annotations

import socket

import pytest

from nestgate.handlers.proxy.upstream import UPSTREAM_HEAD_MAX
from rawupstream import RawUpstream, proxy_toml

KIB = 1024


@pytest.fixture
def head_server(start_server):
    up = RawUpstream()
    server = start_server(proxy_toml(up.url))
    yield server
    up.stop()


def status_for_head(port: int, size: int) -> int:
    """The status nestgate answers when the upstream's response head is `size` bytes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /head/%d HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n" % size)
        got = b""
        while not got.endswith(b"\r\n") or b" " not in got:
            chunk = sock.recv(64)
            if not chunk:
                break
            got += chunk
        return int(got.split(b" ", 2)[1])


def test_the_limit_is_the_documented_one():
    assert UPSTREAM_HEAD_MAX == 64 * KIB


@pytest.mark.parametrize("size, status", [
    (UPSTREAM_HEAD_MAX - 1, 200),
    (UPSTREAM_HEAD_MAX, 200),
    (UPSTREAM_HEAD_MAX + 1, 502),
    (96 * KIB, 502),
    (127 * KIB, 502),
    (200 * KIB, 502),
], ids=["64KiB-1", "64KiB", "64KiB+1", "96KiB", "127KiB", "200KiB"])
def test_response_head_over_the_limit_is_502(head_server, size, status):
    assert status_for_head(head_server.port(), size) == status
    # The worker is still serving: a head within the limit passes after one over it.
    assert status_for_head(head_server.port(), 1 * KIB) == 200
