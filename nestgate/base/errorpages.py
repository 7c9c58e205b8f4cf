"""Error pages: what a visitor, or a client that asks for JSON, gets when nestgate
refuses a request or the service behind a site fails.

Theory of operation
-------------------
Every status nestgate answers by itself has a built-in page: the built-in stylesheet's
look inlined in a few rules (a proxied site has no `/__nestgate__/` path of its own to
link to; the 404 page is about 500 bytes), the status,
and one sentence saying what happened in words a visitor understands ("the service
behind this site is not answering"). A client whose `Accept` names JSON and not HTML
(an API client, `fetch` with `Accept: application/json`) gets the same as
`{"status", "error", "detail"}` instead. A site replaces the HTML of any status with
its own file (`error_pages = { 403 = "403.html", 502 = "down.html" }`); JSON stays
nestgate's, since a client that asked for JSON cannot read a page.

All of it is built at load as `Prebuilt` responses: an error costs what any ready
answer costs. The one exception is the built-in 403 page, which shows the client the
address it was refused for, and its country where [geoip] places it (so a visitor can
tell the owner what to allow); those are kept in a small bounded memo by address.

`ERRORS` (responses.py) are the default site's pages, used where no site is known yet:
a request that fails before routing (a malformed head, a Host no site claims).
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from nestgate.base.handler import ReadyChoice
from nestgate.base.responses import SERVER, Prebuilt, alt_svc_value, reason

HTML = "text/html; charset=utf-8"
JSON = "application/json"
# The built-in stylesheet's look (colours, type, measure) in the few rules an error page
# uses: inlined, since a proxied site has no /__nestgate__/ path to link to, and small:
# a 404 or 403 is what scanners and unknown Hosts cost (over TLS every byte is encrypted
# and sent), so the page is in HTML5's short form (no <head>, <body>), about 500 bytes.
STYLE = ('body{font:17px/1.6 system-ui,sans-serif;color:#1d2330;background:#fbfaf7;'
         'max-width:46rem;margin:1.5rem auto;padding:0 1.25rem}a{color:#2f6f4f}'
         'code{font-family:ui-monospace,monospace;background:#eef0f3}'
         '.meta,footer{color:#5c6575;font-size:.9rem}')
H2C_OFF = (b"400 Bad Request: this listener speaks HTTP/1.1. HTTP/2 in clear text (h2c with "
           b"prior knowledge) is off here: set `http2_cleartext = true` in its [[listen]] "
           b"table, or use its HTTPS listener, where ALPN offers h2.\n")
_FORBIDDEN_MEMO_MAX = 64         # 403 pages kept by address: each is several KB
_TOO_MANY_MEMO_MAX = 128         # 429 answers kept by Retry-After value
_RETRY_AFTER_MAX = 3600          # a slower limit still says "within the hour"

# One sentence per status, as a visitor would want it said.
EXPLANATIONS = {
    400: "The request could not be understood.",
    401: "Sign in to see this page.",
    403: "This address is not allowed here.",
    404: "There is nothing at this address.",
    405: "This address does not take that kind of request.",
    408: "The request took too long to arrive.",
    413: "The request is larger than this site accepts.",
    414: "The address is longer than this site accepts.",
    417: "The request asked for something this server does not do.",
    421: "This connection is not for that site.",
    422: "The request was understood but its content is not valid.",
    429: "Too many requests came from your address; wait a moment and try again.",
    431: "The request's headers are larger than this site accepts.",
    500: "Something went wrong on this server.",
    501: "This server does not do that.",
    502: "The service behind this site is not answering.",
    503: "The service behind this site is busy or down for a moment; try again soon.",
    504: "The service behind this site took too long to answer.",
    505: "This HTTP version is not supported.",
    507: "The server has no room to store that.",
}
STATUSES = tuple(EXPLANATIONS)


def explanation(status: int) -> str:
    return EXPLANATIONS.get(status) or f"The server answered {status} {reason(status)}."


def error_html(status: int, detail: str = "", client: str = "", country: str = "") -> bytes:
    """The built-in page for `status`: styled, with its explanation (and the address a
    403 refused, with its country when known)."""
    title = f"{status} {reason(status)}"
    where = (f", in country <code>{html.escape(country)}</code>") if country else ""
    seen_as = (f"<p class=\"meta\">Your address, as this site sees it: "
               f"<code>{html.escape(client)}</code>{where}</p>") if client else ""
    detail = f"<p>{html.escape(detail)}</p>" if detail else ""
    return (f"<!doctype html>\n<html lang=\"en\"><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
            f"<title>{title}</title><style>{STYLE}</style>\n"
            f"<h1>{title}</h1><p>{html.escape(explanation(status))}</p>{detail}{seen_as}"
            f"<footer>{SERVER.text}</footer></html>\n").encode()


def error_json(status: int, client: str = "", country: str = "") -> bytes:
    body = {"status": status, "error": reason(status), "detail": explanation(status)}
    if client:
        body["client"] = client
    if country:
        body["country"] = country
    return json.dumps(body).encode() + b"\n"


def wants_json(headers) -> bool:
    """The request's Accept names JSON and not HTML (a browser always names HTML)."""
    for name, value in headers:
        if name == b"accept":
            value = value.lower()
            # find(), not `in`: see base/paths.py on bytes in bytes.
            return value.find(b"json") >= 0 and value.find(b"text/html") < 0
    return False


class ErrorAnswer(ReadyChoice):
    """One status's page and JSON, picked by Accept; a route handler too (a site's 404
    for unmatched paths)."""

    __slots__ = ("status", "page", "json")

    def __init__(self, status: int, page: bytes | None = None, headers=()) -> None:
        self.status = status
        self.page = Prebuilt(status, page if page is not None else error_html(status),
                             HTML, headers)
        self.json = Prebuilt(status, error_json(status), JSON, headers)

    def choose(self, headers) -> Prebuilt:
        return self.json if wants_json(headers) else self.page

    def peek(self, path: str, method: bytes, headers) -> Prebuilt:
        # `choose` without the call through it: a site's 404 is what scanners and
        # unknown Hosts cost.
        return self.json if wants_json(headers) else self.page


class ErrorPages:
    """One site's error answers (the default site's when `custom` is empty)."""

    def __init__(self, custom: dict[int, bytes] | None = None) -> None:
        custom = custom or {}
        self.custom_forbidden = 403 in custom
        self.answers = {status: ErrorAnswer(status, custom.get(status))
                        for status in (*STATUSES, *custom)}
        self._forbidden: dict[tuple[str, bool, str], Prebuilt] = {}
        self._too_many: dict[tuple[int, bool], Prebuilt] = {}
        self._custom_too_many = custom.get(429)
        # The HTTP/2 preface on a listener that speaks HTTP/1.1 only (h2load, curl
        # --http2-prior-knowledge): plain text, since such a client shows no page.
        self.h2c_off = Prebuilt(400, H2C_OFF, "text/plain; charset=utf-8")

    def answer(self, status: int, headers) -> Prebuilt:
        found = self.answers.get(status)
        if found is None:
            found = self.answers[500 if status >= 500 else 400]
        return found.choose(headers)

    def __getitem__(self, status: int) -> ErrorAnswer:
        return self.answers[status]

    def forbidden(self, client: str, headers, country: str = "") -> Prebuilt:
        """The 403 for a refused address: the built-in page names the address (and the
        country [geoip] puts it in)."""
        as_json = wants_json(headers)
        if self.custom_forbidden and not as_json:
            return self.answers[403].page
        key = (client, as_json, country)
        page = self._forbidden.get(key)
        if page is None:
            if len(self._forbidden) >= _FORBIDDEN_MEMO_MAX:
                self._forbidden.clear()
            page = self._forbidden[key] = \
                Prebuilt(403, error_json(403, client, country), JSON) if as_json else \
                Prebuilt(403, error_html(403, client=client, country=country), HTML)
        return page


    def too_many(self, retry_after: int, headers) -> Prebuilt:
        """The 429 of a rate limit, with `Retry-After` in whole seconds; kept by
        (seconds, JSON or page), so a refused request costs a ready answer."""
        retry_after = min(retry_after, _RETRY_AFTER_MAX)
        as_json = wants_json(headers)
        key = (retry_after, as_json)
        found = self._too_many.get(key)
        if found is None:
            if len(self._too_many) >= _TOO_MANY_MEMO_MAX:
                self._too_many.clear()
            extra = [("retry-after", str(retry_after)), ("cache-control", "no-store")]
            found = self._too_many[key] = \
                Prebuilt(429, error_json(429), JSON, extra) if as_json else \
                Prebuilt(429, self._custom_too_many or error_html(429), HTML, extra)
        return found


# The default site's pages: the engine's own errors before a site is known.
DEFAULT_PAGES = ErrorPages()
ERRORS = {status: DEFAULT_PAGES[status].page for status in STATUSES}


def rebuild_defaults() -> None:
    """`DEFAULT_PAGES` and `ERRORS` again, after `SERVER` changed (server_tokens);
    both are changed in place, so every holder sees the new pages."""
    fresh = ErrorPages()
    DEFAULT_PAGES.__dict__.update(fresh.__dict__)
    ERRORS.update({status: fresh[status].page for status in STATUSES})


def error_pages(config, site_config=None) -> ErrorPages:
    """A site's error pages: its own `error_pages` files, else [server]
    `not_found_page` for 404, else the built-in pages."""
    custom = {}
    if config.server.not_found_page:
        custom[404] = Path(config.server.not_found_page).read_bytes()
    if site_config is not None:
        custom.update(site_config.error_pages)
    # Without pages of its own a site answers with the built-in ones, built once when
    # the module was imported (before the workers were forked, so shared by them);
    # unless this worker announces HTTP/3, whose Alt-Svc line they were built without.
    if not custom and not alt_svc_value():
        return DEFAULT_PAGES
    return ErrorPages(custom)
