"""The answer queue of an HTTP/1 connection (`AnswerQueue`, mixed into
`nestgate.wire.http1.HTTP1Connection`).

Pipelined requests are answered in order: while a task is answering, later
requests are parsed and queued and take their turn when the one ahead finishes.
Each queued answer is a ready response (`ReadyAnswer`) or a waiting
`HTTP1Request`; both take their turn, end the connection or are abandoned the same
way. A request that breaks the protocol or a limit queues its error response and
the connection closes after it (`_fail`).
"""

from __future__ import annotations

from nestgate.bans.watch import BANS
from nestgate.pipeline.dispatch import GONE, conclude, log_ready, ready, record, run, start
from nestgate.base.errorpages import ERRORS
from nestgate.wire.h1phases import CLOSING, IDLE
from nestgate.wire.h1request import HTTP1Request
from nestgate.base.tally import UNROUTED


class ReadyAnswer:
    """A ready response that waits in the queue for the answers ahead of it."""

    __slots__ = ("connection", "response", "mode", "head_only")

    def __init__(self, connection, response, mode: int, head_only: bool) -> None:
        self.connection = connection
        self.response = response
        self.mode = mode
        self.head_only = head_only

    def take_turn(self) -> bool:
        """Written; False when the connection ends with it."""
        conn = self.connection
        mode = conn.close_mode if conn.ctx.draining else self.mode
        conn.write_later()
        conn.bytes_out += self.response.write_to(conn.transport, mode, self.head_only)
        if mode == conn.close_mode:
            conn.close_now()
            return False
        return True

    def end_connection(self) -> None:
        self.mode = self.connection.close_mode

    def abandon(self) -> None:
        pass


class AnswerQueue:
    """The answering side of the connection: the request being answered (`_active`),
    then the answers waiting behind it (`_queue`)."""

    def write_closing(self, response) -> None:
        """A ready `response` as the last thing on this connection, which then closes."""
        data = response.render(self.close_mode)
        self.bytes_out += len(data)
        self.write_later()
        self.transport.write(data)
        self.transport.close()

    def _answer_sync(self, response, mode, method, path, host, route) -> None:
        """A ready `response` (after the request's body, or behind answers ahead of it):
        written now if nothing is ahead, else queued."""
        route.tally.count(response.status)
        head_only = method == b"HEAD"
        if self._active is None and not self._queue and not self.write_paused:
            if mode == self.close_mode or self.ctx.draining:
                self._enter(CLOSING)
                self.write_later()
                self.bytes_out += response.write_to(self.transport, self.close_mode, head_only)
                self.transport.close()
            else:
                self.write_ready(response, mode, head_only)
        else:
            self._queue.append(ReadyAnswer(self, response, mode, head_only))
        if self.logging:
            log_ready(self, response.status, 0 if head_only else response.content_length,
                      method, host, path, route.label, self._headers, self._t0)

    def start_answer(self, req: HTTP1Request) -> None:
        """`req`'s turn: its handler answers it, from callbacks or in a task."""
        self._active = req
        if self._later.parts:           # `write_later`, without a call when nothing waits
            self._later.flush()
        start(req)

    def finish(self, req: HTTP1Request, status: int = 0) -> None:
        """For a handler whose `begin(req)` took the request: it is answered, or failed
        with `status` (the answer if nothing was sent yet, else the connection is cut).
        A handler may set `req.cancel` to be told if the client goes away first."""
        if self._active is not req:
            return                          # the client went away meanwhile
        req.cancel = None
        if status or not req.finished:
            conclude(req, status)
        else:
            record(req, req.logged)         # answered in full
        self._done(req)

    def fallback(self, req: HTTP1Request) -> None:
        """A handler's `begin` took `req` but cannot answer it from callbacks after all
        (nothing was sent): answer it with `handle` in a task, as usual."""
        req.cancel = None
        if self._active is req:
            req.task = self.loop.create_task(run(req))

    def conclude(self, req: HTTP1Request, status: int) -> None:
        """`dispatch.answer`'s outcome for the request being answered."""
        if self._active is not req:
            return                          # the connection was lost: nothing to say
        if status == GONE:
            # Not from this connection (it is still here): the answer cannot go on.
            status = 500
        conclude(req, status)
        self._done(req)

    def _done(self, req: HTTP1Request) -> None:
        """`req` is answered and recorded: the connection goes on to the next, or ends."""
        self.bytes_out += req.sent
        self._active = None
        if req.body is not None and not req.body.done:
            if req.keep_alive:
                req.body.discard()        # read and drop the rest to reach the next request
            else:
                req.body.abort()
        if not req.keep_alive:
            self.close_now()
            return
        if self._queue:
            self._run_queue()

    def close_now(self) -> None:
        """The answer just written was the last: nothing after it is read or answered."""
        self._enter(CLOSING)
        for waiting in self._queue:
            waiting.abandon()
        self._queue.clear()
        if self.transport is not None:
            self.write_later()
            self.transport.close()

    def _run_queue(self) -> None:
        """The answers waiting take their turns while the client takes the bytes."""
        queue = self._queue
        while queue and not self.write_paused:
            if not queue.popleft().take_turn():
                break
        if self._held is not None:
            self._release()

    def _fail(self, status: int, response=None) -> None:
        """A protocol error or limit: answer `status` (or `response`) after what is
        ahead, then close."""
        if self._closing_transport():
            return       # bytes after a closing response: nothing more is answered
        self._enter(CLOSING)
        self.write_later()
        self.state = IDLE
        response = response or ERRORS.get(status) or ERRORS[400]
        broken, self._parsing = self._parsing, None
        if broken is not None:
            # The request whose body broke the rules gets the error as its answer.
            broken.body.abort(ConnectionResetError(f"request body refused ({status})"))
            if broken is self._active:
                if broken.started:
                    self.transport.close()     # a response is under way: only cutting is left
                    return
                broken.task.cancel()
                self._active = None
            elif broken in self._queue:
                self._queue.remove(broken)
        if self._active is None and not self._queue:
            self.write_closing(response)
        else:
            self._queue.append(ReadyAnswer(self, response, self.close_mode, False))
        ready(self, UNROUTED, response, response.content_length, b"-", b"", "-", "",
              self._headers, self._t0)
        if status == 400:
            BANS.note("malformed", self.client)      # [[ban]] rules on = "malformed"

    def _close_when_idle(self) -> None:
        """The connection ends after the answers ahead: the last of them says so."""
        if self._queue:
            self._queue[-1].end_connection()
        elif self._active is not None:
            self._active.end_connection()
        elif self.transport is not None:
            self.write_later()
            self.transport.close()
