"""HTTP/3 over a path that loses datagrams: aioquic's client asks a real nestgate (two
workers sharing the UDP port) through `udprelay.LossyRelay`, which drops datagrams at
random, the first ones of each connection (the handshake), or the last one the server
sends for an answer (its end, which only the server's own loss timer sends again), or
swaps two requests' datagrams. Every request must come back whole within a bound. The
server's QUIC timer left unarmed, the three loss tests fail; so do the random loss and
the swap when a request stream that reaches the server after a higher-numbered one is
not taken as opened (a resent request, never answered). Last, the bench's HTTP/3 client
(nestgate.bench.h3load) given answers later than it waits for.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import h3client
from udprelay import TAIL_GAP_S, LossyRelay

HEALTH = "/api/v1/health"
ANSWER_BYTES = 4096
REQUEST_BOUND_S = 20      # one request, however many of its datagrams were lost
RUN_BOUND_S = 90          # a whole test's requests
SLOW_ANSWER_S = 0.4       # the upstream's answer to /app/slow/...


def proxied_body(path: str) -> bytes:
    """The upstream's 4 KB answer to `path`: different per path, so a mixed-up answer
    shows."""
    return (path.encode() + b"|") * (ANSWER_BYTES // (len(path) + 1)) + b"." * (
        ANSWER_BYTES % (len(path) + 1))


class _Upstream(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        if self.path.startswith("/app/slow/"):
            time.sleep(SLOW_ANSWER_S)
        body = proxied_body(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server(tmp_path_factory, certs):
    folder = tmp_path_factory.mktemp("h3loss")
    yield from h3client.serve_with_upstream(folder, certs, _Upstream, 2, """
[[site.route]]
prefix = "/app/"
type = "proxy"
upstream = "{upstream}"
""")


def _check(path: str, reply: h3client.Reply) -> None:
    assert reply.reset is None, (path, reply.reset)
    assert reply.status == 200, (path, reply.status)
    if path == HEALTH:
        assert json.loads(reply.body)["status"] == "ok"
    else:
        assert reply.body == proxied_body(path), path


async def _one_connection(port: int, ca: str, paths: list[str], streams: int) -> list[float]:
    """Ask every path on one connection, `streams` at a time; each answer is checked.
    Returns how long each request took."""
    took: list[float] = []
    async with await h3client.session(port, ca) as client:
        queue = list(paths)

        async def one_stream() -> None:
            while queue:
                path = queue.pop()
                started = time.monotonic()
                reply = await asyncio.wait_for(
                    client.send_request("GET", path, "localhost"), REQUEST_BOUND_S)
                took.append(time.monotonic() - started)
                _check(path, reply)
        await asyncio.gather(*(one_stream() for _ in range(streams)))
    return took


def _mixed_paths(tag: str, count: int) -> list[str]:
    return [HEALTH if i % 2 else f"/app/{tag}/{i}" for i in range(count)]


async def _through(relay_options: dict, server, certs, connections: int, per_connection: int,
                   streams: int):
    relay = await LossyRelay.start(("127.0.0.1", server.port("https")), **relay_options)
    try:
        took = await asyncio.wait_for(asyncio.gather(*(
            _one_connection(relay.port, certs["ca"], _mixed_paths(f"c{n}", per_connection),
                            streams)
            for n in range(connections))), RUN_BOUND_S)
    finally:
        relay.close()
    return relay, [seconds for one in took for seconds in one]


def test_a_request_stream_that_comes_after_a_higher_one_is_answered(server, certs):
    # What a loss does to requests in flight together: the lower stream's datagram is
    # sent again and comes after the higher one's. Here the relay loses nothing but
    # swaps the two requests' datagrams, so stream 4 reaches the server before 0.
    async def run():
        relay = await LossyRelay.start(("127.0.0.1", server.port("https")))
        try:
            async with await h3client.session(relay.port, certs["ca"]) as client:
                relay.swap_up()
                sooner = client.send_request("GET", HEALTH, "localhost")
                later = client.send_request("GET", "/app/later", "localhost")
                return await asyncio.wait_for(asyncio.gather(sooner, later), REQUEST_BOUND_S)
        finally:
            relay.close()

    sooner, later = asyncio.run(run())
    _check(HEALTH, sooner)
    _check("/app/later", later)


def test_answers_come_whole_through_random_loss_both_ways(server, certs):
    # 15 % of the datagrams each way, by a fixed seed: 3 connections (spread over the
    # two workers' sockets, or sharing one) x 80 requests, 8 streams at a time.
    relay, took = asyncio.run(_through({"loss": 0.15, "seed": 20261206}, server, certs,
                                       connections=3, per_connection=80, streams=8))
    assert len(took) == 240
    assert relay.dropped["up"] > 20 and relay.dropped["down"] > 20, relay.dropped


def test_a_lost_handshake_is_sent_again(server, certs):
    # The first three datagrams each way of every connection are lost: the client's
    # Initial and its resends, the server's first flight and its resends.
    relay, took = asyncio.run(_through({"drop_first": 3}, server, certs,
                                       connections=3, per_connection=10, streams=4))
    assert len(took) == 30
    assert relay.dropped == {"up": 9, "down": 9}


def test_the_lost_end_of_each_answer_is_sent_again(server, certs):
    # One request at a time, and the last datagram the server sends for each is lost:
    # the end of the answer, which the client cannot ask for (it does not know it is
    # missing); only the server's probe timeout sends it again.
    async def run():
        relay = await LossyRelay.start(("127.0.0.1", server.port("https")))
        lost_before_answer = 0
        try:
            async with await h3client.session(relay.port, certs["ca"]) as client:
                relay.hold_tails = True
                await asyncio.sleep(3 * TAIL_GAP_S)      # the handshake's last frames
                for path in _mixed_paths("tail", 20):
                    dropped = relay.dropped_tails
                    relay.drop_next_tail()
                    reply = await asyncio.wait_for(
                        client.send_request("GET", path, "localhost"), REQUEST_BOUND_S)
                    _check(path, reply)
                    # the drop came first: the answer was whole only once it was resent
                    lost_before_answer += relay.dropped_tails == dropped + 1
                    await asyncio.sleep(5 * TAIL_GAP_S)  # the server falls quiet
                    relay.tail_armed = False
        finally:
            relay.close()
        return relay, lost_before_answer

    relay, lost_before_answer = asyncio.run(asyncio.wait_for(run(), RUN_BOUND_S))
    assert relay.dropped_tails == 20
    # Most drops take the answer's end itself. Now and then the server sends an end
    # twice before it falls quiet (its loss detection, early): the first copy passes
    # and the drop takes the second, after the answer came whole.
    assert lost_before_answer >= 12, lost_before_answer


def test_the_bench_client_drops_an_answer_that_comes_after_it_gave_up(server, tmp_path,
                                                                      monkeypatch, caplog):
    # nestgate.bench.h3load gives an answer up after ANSWER_TIMEOUT_S; here every answer
    # comes later than that, on a connection still in use: each is counted a timeout
    # and dropped when it comes, the connection reading on.
    from nestgate.bench import h3load
    monkeypatch.setattr(h3load, "ANSWER_TIMEOUT_S", SLOW_ANSWER_S / 4)
    result = h3load.run(server.port("https"), "/app/slow/x", 1, 2, 1.5, tmp_path / "raw.txt")
    assert result.requests == 0 and result.errors["timeout"] >= 4, result.errors
    assert not [r for r in caplog.records if r.name == "asyncio"], caplog.text


def _udp_receive_buffers(port: int) -> list[int]:
    """The receive buffer (`ss`'s skmem rb, in bytes) of each UDP socket on `port`."""
    out = subprocess.run(["ss", "-u", "-a", "-n", "-m", f"sport = :{port}"],
                         capture_output=True, text=True, timeout=10, check=True).stdout
    return [int(size) for size in re.findall(r"\brb(\d+)", out)]


def test_the_quic_sockets_have_room_for_a_burst(server):
    # One socket per worker, each asking QUIC_SOCKET_BUFFER (the kernel reports twice
    # what it grants): all of it as root, else up to net.core.rmem_max.
    from nestgate.server.supervisor import QUIC_SOCKET_BUFFER
    rmem_max = int(Path("/proc/sys/net/core/rmem_max").read_text())
    granted = QUIC_SOCKET_BUFFER if os.geteuid() == 0 else min(QUIC_SOCKET_BUFFER, rmem_max)
    buffers = _udp_receive_buffers(server.port("https"))
    assert len(buffers) == 2, buffers
    assert all(size >= 2 * granted for size in buffers), (buffers, granted)


def test_a_buffer_the_kernel_caps_is_reported_with_its_sysctl():
    # Without CAP_NET_ADMIN the kernel's caps hold: asked past both, each way is
    # reported short, naming the sysctl that would allow it.
    limits = [int(Path(f"/proc/sys/net/core/{name}").read_text())
              for name in ("rmem_max", "wmem_max")]
    code = ("import socket\n"
            "from nestgate.server.supervisor import widen_buffers\n"
            "sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            "sock.bind(('127.0.0.1', 0))\n"
            f"print('\\n'.join(widen_buffers(sock, {2 * max(limits) + (1 << 20)})))\n")
    unprivileged = (lambda: os.setuid(65534)) if os.geteuid() == 0 else None
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, preexec_fn=unprivileged,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 2, lines
    assert "UDP receive buffer" in lines[0] and "net.core.rmem_max" in lines[0]
    assert "UDP send buffer" in lines[1] and "net.core.wmem_max" in lines[1]
