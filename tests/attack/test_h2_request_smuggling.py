"""HTTP/2 -> HTTP/1.1 request smuggling through the proxy: real nestgate, raw upstream.

An HTTP/2 request is framed by its DATA frames; the proxy writes it upstream as an
HTTP/1.1 message framed by a Content-Length line (or chunked). Any field that frames,
routes or splits the request differently on the two sides lets the client hide a
second request in the body: two `content-length` fields (55, then 5) had the engine
take 55 bytes and the proxy announce 5, so the upstream read the other 50 as
`GET /admin2/`, a route whose allow list refuses the client, and the next client on
the pooled upstream connection got its answer.

RFC 9113 8.1.1 and 8.2 make each such request malformed: a stream error (RST_STREAM
PROTOCOL_ERROR, or 400), nothing forwarded. The corpus below holds the shapes of the
family; each is sent over TLS (ALPN h2) and in clear (h2c), followed on the same
connection by an innocent request, which must be the only one the upstream reads
(`RawUpstream` parses each connection for its whole life) and must get its own answer.
"""

from __future__ import annotations

import time

import pytest
from h2raw import DataFrame, HeadersFrame, RawH2
from rawupstream import UNASKED_AFTER_S, RawUpstream, guarded_gateway, \
    refused_corpus_stays_bounded

PROTOCOL_ERROR = 0x1
MEANT = b"/public/x"
VISIBLE = b"hello"
# 50 bytes: with VISIBLE, the 55 of the report's first content-length.
HIDDEN = b"GET /admin2/ HTTP/1.1\r\nhost: localhost\r\nx: 123\r\n\r\n"
assert len(HIDDEN) == 50
BODY = VISIBLE + HIDDEN
LONG, SHORT = b"%d" % len(BODY), b"%d" % len(VISIBLE)
CHUNKED_BODY = b"5\r\nhello\r\n0\r\n\r\n" + HIDDEN
# The worker's memory after the whole corpus, several times over, may grow by this.
RSS_GROWTH_KIB = 12 * 1024


def post(*extra, path: bytes = MEANT, method: bytes = b"POST", authority: bytes = b"localhost"):
    return [(b":method", method), (b":scheme", b"https"), (b":path", path),
            (b":authority", authority), *extra]


class Shape:
    """A request: its header block, its DATA payloads (the last ends the stream; none:
    HEADERS ends it), and trailers if any."""

    def __init__(self, fields, data=(BODY,), trailers=None, statuses=(400,)) -> None:
        self.fields = fields
        self.data = list(data)
        self.trailers = trailers
        self.statuses = statuses        # answers that count as a refusal

    def frames(self, conn: RawH2, stream: int) -> list:
        out = [HeadersFrame(stream, conn.block(self.fields),
                            flags={"END_HEADERS"} | (set() if self.data or self.trailers
                                                     else {"END_STREAM"}))]
        for i, chunk in enumerate(self.data):
            last = i == len(self.data) - 1 and self.trailers is None
            out.append(DataFrame(stream, chunk, flags={"END_STREAM"} if last else set()))
        if self.trailers is not None:
            out.append(HeadersFrame(stream, conn.block(self.trailers),
                                    flags={"END_HEADERS", "END_STREAM"}))
        return out


CL = b"content-length"
SHAPES = {
    # content-length: repeated, listed, or not the plain digits the proxy writes
    "cl-long-then-short": Shape(post((CL, LONG), (CL, SHORT))),        # the report
    "cl-short-then-long": Shape(post((CL, SHORT), (CL, LONG))),
    "cl-repeated-identical": Shape(post((CL, LONG), (CL, LONG))),
    "cl-repeated-identical-short-body": Shape(post((CL, SHORT), (CL, SHORT)), data=[VISIBLE]),
    "cl-list-differing": Shape(post((CL, SHORT + b", " + LONG))),
    "cl-list-identical": Shape(post((CL, LONG + b"," + LONG))),
    "cl-plus-sign": Shape(post((CL, b"+" + LONG))),
    "cl-minus": Shape(post((CL, b"-1"))),
    "cl-underscore": Shape(post((CL, b"5_5"))),
    "cl-hex": Shape(post((CL, b"0x37"))),
    "cl-empty": Shape(post((CL, b""))),
    "cl-space-inside": Shape(post((CL, b"5 5"))),
    "cl-leading-space": Shape(post((CL, b" " + LONG))),
    "cl-trailing-tab": Shape(post((CL, LONG + b"\t"))),
    "cl-non-ascii-digit": Shape(post((CL, "٥٥".encode()))),
    "cl-huge": Shape(post((CL, b"9" * 40)), statuses=(400, 413)),
    "cl-uppercase-name": Shape(post((b"Content-Length", SHORT))),
    "cl-in-connection-and-field": Shape(post((CL, SHORT), (b"connection", b"content-length"))),
    # content-length against the DATA that follows
    "cl-short-data-long": Shape(post((CL, SHORT))),
    "cl-short-data-long-in-pieces": Shape(post((CL, SHORT)), data=[b"hel", b"lo" + HIDDEN]),
    "cl-zero-data-long": Shape(post((CL, b"0"))),
    "cl-long-data-short": Shape(post((CL, LONG)), data=[VISIBLE]),
    "cl-long-data-none-then-end": Shape(post((CL, LONG)), data=[b""]),
    "cl-without-body": Shape(post((CL, LONG)), data=[]),
    "cl-in-trailers": Shape(post((CL, SHORT)), data=[VISIBLE], trailers=[(CL, LONG)]),
    "pseudo-in-trailers": Shape(post((CL, SHORT)), data=[VISIBLE],
                                trailers=[(b":path", b"/admin2/")]),
    # transfer-encoding, te and the other connection-specific fields
    "te-chunked": Shape(post((b"transfer-encoding", b"chunked")), data=[CHUNKED_BODY]),
    "te-chunked-with-cl": Shape(post((b"transfer-encoding", b"chunked"),
                                     (CL, b"%d" % len(CHUNKED_BODY))), data=[CHUNKED_BODY]),
    "te-identity": Shape(post((b"transfer-encoding", b"identity"))),
    "te-field-gzip": Shape(post((b"te", b"gzip"))),
    "te-field-trailers-and-more": Shape(post((b"te", b"trailers, chunked"))),
    "connection-keep-alive": Shape(post((b"connection", b"keep-alive"))),
    "keep-alive": Shape(post((b"keep-alive", b"timeout=5"))),
    "proxy-connection": Shape(post((b"proxy-connection", b"keep-alive"))),
    "upgrade-websocket": Shape(post((b"upgrade", b"websocket"))),
    "upgrade-h2c": Shape(post((b"upgrade", b"h2c"), (b"http2-settings", b"AAMAAABkAAQAAP__"))),
    # CR, LF, NUL and whitespace in names and values
    "crlf-in-value": Shape(post((b"x-a", b"a\r\n" + HIDDEN[:-2]))),
    "lf-in-value": Shape(post((b"x-a", b"a\n" + HIDDEN[:-1]))),
    "cr-in-value": Shape(post((b"x-a", b"a\rb"))),
    "nul-in-value": Shape(post((b"x-a", b"a\x00b"))),
    "crlf-in-name": Shape(post((b"x-a\r\ncontent-length", SHORT))),
    "nul-in-name": Shape(post((b"x-a\x00", b"b"))),
    "leading-space-in-value": Shape(post((b"x-a", b" a"))),
    "trailing-space-in-value": Shape(post((b"x-a", b"a "))),
    "leading-space-in-name": Shape(post((b" content-length", SHORT))),
    "trailing-space-in-name": Shape(post((b"content-length ", SHORT))),
    "uppercase-name": Shape(post((b"X-Admin", b"1"))),
    "colon-in-name": Shape(post((b"content-length:", SHORT))),
    "colon-inside-name": Shape(post((b"x:content-length", SHORT))),
    "empty-name": Shape(post((b"", b"a"))),
    "crlf-in-host": Shape(post((b"host", b"localhost\r\nx-a: b"))),
    # pseudo-fields: where, which, how many
    "pseudo-after-regular": Shape([(b":method", b"POST"), (b":scheme", b"https"),
                                   (CL, LONG), (b":path", MEANT),
                                   (b":authority", b"localhost")]),
    "pseudo-unknown": Shape(post((b":protocol", b"websocket"))),
    "pseudo-status-in-request": Shape(post((b":status", b"200"))),
    "pseudo-path-repeated": Shape(post((b":path", b"/admin2/"))),
    "pseudo-authority-repeated": Shape(post((b":authority", b"admin.internal"))),
    "pseudo-method-repeated": Shape(post((b":method", b"GET"))),
    "pseudo-path-missing": Shape([(b":method", b"POST"), (b":scheme", b"https"),
                                  (b":authority", b"localhost")]),
    "method-with-request-line": Shape(post(method=b"GET /admin2/ HTTP/1.1\r\nx:")),
    "path-with-request-line": Shape(post(path=b"/public/x HTTP/1.1\r\n\r\n" + HIDDEN)),
    "path-with-space": Shape(post(path=b"/public/x /admin2/")),
    "authority-with-crlf": Shape(post(authority=b"localhost\r\nx-a: b")),
    # host against :authority
    "host-differs-from-authority": Shape(post((b"host", b"admin.internal"))),
    "host-repeated-without-authority": Shape(
        [(b":method", b"POST"), (b":scheme", b"https"), (b":path", MEANT),
         (b"host", b"localhost"), (b"host", b"admin.internal")]),
    "host-repeated-with-authority": Shape(post((b"host", b"localhost"), (b"host", b"localhost"))),
}
assert len(SHAPES) >= 40
TRANSPORTS = ("h2", "h2c")


@pytest.fixture(scope="module")
def upstream():
    up = RawUpstream()
    yield up
    up.stop()


@pytest.fixture(scope="module")
def gateway(request, upstream, certs, tmp_path_factory):
    """One nestgate: a TLS listener (ALPN h2) and a plain one taking h2c by prior
    knowledge, everything forwarded to `upstream`, `/admin2/` allowed only to
    10.0.0.0/8 (so never to these loopback clients)."""
    server = guarded_gateway(request, tmp_path_factory, upstream, certs, "/admin2/",
                             cleartext=True)
    yield server
    server.stop()


@pytest.fixture
def up(upstream, gateway):
    upstream.take()                     # nothing left over from an earlier test
    return upstream


def connect(gateway, certs, transport: str) -> RawH2:
    if transport == "h2":
        return RawH2(gateway.port("https"), certs["ca"], timeout=5)
    return RawH2(gateway.port("http"), None, timeout=5)


def ask(conn: RawH2, path: bytes):
    """An innocent GET on `conn`: its stream's (status, body)."""
    stream = conn.request(post(path=path, method=b"GET"))
    answer = conn.answers([stream], timeout=5)[stream]
    return answer.status, bytes(answer.data)


def attempt(conn: RawH2, shape: Shape):
    """Send `shape` on a new stream: its answer (status, reset code)."""
    stream = conn.new_stream()
    conn.send(*shape.frames(conn, stream))
    answer = conn.answers([stream], timeout=5)[stream]
    return answer.status, answer.reset


def refused(shape: Shape, status: int, reset) -> bool:
    return status in shape.statuses or (not status and reset == PROTOCOL_ERROR)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("name", list(SHAPES))
def test_malformed_request_is_refused_and_nothing_reaches_upstream(gateway, up, certs,
                                                                   transport, name):
    shape = SHAPES[name]
    conn = connect(gateway, certs, transport)
    try:
        status, reset = attempt(conn, shape)
        innocent = b"/public/after-" + name.encode()
        after = ask(conn, innocent)
    finally:
        conn.close()
    seen = up.take()
    assert [r["target"] for r in seen] == [innocent.decode()], "a request reached upstream"
    assert refused(shape, status, reset), (status, reset)
    assert after == (200, innocent), "the connection or the upstream was left broken"
    assert conn.goaway is None, "a stream error, not the connection's"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_reported_attack_never_answers_the_next_client(gateway, up, certs, transport):
    # The report: CL 55 then 5, 50 bytes of `GET /admin2/` behind them on an allowed
    # route; the next request on the pooled upstream connection got the hidden answer.
    for round_ in range(4):
        attacker = connect(gateway, certs, transport)
        status, reset = attempt(attacker, SHAPES["cl-long-then-short"])
        attacker.close()
        assert refused(SHAPES["cl-long-then-short"], status, reset), (status, reset)
        victim = connect(gateway, certs, transport)
        target = b"/public/victim-%d" % round_
        assert ask(victim, target) == (200, target)
        victim.close()
    seen = [r["target"] for r in up.take()]
    assert seen == [f"/public/victim-{i}" for i in range(4)]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_hidden_route_refuses_this_client(gateway, up, certs, transport):
    # What the attack hides: asked openly, it never gets through.
    conn = connect(gateway, certs, transport)
    status = ask(conn, b"/admin2/")[0]
    conn.close()
    assert status == 403
    assert up.take() == []


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("length", [True, False], ids=["content-length", "no-length"])
def test_well_formed_body_is_forwarded_framed_by_what_is_sent(gateway, up, certs, transport,
                                                              length):
    fields = post((CL, LONG)) if length else post()
    conn = connect(gateway, certs, transport)
    status, _reset = attempt(conn, Shape(fields + [(b"te", b"trailers")],
                                         data=[BODY[:20], BODY[20:]]))
    conn.close()
    assert status == 200
    [seen] = up.take()
    assert seen["body"] == BODY
    framing = [(n, v) for n, v in seen["headers"] if n in ("content-length", "transfer-encoding")]
    assert framing == ([("content-length", LONG.decode())] if length
                       else [("transfer-encoding", "chunked")])


def test_the_corpus_leaves_the_worker_memory_bounded(gateway, up, certs):
    def corpus() -> None:
        for transport in TRANSPORTS:
            for shape in SHAPES.values():
                conn = connect(gateway, certs, transport)
                assert refused(shape, *attempt(conn, shape))
                conn.close()

    refused_corpus_stays_bounded(gateway, up, corpus, RSS_GROWTH_KIB)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("when", ["now", "later"])
def test_upstream_connection_with_an_unasked_answer_is_not_reused(gateway, up, certs,
                                                                  transport, when):
    # What a hidden request leaves on a pooled upstream connection: an answer beyond
    # what was asked, in the same read or after the exchange ended. Whatever let it
    # through, that connection is closed, never handed to the next request.
    conn = connect(gateway, certs, transport)
    try:
        target = b"/extra/" + when.encode()
        assert ask(conn, target) == (200, target)
        time.sleep(3 * UNASKED_AFTER_S)          # the unasked answer has come by now
        assert ask(conn, b"/public/next") == (200, b"/public/next")
    finally:
        conn.close()
    seen = up.take()
    assert [r["target"] for r in seen] == [target.decode(), "/public/next"]
    assert seen[1]["conn"] != seen[0]["conn"], "the connection was reused"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_body_cut_short_after_it_went_upstream_leaves_nothing_pooled(gateway, up, certs,
                                                                       transport):
    # The head (content-length 55) and the first 5 bytes are upstream before the
    # client ends the stream short: the upstream connection waits for 50 more bytes,
    # which the next request on it must never be.
    conn = connect(gateway, certs, transport)
    try:
        stream = conn.new_stream()
        sent = time.monotonic()
        conn.send(HeadersFrame(stream, conn.block(post((CL, LONG))), flags={"END_HEADERS"}),
                  DataFrame(stream, VISIBLE))
        deadline = sent + 5
        while up.last_byte < sent and time.monotonic() < deadline:    # the head is upstream
            time.sleep(0.01)
        assert up.last_byte > sent
        conn.send(DataFrame(stream, b"", flags={"END_STREAM"}))
        answer = conn.answers([stream], timeout=5)[stream]
        assert (answer.status, answer.reset) == (0, PROTOCOL_ERROR)
        assert ask(conn, b"/public/next") == (200, b"/public/next")
    finally:
        conn.close()
    assert [r["target"] for r in up.take()] == ["/public/next"]
