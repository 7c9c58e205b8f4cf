"""A load client for HTTP/3, on aioquic: the `h3py` driver.

Debian 12's h2load (nghttp2 1.52) is built without ngtcp2, so it has no `--h3`, and no
other HTTP/3 load tool is packaged here. This driver opens `connections` QUIC
connections with `streams` requests in flight on each, closed loop, for the run's
duration, in one Python process. It is itself the bottleneck long before nestgate is:
its figures say what one Python client gets, for a run against the same run before a
change (paired rounds), never beside h2load's numbers as if they were of one kind.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from pathlib import Path

from .drivers import ERROR_KEYS, RunResult
from .pyclient import run_result

# An answer not complete after this long is counted as a timeout and its stream given
# up, so that a server which never answers cannot hold the run forever. (QUIC resends
# lost datagrams: a timeout here is an answer the server never sent, see
# docs/benchmarks.md, "HTTP/3: the answers that never came".)
ANSWER_TIMEOUT_S = 5.0


async def _connection(port: int, path: str, streams: int, until: float, latencies: list,
                      statuses: list, sizes: list, errors: dict) -> None:
    from aioquic.asyncio.client import connect
    from aioquic.h3.connection import H3_ALPN, H3Connection
    from aioquic.h3.events import DataReceived, HeadersReceived
    from aioquic.quic.configuration import QuicConfiguration
    from aioquic.asyncio.protocol import QuicConnectionProtocol

    class Client(QuicConnectionProtocol):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.http = H3Connection(self._quic)
            self.waiting: dict[int, list] = {}

        def quic_event_received(self, event) -> None:
            for h3 in self.http.handle_event(event):
                entry = self.waiting.get(h3.stream_id)
                if entry is None:
                    continue
                if isinstance(h3, HeadersReceived):
                    entry[1] = int(dict(h3.headers)[b":status"])
                elif isinstance(h3, DataReceived):
                    entry[2] += len(h3.data)
                if h3.stream_ended:
                    del self.waiting[h3.stream_id]
                    entry[3].set_result(entry)

        async def get(self) -> list:
            stream_id = self._quic.get_next_available_stream_id()
            entry = [time.perf_counter(), 0, 0, self._loop.create_future()]
            self.waiting[stream_id] = entry
            self.http.send_headers(stream_id, [
                (b":method", b"GET"), (b":scheme", b"https"), (b":authority", b"localhost"),
                (b":path", path.encode())], end_stream=True)
            self.transmit()
            try:
                return await entry[3]
            finally:
                # Given up (ANSWER_TIMEOUT_S) or done: an answer coming later is dropped
                # (set on a cancelled future it would raise in the datagram's callback,
                # and the rest of that datagram would wait for the next).
                self.waiting.pop(stream_id, None)

    config = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN,
                               verify_mode=ssl.CERT_NONE)        # ours, self-signed
    async with connect("127.0.0.1", port, configuration=config,
                       create_protocol=Client) as client:
        async def one_stream() -> None:
            while time.perf_counter() < until:
                try:
                    started, status, size, _ = await asyncio.wait_for(client.get(),
                                                                      ANSWER_TIMEOUT_S)
                except asyncio.TimeoutError:
                    errors["timeout"] += 1
                    continue
                latencies.append((time.perf_counter() - started) * 1000)
                statuses.append(status)
                sizes.append(size)
        await asyncio.gather(*(one_stream() for _ in range(streams)))


def run(port: int, path: str, connections: int, streams: int, duration_s: float,
        raw_path: Path) -> RunResult:
    latencies: list[float] = []
    statuses: list[int] = []
    sizes: list[int] = []
    errors = dict.fromkeys(ERROR_KEYS, 0)
    started = time.perf_counter()

    async def load() -> None:
        until = time.perf_counter() + duration_s
        results = await asyncio.gather(
            *(_connection(port, path, streams, until, latencies, statuses, sizes, errors)
              for _ in range(connections)), return_exceptions=True)
        for result in results:
            if isinstance(result, Exception):
                errors["connect" if isinstance(result, ConnectionError) else "other"] += 1

    asyncio.run(load())
    elapsed = time.perf_counter() - started
    result = run_result(latencies, statuses, sum(sizes), elapsed, errors, "h3")
    raw_path.write_text(f"h3py: {connections} connections x {streams} streams, "
                        f"{duration_s}s: {len(statuses)} answers, {result.status}, "
                        f"errors {errors}\n")
    return result
