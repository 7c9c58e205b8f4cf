"""Handlers answered through the request contract, in memory, without a server.

`Harness` builds a site's router from a config as a worker does and answers requests
through the stream sequence the protocol adapters drive (`nestgate.pipeline.dispatch.open_stream`,
then `run`): `MemoryConnection` is one more adapter, whose `MemoryRequest` keeps the
answer as (status, fields, body) instead of sending it. Handlers that work here and over
HTTP/1.1 and HTTP/2 cannot be asking which protocol they are on.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from nestgate.config import parse_config
from nestgate.pipeline import dispatch
from nestgate.pipeline.dispatch import GONE, open_stream, run
from nestgate.pipeline.request import Body, Request
from nestgate.base.responses import header_pairs
from nestgate.sites.build import build_router
from nestgate.server.worker import ServerContext
from wire import WorkerStub


@dataclass
class Answer:
    status: int
    headers: dict = field(default_factory=dict)
    body: bytes = b""
    ready: bool = False      # a ready answer, written without a request object or task
    cut: bool = False        # the handler failed after its answer began


class _Flow:
    """A request body's source that always has the whole body."""

    def __init__(self, loop) -> None:
        self.loop = loop

    def pause_reading_for_body(self) -> None:
        pass

    def resume_reading_for_body(self) -> None:
        pass

    def send_continue(self) -> None:
        pass


class MemoryConnection:
    """What a handler's request and the stream sequence need from a client connection."""

    protocol = "memory"

    def __init__(self, ctx, client: str) -> None:
        self.ctx = ctx
        self.router = ctx.router
        self.loop = ctx.loop
        self.limits = ctx.limits
        self.client = client
        self.decisions = None          # access decisions (nestgate.pipeline.access.Gate.admit)
        self.xff_trusted = False       # the client is not a trusted proxy
        self.scheme = ctx.scheme       # the listener's: no proxy tells another
        self.known_plain = False       # never sent to HTTPS here
        self.logging = False           # requests are not logged (no request log here)
        self.outcomes: list[int] = []  # each `conclude` status, in order
        self.ready_answer: Answer | None = None   # a ready answer `send_ready` was given

    async def wait_writable(self) -> None:
        return None

    # the adapter's side of the stream sequence
    def send_ready(self, key, response, head_only: bool) -> int:
        self.ready_answer = answer_of(response, head_only)
        return len(self.ready_answer.body)

    def new_request(self, key, handler, route, method, raw_target, qmark, headers,
                    authority, t0) -> MemoryRequest:
        return MemoryRequest(self, handler, route, method, raw_target, qmark, headers,
                             authority, True, t0)

    def conclude(self, req: MemoryRequest, status: int) -> None:
        self.outcomes.append(status)
        if status != GONE:         # no client to go away here: only a handler's own reset
            dispatch.conclude(req, status)


class MemoryRequest(Request):
    """A responder that keeps the answer instead of sending it."""

    __slots__ = ("fields", "chunks", "was_cut")

    protocol = "memory"

    def __init__(self, *args) -> None:
        Request.__init__(self, *args)
        self.fields: list[tuple[bytes, bytes]] = []
        self.chunks: list[bytes] = []
        self.was_cut = False

    def _begin(self, status: int, pairs, content_length: int | None) -> None:
        if self.started:
            raise RuntimeError("response already started")
        self.started = True
        self.status = status
        self.fields = [(name.lower(), value) for name, value in pairs]
        if content_length is not None:     # the length given wins over a field's
            self.fields = [f for f in self.fields if f[0] != b"content-length"]
            self.fields.append((b"content-length", b"%d" % content_length))

    def start(self, status: int, headers, content_length: int | None = None) -> None:
        self._begin(status, header_pairs(headers), content_length)

    def start_raw(self, status: int, block: bytes, content_length: int | None = None) -> None:
        pairs = [line.split(b":", 1) for line in block.split(b"\r\n") if line]
        self._begin(status, [(n.strip(), v.strip()) for n, v in pairs], content_length)

    async def write(self, data: bytes) -> None:
        self.push(data)

    def push(self, data: bytes) -> bool:
        if not self.started:
            raise RuntimeError("write before start")
        if data and not self.head_only:
            self.chunks.append(bytes(data))
            self.sent += len(data)
        return False

    async def send_prebuilt(self, response) -> None:
        self.fill(response)

    def fill(self, response) -> None:
        """The whole answer from a ready response."""
        self._begin(response.status, response.fields, None)
        if not self.head_only:
            self.chunks.append(response.body)
            self.sent += len(response.body)
        self.finished = True

    answer_ready = fill

    def cut(self) -> None:
        self.was_cut = True

    def end(self) -> None:
        self.finished = True


def answer_of(response, head_only: bool) -> Answer:
    return Answer(response.status, {n.lower().decode(): v.decode() for n, v in response.fields},
                  b"" if head_only else response.body, ready=True)


class Harness:
    """A site's handlers, from a config dict, asked in memory on a private loop."""

    def __init__(self, data: dict, handlers: dict | None = None) -> None:
        self.loop = asyncio.new_event_loop()
        self.config = parse_config(data)
        worker = WorkerStub(self.config, self.loop)
        self.router = build_router(self.config)
        for path, handler in (handlers or {}).items():     # extra handlers, unguarded
            self.router.catch_all.add_exact(path, handler)
        self.ctx = ServerContext(worker, self.config.listeners[0], self.router)
        self.loop.run_until_complete(self._start_services())

    async def _start_services(self) -> None:
        for service in self.router.services:
            service.start()

    def ask(self, method: str, target: str, headers=(), body: bytes = b"",
            host: str = "localhost", client: str = "192.0.2.10") -> Answer:
        return self.loop.run_until_complete(
            asyncio.wait_for(self._ask(method, target, headers, body, host, client), 10))

    async def _ask(self, method, target, headers, body, host, client) -> Answer:
        conn = MemoryConnection(self.ctx, client)
        fields = [(b"host", host.encode())] + [(n.lower().encode(), v.encode())
                                               for n, v in headers]
        if body:
            fields.append((b"content-length", b"%d" % len(body)))
        req = open_stream(conn, None, method.encode(), target.encode(), host.encode(), fields)
        if req is None:
            return conn.ready_answer
        if body:
            req.body = Body(_Flow(self.loop), False, len(body))
            req.body.feed(body)
            req.body.finish()
        await run(req)
        return Answer(req.status, {n.decode(): v.decode() for n, v in req.fields},
                      b"".join(req.chunks), cut=req.was_cut)

    def close(self) -> None:
        for service in self.router.services:
            service.stop()
        pending = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self.loop.close()
