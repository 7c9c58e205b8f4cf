"""Protocol tests without sockets: bytes in, bytes out, through a fake transport.

`Wire` builds the same `ServerContext` a worker builds, from a config dict, and
drives one `HTTP1Connection` on a private event loop so asynchronous handlers
run too. `parse_responses` splits what the server wrote into responses.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import httptools

from nestgate.pipeline.accesslog import AccessLog
from nestgate.config import parse_config
from nestgate.wire.http1 import HTTP1Connection
from nestgate.sites.build import build_router
from nestgate.server.worker import ServerContext


class FakeTransport:
    def __init__(self, peer=("192.0.2.10", 40000)) -> None:
        self.out = bytearray()
        self.closed = False
        self.reading = True
        self.peer = peer

    def write(self, data: bytes) -> None:
        assert not self.closed, "write after close"
        self.out += data

    def writelines(self, parts) -> None:
        for data in parts:
            self.write(data)

    def close(self) -> None:
        self.closed = True

    abort = close

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return 0                      # every write is taken at once

    def get_extra_info(self, name, default=None):
        return self.peer if name == "peername" else default

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        pass

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


# Handlers for protocol tests.
class Echo:
    """An asynchronous handler that answers with the request body it read."""
    is_async = True

    async def handle(self, request):
        body = await request.body.read_all() if request.body else b""
        await request.send(200, [(b"content-type", b"text/plain")], body)


class Broken:
    is_async = True

    async def handle(self, request):
        raise RuntimeError("boom")


class WorkerStub:
    def __init__(self, config, loop) -> None:
        self.config = config
        self.loop = loop
        self.connections = set()
        self.access_log = AccessLog(config.log)
        self.draining = False


BASE = {
    "listen": [{"address": "127.0.0.1:0"}],
    "site": [{"hosts": ["*"], "route": [
        {"path": "/hello", "type": "return", "body": "hello\n"},
    ]}],
}


def config_dict(limits=None, sites=None, log=None) -> dict:
    data = {"listen": BASE["listen"], "site": sites or BASE["site"]}
    if limits:
        data["limits"] = limits
    if log:
        data["log"] = log
    return data


class Wire:
    def __init__(self, data: dict | None = None, peer=("192.0.2.10", 40000),
                 handlers: dict | None = None) -> None:
        self.loop = asyncio.new_event_loop()
        self.config = parse_config(data or config_dict())
        self.worker = WorkerStub(self.config, self.loop)
        router = build_router(self.config)
        for path, handler in (handlers or {}).items():
            router.catch_all.add_exact(path, handler)
        self.ctx = ServerContext(self.worker, self.config.listeners[0], router)
        self.transport = FakeTransport(peer)
        self.conn = HTTP1Connection(self.ctx)
        self.conn.connection_made(self.transport)

    def send(self, data: bytes, settle: int = 20) -> None:
        self.conn.data_received(data)
        self.run(settle)

    def run(self, rounds: int = 20) -> None:
        async def spin():
            for _ in range(rounds):
                await asyncio.sleep(0)
        self.loop.run_until_complete(spin())

    def responses(self) -> list[Response]:
        return parse_responses(bytes(self.transport.out))

    @property
    def closed(self) -> bool:
        return self.transport.closed

    def expire(self, seconds: float) -> None:
        """Let `seconds` pass in one tick of the worker, as its timer would."""
        self.conn.tick(seconds)

    def close(self) -> None:
        """The client goes away. Nothing the connection started may outlive it: a
        task still pending then is a leak (a handler nobody will ever answer for)."""
        self.conn.connection_lost(None)
        self.run()
        left = [task for task in asyncio.all_tasks(self.loop) if not task.done()]
        for task in left:
            task.cancel()
        if left:
            self.loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
        self.loop.close()
        assert not left, f"tasks still pending after the connection closed: {left}"


@dataclass
class Response:
    status: int
    headers: dict = field(default_factory=dict)
    body: bytes = b""


def parse_responses(data: bytes) -> list[Response]:
    """Every response in `data`, in order (a 100 Continue counts as one)."""
    out: list[Response] = []

    class Sink:
        def on_message_begin(self):
            out.append(Response(0))

        def on_header(self, name, value):
            out[-1].headers[name.decode().lower()] = value.decode()

        def on_headers_complete(self):
            out[-1].status = parser.get_status_code()

        def on_body(self, body):
            out[-1].body += body

    parser = httptools.HttpResponseParser(Sink())
    parser.feed_data(data)
    return out
