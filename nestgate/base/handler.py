"""Route handlers, and the kinds of handler the engines (http1, http2) know.

A handler's `is_async` says how the engine answers with it:
  False  synchronous: the handler is itself a ready response (`Prebuilt` or
         `Bodiless`), written from the parser callback;
  True   asynchronous: `handle(request)` is a coroutine answering through the request;
  GATED  access control first: `admit(conn, headers)` returns the handler to use
         (or a ready refusal);
  PEEK   `peek(path, method, headers)` returns a ready `Prebuilt` when it has one
         (a cached file or page), else None and `handle(request)` runs.
"""

GATED = 2
PEEK = 3


class Service:
    """A part that runs beside the requests on a worker's loop (a proxy route's
    timeout watch and health checks, the gateway's shared store): the worker starts
    every service of its router once serving and stops them when it ends.

    The worker's tick drives every timer: a service that has one sets `tick_every`
    (seconds) and is ticked at least that often. `tick` must not wait; waiting work
    goes into a task the service owns (`Periodic`), which `stop` cancels."""

    tick_every = 0.0             # 0: no timer

    def start(self) -> None:
        """Begin on the running loop; returns at once."""

    def stop(self) -> None:
        """Cancel what `start` began."""

    def tick(self, now: float) -> None:
        """The worker's tick (`now` is the clock's monotonic reading)."""


class TellsIdentity:
    """A handler that tells what it forwards to who signed in (the proxy). The gate of a
    protected route asks it once per user, at load, for the handler that answers that
    user: `with_identity(lines)`, where `lines` are the user's identity header lines
    (nestgate.handlers.auth.identity), ready to go into a request head."""

    __slots__ = ()

    def with_identity(self, lines: bytes):
        raise NotImplementedError


class Periodic:
    """Waiting work started from ticks: one run at a time, each `every` seconds after
    the last one ended (the first at the first tick)."""

    __slots__ = ("every", "work", "task", "after")

    def __init__(self, every: float, work) -> None:
        self.every = every
        self.work = work                 # an async function without arguments
        self.task = None
        self.after = 0.0

    def tick(self, now: float) -> None:
        if self.task is None and now >= self.after:
            import asyncio
            self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        from nestgate.base.clock import CLOCK
        try:
            await self.work()
        finally:
            self.task = None
            self.after = CLOCK.now + self.every

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            self.task = None


class ReadyChoice:
    """A route handler that always has a ready answer but picks it by the request's
    headers (a coding by Accept-Encoding, JSON or HTML by Accept): as a PEEK its `peek`
    never returns None, so the engine writes the answer from the parser callback."""

    __slots__ = ()
    is_async = PEEK

    def choose(self, headers):
        """The `Prebuilt` for these (lower-case name, value) header pairs."""
        raise NotImplementedError

    def peek(self, path: str, method: bytes, headers):
        return self.choose(headers)

    async def handle(self, request) -> None:      # peek always answers; kept for the contract
        await request.send_prebuilt(self.choose(request.headers))
