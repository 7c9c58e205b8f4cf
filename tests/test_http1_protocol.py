"""HTTP/1.1 engine, bytes in and out, no sockets."""

import pytest

from nestgate.wire import h1phases
from nestgate.handlers.health import HealthAnswer
from wire import Broken, Echo, Wire, config_dict


class Streamer:
    is_async = True

    async def handle(self, request):
        request.start(200, [(b"content-type", b"text/plain")])
        for part in (b"one ", b"two ", b"three"):
            await request.write(part)
        request.end()


class Refuser:
    """Answers 401 without reading the body, as an API refusing a request does."""
    is_async = True

    async def handle(self, request):
        await request.send(401, [(b"content-type", b"text/plain")], b"no\n")


class HeaderEcho:
    """Reads the body, then answers with the request's header names, one per line."""
    is_async = True

    async def handle(self, request):
        if request.body:
            await request.body.read_all()
        names = b"\n".join(name for name, _ in request.headers)
        await request.send(200, [(b"content-type", b"text/plain")], names)


@pytest.fixture
def wire():
    w = Wire(handlers={"/echo": Echo(), "/stream": Streamer(), "/broken": Broken(),
                       "/refuse": Refuser(), "/headers": HeaderEcho()})
    yield w
    w.close()


def test_get_keep_alive(wire):
    wire.send(b"GET /hello HTTP/1.1\r\nHost: a\r\n\r\n")
    wire.send(b"GET /hello HTTP/1.1\r\nHost: a\r\n\r\n")
    responses = wire.responses()
    assert [r.status for r in responses] == [200, 200]
    assert responses[0].body == b"hello\n"
    assert responses[0].headers["connection"] == "keep-alive" and "date" in responses[0].headers
    assert not wire.closed


def test_pipelined_responses_keep_request_order(wire):
    wire.send(b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nfirst"
              b"GET /hello HTTP/1.1\r\nHost: a\r\n\r\n"
              b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 6\r\n\r\nsecond"
              b"GET /missing HTTP/1.1\r\nHost: a\r\n\r\n")
    assert [(r.status, r.body) for r in wire.responses()][:3] == [
        (200, b"first"), (200, b"hello\n"), (200, b"second")]
    assert wire.responses()[3].status == 404


def test_head_has_headers_but_no_body(wire):
    wire.send(b"HEAD /hello HTTP/1.1\r\nHost: a\r\n\r\nGET /hello HTTP/1.1\r\nHost: a\r\n\r\n")
    raw = bytes(wire.transport.out)
    first, second = raw.split(b"HTTP/1.1 200 OK")[1:]
    assert b"content-length: 6" in first and not first.endswith(b"hello\n")
    assert second.endswith(b"hello\n")


def test_chunked_request_body(wire):
    wire.send(b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
              b"3\r\nabc\r\n4;ext=1\r\ndefg\r\n0\r\n\r\n")
    assert wire.responses()[0].body == b"abcdefg"


def test_streamed_response_is_chunked(wire):
    wire.send(b"GET /stream HTTP/1.1\r\nHost: a\r\n\r\n")
    response = wire.responses()[0]
    assert response.headers["transfer-encoding"] == "chunked"
    assert response.body == b"one two three"


def test_http10_response_without_length_ends_with_connection(wire):
    wire.send(b"GET /stream HTTP/1.0\r\n\r\n")
    assert wire.responses()[0].body == b"one two three" and wire.closed


def test_expect_100_continue(wire):
    wire.send(b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n"
              b"Expect: 100-continue\r\n\r\n")
    assert bytes(wire.transport.out) == b"HTTP/1.1 100 Continue\r\n\r\n"
    wire.send(b"data")
    assert [r.status for r in wire.responses()] == [100, 200]
    assert wire.responses()[1].body == b"data"


def test_an_http1_0_clients_expectation_is_ignored(wire):
    # RFC 9110 10.1.1: an HTTP/1.0 client may not know 1xx answers and would take
    # `100 Continue` for its answer (it was sent), then the real one for the next's.
    wire.send(b"POST /echo HTTP/1.0\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
    assert bytes(wire.transport.out) == b""
    wire.send(b"data")
    [resp] = wire.responses()
    assert (resp.status, resp.body) == (200, b"data")


def test_an_http1_0_clients_unknown_expectation_is_not_417(wire):
    wire.send(b"POST /echo HTTP/1.0\r\nContent-Length: 4\r\nExpect: x-other\r\n\r\ndata")
    assert [(r.status, r.body) for r in wire.responses()] == [(200, b"data")]


def test_expect_100_not_sent_when_body_too_large(wire):
    wire.send(b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999\r\n"
              b"Expect: 100-continue\r\n\r\n")
    assert [r.status for r in wire.responses()] == [413]
    assert wire.closed


def test_answer_before_a_body_awaiting_100_continue_closes(wire):
    # The client waits for 100 Continue and may never send the body: a response that
    # comes first says `connection: close`, so nothing later is mistaken for body.
    wire.send(b"PUT /refuse HTTP/1.1\r\nHost: a\r\nContent-Length: 20\r\n"
              b"Expect: 100-continue\r\n\r\n")
    [resp] = wire.responses()
    assert resp.status == 401 and resp.headers["connection"] == "close"
    assert wire.closed


def test_answer_before_an_unexpected_body_keeps_the_connection(wire):
    # Without Expect the body is on its way: it is read and dropped, the connection lives.
    wire.send(b"PUT /refuse HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n\r\ndata"
              b"GET /hello HTTP/1.1\r\nHost: a\r\n\r\n")
    assert [(r.status, r.headers["connection"]) for r in wire.responses()] == [
        (401, "keep-alive"), (200, "keep-alive")]


def test_trailer_fields_are_dropped_not_merged(wire):
    # RFC 9110 6.5.1: trailers never join the header section, and a Host among them
    # must not become the next request's Host.
    wire.send(b"POST /headers HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
              b"1\r\nx\r\n0\r\nX-Remote-User: admin\r\nHost: up.test\r\n\r\n"
              b"GET /hello HTTP/1.1\r\n\r\n")
    first, second = wire.responses()
    assert first.status == 200 and first.body.split(b"\n") == [b"host", b"transfer-encoding"]
    assert second.status == 400 and wire.closed


def test_trailer_fields_count_against_the_header_limit(tight):
    tight.send(b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"1\r\nx\r\n0\r\n" + b"".join(b"X-T%d: %s\r\n" % (i, b"v" * 60) for i in range(5))
               + b"\r\n")
    assert [r.status for r in tight.responses()] == [431] and tight.closed


def test_trailer_line_without_end_is_bounded(tight):
    tight.send(b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"1\r\nx\r\n0\r\nX-Endless: ")
    for _ in range(8):
        tight.send(b"t" * 64)
        if tight.closed:
            break
    assert [r.status for r in tight.responses()] == [431] and tight.closed


def test_connection_close_is_honoured(wire):
    wire.send(b"GET /hello HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
    assert wire.responses()[0].headers["connection"] == "close"
    assert wire.closed


def test_http10_keep_alive_on_request(wire):
    wire.send(b"GET /hello HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
    assert wire.responses()[0].headers["connection"] == "keep-alive"
    assert not wire.closed
    wire.send(b"GET /hello HTTP/1.0\r\n\r\n")
    assert wire.closed


def test_handler_error_is_500_and_connection_lives(wire):
    wire.send(b"GET /broken HTTP/1.1\r\nHost: a\r\n\r\nGET /hello HTTP/1.1\r\nHost: a\r\n\r\n")
    assert [r.status for r in wire.responses()] == [500, 200]


def test_unknown_host_gets_404_page():
    w = Wire(config_dict(sites=[{"hosts": ["site.test"], "route": [
        {"path": "/", "type": "return", "body": "x"}]}]))
    w.send(b"GET / HTTP/1.1\r\nHost: other.test\r\n\r\nGET / HTTP/1.1\r\nHost: SITE.test:80\r\n\r\n")
    first, second = w.responses()
    assert first.status == 404 and b"404 Not Found" in first.body
    assert second.status == 200
    w.close()


LIMITS = {"max_url": "64B", "max_header_bytes": "256B", "max_headers": 5, "max_body": "16B",
          "header_timeout": "2s", "body_timeout": "2s", "keepalive_timeout": "3s"}


@pytest.fixture
def tight():
    w = Wire(config_dict(limits=LIMITS), handlers={"/echo": Echo()})
    yield w
    w.close()


@pytest.mark.parametrize("request_bytes, status", [
    (b"GET /" + b"a" * 80 + b" HTTP/1.1\r\nHost: a\r\n\r\n", 414),
    (b"GET / HTTP/1.1\r\nHost: a\r\nX-Big: " + b"b" * 300 + b"\r\n\r\n", 431),
    (b"GET / HTTP/1.1\r\nHost: a\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(6)) + b"\r\n",
     431),
    (b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 17\r\n\r\n" + b"x" * 17, 413),
    (b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"10\r\n" + b"x" * 16 + b"\r\n1\r\nx\r\n0\r\n\r\n", 413),
    (b"GET / HTTP/2.0\r\nHost: a\r\n\r\n", 505),
    (b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nExpect: magic\r\n\r\nx", 417),
])
def test_limits_answer_their_status_and_close(tight, request_bytes, status):
    tight.send(request_bytes)
    assert [r.status for r in tight.responses()] == [status]
    assert tight.closed


def test_header_line_without_end_is_bounded_across_reads(tight):
    # httptools holds a header line until its CRLF: without a bound on the bytes a
    # head takes across reads, one endless line would grow the worker's memory.
    tight.send(b"GET / HTTP/1.1\r\nHost: a\r\nX-Endless: ")
    for _ in range(8):
        tight.send(b"b" * 64)
        if tight.closed:
            break
    assert [r.status for r in tight.responses()] == [431] and tight.closed


def test_head_bound_leaves_pipelined_requests_in_one_read_alone(tight):
    # 64-byte URL and 256-byte header limits: the complete requests ahead of an
    # unfinished head in the same read are not charged to it.
    burst = b"GET /hello HTTP/1.1\r\nHost: a\r\nX-Pad: " + b"p" * 200 + b"\r\n\r\n"
    tight.send(burst * 20 + b"GET /hello HTTP/1.1\r\nHost: a\r\n")
    tight.send(b"X-Last: 1\r\n")
    tight.send(b"\r\n")
    assert [r.status for r in tight.responses()] == [200] * 21 and not tight.closed


def test_partial_header_past_deadline_gets_408(tight):
    tight.send(b"GET / HTTP/1.1\r\nHost: a\r\n")
    tight.expire(0.1)                       # the tick sees a head being read
    tight.expire(1.0)
    tight.send(b"X-Slow: 1\r\n")            # bytes keep coming: the deadline is absolute
    assert not tight.closed
    tight.expire(1.5)
    assert [r.status for r in tight.responses()] == [408] and tight.closed


def test_idle_keep_alive_closes_silently(tight):
    tight.send(b"GET /hello HTTP/1.1\r\nHost: a\r\n\r\n")
    tight.expire(0.1)
    tight.expire(2.5)
    assert not tight.closed
    tight.expire(1.0)
    assert tight.closed and len(tight.responses()) == 1


def test_each_request_restarts_the_idle_clock(tight):
    for _ in range(3):
        tight.send(b"GET /hello HTTP/1.1\r\nHost: a\r\n\r\n")
        tight.expire(2.5)
    assert not tight.closed and len(tight.responses()) == 3


def test_silent_new_connection_closes_after_header_timeout(tight):
    tight.expire(1.5)
    assert not tight.closed
    tight.expire(1.0)
    assert tight.closed and tight.responses() == []


def test_slow_body_gets_408(tight):
    tight.send(b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nabc")
    tight.expire(0.1)
    tight.expire(1.5)
    tight.send(b"def")                      # a piece of body: the idle clock restarts
    tight.expire(0.1)
    tight.expire(1.5)
    assert not tight.closed
    tight.expire(1.0)
    assert [r.status for r in tight.responses()] == [408] and tight.closed


def test_health_body_has_status_version_uptime_pid():
    import json, os
    from nestgate.base.clock import CLOCK
    body = json.loads(HealthAnswer(CLOCK.wall, True).body)
    assert body["status"] == "ok" and body["pid"] == os.getpid()
    assert set(body) == {"status", "version", "uptime_s", "pid"}


@pytest.mark.parametrize("details, peer, keys", [
    ("local", "192.0.2.10", {"status", "uptime_s"}),          # an outsider
    ("local", "127.0.0.1", {"status", "uptime_s", "version", "pid"}),
    ("local", "192.168.1.20", {"status", "uptime_s", "version", "pid"}),
    ("all", "192.0.2.10", {"status", "uptime_s", "version", "pid"}),
    ("none", "127.0.0.1", {"status", "uptime_s"}),
])
def test_health_shows_version_and_pid_only_to_whom_the_config_says(details, peer, keys):
    import json
    w = Wire({**config_dict(), "server": {"health_details": details}}, peer=(peer, 40000))
    for _ in range(2):                      # the second time from the remembered choice
        w.send(b"GET /api/v1/health HTTP/1.1\r\nHost: a\r\n\r\n")
    responses = w.responses()
    assert [r.status for r in responses] == [200, 200]
    assert all(set(json.loads(r.body)) == keys for r in responses)
    w.close()


def test_connections_above_the_limit_get_503():
    w = Wire(config_dict(limits={"max_connections": 1}))
    from nestgate.wire.http1 import HTTP1Connection
    from wire import FakeTransport
    extra = FakeTransport()
    HTTP1Connection(w.ctx).connection_made(extra)
    assert extra.closed and extra.out.startswith(b"HTTP/1.1 503 ")
    w.send(b"GET /hello HTTP/1.1\r\nHost: a\r\n\r\n")       # the first one is unaffected
    assert w.responses()[0].status == 200
    w.close()


def test_health_is_rebuilt_when_the_second_changes_and_not_before():
    import json
    from nestgate.base.clock import CLOCK
    health = HealthAnswer(CLOCK.wall, True)
    first = health.render(0)
    health.started -= 5                         # five seconds of uptime
    assert health.render(0) == first            # same second: the same prebuilt bytes
    CLOCK.second -= 1                           # the next tick sees a new second
    CLOCK.tick()
    assert json.loads(health.body)["uptime_s"] >= 5 and health.render(0) != first


def test_requests_in_flight_on_a_draining_worker_end_with_close(wire):
    wire.send(b"GET /hello HTTP/1.1\r\nHost: a\r\n")
    wire.ctx.draining = True
    wire.conn.finish_and_close()
    wire.send(b"\r\n")
    response = wire.responses()[0]
    assert response.status == 200 and response.headers["connection"] == "close"
    assert wire.closed


def test_connection_accepted_while_draining_is_served_then_closed():
    w = Wire()
    w.ctx.draining = True
    from nestgate.wire.http1 import HTTP1Connection
    from wire import FakeTransport
    late = FakeTransport()
    conn = HTTP1Connection(w.ctx)
    conn.connection_made(late)
    conn.data_received(b"GET /hello HTTP/1.1\r\nHost: a\r\n\r\n")
    assert late.out.startswith(b"HTTP/1.1 200 OK") and b"connection: close" in late.out
    assert late.closed
    w.close()


def test_http10_kept_alive_stream_is_not_chunked(wire):
    # A kept-alive HTTP/1.0 request looks like the common HTTP/1.1 one but for its
    # Connection header: its version must still be read (no chunked for 1.0).
    wire.send(b"GET /stream HTTP/1.0\r\nHost: a\r\nConnection: keep-alive\r\n\r\n")
    response = wire.responses()[0]
    assert "transfer-encoding" not in response.headers
    assert response.body == b"one two three" and wire.closed


def test_http11_stream_with_connection_keep_alive_is_chunked(wire):
    wire.send(b"GET /stream HTTP/1.1\r\nHost: a\r\nConnection: keep-alive\r\n\r\n"
              b"GET /stream HTTP/1.1\r\nHost: a\r\n\r\n")
    first, second = wire.responses()
    assert first.headers["transfer-encoding"] == second.headers["transfer-encoding"] == "chunked"
    assert not wire.closed


# ---- the connection's phases (h1phases.OPEN ... CLOSED and the moves `NEXT` allows)

def test_phases_only_move_as_the_table_says():
    # Every phase can end (CLOSED), CLOSED ends everything, and no phase returns to a
    # reading phase once reading stopped.
    for phase, nexts in h1phases.NEXT.items():
        assert phase == h1phases.CLOSED or h1phases.CLOSED in nexts
        if phase >= h1phases.CLOSING:
            assert all(n >= h1phases.CLOSING for n in nexts), h1phases.PHASE_NAMES[phase]
    assert h1phases.NEXT[h1phases.CLOSED] == ()


def test_a_move_the_table_forbids_is_refused(wire):
    wire.send(b"GET /hello HTTP/1.1\r\nHost: a\r\n\r\n")
    assert wire.conn.phase == h1phases.OPEN
    wire.conn.connection_lost(None)
    with pytest.raises(RuntimeError, match="from closed to open"):
        wire.conn._enter(h1phases.OPEN)


def test_connection_close_moves_to_last_then_closing(wire):
    wire.send(b"POST /echo HTTP/1.1\r\nHost: a\r\nConnection: close\r\nContent-Length: 4\r\n\r\n"
              b"da", settle=0)
    assert wire.conn.phase == h1phases.LAST       # the rest of this request is still read
    wire.send(b"taGET /hello HTTP/1.1\r\nHost: a\r\n\r\n")
    assert [(r.status, r.body) for r in wire.responses()] == [(200, b"data")]
    assert wire.conn.phase == h1phases.CLOSING and wire.closed


def test_upgrade_request_queued_behind_an_answer_is_answered_then_closes(wire):
    # The upgrade goes to a route that does not take connections over: it is answered
    # in its turn, as the last answer on the connection.
    wire.send(b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nfirst"
              b"GET /hello HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\n"
              b"Upgrade: websocket\r\n\r\n")
    responses = wire.responses()
    assert [(r.status, r.body, r.headers["connection"]) for r in responses] == [
        (200, b"first", "keep-alive"), (200, b"hello\n", "close")]
    assert wire.closed


def test_request_after_an_answer_that_refused_its_expected_body_is_not_read(wire):
    # The ready answer to a request awaiting 100 Continue ends the connection: what
    # follows is unknowable (body or not) and is never parsed as a request.
    wire.send(b"POST /hello HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n"
              b"Expect: 100-continue\r\n\r\ndata"
              b"GET /hello HTTP/1.1\r\nHost: a\r\n\r\n")
    [response] = wire.responses()
    assert response.headers["connection"] == "close" and wire.closed
    assert wire.conn.phase == h1phases.CLOSING


def test_an_http2_preface_on_an_http1_listener_gets_a_hint(wire):
    """h2load or curl --http2-prior-knowledge against a listener without
    http2_cleartext: a 400 that says how to turn HTTP/2 in clear text on."""
    wire.send(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
    response = wire.responses()[0]
    assert response.status == 400 and b"http2_cleartext = true" in response.body
    assert wire.closed


def test_other_malformed_requests_get_the_plain_400(wire):
    wire.send(b"GET / HTTP/1.1\r\nHost: a\r\nBad Header\r\n\r\n")
    response = wire.responses()[0]
    assert response.status == 400 and b"http2_cleartext" not in response.body
