"""Malformed HTTP/2 requests (RFC 9113 8.1.1, 8.2, 8.3) are a stream error: that
stream gets 400 (or RST_STREAM(PROTOCOL_ERROR)), the connection and its other
streams go on."""

from __future__ import annotations

from conftest import TEMPLATE, tls_block
from h2raw import RawH2, get

PROTOCOL_ERROR = 0x1


def with_path(path):
    return [(b":method", b"GET"), (b":scheme", b"https"), (b":path", path),
            (b":authority", b"localhost")]


CASES = {
    "nul-in-path": with_path(b"/hel\x00lo"),
    "cr-in-path": with_path(b"/hel\rlo"),
    "lf-in-path": with_path(b"/hel\nlo"),
    "empty-path": with_path(b""),
    "nul-in-value": get() + [(b"x-a", b"a\x00b")],
    "cr-in-value": get() + [(b"x-a", b"a\rb")],
    "lf-in-value": get() + [(b"x-a", b"a\nb")],
    "space-around-value": get() + [(b"x-a", b" a")],
    # Not in an HTTP/1.1 field value either (RFC 9110 5.5): a DEL or VT forwarded
    # upstream was a 502 from a strict upstream, and went to a lenient one as it was.
    "del-in-value": get() + [(b"x-a", b"a\x7fb")],
    "vt-in-value": get() + [(b"x-a", b"a\x0bb")],
    "soh-in-value": get() + [(b"x-a", b"\x01ab")],
    "uppercase-name": get() + [(b"X-Upper", b"a")],
    "name-with-space": get() + [(b"x a", b"a")],
    "empty-name": get() + [(b"", b"a")],
    "connection": get() + [(b"connection", b"keep-alive")],
    "keep-alive": get() + [(b"keep-alive", b"timeout=5")],
    "te-gzip": get() + [(b"te", b"gzip")],
    "transfer-encoding": get() + [(b"transfer-encoding", b"chunked")],
    "upgrade": get() + [(b"upgrade", b"websocket")],
    "host-differs": get() + [(b"host", b"other.test")],
    "pseudo-after-regular": [(b":method", b"GET"), (b":scheme", b"https"),
                             (b"x-a", b"a"), (b":path", b"/hello"),
                             (b":authority", b"localhost")],
    "duplicate-path": get() + [(b":path", b"/docs/x")],
    "unknown-pseudo": get() + [(b":protocol", b"websocket")],
    "response-pseudo": get() + [(b":status", b"200")],
    "no-method": [(b":scheme", b"https"), (b":path", b"/hello"), (b":authority", b"localhost")],
    "no-scheme": [(b":method", b"GET"), (b":path", b"/hello"), (b":authority", b"localhost")],
}


def test_malformed_fields_are_a_stream_error_not_a_connection_error(start_server, certs):
    server = start_server(TEMPLATE.format(tls=tls_block(certs)))
    port, outcome = server.port("https"), {}
    for name, headers in CASES.items():
        conn = RawH2(port, certs["ca"])
        bad = conn.new_stream()
        good = conn.new_stream()
        conn.send(conn.headers_frame(bad, headers), conn.headers_frame(good, get()))
        answers = conn.answers([bad, good], timeout=5)
        bad_ok = answers[bad].status == 400 or answers[bad].reset == PROTOCOL_ERROR
        good_ok = answers[good].status == 200 and conn.goaway is None
        outcome[name] = (answers[bad].status, answers[bad].reset, answers[good].status,
                         conn.goaway and conn.goaway.error_code)
        if not (bad_ok and good_ok):
            outcome[name] += ("WRONG",)
        conn.close()
    for name, seen in outcome.items():
        print(f"{name:22} bad: status={seen[0]} reset={seen[1]}  good: {seen[2]}  "
              f"goaway: {seen[3]} {seen[4:] and 'WRONG' or ''}")
    assert [n for n, seen in outcome.items() if seen[4:]] == []
    assert "Traceback" not in "\n".join(server.lines)


def test_the_fields_that_are_allowed_still_pass(start_server, certs):
    server = start_server(TEMPLATE.format(tls=tls_block(certs)))
    conn = RawH2(server.port("https"), certs["ca"])
    stream = conn.request(get() + [(b"host", b"LocalHost"), (b"te", b"trailers"),
                                   (b"x-empty", b""), (b"x-inner", b"a b\tc"),
                                   (b"x-obs-text", b"caf\xe9")])
    assert conn.answers([stream])[stream].status == 200
    conn.close()
