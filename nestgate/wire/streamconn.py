"""What the adapters of the protocols with a stream per request (HTTP/2, HTTP/3) share,
mixed into `nestgate.wire.http2.HTTP2Connection` and `nestgate.wire.http3.HTTP3Connection`
(`StreamAdapter`): a request stream's head read and checked by HTTP/2's rules
(`nestgate.wire.fieldhead`, which HTTP/3 keeps too), then refused or opened in the stream
sequence (`nestgate.pipeline.dispatch.open_stream`); the sequence's `Request` made for a stream;
a stream's work dropped. Framing, windows and ending stay each adapter's own.
"""

from __future__ import annotations

from nestgate.pipeline.dispatch import open_stream, refresh_client, refuse
from nestgate.base.errors import RequestError
from nestgate.wire.fieldhead import declared_length, read_head


class StreamAdapter:
    """The stream sequence's side of a connection that carries a request per stream."""

    request_class = None           # the adapter's `request.Request` subclass

    def _open_head(self, stream_id: int, fields, ended: bool, length: int | None):
        """A request stream's head `fields` (`ended`: no body follows). `length` is the
        body's declared length when the frame layer read it already (-1: none), None to
        take it from the head's content-length. Returns the `Request` a handler answers
        (None when the head was refused or answered already) and the body's length."""
        method, raw_target, authority, headers, problem = read_head(fields, ended, self.limits)
        # Per request: streams may carry many clients (a banned one gets the page).
        router = refresh_client(self, headers) if self.xff_trusted else None
        if problem is None:
            try:
                if length is None and not ended:
                    length = declared_length(headers)
                if length is not None and length > self.limits.max_body:
                    raise RequestError(413)             # before a byte of it comes
            except RequestError as exc:
                problem = exc
        if problem is not None:
            refuse(self, stream_id, problem.status, method, authority, headers)
            return None, length
        return open_stream(self, stream_id, method, raw_target, authority, headers,
                           router), length

    def new_request(self, stream_id, handler, route, method, raw_target, qmark, headers,
                    authority, t0):
        """The stream sequence's `Request` for a stream (nestgate.pipeline.dispatch)."""
        req = self.request_class(self, handler, route, method, raw_target, qmark, headers,
                                 authority, True, t0)
        req.stream_id = stream_id
        return req

    def tunnelled(self) -> bool:
        """Never: a stream per request has no upgrade (RFC 9113 8.6, RFC 9114 4.5)."""
        return False

    def cut_tunnel(self) -> None:
        pass

    def _abandon(self, req) -> None:
        """The stream's handler and body are of no more use: stopped."""
        if req.body is not None:
            req.body.abort()
        if req.task is not None and not req.task.done():
            req.task.cancel()
        elif req.cancel is not None:
            req.cancel()                 # a handler answering from callbacks (`begin`)
