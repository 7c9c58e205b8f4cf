"""What a request routed to, as every router answers it (a site's route table, the
page a banned client is shown): the route table builds these, the stream sequence
and the adapters read them."""

from __future__ import annotations

NO_PARAMS: dict[str, str] = {}


class Route:
    """What a request routed to: the handler (already behind the site's guard), the
    `{name}` values of a pattern route, the route's label for the request log, the
    decoded path, the site's error pages (an error the handler raises is answered
    with them) and the route's `RouteTally` (its answers are counted there)."""

    __slots__ = ("handler", "params", "label", "path", "errors", "tally")

    def __init__(self, handler, params: dict, label: str, path: str, errors, tally) -> None:
        self.handler = handler
        self.params = params
        self.label = label
        self.path = path
        self.errors = errors
        self.tally = tally
