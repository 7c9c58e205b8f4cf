"""Errors that carry the HTTP status they map to, one small hierarchy per layer.

The engine translates them once, at its edge: a `RequestError` raised while parsing
becomes its status and the connection closes; a `HandlerError` raised by a handler
becomes its status if no response byte was sent yet, otherwise the connection is cut.
"""


class NestgateError(Exception):
    status = 500


class RequestError(NestgateError):
    """The client's request breaks the protocol or a limit: answer `status`, then close."""

    def __init__(self, status: int, detail: str = "") -> None:
        super().__init__(detail or str(status))
        self.status = status


class HandlerError(NestgateError):
    """A handler could not produce a response (upstream down, storage failed, ...)."""

    def __init__(self, status: int, detail: str = "") -> None:
        super().__init__(detail or str(status))
        self.status = status


class RouteTaken(ValueError):
    """A route was added on an exact or `{name}` path its site already routes: a route
    table never replaces one (the route already there keeps answering). Raised by the
    table (nestgate.pipeline.routing), caught by whoever adds routes while serving."""

    def __init__(self, site: str, path: str, label: str, taken_by: str) -> None:
        super().__init__(f"site {site or '-'}: {path} is already the route {taken_by!r}")
        self.path, self.label, self.taken_by = path, label, taken_by
