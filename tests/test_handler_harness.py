"""The handlers on the request contract alone: static files, notes and their API,
the proxy, sign-in and access decisions, and dispatch's handling of failures, each
answered through `tests/harness.py`'s in-memory responder (no server, no protocol)."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from harness import Harness
from nestgate.base.errors import HandlerError
from nestgate.handlers.auth.passwords import hash_password

TEXT = b"0123456789abcdef" * 64                      # 1 KiB
NOTE = "---\ntitle: Plans\ndate: 2026-05-01\n---\n\nthe plans, in **bold**\n"


class _Upstream:
    """An HTTP/1.1 upstream that echoes what it was asked, served on the harness's
    loop (its port is known before the config is, the server starts after)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        self.seen: list[bytes] = []

    def serve_on(self, loop) -> None:
        self.server = loop.run_until_complete(asyncio.start_server(self._serve, sock=self.sock))

    async def _serve(self, reader, writer) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.seen.append(head)
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length) if length else b""
                target = head.split(b" ")[1]
                answer = b"upstream saw " + target + b" " + body[::-1]
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n"
                             b"x-upstream: yes\r\ncontent-length: %d\r\n\r\n%b"
                             % (len(answer), answer))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


class _Failing:
    """Handlers that fail in each way dispatch must translate."""

    is_async = True

    def __init__(self, how: str) -> None:
        self.how = how

    async def handle(self, request) -> None:
        if self.how == "error":
            raise HandlerError(503, "store down")
        if self.how == "crash":
            raise ValueError("a bug")
        if self.how == "after start":
            request.start(200, [("content-type", "text/plain")])
            await request.write(b"part")
            raise HandlerError(502, "upstream broke")
        # "silent": returns without answering


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    folder = tmp_path_factory.mktemp("harness")
    (folder / "www").mkdir()
    (folder / "www" / "text.txt").write_bytes(TEXT)
    (folder / "notes").mkdir()
    (folder / "notes" / "plans.md").write_text(NOTE)
    (folder / "office").mkdir()
    (folder / "office" / "memo.md").write_text("---\ntitle: Memo\n---\n\nfor staff only\n")
    upstream = _Upstream()
    harness = Harness({
        "listen": [{"address": "127.0.0.1:0"}],
        "auth": {"store": str(folder / "state.db"),
                 "user": [{"name": "demo", "password": hash_password("demo-password")}]},
        "site": [
            {"hosts": ["*"],
             "notes": {"dir": str(folder / "notes"), "token": "tok"},
             "route": [
                 {"path": "/hello", "type": "return", "body": "hello\n"},
                 {"path": "/old", "type": "redirect", "to": "/hello", "status": 301},
                 {"prefix": "/files/", "type": "static", "root": str(folder / "www")},
                 {"prefix": "/app/", "type": "proxy",
                  "upstream": f"http://127.0.0.1:{upstream.port}"},
             ]},
            {"hosts": ["private.test"], "protected": True,
             "route": [{"prefix": "/", "type": "return", "body": "private\n"}]},
            {"hosts": ["office.test"], "allow": ["10.0.0.0/8"],
             "notes": {"dir": str(folder / "office"), "token": "tok2"}},
        ],
    }, handlers={f"/fail/{how}": _Failing(how)
                 for how in ("error", "crash", "after start", "silent")})
    upstream.serve_on(harness.loop)
    harness.upstream = upstream
    yield harness
    upstream.server.close()
    harness.close()


def test_ready_answers_need_no_request_object(site):
    answer = site.ask("GET", "/hello")
    assert (answer.status, answer.body, answer.ready) == (200, b"hello\n", True)
    answer = site.ask("GET", "/old")
    assert (answer.status, answer.headers["location"]) == (301, "/hello")
    assert site.ask("HEAD", "/hello").body == b""


def test_static_file_range_and_conditional(site):
    whole = site.ask("GET", "/files/text.txt")
    assert (whole.status, whole.body) == (200, TEXT)
    assert whole.headers["content-length"] == str(len(TEXT))
    part = site.ask("GET", "/files/text.txt", [("range", "bytes=10-19")])
    assert (part.status, part.body) == (206, TEXT[10:20])
    assert part.headers["content-range"] == f"bytes 10-19/{len(TEXT)}"
    assert site.ask("GET", "/files/text.txt", [("range", "bytes=5000-")]).status == 416
    again = site.ask("GET", "/files/text.txt", [("if-none-match", whole.headers["etag"])])
    assert (again.status, again.body) == (304, b"")
    assert site.ask("GET", "/files/none.txt").status == 404
    assert site.ask("GET", "/files/..%2f..%2fetc/passwd").status == 400
    assert site.ask("GET", "/files/../../etc/passwd").status == 400


def test_notes_page_and_api_write(site):
    page = site.ask("GET", "/notes/plans")
    assert page.status == 200 and b"<strong>bold</strong>" in page.body
    assert site.ask("GET", "/api/v1/notes/plans").status == 401
    body = json.dumps({"title": "Fresh", "body": "written over the API"}).encode()
    written = site.ask("PUT", "/api/v1/notes/fresh", [("authorization", "Bearer tok"),
                                                     ("content-type", "application/json")],
                       body)
    assert written.status == 201, written.body
    fresh = site.ask("GET", "/notes/fresh")
    assert fresh.status == 200 and b"written over the API" in fresh.body
    bad = site.ask("PUT", "/api/v1/notes/broken", [("authorization", "Bearer tok"),
                                                  ("content-type", "application/json")],
                   b"{not json")
    assert bad.status == 422 and json.loads(bad.body)["field"] == "body"


def test_allow_list_covers_rendered_and_written_note_pages(site):
    # An allowed visitor renders the page; the outsider still gets 403 after it.
    assert site.ask("GET", "/notes/memo", host="office.test", client="203.0.113.9").status == 403
    inside = site.ask("GET", "/notes/memo", host="office.test", client="10.1.2.3")
    assert inside.status == 200 and b"for staff only" in inside.body
    outside = site.ask("GET", "/notes/memo", host="office.test", client="203.0.113.9")
    assert outside.status == 403 and b"for staff only" not in outside.body
    # A write through the API (from inside) renders the new page: it stays guarded.
    body = json.dumps({"title": "New", "body": "staff news"}).encode()
    assert site.ask("PUT", "/api/v1/notes/news", [("authorization", "Bearer tok2")], body,
                    host="office.test", client="10.1.2.3").status == 201
    assert site.ask("GET", "/notes/news", host="office.test",
                    client="203.0.113.9").status == 403


def test_sign_in_decides_before_the_route(site):
    browser = site.ask("GET", "/x", [("accept", "text/html")], host="private.test")
    assert browser.status == 401 and b'type="submit">Sign in' in browser.body
    assert browser.headers["cache-control"] == "no-store"
    script = site.ask("GET", "/x", [("accept", "application/json")], host="private.test")
    assert script.status == 401 and b"private\n" not in script.body
    forged = site.ask("GET", "/x", [("cookie", "nestgate_session=forged")],
                      host="private.test")
    assert forged.status == 401 and b"private\n" not in forged.body


def test_proxy_through_the_contract(site):
    got = site.ask("GET", "/app/page?q=1")
    assert (got.status, got.body) == (200, b"upstream saw /app/page?q=1 ")
    assert got.headers["x-upstream"] == "yes"
    posted = site.ask("POST", "/app/echo", [("content-type", "application/octet-stream")],
                      b"abcdef")
    assert (posted.status, posted.body) == (200, b"upstream saw /app/echo fedcba")
    # The upstream was asked with X-Forwarded-For naming the client.
    assert b"x-forwarded-for: 192.0.2.10" in site.upstream.seen[-1].lower()


@pytest.mark.parametrize("how, status, cut", [
    ("error", 503, False), ("crash", 500, False), ("silent", 500, False),
    ("after start", 200, True)])
def test_dispatch_translates_handler_failures(site, how, status, cut):
    answer = site.ask("GET", f"/fail/{how}")
    assert (answer.status, answer.cut) == (status, cut)
    if not cut:
        assert answer.headers["content-type"].startswith("text/html")
    else:
        assert answer.body == b"part"


def test_a_gate_asked_again_after_an_await_decides_for_the_requests_own_client():
    # The sign-in portal settles the route's handler again once the store has
    # answered; by then the connection may have read another request's head (a
    # trusted proxy's pipelining, another HTTP/2 stream) and name another client.
    # Health details go to local clients only: the remote request must not get them.
    from harness import MemoryConnection, MemoryRequest
    from nestgate.handlers.auth.portal import answer_with
    from nestgate.handlers.health import health_handler
    harness = Harness({"listen": [{"address": "127.0.0.1:0"}], "site": [{"hosts": ["*"]}]})
    try:
        conn = MemoryConnection(harness.ctx, "203.0.113.5")
        route = harness.router.route(b"localhost", b"/api/v1/health")
        req = MemoryRequest(conn, route.handler, route, b"GET", b"/api/v1/health", -1,
                            [(b"host", b"localhost")], b"localhost", True, 0.0)
        conn.client = "127.0.0.1"          # the head read after this request's
        harness.loop.run_until_complete(answer_with(health_handler("local"), req))
        answer = json.loads(b"".join(req.chunks))
        assert req.status == 200 and "pid" not in answer, answer
    finally:
        harness.close()
