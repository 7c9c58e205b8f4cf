"""A stream the client ends and resets (or sends on after its end) in the same read as
its request: it is dropped alone, other streams get their answers, and nothing
reaches the log as a traceback."""

from __future__ import annotations

import pytest
from conftest import TEMPLATE, tls_block
from h2raw import DataFrame, RawH2, RstStreamFrame, get

CANCEL = 0x8
ROUNDS = 60


def reset_after(conn, stream):
    return RstStreamFrame(stream, error_code=CANCEL)


def data_after(conn, stream):
    return DataFrame(stream, b"late", flags={"END_STREAM"})


@pytest.mark.parametrize("after", [reset_after, data_after])
def test_a_request_with_its_reset_in_one_write_is_dropped_alone(after, start_server, certs):
    server = start_server(TEMPLATE.format(tls=tls_block(certs)))
    conn = RawH2(server.port("https"), certs["ca"])
    others = []
    for _ in range(ROUNDS):
        kept = [conn.new_stream()]
        dropped = conn.new_stream()
        kept.append(conn.new_stream())
        conn.send(conn.headers_frame(kept[0], get()),
                  conn.headers_frame(dropped, get()), after(conn, dropped),
                  conn.headers_frame(kept[1], get(b"/docs/x")))
        others += kept
        conn.pump(0.001)
    answers = conn.answers(others, timeout=10)
    got = sum(1 for a in answers.values() if a.status == 200 and a.ended)
    print(f"{after.__name__}: {got} of {len(others)} other streams answered, "
          f"goaway={conn.goaway and conn.goaway.error_code}, closed={conn.closed}")
    assert got == len(others)
    assert conn.goaway is None and not conn.closed
    conn.close()
    assert "Traceback" not in "\n".join(server.lines)
