"""HTTP/2 limits at the protocol level: resets, stream counts, timeouts, sizes."""

from __future__ import annotations

import h2.errors
import h2.events
import hyperframe.frame
import pytest

from h2raw import get, unindexed_block
from h2wire import frames
from wire import config_dict

from nestgate.wire import h2engine as engine
from nestgate.wire.h2guard import DECODED_BUDGET
from nestgate.wire.h2phases import DRAIN_IDLE_GRACE

_GET = [(b":method", b"GET"), (b":scheme", b"https"), (b":authority", b"a")]


class Hang:
    """Never answers: stands for a slow upstream."""
    is_async = True
    started = 0

    async def handle(self, request):
        Hang.started += 1
        await request.connection.loop.create_future()


def open_stream(pump, path: bytes, end: bool = True, headers=(), method=b"GET") -> int:
    stream = pump.client.get_next_available_stream_id()
    pump.client.send_headers(stream, [(b":method", method), (b":path", path),
                                      (b":scheme", b"https"), (b":authority", b"a"),
                                      *headers], end_stream=end)
    return stream


def step(pump) -> list:
    """Client bytes to the server, let handlers run, the server's answer as events."""
    out = pump.client.data_to_send()
    if out and not pump.transport.closed:
        pump.server.data_received(out)
    pump.wire.run(5)
    inbound, pump.transport.out = bytes(pump.transport.out), bytearray()
    return pump.client.receive_data(inbound) if inbound else []


def goaway(events):
    found = [e for e in events if isinstance(e, h2.events.ConnectionTerminated)]
    return found[0] if found else None


def test_rapid_reset_ends_the_connection_with_enhance_your_calm(make_pump):
    pump = make_pump(handlers={"/hang": Hang()})
    Hang.started = 0
    events = []
    for _ in range(40):                      # 40 x 10 streams opened and reset at once
        for _ in range(10):
            stream = open_stream(pump, b"/hang")
            pump.client.reset_stream(stream)
        events += step(pump)
        if pump.transport.closed:
            break
    end = goaway(events)
    assert end is not None and end.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
    assert pump.transport.closed
    assert not pump.server._streams


class Quick:
    """Answers without reading the body."""
    is_async = True

    async def handle(self, request):
        await request.send(200, [], b"ok")


def test_streams_reset_after_their_answer_are_not_counted(make_pump):
    pump = make_pump(handlers={"/quick": Quick()})
    for _ in range(30):
        for _ in range(10):
            stream = open_stream(pump, b"/quick", end=False, method=b"POST")
            step(pump)                         # answered while the body is still due
            pump.client.reset_stream(stream)
        assert goaway(step(pump)) is None
    assert not pump.transport.closed


def raw_step(pump) -> list:
    pump.server.data_received(pump.client.data_to_send())
    pump.wire.run(5)
    inbound, pump.transport.out = bytes(pump.transport.out), bytearray()
    return frames(inbound)


def test_keepalive_requests_bounds_the_streams_of_a_connection(make_pump):
    pump = make_pump(config_dict(limits={"keepalive_requests": 3}))
    step(pump)
    slow = open_stream(pump, b"/echo", end=False, method=b"POST")   # body still due
    assert goaway(step(pump)) is None
    assert pump.exchange(b"GET", b"/hello") == (200, b"hello\n")
    third = open_stream(pump, b"/hello")
    sent = raw_step(pump)
    assert any(isinstance(f, hyperframe.frame.HeadersFrame) and f.stream_id == third
               for f in sent)
    assert not [f for f in sent if isinstance(f, hyperframe.frame.GoAwayFrame)]  # one is open
    late = open_stream(pump, b"/hello")         # past the limit: held, not answered
    pump.client.send_data(slow, b"body", end_stream=True)
    sent = raw_step(pump)
    assert not [f for f in sent if f.stream_id == late]
    assert any(isinstance(f, hyperframe.frame.DataFrame) and f.stream_id == slow
               and f.data == b"body" for f in sent)
    # One GOAWAY naming the third stream, the last frame written: nothing follows it.
    assert isinstance(sent[-1], hyperframe.frame.GoAwayFrame)
    assert (sent[-1].last_stream_id, sent[-1].error_code) == (third, 0)
    assert not pump.transport.closed            # the client's turn to close
    pump.server.tick(DRAIN_IDLE_GRACE)
    assert pump.transport.closed


class Big:
    """Answers with more than the client's initial window."""
    is_async = True

    async def handle(self, request):
        await request.send(200, [], b"x" * 100_000)


def resets(events) -> dict:
    return {e.stream_id: e.error_code for e in events if isinstance(e, h2.events.StreamReset)}


def test_a_send_waiting_for_the_window_past_send_timeout_is_reset(make_pump):
    pump = make_pump(handlers={"/big": Big()})
    stream = open_stream(pump, b"/big")
    step(pump)                                   # the client takes data, opens no window
    task = pump.server._streams[stream].task
    pump.server.tick(1.0)
    assert resets(step(pump)) == {}
    pump.server.tick(30.0)
    assert resets(step(pump)) == {}
    pump.server.tick(30.0)
    assert resets(step(pump)) == {stream: h2.errors.ErrorCodes.CANCEL}
    assert task.done() and not pump.server._streams
    pump.client.increment_flow_control_window(1 << 20)    # the connection's window
    assert pump.exchange(b"GET", b"/hello") == (200, b"hello\n")


def test_a_send_that_gets_window_now_and_then_is_not_reset(make_pump):
    pump = make_pump(handlers={"/big": Big()})
    stream = open_stream(pump, b"/big")
    step(pump)
    for _ in range(5):
        pump.server.tick(1.0)
        pump.server.tick(40.0)
        pump.client.increment_flow_control_window(1000)
        pump.client.increment_flow_control_window(1000, stream_id=stream)
        assert resets(step(pump)) == {}
    assert stream in pump.server._streams


def test_a_body_that_never_comes_is_408_after_body_timeout(make_pump):
    pump = make_pump()
    stream = open_stream(pump, b"/echo", end=False, method=b"POST",
                         headers=[(b"content-length", b"10")])
    step(pump)
    pump.server.tick(1.0)
    pump.server.tick(58.0)
    assert step(pump) == []
    pump.server.tick(1.0)
    events = step(pump)
    statuses = [dict(e.headers)[b":status"] for e in events
                if isinstance(e, h2.events.ResponseReceived)]
    assert statuses == [b"408"]
    assert resets(events) == {stream: h2.errors.ErrorCodes.NO_ERROR}
    assert not pump.server._streams


class Slurp:
    """Starts its answer, then reads the body."""
    is_async = True

    async def handle(self, request):
        request.start(200, [])
        await request.write(b"go")
        await request.write(await request.body.read_all())
        request.end()


def test_a_body_that_stops_after_the_answer_began_cancels_the_stream(make_pump):
    pump = make_pump(handlers={"/slurp": Slurp()})
    stream = open_stream(pump, b"/slurp", end=False, method=b"POST")
    pump.client.send_data(stream, b"part")
    step(pump)
    pump.server.tick(1.0)
    pump.server.tick(60.0)
    assert resets(step(pump)) == {stream: h2.errors.ErrorCodes.CANCEL}
    assert not pump.server._streams


def test_a_client_that_does_not_read_is_not_read_from(make_pump):
    pump = make_pump()
    step(pump)
    pump.server.pause_writing()                  # its answers back up in the transport
    assert not pump.transport.reading
    pump.server.resume_writing()
    assert pump.transport.reading
    assert pump.exchange(b"GET", b"/hello") == (200, b"hello\n")


def test_keepalive_timeout_counts_idle_time_not_connection_age(make_pump):
    pump = make_pump()
    step(pump)
    pump.server.tick(50.0)
    assert pump.exchange(b"GET", b"/hello") == (200, b"hello\n")   # answered at once
    pump.server.tick(50.0)
    assert not pump.transport.closed
    pump.server.tick(30.0)
    assert goaway(step(pump)) is not None      # idle too long: the GOAWAY, then the close
    pump.server.tick(DRAIN_IDLE_GRACE)
    assert pump.transport.closed


def test_a_download_in_progress_keeps_the_connection(make_pump):
    sites = [{"hosts": ["*"], "route": [
        {"path": "/large", "type": "return", "body": "x" * 100_000}]}]
    pump = make_pump(config_dict(sites=sites))
    stream = open_stream(pump, b"/large")        # more than the window: sent in the background
    step(pump)
    pump.server.tick(80.0)
    assert not pump.transport.closed
    pump.client.increment_flow_control_window(1 << 20)
    pump.client.increment_flow_control_window(1 << 20, stream_id=stream)
    assert any(isinstance(e, h2.events.StreamEnded) for e in step(pump))
    pump.server.tick(80.0)
    pump.server.tick(DRAIN_IDLE_GRACE)
    assert pump.transport.closed


def statuses(events) -> list:
    return [int(dict(e.headers)[b":status"]) for e in events
            if isinstance(e, h2.events.ResponseReceived)]


def test_a_declared_body_over_max_body_is_413_before_the_handler_runs(make_pump):
    pump = make_pump(handlers={"/hang": Hang()})
    Hang.started = 0
    stream = open_stream(pump, b"/hang", end=False, method=b"POST",
                         headers=[(b"content-length", b"%d" % (2 << 20))])
    events = step(pump)
    assert statuses(events) == [413] and Hang.started == 0
    assert resets(events) == {stream: h2.errors.ErrorCodes.NO_ERROR}
    assert not pump.server._streams


def test_a_body_growing_past_max_body_is_413_not_refused(make_pump):
    pump = make_pump()
    status, body = pump.exchange(b"POST", b"/echo", b"x" * ((1 << 20) + 1))
    assert status == 413 and b"413" in body
    assert not pump.server._streams
    assert pump.exchange(b"GET", b"/hello") == (200, b"hello\n")


def test_a_body_growing_past_max_body_after_the_answer_began_is_cancelled(make_pump):
    pump = make_pump(handlers={"/slurp": Slurp()})
    stream = open_stream(pump, b"/slurp", end=False, method=b"POST")
    events = step(pump)
    for _ in range(40):
        while pump.client.local_flow_control_window(stream) > 0 and not resets(events):
            size = min(pump.client.local_flow_control_window(stream),
                       pump.client.max_outbound_frame_size)
            pump.client.send_data(stream, b"x" * size)
        events += step(pump)
        if resets(events):
            break
    assert statuses(events) == [200]
    assert resets(events) == {stream: h2.errors.ErrorCodes.CANCEL}


def test_an_answer_that_needs_no_body_stops_the_upload(make_pump):
    pump = make_pump()
    stream = open_stream(pump, b"/hello", end=False, method=b"POST")
    events = step(pump)
    assert statuses(events) == [200]
    assert resets(events) == {stream: h2.errors.ErrorCodes.NO_ERROR}


def test_a_stream_over_the_concurrency_limit_is_refused_alone(make_pump):
    from nestgate.wire.h2guard import MAX_CONCURRENT_STREAMS
    pump = make_pump(handlers={"/hang": Hang()})
    # The client has not read our SETTINGS yet: it does not know the limit.
    streams = [open_stream(pump, b"/hang") for _ in range(MAX_CONCURRENT_STREAMS + 2)]
    events = step(pump)
    assert goaway(events) is None and not pump.transport.closed
    assert resets(events) == {s: h2.errors.ErrorCodes.REFUSED_STREAM for s in streams[-2:]}
    assert len(pump.server._streams) == MAX_CONCURRENT_STREAMS
    pump.client.reset_stream(streams[0])
    assert goaway(step(pump)) is None
    assert pump.exchange(b"GET", b"/hello") == (200, b"hello\n")


class Records:
    def __init__(self) -> None:
        self.clients = []

    def record(self, client, method, host, path, status, *rest) -> None:
        self.clients.append((client, path, status))


def test_requests_behind_a_trusted_loopback_proxy_are_logged_by_their_client(make_pump):
    from nestgate.wire.http2 import HTTP2Connection
    from wire import FakeTransport
    data = config_dict()
    data["client_ip"] = {"trusted_proxies": ["127.0.0.1"]}   # log_loopback stays false
    pump = make_pump(data)
    pump.wire.ctx.access_log = log = Records()
    pump.transport = FakeTransport(("127.0.0.1", 50000))
    pump.server = HTTP2Connection(pump.wire.ctx)
    pump.server.connection_made(pump.transport)
    xff = [(b"x-forwarded-for", b"203.0.113.5")]
    assert pump.exchange(b"GET", b"/hello", headers=xff) == (200, b"hello\n")
    assert pump.exchange(b"POST", b"/echo", b"hi", headers=xff) == (200, b"hi")
    assert pump.exchange(b"GET", b"/hello") == (200, b"hello\n")     # the proxy's own
    assert pump.exchange(b"GET", b"/hello", headers=[(b"x-forwarded-for", b"127.0.0.1")]) \
        == (200, b"hello\n")
    assert log.clients == [("203.0.113.5", "/hello", 200), ("203.0.113.5", "/echo", 200)]


def test_the_frame_guard_reads_frame_headers_split_across_reads():
    import random
    from nestgate.config import Limits
    from nestgate.wire.h2guard import CONTROL_FRAME_BURST, FrameGuard
    limits = Limits(max_header_bytes=8192)
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + hyperframe.frame.SettingsFrame(0).serialize()
    ping = hyperframe.frame.PingFrame(0, opaque_data=b"12345678").serialize()
    data = preface + hyperframe.frame.DataFrame(1, b"x" * 300).serialize() \
        + ping * (CONTROL_FRAME_BURST - 1)              # with the SETTINGS: all allowed
    assert FrameGuard(limits, 0.0).feed(data, 0.0) is None
    assert FrameGuard(limits, 0.0).feed(data + ping, 0.0) == "control_flood"
    rng = random.Random(7)
    guard, pos, why = FrameGuard(limits, 0.0), 0, None
    while pos <= len(data) and why is None:
        step_ = rng.randint(1, 40)
        why = guard.feed((data + ping)[pos:pos + step_], 0.0)
        pos += step_
    assert why == "control_flood" and pos >= len(data) + 1


def test_a_client_goaway_still_gets_the_answers_it_asked_for(start_server, certs):
    """GOAWAY(NO_ERROR) from the client in the same write as its requests: it opens
    no more streams, but those it opened are answered, then the connection closes."""
    from h2raw import GoAwayFrame, RawH2, get
    from conftest import TEMPLATE, tls_block
    server = start_server(TEMPLATE.format(tls=tls_block(certs)))
    conn = RawH2(server.port("https"), certs["ca"])
    first, second = conn.new_stream(), conn.new_stream()
    conn.send(conn.headers_frame(first, get()), conn.headers_frame(second, get(b"/docs/x")),
              GoAwayFrame(0, last_stream_id=0, error_code=0))
    answers = conn.answers([first, second])
    assert [(a.status, bytes(a.data)) for a in answers.values()] == \
        [(200, b"hello\n"), (200, b"docs\n")]
    assert conn.wait(lambda: conn.closed, timeout=5)
    conn.close()


class OwnReset:
    """Fails with a ConnectionResetError of its own (a connection it opened elsewhere
    was reset), before its answer began or after part of it went out."""
    is_async = True

    def __init__(self, after_start: bool) -> None:
        self.after_start = after_start

    async def handle(self, request):
        if self.after_start:
            request.start(200, [(b"content-type", b"text/plain")])
            await request.write(b"part of it")
        raise ConnectionResetError("a connection of the handler's own was reset")


@pytest.mark.parametrize("after_start", [False, True], ids=["before-answer", "mid-answer"])
def test_a_handlers_own_connection_reset_still_concludes_its_stream(make_pump, after_start):
    # The client's stream is open: the handler's reset is a failure, not the client
    # leaving. Left alone, the stream kept its slot and the client waited for ever.
    pump = make_pump(handlers={"/own-reset": OwnReset(after_start)})
    step(pump)
    stream = open_stream(pump, b"/own-reset")
    events = step(pump)
    if after_start:
        assert resets(events) == {stream: h2.errors.ErrorCodes.INTERNAL_ERROR}
    else:
        answer = [e for e in events if isinstance(e, h2.events.ResponseReceived)]
        assert [dict(e.headers)[b":status"] for e in answer] == [b"500"]
        assert any(isinstance(e, h2.events.StreamEnded) and e.stream_id == stream
                   for e in events)
    assert pump.server.h2.open_streams == 0 and not pump.server._streams
    assert pump.exchange(b"GET", b"/hello") == (200, b"hello\n")


def _fill_decoded(h2: engine.H2Engine, tag: int, blocks: int) -> None:
    """`blocks` requests whose header blocks (about 4 KB each, all different) change
    no HPACK table, so the engine may keep each one decoded."""
    h2.receive_data(engine.PREFACE + hyperframe.frame.SettingsFrame(0).serialize())
    for i in range(blocks):
        block = unindexed_block(get() + [(b"x-fill", b"%d-%d;" % (tag, i) * 500)])
        h2.receive_data(hyperframe.frame.HeadersFrame(
            2 * i + 1, block, flags={"END_HEADERS", "END_STREAM"}).serialize())


def test_decoded_blocks_kept_are_bounded_per_connection_and_per_worker():
    budget = engine.DecodedBudget(100_000)
    alone = engine.H2Engine(128, 32 * 1024, 128 * 1024, engine.DecodedBudget(1 << 30))
    _fill_decoded(alone, 0, 60)
    assert 0 < alone._decoded_budget.used <= engine.DECODED_CONNECTION_BYTES
    # Four connections of one worker would keep 4 x 64 KiB: the worker's budget holds.
    shared = [engine.H2Engine(128, 32 * 1024, 128 * 1024, budget) for _ in range(4)]
    for tag, h2 in enumerate(shared, 1):
        _fill_decoded(h2, tag, 60)
    assert 90_000 < budget.used <= 100_000
    for h2 in shared:
        h2.forget_decoded()
    assert budget.used == 0


def test_a_closed_connection_gives_its_decoded_blocks_back(make_pump):
    before = DECODED_BUDGET.used
    pump = make_pump()
    for _ in range(3):          # again and again: the client's blocks become all indexed
        assert pump.exchange(b"GET", b"/hello") == (200, b"hello\n")
    assert DECODED_BUDGET.used > before
    pump.server.connection_lost(None)            # the client went away
    assert DECODED_BUDGET.used == before


class _FrameByFrame(engine.H2Engine):
    """The engine taking every DATA frame on its own (`_data`), as it did before it
    took a read's frames of one stream together: the reference."""

    def _data_run(self, data, pos, end, stream_id, payload, events):
        self._data(stream_id, 0, payload, events)
        return pos


def _data_outcome(reads: list[bytes], kind=engine.H2Engine) -> tuple[list, bytes]:
    """What an engine makes of `reads`: its events, consecutive body bytes of one
    stream merged (as a handler reads them), or only the connection error if one
    came, and the bytes it would send."""
    h2 = kind(128, 32 * 1024, 128 * 1024, engine.DecodedBudget(1 << 30))
    outcome: list = []
    for read in reads:
        try:
            events = h2.receive_data(read)
        except engine.ConnectionError_ as exc:
            # The events of the read that broke the connection are never handled,
            # so where the reads were cut would show: only the error counts.
            return [("connection error", exc.args[0])], h2.data_to_send()
        for event in events:
            if isinstance(event, engine.DataReceived):
                if outcome and outcome[-1][0] == "data" and outcome[-1][1] == event.stream_id:
                    _, sid, body, flow = outcome.pop()
                    outcome.append(("data", sid, body + event.data, flow + event.flow_length))
                else:
                    outcome.append(("data", event.stream_id, event.data, event.flow_length))
            elif isinstance(event, engine.StreamReset):
                outcome.append(("reset", event.stream_id, event.code))
            elif isinstance(event, engine.StreamEnded):
                outcome.append(("ended", event.stream_id))
            elif isinstance(event, engine.RequestReceived):
                outcome.append(("request", event.stream_id))
    windows = [h2.recv_window] + sorted((sid, stream.recv_window, stream.received)
                                        for sid, stream in h2.streams.items())
    return outcome + [("windows", windows)], h2.data_to_send()


@pytest.mark.parametrize("seed", range(12))
def test_data_frames_in_one_read_mean_what_they_mean_one_by_one(seed):
    """The DATA frames of a stream that follow each other in one read are settled
    together. Whatever they hold (tiny, empty, padded, ending the stream, past its
    content-length, on a stream ended or reset, on an idle stream), the events, the
    windows and the frames sent back are the same as the engine's frame by frame, and
    as when each frame comes in a read of its own or the reads are cut anywhere. (At
    most 40,000 bytes: the connection's window, held per read, is not what is tested.)"""
    import random
    rng = random.Random(seed)
    start = engine.PREFACE + hyperframe.frame.SettingsFrame(0).serialize()
    for sid, extra in ((1, []), (3, []), (5, [(b"content-length", b"40")])):
        start += hyperframe.frame.HeadersFrame(
            sid, unindexed_block(get(method=b"POST") + extra),
            flags={"END_HEADERS"}).serialize()
    frames_ = []
    for _ in range(rng.randint(50, 400)):
        sid = rng.choice((1, 1, 1, 3, 5, 7 if seed % 4 == 0 else 1))
        size = rng.choice((0, 1, 1, 1, 2, 5, 100))
        flags = set()
        if rng.random() < 0.03:
            flags.add("END_STREAM")
        frame = hyperframe.frame.DataFrame(sid, bytes([rng.randrange(256)]) * size,
                                           flags=flags)
        if rng.random() < 0.05:
            frame.flags.add("PADDED")
            frame.pad_length = rng.randint(0, 20)
        frames_.append(frame.serialize())
    stream = start + b"".join(frames_)
    whole = _data_outcome([stream])
    assert whole == _data_outcome([stream], _FrameByFrame)
    assert whole == _data_outcome([start] + frames_)
    cuts = sorted(rng.sample(range(1, len(stream)), 20))
    assert whole == _data_outcome([stream[a:b] for a, b in
                                   zip([0] + cuts, cuts + [len(stream)])])
    kinds = {kind for kind, *_ in whole[0]}
    assert kinds == {"connection error"} if seed % 4 == 0 else {"data", "reset"} <= kinds
