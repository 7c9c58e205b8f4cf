"""HTTP/2 frame floods: each kind ends the connection with GOAWAY(ENHANCE_YOUR_CALM)
soon, and another client is answered while it runs."""

from __future__ import annotations

import threading
import time

import pytest
from conftest import TEMPLATE, h2_protections, poll, tls_block
from h2raw import (
    DataFrame,
    PingFrame,
    RawH2,
    SettingsFrame,
    WindowUpdateFrame,
    flood,
    frames,
    get,
)
from hyperframe.frame import PriorityFrame

ENHANCE_YOUR_CALM = 0xB
FLOOD_SECONDS = 3.0
GOAWAY_WITHIN = 2.0


def ping(_conn):
    return frames(PingFrame(0, opaque_data=b"12345678"), 2000)


def settings(_conn):
    return frames(SettingsFrame(0), 2000)


def empty_data(conn):
    stream = conn.request(get(method=b"POST"), end=False)   # a body is due
    return frames(DataFrame(stream, b""), 2000)


def window_update(_conn):
    return frames(WindowUpdateFrame(0, window_increment=1), 2000)


def priority(conn):
    stream = conn.request(get())
    return frames(PriorityFrame(stream, depends_on=0, stream_weight=16), 2000)


def others_answered(port: int, cafile: str, until: float, tries: int = 3) -> int:
    """Fresh clients asking for a page while the flood runs (before `until`): how
    many got it in time."""
    answered = 0
    for _ in range(tries):
        left = min(1.0, until - time.monotonic())
        if left <= 0:
            break
        try:
            conn = RawH2(port, cafile, timeout=left)
            stream = conn.request(get())
            answer = conn.answers([stream], timeout=left)[stream]
            if answer.status == 200 and time.monotonic() < until:
                answered += 1
            conn.close()
        except OSError:
            pass
    return answered


def attack(port: int, cafile: str, make, seconds: float) -> list:
    """Flood, and on each GOAWAY connect again and go on, for `seconds`: how long each
    connection lasted (None: it never ended) and the GOAWAY code it got."""
    ends, until = [], time.monotonic() + seconds
    while time.monotonic() < until:
        conn = RawH2(port, cafile)
        took = flood(conn, make(conn), GOAWAY_WITHIN)
        ends.append((took, conn.goaway and conn.goaway.error_code, conn.received))
        conn.close()
        if took is None:
            break
    return ends


# The protection counter (nestgate_http2_protections_total) each flood moves.
REASON = {ping: "control_flood", settings: "control_flood", empty_data: "empty_frames",
          window_update: "window_update_flood", priority: "priority_flood"}


@pytest.mark.parametrize("make", [ping, settings, empty_data, window_update, priority])
def test_a_frame_flood_ends_with_enhance_your_calm_and_others_are_served(
        make, start_server, certs):
    server = start_server(TEMPLATE.format(tls=tls_block(certs)))
    port = server.port("https")
    result = {}
    thread = threading.Thread(target=lambda: result.update(
        ends=attack(port, certs["ca"], make, FLOOD_SECONDS)))
    thread.start()
    try:
        # While the attack goes on: one connection flooding for GOAWAY_WITHIN, or a
        # stream of new ones each cut off at once.
        answered = others_answered(port, certs["ca"], time.monotonic() + GOAWAY_WITHIN - 0.2)
    finally:
        thread.join(FLOOD_SECONDS + 10)
    ends = result["ends"]
    took = [t for t, _code, _n in ends if t is not None]
    print(f"{make.__name__}: {len(ends)} connections, GOAWAY after "
          f"{max(took) if took else None} s at most, codes {[c for _t, c, _n in ends][:20]}, "
          f"others answered {answered}/3, frames read on the first {ends[0][2]}")
    assert ends and all(t is not None for t, _c, _n in ends), "a flood went on"
    assert all(code == ENHANCE_YOUR_CALM for _t, code, _n in ends)
    assert answered == 3
    assert "Traceback" not in "\n".join(server.lines)
    counted = poll(lambda: h2_protections(server), lambda c: c.get(REASON[make], 0) >= len(ends))
    assert counted[REASON[make]] >= len(ends), counted
