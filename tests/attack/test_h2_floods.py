"""HTTP/2 frame floods: each kind ends the connection with GOAWAY(ENHANCE_YOUR_CALM)
soon, and another client is answered while it runs."""

from __future__ import annotations

import threading

import pytest
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
from test_e2e_core import TEMPLATE, tls_block

ENHANCE_YOUR_CALM = 0xB
FLOOD_SECONDS = 6.0


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


def others_answered(port: int, cafile: str, tries: int = 3) -> int:
    """Fresh clients asking for a page while the flood runs: how many got it."""
    answered = 0
    for _ in range(tries):
        try:
            conn = RawH2(port, cafile, timeout=3)
            stream = conn.request(get())
            if conn.answers([stream], timeout=3)[stream].status == 200:
                answered += 1
            conn.close()
        except OSError:
            pass
    return answered


@pytest.mark.parametrize("make", [ping, settings, empty_data, window_update, priority])
def test_a_frame_flood_ends_with_enhance_your_calm_and_others_are_served(
        make, start_server, certs):
    server = start_server(TEMPLATE.format(tls=tls_block(certs)))
    port = server.port("https")
    attacker = RawH2(port, certs["ca"])
    chunk = make(attacker)
    result = {}
    thread = threading.Thread(
        target=lambda: result.update(took=flood(attacker, chunk, FLOOD_SECONDS)))
    thread.start()
    try:
        answered = others_answered(port, certs["ca"])
    finally:
        thread.join(FLOOD_SECONDS + 5)
        attacker.close()
    took = result.get("took")
    print(f"{make.__name__}: GOAWAY after {took}, others answered {answered}/3, "
          f"frames read {attacker.received}")
    assert took is not None and took < 2.0, "no GOAWAY within the flood"
    assert attacker.goaway is not None and attacker.goaway.error_code == ENHANCE_YOUR_CALM
    assert answered == 3
    assert "Traceback" not in "\n".join(server.lines)
