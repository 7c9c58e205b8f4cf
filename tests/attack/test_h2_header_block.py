"""One header block (HEADERS and its CONTINUATION frames) is bounded by
`max_header_bytes` in bytes, not by a count of frames."""

from __future__ import annotations

import time

from conftest import TEMPLATE, tls_block
from h2raw import ContinuationFrame, HeadersFrame, RawH2, get

ENHANCE_YOUR_CALM = 0xB
MAX_HEADER_BYTES = 8 * 1024


def test_a_header_block_past_max_header_bytes_ends_the_connection(start_server, certs):
    config = TEMPLATE.format(tls=tls_block(certs)).replace(
        'max_body = "1KiB"', f'max_body = "1KiB"\nmax_header_bytes = {MAX_HEADER_BYTES}')
    server = start_server(config)
    conn = RawH2(server.port("https"), certs["ca"])
    first = conn.request(get())                   # settings exchanged before the block
    assert conn.answers([first])[first].status == 200
    block = conn.block(get())
    filler = b"\x00" * 4000                       # bytes the server must hold undecoded
    stream = conn.new_stream()
    conn.send(HeadersFrame(stream, block, flags={"END_STREAM"}))
    sent, start = len(block), time.monotonic()
    for _ in range(60):                           # never END_HEADERS, under 64 frames
        conn.send(ContinuationFrame(stream, filler))
        sent += len(filler)
        if not conn.pump(0.05) or conn.goaway is not None:
            break
    conn.wait(lambda: conn.goaway is not None, timeout=3)
    print(f"header block: GOAWAY {conn.goaway and conn.goaway.error_code} after "
          f"{sent} bytes, {time.monotonic() - start:.2f} s")
    assert conn.goaway is not None and conn.goaway.error_code == ENHANCE_YOUR_CALM
    assert sent <= MAX_HEADER_BYTES + 3 * len(filler)      # what was in flight
    conn.close()


def test_a_header_block_within_the_limit_still_gets_an_answer(start_server, certs):
    server = start_server(TEMPLATE.format(tls=tls_block(certs)))
    conn = RawH2(server.port("https"), certs["ca"])
    block = conn.block(get() + [(b"x-pad", b"a" * 6000)])
    stream = conn.new_stream()
    conn.send(HeadersFrame(stream, block[:100], flags={"END_STREAM"}),
              ContinuationFrame(stream, block[100:3000]),
              ContinuationFrame(stream, block[3000:], flags={"END_HEADERS"}))
    assert conn.answers([stream])[stream].status == 200
    conn.close()
