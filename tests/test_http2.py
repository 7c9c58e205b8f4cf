"""HTTP/2 over TLS: ALPN picks it, the same routes answer, bodies flow both ways."""

from __future__ import annotations

import json

import hyperframe.frame
import pytest

from conftest import TEMPLATE, tls_block
from h2client import H2Client
from h2wire import frames
from nestgate.wire import h2phases
from nestgate.wire.h2phases import DRAIN_BUSY_GRACE, DRAIN_IDLE_GRACE, QUIET_GRACE


@pytest.fixture
def h2conn(start_server, certs):
    server = start_server(TEMPLATE.format(tls=tls_block(certs)))
    client = H2Client(server.port("https"), certs["ca"])
    yield client
    client.close()


def test_health_over_h2(h2conn):
    status, headers, body = h2conn.request("GET", "/api/v1/health")
    assert status == 200 and headers["content-type"] == "application/json"
    assert json.loads(body)["status"] == "ok" and "date" in headers


def test_many_streams_on_one_connection(h2conn):
    for path, expected in (("/hello", b"hello\n"), ("/docs/x", b"docs\n"), ("/hello", b"hello\n")):
        status, _headers, body = h2conn.request("GET", path)
        assert (status, body) == (200, expected)


def test_head_unknown_host_and_redirect(h2conn):
    status, headers, body = h2conn.request("HEAD", "/hello")
    assert (status, body, headers["content-length"]) == (200, b"", "6")
    status, _h, body = h2conn.request("GET", "/hello", authority=b"nobody.invalid")
    assert status == 404 and b"404 Not Found" in body
    status, headers, _b = h2conn.request("GET", "/old")
    assert (status, headers["location"]) == (301, "/hello")


def test_no_connection_specific_headers(h2conn):
    _status, headers, _body = h2conn.request("GET", "/hello")
    assert not {"connection", "transfer-encoding", "keep-alive"} & set(headers)


def test_h2_can_be_turned_off(start_server, certs):
    import socket
    import ssl
    config = TEMPLATE.format(tls=tls_block(certs).replace(
        "[[listen.certificate]]", "http2 = false\n[[listen.certificate]]", 1))
    server = start_server(config)
    ctx = ssl.create_default_context(cafile=certs["ca"])
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    with socket.create_connection(("127.0.0.1", server.port("https"))) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
            assert tls.selected_alpn_protocol() == "http/1.1"


# ---- protocol level: an HTTP/2 client and server exchanging bytes, no sockets



def test_large_bodies_both_ways_respect_flow_control(make_pump):
    pump = make_pump()
    pump.wire.ctx.limits = pump.server.limits = type(pump.server.limits)(max_body=1 << 20)
    body = bytes(range(256)) * 1024                        # 256 KiB, four default windows
    status, data = pump.exchange(b"POST", b"/echo", body)
    assert status == 200 and data == body


def test_handler_failure_is_500_on_its_stream_only(make_pump):
    pump = make_pump()
    assert pump.exchange(b"GET", b"/broken")[0] == 500
    assert pump.exchange(b"GET", b"/hello") == (200, b"hello\n")


class Pusher:
    """Pushes more than a window's worth without waiting, then ends at once."""
    is_async = True

    async def handle(self, request):
        request.start(200, [(b"content-type", b"application/octet-stream")])
        for i in range(4):
            request.push(bytes([65 + i]) * 50_000)
        request.end()


class WhoAmI:
    is_async = True

    async def handle(self, request):
        await request.send(200, [], request.client.encode())


def test_pushed_data_is_sent_in_order_before_the_stream_ends(make_pump):
    pump = make_pump()
    pump.wire.ctx.router.catch_all.add_exact("/push", Pusher())
    status, data = pump.exchange(b"GET", b"/push")
    assert status == 200
    assert data == b"A" * 50_000 + b"B" * 50_000 + b"C" * 50_000 + b"D" * 50_000


def test_forwarded_client_only_through_a_trusted_peer(make_pump):
    from wire import config_dict
    for trusted, expected in ((["192.0.2.10"], b"203.0.113.5"), ([], b"192.0.2.10")):
        data = config_dict()
        if trusted:
            data["client_ip"] = {"trusted_proxies": trusted}
        pump = make_pump(data, handlers={"/who": WhoAmI()})
        headers = [(b"x-forwarded-for", b"203.0.113.5")]
        assert pump.exchange(b"GET", b"/who", headers=headers) == (200, expected)


def test_path_must_be_absolute(make_pump):
    pump = make_pump()
    for path in (b"hello", b"*", b"../x"):
        assert pump.exchange(b"GET", path)[0] == 400
    assert pump.exchange(b"GET", b"/hello") == (200, b"hello\n")


@pytest.mark.parametrize("method, path", [
    (b"GET /private HTTP/1.1", b"/hello"),            # a second request line upstream
    (b"GET\tX", b"/hello"),
    (b"GE(T", b"/hello"),                              # "(" is not a tchar
    (b"G\xc3\x89T", b"/hello"),
    (b"GET", b"/hello world"),
    (b"GET", b"/hello\xc3\xa9"),
    (b"GET", b"/hello\x7f"),
    (b"GET", b"/hello\x01"),
], ids=["method-space", "method-tab", "method-non-token", "method-non-ascii",
        "path-space", "path-non-ascii", "path-del", "path-ctl"])
def test_malformed_method_or_path_is_400_on_its_stream_only(method, path, make_pump):
    pump = make_pump()
    status, body = pump.exchange(method, path)
    assert status == 400 and b"400 Bad Request" in body
    assert not pump.transport.closed
    assert pump.exchange(b"GET", b"/hello") == (200, b"hello\n")


def test_only_the_methods_http1_takes_are_routed(make_pump):
    # A token is not enough: HTTP/1.1's parser refuses a method it does not know (400),
    # and an upstream's would too, so HTTP/2 refuses the same ones on their stream.
    pump = make_pump()
    for method in (b"X-Custom!#$%&'*+.^_`|~9", b"get", b"FOO"):
        assert pump.exchange(method, b"/hello")[0] == 400
    assert not pump.transport.closed
    assert pump.exchange(b"M-SEARCH", b"/hello") == (200, b"hello\n")
    assert pump.exchange(b"GET", b"/hello?a=%20&b=~!$'()*,;:@") == (200, b"hello\n")


def test_authority_with_a_space_is_400_from_the_router(make_pump):
    pump = make_pump()
    assert pump.exchange(b"GET", b"/hello", authority=b"a b")[0] == 400
    assert pump.exchange(b"GET", b"/hello") == (200, b"hello\n")


def test_requests_ahead_of_a_goaway_in_the_same_read_are_dropped_quietly(make_pump):
    # h2 processes the whole read first: after the GOAWAY it cannot send, so the
    # request ahead of it goes unanswered (it used to raise out of data_received,
    # a traceback per connection at the end of every load run).
    pump = make_pump()
    pump.server.data_received(pump.client.data_to_send())
    stream = pump.client.get_next_available_stream_id()
    pump.client.send_headers(stream, [(b":method", b"GET"), (b":path", b"/hello"),
                                      (b":scheme", b"https"), (b":authority", b"a")],
                             end_stream=True)
    pump.client.close_connection()
    pump.server.data_received(pump.client.data_to_send())
    assert pump.transport.closed            # the client left: no grace to wait for it


def _request(client, stream: int, path: bytes, end_stream: bool = True) -> bytes:
    client.send_headers(stream, [(b":method", b"GET" if end_stream else b"POST"),
                                 (b":path", path), (b":scheme", b"https"),
                                 (b":authority", b"a")], end_stream=end_stream)
    return client.data_to_send()


def _written(pump) -> list:
    pump.wire.run(5)
    out, pump.transport.out = frames(bytes(pump.transport.out)), bytearray()
    return out


def _goaways(written) -> list[int]:
    return [f.last_stream_id for f in written if isinstance(f, hyperframe.frame.GoAwayFrame)]


def _pings(written) -> list:
    return [f for f in written if isinstance(f, hyperframe.frame.PingFrame)
            and "ACK" not in f.flags]


def test_a_graceful_stop_serves_until_no_stream_is_open_then_one_goaway(make_pump):
    """Stopping: streams are served until none is open and a PING's ACK confirms none
    was on its way; then one GOAWAY naming the last, and nothing after it (the h2
    library under httpx takes no frame after a GOAWAY); a stream opened later is held,
    never answered nor reset; the close comes DRAIN_IDLE_GRACE later."""
    pump = make_pump()
    server, transport = pump.server, pump.transport
    server.data_received(pump.client.data_to_send())
    _written(pump)
    server.data_received(_request(pump.client, 1, b"/echo", end_stream=False))
    server.finish_and_close()
    assert _goaways(_written(pump)) == []                 # stream 1 is open
    server.data_received(_request(pump.client, 3, b"/hello"))
    answer = _written(pump)
    assert any(f.stream_id == 3 and "END_STREAM" in f.flags for f in answer)
    assert _goaways(answer) == [] and _pings(answer) == []   # stream 1 is still open
    pump.client.send_data(1, b"last", end_stream=True)
    server.data_received(pump.client.data_to_send())
    answer = _written(pump)
    assert any(f.stream_id == 1 and "END_STREAM" in f.flags for f in answer)
    assert _goaways(answer) == [] and _pings(answer) == []
    server.tick(QUIET_GRACE)                # the tick sees the streams came and went
    server.tick(QUIET_GRACE / 2)
    assert _written(pump) == []                             # not quiet for long enough
    server.tick(QUIET_GRACE / 2)
    quiet = _written(pump)
    ping = _pings(quiet)
    assert len(ping) == 1 and _goaways(quiet) == []         # is anything on its way?
    server.data_received(_request(pump.client, 5, b"/hello"))   # yes: served
    answer = _written(pump)
    assert any(f.stream_id == 5 and "END_STREAM" in f.flags for f in answer)
    assert _goaways(answer) == [] and _pings(answer) == []
    ack = hyperframe.frame.PingFrame(0, flags=["ACK"])
    ack.opaque_data = ping[0].opaque_data
    server.data_received(ack.serialize())
    final = _written(pump)
    assert [type(f) for f in final] == [hyperframe.frame.GoAwayFrame]
    assert _goaways(final) == [5]
    server.data_received(_request(pump.client, 7, b"/hello"))
    assert _written(pump) == [] and not transport.closed  # held; the client may close
    server.tick(DRAIN_IDLE_GRACE)
    assert transport.closed



def test_phases_only_move_as_the_table_says():
    # Every phase can end (CLOSED), CLOSED ends everything, no phase goes back to
    # SERVING, and once the GOAWAY is out only the close follows.
    for phase, nexts in h2phases.NEXT.items():
        assert phase == h2phases.CLOSED or h2phases.CLOSED in nexts
        assert h2phases.SERVING not in nexts
        assert all(n > phase for n in nexts), h2phases.PHASE_NAMES[phase]
    assert h2phases.NEXT[h2phases.GOAWAY] == (h2phases.CLOSED,)


def test_a_stop_moves_through_the_phases(make_pump):
    """SERVING; a stop with a stream open is STOPPING; past DRAIN_BUSY_GRACE the last
    stream is chosen (LAST); its answer brings the GOAWAY; the close is CLOSED, and a
    move the table forbids raises."""
    pump = make_pump()
    server = pump.server
    server.data_received(pump.client.data_to_send())
    _written(pump)
    assert server.phase == h2phases.SERVING
    server.data_received(_request(pump.client, 1, b"/echo", end_stream=False))
    server.finish_and_close()
    assert server.phase == h2phases.STOPPING
    server.tick(DRAIN_BUSY_GRACE)
    assert server.phase == h2phases.LAST
    pump.client.send_data(1, b"last", end_stream=True)
    server.data_received(pump.client.data_to_send())
    assert _goaways(_written(pump)) == [1]
    assert server.phase == h2phases.GOAWAY
    server.connection_lost(None)
    assert server.phase == h2phases.CLOSED
    with pytest.raises(RuntimeError, match="from closed to serving"):
        server._enter(h2phases.SERVING)

def _recording_writes(pump) -> list[bytes]:
    """Each write the connection makes to its transport, apart."""
    writes, write = [], pump.transport.write
    pump.transport.write = lambda data: (writes.append(bytes(data)), write(data))
    return writes


def test_a_client_that_waits_for_each_answer_gets_the_goaway_with_its_next_answer(make_pump):
    """A client that opens each stream only once the one before was answered (a proxy's
    pooled connection: nginx's grpc module) sends its next request as soon as it has
    read an answer. Stopping, the GOAWAY goes out in the same write as the next answer,
    so it cannot cross a request, which such a client fails rather than retries."""
    pump = make_pump()
    assert pump.exchange(b"GET", b"/hello") == (200, b"hello\n")        # stream 1
    assert pump.exchange(b"GET", b"/hello") == (200, b"hello\n")        # stream 3
    pump.server.finish_and_close()
    assert _written(pump) == []          # answered before the stop: nothing to ride on
    writes = _recording_writes(pump)
    pump.server.data_received(_request(pump.client, 5, b"/hello"))
    pump.wire.run(5)
    last = frames(writes[-1])
    assert any(f.stream_id == 5 and "END_STREAM" in f.flags for f in last)
    assert _goaways(last) == [5]


def test_two_streams_alone_do_not_make_a_client_one_that_waits(make_pump):
    """curl opens the first stream of a parallel batch alone and the others right after,
    and an answer made at once leaves no stream open when the next comes: stopping
    then, the next answer goes out without a GOAWAY (the quiet and the PING decide), so
    the rest of the batch is served, not held."""
    pump = make_pump()
    assert pump.exchange(b"GET", b"/hello") == (200, b"hello\n")        # stream 1
    pump.server.finish_and_close()
    pump.server.data_received(_request(pump.client, 3, b"/hello"))
    answer = _written(pump)
    assert any(f.stream_id == 3 and "END_STREAM" in f.flags for f in answer)
    assert _goaways(answer) == []


def test_a_quiet_connection_whose_client_never_answers_the_ping_still_ends(make_pump):
    pump = make_pump()
    server = pump.server
    server.data_received(pump.client.data_to_send())
    _written(pump)
    server.finish_and_close()
    server.tick(QUIET_GRACE)
    assert len(_pings(_written(pump))) == 1
    server.tick(DRAIN_IDLE_GRACE)
    assert _goaways(_written(pump)) == [0]


def test_a_connection_never_idle_holds_new_streams_after_the_busy_grace(make_pump):
    pump = make_pump()
    server = pump.server
    server.data_received(pump.client.data_to_send())
    _written(pump)
    server.data_received(_request(pump.client, 1, b"/echo", end_stream=False))
    server.finish_and_close()
    server.tick(DRAIN_BUSY_GRACE)
    server.data_received(_request(pump.client, 3, b"/hello"))
    assert [f for f in _written(pump) if f.stream_id == 3] == []     # held
    pump.client.send_data(1, b"last", end_stream=True)
    server.data_received(pump.client.data_to_send())
    final = _written(pump)
    assert _goaways(final) == [1] and not [f for f in final if f.stream_id == 3]
