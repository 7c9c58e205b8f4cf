"""A whole answer queued by one engine call (`H2Engine.send_answer`, for ready and
proxied answers): the frames are those the separate calls made, HEADERS (and
CONTINUATION where the client's frame size needs them) then one DATA frame ending the
stream, or the HEADERS alone with the body left to the caller when the client's
window or frame size does not take it now."""

from __future__ import annotations

import struct

import hpack
import pytest
from hyperframe.frame import Frame

from nestgate.wire import h2engine as engine

FRAME = struct.Struct(">IBI")


def opened(initial_window: int = engine.DEFAULT_WINDOW) -> engine.H2Engine:
    """An engine with stream 1 opened by a GET, after a SETTINGS that sets the
    client's INITIAL_WINDOW_SIZE."""
    h2 = engine.H2Engine(128, 65536, 4 * 65536, engine.DecodedBudget(1 << 20))
    h2.initiate_connection()
    settings = struct.pack(">HI", engine.INITIAL_WINDOW_SIZE, initial_window)
    block = hpack.Encoder().encode([(b":method", b"GET"), (b":scheme", b"https"),
                                    (b":path", b"/"), (b":authority", b"localhost")])
    events = h2.receive_data(
        engine.PREFACE + FRAME.pack(len(settings) << 8 | engine.SETTINGS, 0, 0) + settings
        + FRAME.pack(len(block) << 8 | engine.HEADERS,
                     engine.END_HEADERS | engine.END_STREAM, 1) + block)
    assert [type(e) for e in events] == [engine.RequestReceived]
    h2.data_to_send()
    return h2


def frames(data: bytes) -> list:
    """(kind, flags, length) of each frame in `data`."""
    out = []
    while data:
        frame, length = Frame.parse_frame_header(memoryview(data[:9]))
        out.append((type(frame).__name__.replace("Frame", ""), sorted(frame.flags), length))
        data = data[9 + length:]
    return out


@pytest.mark.parametrize("block_size, body_size, window, sent, expected", [
    (10, 100, 65535, True, [("Headers", ["END_HEADERS"], 10), ("Data", ["END_STREAM"], 100)]),
    (10, 0, 65535, True, [("Headers", ["END_HEADERS", "END_STREAM"], 10)]),
    (20000, 100, 65535, True, [("Headers", [], 16384), ("Continuation", ["END_HEADERS"], 3616),
                               ("Data", ["END_STREAM"], 100)]),
    (20000, 0, 65535, True, [("Headers", ["END_STREAM"], 16384),
                             ("Continuation", ["END_HEADERS"], 3616)]),
    (10, 100, 50, False, [("Headers", ["END_HEADERS"], 10)]),
    (10, 20000, 65535, False, [("Headers", ["END_HEADERS"], 10)]),
])
def test_a_whole_answer_is_headers_then_one_data_frame_as_the_window_allows(
        block_size, body_size, window, sent, expected):
    h2 = opened(window)
    assert h2.send_answer(1, b"x" * block_size, b"y" * body_size) is sent
    assert frames(h2.data_to_send()) == expected
    assert h2.can_send(1) is not sent          # an answer sent whole closed the stream
    if not sent:
        assert h2.local_flow_control_window(1) == window     # nothing of the body went


def test_a_whole_answer_on_a_closed_stream_raises():
    h2 = opened()
    assert h2.send_answer(1, b"x", b"y")
    with pytest.raises(engine.StreamClosedError):
        h2.send_answer(1, b"x", b"y")
