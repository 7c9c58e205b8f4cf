"""RFC 9113 (HTTP/2) and RFC 7541 (HPACK) conformance, case by case after h2spec's list.

Every case sends frames built by hand (`attack/h2raw.py`) to one real nestgate over TLS
and asserts what the RFC allows as the answer, exactly:

- a connection error (5.4.1) is a GOAWAY with its code, then the server closes;
- a stream error (5.4.2) is a RST_STREAM with its code on that stream, and the
  connection goes on: a new request on it gets its 200;
- a malformed request (8.1.1) may get either a 400 on its stream or RST_STREAM
  (PROTOCOL_ERROR); nestgate answers 400 and the connection goes on.

Where the RFC lets a receiver choose (a stream error or a connection error, one code
or another), the case names every outcome it accepts. Test ids carry the section
and h2spec's case number where it has one ("6.5.2-1"); h2spec's numbers follow RFC
7540, whose 8.1.2.x became RFC 9113's 8.2 and 8.3.

The server is one worker for the module: `/hello` answers "hello\\n" at once from the
event callback; `/up/...` is proxied to a raw upstream that answers only after the
whole request, body and all, with the target as its body. So a stream to `/up/` stays
open until the client ends it (the open state), and a stream to `/hello` from a
client that granted no window stays half-closed (remote) with its body unsent.
"""

from __future__ import annotations

import itertools
import textwrap

import pytest
from hpack.huffman import HuffmanEncoder
from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH

from attack.h2raw import PREFACE, RawH2, Stream, get, raw_frame
from attack.rawupstream import RawUpstream
from conftest import Server

WAIT_S = 3              # for an answer, an error or a close
CONNECT_S = 5           # socket timeout

# Frame types, flags, settings (RFC 9113 6) and error codes (7).
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE = 0x0, 0x1, 0x2, 0x3, 0x4, 0x5
PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0x6, 0x7, 0x8, 0x9
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS = 0x1, 0x2, 0x3
INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = 0x4, 0x5, 0x6
CODES = ["NO_ERROR", "PROTOCOL_ERROR", "INTERNAL_ERROR", "FLOW_CONTROL_ERROR",
         "SETTINGS_TIMEOUT", "STREAM_CLOSED", "FRAME_SIZE_ERROR", "REFUSED_STREAM", "CANCEL",
         "COMPRESSION_ERROR", "CONNECT_ERROR", "ENHANCE_YOUR_CALM", "INADEQUATE_SECURITY",
         "HTTP_1_1_REQUIRED"]
(NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR, _, STREAM_CLOSED,
 FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR) = range(10)
MAX_WINDOW = (1 << 31) - 1
FRAME_LIMIT = 16384      # SETTINGS_MAX_FRAME_SIZE: nestgate advertises no other


def goaway(code: int) -> str:
    return "GOAWAY " + CODES[code]


def reset(code: int) -> str:
    return "RST_STREAM " + CODES[code]


MALFORMED = {"400", reset(PROTOCOL_ERROR)}      # 8.1.1: either answer


# ---------------------------------------------------------------- the server
SITE = """
[server]
workers = 1

[[listen]]
address = "127.0.0.1:0"
[[listen.certificate]]
cert = "{cert}"
key = "{key}"

[[site]]
hosts = ["*"]

[[site.route]]
path = "/hello"
type = "return"
body = "hello\\n"

[[site.route]]
prefix = "/up/"
type = "proxy"
upstream = "{upstream}"
"""


@pytest.fixture(scope="module")
def upstream():
    up = RawUpstream()
    yield up
    up.stop()


@pytest.fixture(scope="module")
def server(upstream, certs, tmp_path_factory):
    path = tmp_path_factory.mktemp("h2conformance") / "nestgate.toml"
    path.write_text(textwrap.dedent(SITE.format(cert=certs["local"][0], key=certs["local"][1],
                                                upstream=upstream.url)))
    running = Server(path)
    yield running
    running.stop()
    assert "Traceback" not in "\n".join(running.lines)


@pytest.fixture
def h2(server, certs):
    """h2(settings=None, **kw) -> RawH2 recording every frame; closed after the test."""
    conns = []

    def connect(settings: dict | None = None, **kw) -> RawH2:
        conn = RawH2(server.port("https"), certs["ca"], settings=settings, timeout=CONNECT_S,
                     record=True, **kw)
        conns.append(conn)
        return conn

    yield connect
    for conn in conns:
        conn.close()


# ---------------------------------------------------------------- frames
def headers(conn: RawH2, stream_id: int, fields=None, flags: int = END_STREAM | END_HEADERS,
            path: bytes = b"/hello") -> bytes:
    return raw_frame(HEADERS, flags, stream_id, conn.block(fields or get(path)))


def data(stream_id: int, payload: bytes = b"test", flags: int = END_STREAM) -> bytes:
    return raw_frame(DATA, flags, stream_id, payload)


def settings(*pairs: tuple[int, int], flags: int = 0, stream_id: int = 0) -> bytes:
    payload = b"".join(key.to_bytes(2, "big") + value.to_bytes(4, "big") for key, value in pairs)
    return raw_frame(SETTINGS, flags, stream_id, payload)


def ping(payload: bytes = b"h2-ping!", flags: int = 0, stream_id: int = 0) -> bytes:
    return raw_frame(PING, flags, stream_id, payload)


def window_update(stream_id: int, increment: int) -> bytes:
    return raw_frame(WINDOW_UPDATE, 0, stream_id, increment.to_bytes(4, "big"))


def rst_stream(stream_id: int, code: int = CANCEL) -> bytes:
    return raw_frame(RST_STREAM, 0, stream_id, code.to_bytes(4, "big"))


def priority(stream_id: int, depends_on: int = 0, weight: int = 16,
             exclusive: bool = False) -> bytes:
    dependency = depends_on | (1 << 31 if exclusive else 0)
    return raw_frame(PRIORITY, 0, stream_id, dependency.to_bytes(4, "big") + bytes((weight - 1,)))


def goaway_frame(last: int = 0, code: int = NO_ERROR, stream_id: int = 0) -> bytes:
    return raw_frame(GOAWAY, 0, stream_id, last.to_bytes(4, "big") + code.to_bytes(4, "big"))


def post(path: bytes = b"/up/post", extra=()) -> list:
    return get(path, method=b"POST") + list(extra)


# HPACK by hand (RFC 7541 5 and 6), for representations an encoder would not choose.
def hp_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    top = (1 << prefix_bits) - 1
    if value < top:
        return bytes((first | value,))
    out, value = bytearray((first | top,)), value - top
    while value >= 0x80:
        out.append(0x80 | value & 0x7F)
        value >>= 7
    return bytes(out + bytes((value,)))


def hp_str(value: bytes, huffman: bool = False) -> bytes:
    if huffman:
        value = HuffmanEncoder(REQUEST_CODES, REQUEST_CODES_LENGTH).encode(value)
        return hp_int(len(value), 7, 0x80) + value
    return hp_int(len(value), 7) + value


def literal(name_index: int, value: bytes) -> bytes:
    """A literal field without indexing, with a static table name: no table changes."""
    return hp_int(name_index, 4) + hp_str(value)


def static_request(path: bytes = b"/hello") -> bytes:
    """GET `path` in a block that only reads the static table and adds nothing."""
    return b"\x82\x87" + literal(1, b"localhost") + literal(4, path)   # GET, https


# ---------------------------------------------------------------- outcomes
def connection_outcome(conn: RawH2) -> str:
    """'GOAWAY <code>' once the server sent it and closed; otherwise what it did."""
    conn.wait_closed(WAIT_S)
    if conn.goaway is not None:
        code = CODES[conn.goaway.error_code] if conn.goaway.error_code < len(CODES) \
            else hex(conn.goaway.error_code)
        return "GOAWAY " + code + ("" if conn.closed else " (connection left open)")
    return "closed without GOAWAY" if conn.closed else "no error, connection open"


def stream_outcome(conn: RawH2, stream_id: int) -> str:
    """'RST_STREAM <code>', the final status of a whole answer, or the connection's end."""
    stream = conn.streams.setdefault(stream_id, Stream())
    conn.wait(lambda: stream.done or conn.goaway is not None or conn.closed, WAIT_S)
    if stream.reset is not None and not stream.ended:
        return reset(stream.reset)
    if stream.ended:
        return str(stream.status)
    if conn.goaway is not None or conn.closed:
        return connection_outcome(conn)
    return "nothing on the stream"


def survives(conn: RawH2) -> bool:
    """Whether a new GET /hello on the connection gets its 200. The stream window is
    opened first (some cases set it to 0) and a PING answered, so that streams held
    by it are done before."""
    conn.send(settings((INITIAL_WINDOW_SIZE, 65535)))
    assert_no_error(conn)
    sid = conn.new_stream()
    conn.send(headers(conn, sid))
    return stream_outcome(conn, sid) == "200" and conn.goaway is None and not conn.closed


def assert_connection_error(conn: RawH2, *allowed: str) -> None:
    assert connection_outcome(conn) in allowed


def assert_stream_error(conn: RawH2, stream_id: int, allowed: set[str]) -> None:
    """The stream's outcome is one `allowed`; after a stream error the connection
    serves the next request."""
    outcome = stream_outcome(conn, stream_id)
    assert outcome in allowed
    if not outcome.startswith("GOAWAY"):
        assert survives(conn), f"the connection did not survive {outcome}"


def assert_no_error(conn: RawH2) -> None:
    """The server took what came before as it should: a PING is still answered with
    its payload, and no GOAWAY came."""
    payload = next(_PINGS)
    conn.send(ping(payload))
    conn.wait(lambda: _acked(conn, payload) or conn.closed, WAIT_S)
    assert conn.goaway is None and not conn.closed, connection_outcome(conn)
    assert _acked(conn, payload)


_PINGS = (b"ping%04d" % n for n in itertools.count())


def _acked(conn: RawH2, payload: bytes) -> bool:
    return any(f.type == PING and "ACK" in f.flags and f.opaque_data == payload
               for f in conn.frames)


def data_lengths(conn: RawH2, stream_id: int) -> list[int]:
    return [len(f.data) for f in conn.frames if f.type == DATA and f.stream_id == stream_id]


def answered(conn: RawH2, stream_id: int) -> tuple[str, bytes]:
    outcome = stream_outcome(conn, stream_id)
    return outcome, bytes(conn.streams[stream_id].data)


# Streams in a given state (5.1).
def half_closed_remote(h2) -> tuple[RawH2, int]:
    """A GET whose answer waits for a window the client never granted: the client
    has ended its side, the server has sent the HEADERS and holds the body."""
    conn = h2({INITIAL_WINDOW_SIZE: 0})
    sid = conn.request(get())
    conn.wait(lambda: conn.streams[sid].status or conn.closed, WAIT_S)
    assert conn.streams[sid].status == 200 and not conn.streams[sid].done
    return conn, sid


def open_stream(h2, path: bytes = b"/up/open") -> tuple[RawH2, int]:
    """A POST whose body has not ended: the proxy waits for it, the stream is open."""
    conn = h2()
    sid = conn.request(post(path), end=False)
    return conn, sid


def closed_stream(h2) -> tuple[RawH2, int]:
    """A GET answered whole: both sides sent END_STREAM. What the client recorded of
    it is dropped, so that only what comes next is read as the stream's outcome."""
    conn = h2()
    sid = conn.request(get())
    assert stream_outcome(conn, sid) == "200"
    conn.streams[sid] = Stream()
    return conn, sid


def reset_by_client(h2) -> tuple[RawH2, int]:
    """An open stream the client reset (RST_STREAM(CANCEL))."""
    conn, sid = open_stream(h2)
    conn.send(rst_stream(sid, CANCEL))
    assert_no_error(conn)
    return conn, sid


# ================================================================ generic (h2spec)
def test_generic_1_preface_answered_with_settings_first(h2):
    conn = h2()
    conn.wait(lambda: conn.frames, WAIT_S)
    first = conn.frames[0]
    assert first.type == SETTINGS and "ACK" not in first.flags
    assert_no_error(conn)


def test_generic_2_1_priority_on_idle_stream_then_headers(h2):
    conn = h2()
    sid = conn.new_stream()
    conn.send(priority(sid, 0, 32), headers(conn, sid))
    assert stream_outcome(conn, sid) == "200"


@pytest.mark.parametrize("frame", ["WINDOW_UPDATE", "PRIORITY", "RST_STREAM"])
def test_generic_2_frames_allowed_on_half_closed_remote(h2, frame):
    conn, sid = half_closed_remote(h2)
    conn.send({"WINDOW_UPDATE": window_update(sid, 1), "PRIORITY": priority(sid, 0, 1),
               "RST_STREAM": rst_stream(sid, CANCEL)}[frame])
    assert_no_error(conn)
    assert survives(conn)


def test_generic_2_5_priority_on_closed_stream(h2):
    conn, sid = closed_stream(h2)
    conn.send(priority(sid, 0, 1))
    assert_no_error(conn)


def test_generic_2_window_update_and_rst_stream_on_closed_stream(h2):
    # 5.1: after END_STREAM a peer may still get WINDOW_UPDATE or RST_STREAM.
    conn, sid = closed_stream(h2)
    conn.send(window_update(sid, 1), rst_stream(sid, CANCEL))
    assert_no_error(conn)
    assert survives(conn)


@pytest.mark.parametrize("body", [
    pytest.param([(b"test", END_STREAM)], id="3.1-1-one-DATA"),
    pytest.param([(b"te", 0), (b"st", 0), (b"", END_STREAM)], id="3.1-2-several-DATA"),
])
def test_generic_3_1_data(h2, body):
    conn = h2()
    sid = conn.request(post(b"/up/data"), end=False)
    conn.send(*(data(sid, chunk, flags) for chunk, flags in body))
    assert answered(conn, sid) == ("200", b"/up/data")


def test_generic_3_1_3_data_with_padding(h2, upstream):
    conn = h2()
    sid = conn.request(post(b"/up/padded"), end=False)
    conn.send(raw_frame(DATA, PADDED | END_STREAM, sid, b"\x06" + b"test" + b"\0" * 6))
    assert answered(conn, sid) == ("200", b"/up/padded")
    body = [r["body"] for r in upstream.take() if r["target"] == "/up/padded"]
    assert body == [b"test"]                # the padding is not the body


def test_generic_3_2_headers_variants(h2):
    conn = h2()
    plain, padded, prioritised = conn.new_stream(), conn.new_stream(), conn.new_stream()
    conn.send(headers(conn, plain))
    conn.send(raw_frame(HEADERS, END_STREAM | END_HEADERS | PADDED, padded,
                        b"\x03" + conn.block(get()) + b"\0\0\0"))
    conn.send(raw_frame(HEADERS, END_STREAM | END_HEADERS | PRIORITY_FLAG, prioritised,
                        (1 << 31 | plain).to_bytes(4, "big") + b"\x0f" + conn.block(get())))
    assert [stream_outcome(conn, s) for s in (plain, padded, prioritised)] == ["200"] * 3


def test_generic_3_2_padded_headers_with_priority(h2):
    conn = h2()
    sid = conn.new_stream()
    conn.send(raw_frame(HEADERS, END_STREAM | END_HEADERS | PADDED | PRIORITY_FLAG, sid,
                        b"\x02" + b"\0\0\0\0\x10" + conn.block(get()) + b"\0\0"))
    assert stream_outcome(conn, sid) == "200"


@pytest.mark.parametrize("frame", [
    pytest.param(lambda sid: priority(sid, 0, 1), id="3.3-1-weight-1"),
    pytest.param(lambda sid: priority(sid, 0, 256), id="3.3-2-weight-256"),
    pytest.param(lambda sid: priority(sid, sid + 2, 16), id="3.3-3-dependency"),
    pytest.param(lambda sid: priority(sid, sid + 2, 16, exclusive=True), id="3.3-4-exclusive"),
])
def test_generic_3_3_priority(h2, frame):
    conn = h2()
    sid = conn.request(get())
    conn.send(frame(sid))
    assert stream_outcome(conn, sid) == "200"
    assert_no_error(conn)


def test_generic_3_3_5_priority_on_idle_stream_then_headers_on_lower_one(h2):
    # PRIORITY does not open a stream, so a lower stream id may still be opened.
    conn = h2()
    conn.send(priority(3, 0, 16))
    sid = conn.request(get())
    assert sid == 1 and stream_outcome(conn, sid) == "200"


def test_generic_3_4_rst_stream(h2):
    conn, sid = open_stream(h2)
    conn.send(rst_stream(sid, CANCEL))
    assert_no_error(conn)
    assert survives(conn)


def test_generic_3_5_settings_acknowledged(h2):
    conn = h2()
    conn.send(settings((HEADER_TABLE_SIZE, 4096), (MAX_FRAME_SIZE, 20000)))
    conn.wait(lambda: sum(1 for f in conn.frames if f.type == SETTINGS and "ACK" in f.flags),
              WAIT_S)
    assert_no_error(conn)
    # The preface's SETTINGS and this one: each acknowledged once.
    assert sum(1 for f in conn.frames if f.type == SETTINGS and "ACK" in f.flags) == 2


def test_generic_3_7_ping(h2):
    conn = h2()
    assert_no_error(conn)


def test_generic_3_8_goaway_closes_without_error(h2):
    conn = h2()
    sid = conn.request(get())
    assert stream_outcome(conn, sid) == "200"
    conn.send(goaway_frame(0, NO_ERROR))
    assert connection_outcome(conn) in ("closed without GOAWAY", goaway(NO_ERROR))


@pytest.mark.parametrize("stream", ["connection", "stream"])
def test_generic_3_9_window_update(h2, stream):
    conn, sid = half_closed_remote(h2)
    conn.send(window_update(0 if stream == "connection" else sid, 1))
    assert_no_error(conn)


@pytest.mark.parametrize("pieces", [2, 5], ids=["3.10-1-one", "3.10-2-several"])
def test_generic_3_10_continuation(h2, pieces):
    conn = h2()
    sid = conn.new_stream()
    block = conn.block(get() + [(b"x-fill", b"f" * 40)])
    size = -(-len(block) // pieces)
    parts = [block[i:i + size] for i in range(0, len(block), size)]
    frames = [raw_frame(HEADERS, END_STREAM, sid, parts[0])]
    frames += [raw_frame(CONTINUATION, 0, sid, p) for p in parts[1:-1]]
    frames.append(raw_frame(CONTINUATION, END_HEADERS, sid, parts[-1]))
    conn.send(*frames)
    assert stream_outcome(conn, sid) == "200"


def test_generic_4_1_get(h2):
    conn = h2()
    sid = conn.request(get())
    assert answered(conn, sid) == ("200", b"hello\n")


def test_a_proxied_answer_ends_its_stream_on_its_last_data_frame(h2):
    # The upstream answers each GET whole in one write, framed by Content-Length.
    # Once the proxy knows that head (from the first answer), such a body goes out
    # as one DATA frame carrying END_STREAM, without an empty frame after it.
    conn = h2()
    sid = conn.request(get(b"/up/whole"))
    assert answered(conn, sid) == ("200", b"/up/whole")
    for _ in range(3):
        sid = conn.request(get(b"/up/whole"))
        assert answered(conn, sid) == ("200", b"/up/whole")
        assert data_lengths(conn, sid) == [len(b"/up/whole")]
        last = [f for f in conn.frames if f.type == DATA and f.stream_id == sid][-1]
        assert "END_STREAM" in last.flags


def test_generic_4_2_head(h2):
    conn = h2()
    sid = conn.request(get(method=b"HEAD"))
    assert answered(conn, sid) == ("200", b"")
    assert data_lengths(conn, sid) in ([], [0])


def test_generic_4_3_post(h2):
    conn = h2()
    sid = conn.request(post(b"/up/post", [(b"content-length", b"4")]), end=False)
    conn.send(data(sid, b"test"))
    assert answered(conn, sid) == ("200", b"/up/post")


def test_generic_4_4_post_with_trailers(h2):
    conn = h2()
    sid = conn.request(post(b"/up/trailers"), end=False)
    conn.send(data(sid, b"test", 0), headers(conn, sid, [(b"x-trailer", b"done")]))
    assert answered(conn, sid) == ("200", b"/up/trailers")


# generic 5: each representation of RFC 7541 6, put on :path so that the upstream's
# answer (the target it read) shows what the server decoded. The other fields are
# indexed (6.1): :method GET and :scheme https, and :authority a literal.
def _representations():
    """(id, blocks): each block a table size update (or nothing) and :path's field."""
    path = b"/up/hpack"
    yield "5-1-indexed-and-literal", [(b"", literal(4, path))]
    for huffman in (False, True):
        tag = "-huffman" if huffman else ""
        value, name = hp_str(path, huffman), hp_str(b":path", huffman)
        yield f"5-incremental-indexed-name{tag}", [(b"", hp_int(4, 6, 0x40) + value),
                                                   (b"", b"\xbe")]
        yield f"5-incremental-new-name{tag}", [(b"", b"\x40" + name + value), (b"", b"\xbe")]
        yield f"5-without-indexing-indexed-name{tag}", [(b"", hp_int(4, 4, 0x00) + value)]
        yield f"5-without-indexing-new-name{tag}", [(b"", b"\x00" + name + value)]
        yield f"5-never-indexed-indexed-name{tag}", [(b"", hp_int(4, 4, 0x10) + value)]
        yield f"5-never-indexed-new-name{tag}", [(b"", b"\x10" + name + value)]
    yield "5-table-size-update", [(hp_int(4096, 5, 0x20), literal(4, path))]
    yield "5-two-table-size-updates", [(b"\x20" + hp_int(4096, 5, 0x20),
                                        hp_int(4, 6, 0x40) + hp_str(path)), (b"", b"\xbe")]


@pytest.mark.parametrize("blocks", [pytest.param(b, id=i) for i, b in _representations()])
def test_generic_5_hpack_representations(h2, blocks):
    conn = h2()
    for update, field in blocks:     # a second block refers to what the first indexed
        sid = conn.new_stream()
        conn.send(raw_frame(HEADERS, END_STREAM | END_HEADERS, sid,
                            update + b"\x82\x87" + literal(1, b"localhost") + field))
        assert answered(conn, sid) == ("200", b"/up/hpack")


# ================================================================ 3.4, 3.5 preface
def test_3_5_1_preface_and_settings(h2):
    conn = h2()
    sid = conn.request(get())
    assert stream_outcome(conn, sid) == "200"


def test_3_5_2_invalid_preface(h2):
    conn = h2(preface=False)
    conn.send(b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n" + settings())
    # 3.4: a connection error; the GOAWAY may be left out, the peer not being HTTP/2.
    assert_connection_error(conn, goaway(PROTOCOL_ERROR), "closed without GOAWAY")


def test_3_4_preface_not_followed_by_settings(h2):
    conn = h2(preface=False)
    conn.send(PREFACE + ping())
    assert_connection_error(conn, goaway(PROTOCOL_ERROR))


# ================================================================ 4.1 frame format
def test_4_1_1_unknown_frame_type_is_ignored(h2):
    conn = h2()
    conn.send(raw_frame(0x16, 0, 0, b"unknown"), raw_frame(0xFF, 0xFF, 1, b"on idle stream"))
    assert_no_error(conn)
    assert survives(conn)


def test_4_1_2_undefined_flags_are_ignored(h2):
    conn = h2()
    conn.send(ping(b"flags!!!", flags=0x16 & ~ACK))
    conn.wait(lambda: _acked(conn, b"flags!!!"), WAIT_S)
    assert _acked(conn, b"flags!!!")
    sid = conn.new_stream()
    conn.send(raw_frame(HEADERS, END_STREAM | END_HEADERS | 0x2 | 0x40, sid, conn.block(get())))
    assert stream_outcome(conn, sid) == "200"


def test_4_1_3_reserved_bit_is_ignored(h2):
    conn = h2()
    sid = conn.new_stream()
    conn.send(raw_frame(HEADERS, END_STREAM | END_HEADERS, sid | 1 << 31, conn.block(get())))
    assert stream_outcome(conn, sid) == "200"
    conn.send(raw_frame(WINDOW_UPDATE, 0, 1 << 31, (1 << 31 | 100).to_bytes(4, "big")))
    assert_no_error(conn)


# ================================================================ 4.2 frame size
def test_4_2_1_data_of_the_maximum_frame_size(h2):
    conn = h2()
    sid = conn.request(post(b"/up/max-frame"), end=False)
    conn.send(data(sid, b"x" * FRAME_LIMIT))
    assert answered(conn, sid) == ("200", b"/up/max-frame")


def test_4_2_2_data_over_the_maximum_frame_size(h2):
    conn, sid = open_stream(h2)
    conn.send(data(sid, b"x" * (FRAME_LIMIT + 1)))
    # DATA changes only its stream: a stream error or a connection error (4.2).
    assert_stream_error(conn, sid, {reset(FRAME_SIZE_ERROR), goaway(FRAME_SIZE_ERROR)})


def test_4_2_3_headers_over_the_maximum_frame_size(h2):
    conn = h2()
    sid = conn.new_stream()
    block = conn.block(get() + [(b"x-dummy-%d" % i, b"v" * 100) for i in range(170)])
    assert len(block) > FRAME_LIMIT
    conn.send(raw_frame(HEADERS, END_STREAM | END_HEADERS, sid, block))
    # A frame carrying a field block alters the connection's state: a connection error.
    assert_connection_error(conn, goaway(FRAME_SIZE_ERROR))


def test_4_2_settings_over_the_maximum_frame_size(h2):
    conn = h2()
    conn.send(settings(*[(0xF0, 0)] * ((FRAME_LIMIT + 6) // 6)))
    assert_connection_error(conn, goaway(FRAME_SIZE_ERROR))


# ================================================================ 4.3 header compression
def test_4_3_1_invalid_header_block(h2):
    conn = h2()
    conn.send(raw_frame(HEADERS, END_STREAM | END_HEADERS, 1, b"\x40"))
    assert_connection_error(conn, goaway(COMPRESSION_ERROR))


@pytest.mark.parametrize("other", [
    pytest.param(lambda conn: priority(1, 0, 16), id="4.3-2-priority"),
    pytest.param(lambda conn: headers(conn, 3), id="4.3-3-headers-of-another-stream"),
])
def test_4_3_header_block_interrupted(h2, other):
    conn = h2()
    block = conn.block(get())
    conn.send(raw_frame(HEADERS, END_STREAM, 1, block[:4]), other(conn),
              raw_frame(CONTINUATION, END_HEADERS, 1, block[4:]))
    assert_connection_error(conn, goaway(PROTOCOL_ERROR))


# ================================================================ 5.1 stream states
@pytest.mark.parametrize("frame", [
    pytest.param(lambda conn: data(1), id="5.1-1-idle-DATA"),
    pytest.param(lambda conn: rst_stream(1), id="5.1-2-idle-RST_STREAM"),
    pytest.param(lambda conn: window_update(1, 100), id="5.1-3-idle-WINDOW_UPDATE"),
    pytest.param(lambda conn: raw_frame(CONTINUATION, END_HEADERS, 1, conn.block(get())),
                 id="5.1-4-idle-CONTINUATION"),
    pytest.param(lambda conn: data(2), id="5.1-idle-DATA-even-stream"),
    pytest.param(lambda conn: window_update(3, 1), id="5.1-idle-WINDOW_UPDATE-above-open"),
])
def test_5_1_idle_stream_frames(h2, frame):
    conn = h2()
    conn.send(frame(conn))
    assert_connection_error(conn, goaway(PROTOCOL_ERROR))


def test_5_1_idle_stream_above_an_open_one(h2):
    conn, sid = open_stream(h2)
    conn.send(data(sid + 2))
    assert_connection_error(conn, goaway(PROTOCOL_ERROR))


@pytest.mark.parametrize("frame", [
    pytest.param(lambda conn: headers(conn, 2), id="HEADERS-on-even-stream"),
    pytest.param(lambda conn: raw_frame(PUSH_PROMISE, END_HEADERS, 1,
                                        (2).to_bytes(4, "big") + conn.block(get())),
                 id="PUSH_PROMISE-reserving-a-stream"),
])
def test_5_1_reserved_streams_are_the_server_s(h2, frame):
    # Only a server reserves streams (even ids, by PUSH_PROMISE); a client cannot put
    # one in a reserved state nor open an even-numbered one.
    conn = h2()
    conn.send(frame(conn))
    assert_connection_error(conn, goaway(PROTOCOL_ERROR))


def test_5_1_open_stream_takes_data_and_trailers(h2):
    conn, sid = open_stream(h2, b"/up/open-state")
    conn.send(data(sid, b"a", 0), window_update(sid, 10), priority(sid, 0, 8))
    assert_no_error(conn)
    conn.send(data(sid, b"b", 0), headers(conn, sid, [(b"x-t", b"1")]))
    assert answered(conn, sid) == ("200", b"/up/open-state")


def test_5_1_5_half_closed_remote_data(h2):
    conn, sid = half_closed_remote(h2)
    conn.send(data(sid))
    assert_stream_error(conn, sid, {reset(STREAM_CLOSED)})


def test_5_1_6_half_closed_remote_headers(h2):
    conn, sid = half_closed_remote(h2)
    conn.send(headers(conn, sid))
    assert_stream_error(conn, sid, {reset(STREAM_CLOSED)})


def test_5_1_7_half_closed_remote_continuation(h2):
    conn, sid = half_closed_remote(h2)
    conn.send(raw_frame(CONTINUATION, END_HEADERS, sid, conn.block([(b"x-a", b"b")])))
    # 6.10 makes a CONTINUATION after END_HEADERS a connection error (PROTOCOL_ERROR);
    # 5.1 a frame in this state a stream error (STREAM_CLOSED).
    assert_stream_error(conn, sid, {reset(STREAM_CLOSED), goaway(PROTOCOL_ERROR)})


def test_5_1_8_closed_by_client_reset_then_data(h2):
    conn, sid = reset_by_client(h2)
    conn.send(data(sid))
    assert_stream_error(conn, sid, {reset(STREAM_CLOSED), goaway(STREAM_CLOSED)})


def test_5_1_9_closed_by_client_reset_then_headers(h2):
    conn, sid = reset_by_client(h2)
    conn.send(headers(conn, sid))
    assert_stream_error(conn, sid, {reset(STREAM_CLOSED), goaway(STREAM_CLOSED)})


def test_5_1_10_closed_by_client_reset_then_continuation(h2):
    conn, sid = reset_by_client(h2)
    conn.send(raw_frame(CONTINUATION, END_HEADERS, sid, conn.block([(b"x-a", b"b")])))
    assert_stream_error(conn, sid, {reset(STREAM_CLOSED), goaway(STREAM_CLOSED),
                                    goaway(PROTOCOL_ERROR)})


def test_5_1_11_closed_then_data(h2):
    conn, sid = closed_stream(h2)
    conn.send(data(sid))
    # 6.1: a stream error; 5.1 lets a closed stream's frame end the connection instead.
    assert_stream_error(conn, sid, {reset(STREAM_CLOSED), goaway(STREAM_CLOSED)})


def test_5_1_12_closed_then_headers(h2):
    conn, sid = closed_stream(h2)
    conn.send(headers(conn, sid))
    assert_stream_error(conn, sid, {reset(STREAM_CLOSED), goaway(STREAM_CLOSED)})


def test_5_1_13_closed_then_continuation(h2):
    conn, sid = closed_stream(h2)
    conn.send(raw_frame(CONTINUATION, END_HEADERS, sid, conn.block([(b"x-a", b"b")])))
    assert_connection_error(conn, goaway(STREAM_CLOSED), goaway(PROTOCOL_ERROR))


def test_5_1_closed_by_our_reset_frames_are_ignored(h2):
    # The client may have sent these before it saw our RST_STREAM (5.1 "closed"):
    # /hello answers a POST before its body and resets the stream (NO_ERROR).
    conn = h2()
    sid = conn.request(post(b"/hello"), end=False)
    assert stream_outcome(conn, sid) == "200"
    conn.wait(lambda: conn.streams[sid].reset is not None, WAIT_S)
    assert conn.streams[sid].reset == NO_ERROR
    conn.send(data(sid, b"late", 0), window_update(sid, 5), headers(conn, sid, [(b"x-t", b"1")]))
    assert_no_error(conn)
    assert survives(conn)


# ================================================================ 5.1.1 stream identifiers
def test_5_1_1_1_even_stream_identifier(h2):
    conn = h2()
    conn.send(headers(conn, 2))
    assert_connection_error(conn, goaway(PROTOCOL_ERROR))


@pytest.mark.parametrize("opened,late", [
    pytest.param([5], 3, id="5.1.1-2-after-5-then-3"),
    pytest.param([3], 1, id="first-id-skipped"),
    pytest.param([1, 3, 9, 11], 7, id="skipped-between-others"),
])
def test_5_1_1_2_stream_identifier_lower_than_previous(h2, opened, late):
    # Ids skipped were never opened: a HEADERS for one is an unexpected stream
    # identifier (PROTOCOL_ERROR), not a frame on a closed stream (5.1/12).
    conn = h2()
    conn.send(*(headers(conn, s) for s in opened))
    assert [stream_outcome(conn, s) for s in opened] == ["200"] * len(opened)
    conn.send(headers(conn, late))
    assert_connection_error(conn, goaway(PROTOCOL_ERROR))


def test_5_1_1_largest_stream_identifier(h2):
    conn = h2()
    conn.send(headers(conn, MAX_WINDOW))
    assert stream_outcome(conn, MAX_WINDOW) == "200"


# ================================================================ 5.1.2 concurrency
def test_5_1_2_1_concurrent_stream_limit(h2):
    conn = h2({INITIAL_WINDOW_SIZE: 0})
    conn.wait(lambda: any(f.type == SETTINGS for f in conn.frames), WAIT_S)
    limit = next(f.settings for f in conn.frames if f.type == SETTINGS)[MAX_CONCURRENT_STREAMS]
    ids = [conn.new_stream() for _ in range(limit + 1)]
    conn.send(*(headers(conn, s) for s in ids))
    # Each held open by the window of 0: the one past the limit is refused alone.
    assert stream_outcome(conn, ids[-1]) in {reset(REFUSED_STREAM), reset(PROTOCOL_ERROR)}
    conn.wait(lambda: all(conn.streams[s].status for s in ids[:-1]), WAIT_S)
    assert [conn.streams[s].status for s in ids[:-1]] == [200] * limit
    conn.send(settings((INITIAL_WINDOW_SIZE, 65535)))
    assert conn.answers(ids[:-1], WAIT_S) and all(conn.streams[s].ended for s in ids[:-1])
    assert survives(conn)


# ================================================================ 5.3.1 dependencies
def test_5_3_1_1_headers_depending_on_itself(h2):
    conn = h2()
    sid = conn.new_stream()
    conn.send(raw_frame(HEADERS, END_STREAM | END_HEADERS | PRIORITY_FLAG, sid,
                        sid.to_bytes(4, "big") + b"\x10" + conn.block(get())))
    assert_stream_error(conn, sid, {reset(PROTOCOL_ERROR)})


@pytest.mark.parametrize("state", ["idle", "half-closed-remote"])
def test_5_3_1_2_priority_depending_on_itself(h2, state):
    if state == "idle":
        conn = h2()
        sid = 1
        conn.next_id = 3
    else:
        conn, sid = half_closed_remote(h2)
    conn.send(priority(sid, sid, 16))
    assert_stream_error(conn, sid, {reset(PROTOCOL_ERROR)})


# ================================================================ 5.4.1 connection errors
def test_5_4_1_1_connection_closed_after_error(h2):
    conn = h2()
    conn.send(ping(b"short", flags=0))
    assert conn.wait_closed(WAIT_S)


def test_5_4_1_2_goaway_names_the_last_stream_processed(h2):
    conn = h2()
    sid = conn.request(get())
    assert stream_outcome(conn, sid) == "200"
    conn.send(raw_frame(PING, 0, 0, b"123456"))
    assert_connection_error(conn, goaway(FRAME_SIZE_ERROR))
    assert conn.goaway.last_stream_id == sid


# ================================================================ 5.5 extending HTTP/2
def test_5_5_1_unknown_extension_frame(h2):
    conn = h2()
    conn.send(raw_frame(0xFE, 0x5, 0, b"\0" * 8))
    assert_no_error(conn)


def test_5_5_unknown_setting(h2):
    conn = h2()
    conn.send(settings((0xFF, 1), (0x7, 100)))
    assert_no_error(conn)
    assert survives(conn)


def test_5_5_2_unknown_extension_frame_inside_a_header_block(h2):
    conn = h2()
    block = conn.block(get())
    conn.send(raw_frame(HEADERS, END_STREAM, 1, block[:4]), raw_frame(0xFE, 0, 1, b"x"),
              raw_frame(CONTINUATION, END_HEADERS, 1, block[4:]))
    assert_connection_error(conn, goaway(PROTOCOL_ERROR))


# ================================================================ 6.1 DATA
def test_6_1_1_data_on_stream_0(h2):
    conn = h2()
    conn.send(data(0))
    assert_connection_error(conn, goaway(PROTOCOL_ERROR))


def test_6_1_2_data_on_half_closed_remote(h2):
    conn = h2({INITIAL_WINDOW_SIZE: 0})
    sid = conn.new_stream()
    conn.send(headers(conn, sid), data(sid))           # as h2spec: in one go
    assert_stream_error(conn, sid, {reset(STREAM_CLOSED)})


@pytest.mark.parametrize("pad", [4, 5, 200], ids=["pad-equals-rest", "pad-equals-length",
                                                  "pad-past-frame"])
def test_6_1_3_data_with_invalid_pad_length(h2, pad):
    conn, sid = open_stream(h2)
    conn.send(raw_frame(DATA, PADDED | END_STREAM, sid, bytes((pad,)) + b"test"))
    if pad == 4:       # 4 bytes of padding after the pad length: an empty body, valid
        assert answered(conn, sid) == ("200", b"/up/open")
    else:
        assert_connection_error(conn, goaway(PROTOCOL_ERROR))


def test_6_1_3_invalid_pad_length_on_a_stream_we_reset(h2):
    # A frame that breaks the frame rules is a connection error in any stream state.
    conn = h2()
    sid = conn.request(post(b"/hello"), end=False)
    conn.wait(lambda: conn.streams[sid].reset is not None, WAIT_S)
    conn.send(raw_frame(DATA, PADDED | END_STREAM, sid, b"\x09test"))
    assert_connection_error(conn, goaway(PROTOCOL_ERROR))


def test_6_1_padded_data_without_pad_length(h2):
    conn, sid = open_stream(h2)
    conn.send(raw_frame(DATA, PADDED, sid, b""))
    assert_connection_error(conn, goaway(FRAME_SIZE_ERROR), goaway(PROTOCOL_ERROR))


# ================================================================ 6.2 HEADERS
def test_6_2_1_headers_without_end_headers_then_priority(h2):
    conn = h2()
    conn.send(raw_frame(HEADERS, END_STREAM, 1, conn.block(get())), priority(1, 0, 16))
    assert_connection_error(conn, goaway(PROTOCOL_ERROR))


def test_6_2_2_headers_to_another_stream_inside_a_header_block(h2):
    conn = h2()
    conn.send(raw_frame(HEADERS, END_STREAM, 1, conn.block(get())), headers(conn, 3))
    assert_connection_error(conn, goaway(PROTOCOL_ERROR))


def test_6_2_3_headers_on_stream_0(h2):
    conn = h2()
    conn.send(headers(conn, 0))
    assert_connection_error(conn, goaway(PROTOCOL_ERROR))


@pytest.mark.parametrize("pad", [None, 255], ids=["pad-equals-length", "pad-past-frame"])
def test_6_2_4_headers_with_invalid_pad_length(h2, pad):
    conn = h2()
    block = conn.block(get())
    pad = len(block) + 1 if pad is None else pad
    conn.send(raw_frame(HEADERS, END_STREAM | END_HEADERS | PADDED, 1, bytes((pad,)) + block))
    assert_connection_error(conn, goaway(PROTOCOL_ERROR))


def test_6_2_headers_too_short_for_its_priority(h2):
    conn = h2()
    conn.send(raw_frame(HEADERS, END_STREAM | END_HEADERS | PRIORITY_FLAG, 1, b"\0\0\0"))
    assert_connection_error(conn, goaway(FRAME_SIZE_ERROR))


# ================================================================ 6.3 PRIORITY
def test_6_3_1_priority_on_stream_0(h2):
    conn = h2()
    conn.send(priority(0, 1, 16))
    assert_connection_error(conn, goaway(PROTOCOL_ERROR))


@pytest.mark.parametrize("length", [4, 6])
def test_6_3_2_priority_of_other_than_5_octets(h2, length):
    conn, sid = half_closed_remote(h2)
    conn.send(raw_frame(PRIORITY, 0, sid, b"\0\0\0\0\x10\0"[:length]))
    assert_stream_error(conn, sid, {reset(FRAME_SIZE_ERROR)})


# ================================================================ 6.4 RST_STREAM
def test_6_4_1_rst_stream_on_stream_0(h2):
    conn = h2()
    conn.send(rst_stream(0))
    assert_connection_error(conn, goaway(PROTOCOL_ERROR))


def test_6_4_2_rst_stream_on_idle_stream(h2):
    conn = h2()
    conn.send(rst_stream(1))
    assert_connection_error(conn, goaway(PROTOCOL_ERROR))


@pytest.mark.parametrize("length", [3, 5])
def test_6_4_3_rst_stream_of_other_than_4_octets(h2, length):
    conn, sid = open_stream(h2)
    conn.send(raw_frame(RST_STREAM, 0, sid, b"\0\0\0\x08\0"[:length]))
    assert_connection_error(conn, goaway(FRAME_SIZE_ERROR))


# ================================================================ 6.5 SETTINGS
@pytest.mark.parametrize("frame,code", [
    pytest.param(raw_frame(SETTINGS, ACK, 0, b"\0\x01\0\0\x10\0"), FRAME_SIZE_ERROR,
                 id="6.5-1-ack-with-payload"),
    pytest.param(settings((INITIAL_WINDOW_SIZE, 100), stream_id=1), PROTOCOL_ERROR,
                 id="6.5-2-on-a-stream"),
    pytest.param(raw_frame(SETTINGS, 0, 0, b"\0\x03\0\0\0"), FRAME_SIZE_ERROR,
                 id="6.5-3-length-not-a-multiple-of-6"),
    pytest.param(settings((ENABLE_PUSH, 2)), PROTOCOL_ERROR, id="6.5.2-1-enable-push-2"),
    pytest.param(settings((INITIAL_WINDOW_SIZE, 1 << 31)), FLOW_CONTROL_ERROR,
                 id="6.5.2-2-initial-window-size-2^31"),
    pytest.param(settings((INITIAL_WINDOW_SIZE, 1 << 31), (INITIAL_WINDOW_SIZE, 100)),
                 FLOW_CONTROL_ERROR, id="6.5.2-2-bad-initial-window-size-then-a-good-one"),
    pytest.param(settings((MAX_FRAME_SIZE, FRAME_LIMIT - 1)), PROTOCOL_ERROR,
                 id="6.5.2-3-max-frame-size-below-16384"),
    pytest.param(settings((MAX_FRAME_SIZE, 1 << 24)), PROTOCOL_ERROR,
                 id="6.5.2-4-max-frame-size-2^24"),
])
def test_6_5_settings_errors(h2, frame, code):
    conn = h2()
    conn.send(frame)
    assert_connection_error(conn, goaway(code))


@pytest.mark.parametrize("pairs", [
    pytest.param([(0xFF00, 7)], id="6.5.2-5-unknown-identifier"),
    pytest.param([(ENABLE_PUSH, 1)], id="enable-push-1"),
    pytest.param([(ENABLE_PUSH, 0), (MAX_CONCURRENT_STREAMS, 0)], id="no-push-no-streams"),
    pytest.param([(HEADER_TABLE_SIZE, 0)], id="header-table-size-0"),
    pytest.param([(MAX_FRAME_SIZE, (1 << 24) - 1)], id="max-frame-size-2^24-1"),
    pytest.param([(INITIAL_WINDOW_SIZE, MAX_WINDOW)], id="initial-window-size-2^31-1"),
    pytest.param([(MAX_HEADER_LIST_SIZE, 100)], id="max-header-list-size"),
])
def test_6_5_2_settings_accepted(h2, pairs):
    conn = h2()
    conn.send(settings(*pairs))
    assert_no_error(conn)
    assert survives(conn)


def test_6_5_3_1_multiple_values_the_last_one_wins(h2):
    conn = h2({INITIAL_WINDOW_SIZE: 0})
    conn.wait(lambda: any(f.type == SETTINGS for f in conn.frames), WAIT_S)
    conn.send(settings((INITIAL_WINDOW_SIZE, 100), (INITIAL_WINDOW_SIZE, 1)))
    sid = conn.request(get())
    conn.wait(lambda: data_lengths(conn, sid), WAIT_S)
    assert data_lengths(conn, sid) == [1]


def test_6_5_3_2_settings_acknowledged_once_applied(h2):
    conn = h2()
    conn.send(settings((INITIAL_WINDOW_SIZE, 1)), ping(b"afterset"))
    conn.wait(lambda: _acked(conn, b"afterset"), WAIT_S)
    acks = [i for i, f in enumerate(conn.frames) if f.type == SETTINGS and "ACK" in f.flags]
    pong = next(i for i, f in enumerate(conn.frames) if f.type == PING)
    assert len(acks) == 2 and acks[-1] < pong


# ================================================================ 6.7 PING
def test_6_7_1_ping_answered_with_its_payload(h2):
    conn = h2()
    conn.send(ping(b"\x00\xff\x01payld"))
    conn.wait(lambda: _acked(conn, b"\x00\xff\x01payld"), WAIT_S)
    assert _acked(conn, b"\x00\xff\x01payld")


def test_6_7_2_ping_ack_is_not_answered(h2):
    conn = h2()
    conn.send(ping(b"ack-sent", flags=ACK), ping(b"expected"))
    conn.wait(lambda: _acked(conn, b"expected"), WAIT_S)
    pings = [f.opaque_data for f in conn.frames if f.type == PING]
    assert pings == [b"expected"]


@pytest.mark.parametrize("frame,code", [
    pytest.param(ping(stream_id=1), PROTOCOL_ERROR, id="6.7-3-on-a-stream"),
    pytest.param(raw_frame(PING, 0, 0, b"123456"), FRAME_SIZE_ERROR, id="6.7-4-6-octets"),
    pytest.param(raw_frame(PING, 0, 0, b"123456789"), FRAME_SIZE_ERROR, id="6.7-4-9-octets"),
    pytest.param(raw_frame(PING, ACK, 0, b"1234567"), FRAME_SIZE_ERROR, id="6.7-4-ack-7-octets"),
])
def test_6_7_ping_errors(h2, frame, code):
    conn = h2()
    conn.send(frame)
    assert_connection_error(conn, goaway(code))


# ================================================================ 6.8 GOAWAY
@pytest.mark.parametrize("frame,code", [
    pytest.param(goaway_frame(stream_id=1), PROTOCOL_ERROR, id="6.8-1-on-a-stream"),
    pytest.param(raw_frame(GOAWAY, 0, 0, b"\0\0\0\0\0\0\0"), FRAME_SIZE_ERROR,
                 id="6.8-shorter-than-8-octets"),
])
def test_6_8_goaway_errors(h2, frame, code):
    conn = h2()
    conn.send(frame)
    assert_connection_error(conn, goaway(code))


def test_6_8_goaway_with_debug_data(h2):
    conn = h2()
    conn.send(raw_frame(GOAWAY, 0, 0, b"\0\0\0\0\0\0\0\0" + b"bye for now"))
    assert connection_outcome(conn) in ("closed without GOAWAY", goaway(NO_ERROR))


# ================================================================ 6.9 WINDOW_UPDATE
def test_6_9_1_zero_increment_on_the_connection(h2):
    conn = h2()
    conn.send(window_update(0, 0))
    assert_connection_error(conn, goaway(PROTOCOL_ERROR))


def test_6_9_2_zero_increment_on_a_stream(h2):
    conn, sid = half_closed_remote(h2)
    conn.send(window_update(sid, 0))
    assert_stream_error(conn, sid, {reset(PROTOCOL_ERROR)})


@pytest.mark.parametrize("stream", [0, 1], ids=["connection", "stream"])
@pytest.mark.parametrize("length", [3, 5])
def test_6_9_3_window_update_of_other_than_4_octets(h2, stream, length):
    conn, sid = open_stream(h2)
    conn.send(raw_frame(WINDOW_UPDATE, 0, stream and sid, b"\0\0\0\x01\0"[:length]))
    assert_connection_error(conn, goaway(FRAME_SIZE_ERROR))


def test_6_9_reserved_bit_of_the_increment_is_ignored(h2):
    conn = h2()
    conn.send(window_update(0, 1 << 31 | 1))
    assert_no_error(conn)


# ================================================================ 6.9.1 flow-control window
def test_6_9_1_1_data_within_a_window_of_1(h2):
    conn = h2({INITIAL_WINDOW_SIZE: 1})
    sid = conn.request(get())
    conn.wait(lambda: data_lengths(conn, sid), WAIT_S)
    assert_no_error(conn)
    assert data_lengths(conn, sid) == [1]
    conn.send(window_update(sid, 5))
    assert answered(conn, sid) == ("200", b"hello\n")


def test_6_9_1_2_connection_window_past_2_31_minus_1(h2):
    conn = h2()
    conn.send(window_update(0, MAX_WINDOW), window_update(0, MAX_WINDOW))
    assert_connection_error(conn, goaway(FLOW_CONTROL_ERROR))


def test_6_9_1_3_stream_window_past_2_31_minus_1(h2):
    conn, sid = open_stream(h2)
    conn.send(window_update(sid, MAX_WINDOW), window_update(sid, MAX_WINDOW))
    assert_stream_error(conn, sid, {reset(FLOW_CONTROL_ERROR)})


def test_6_9_1_connection_window_binds_whatever_the_stream_windows(h2):
    # Stream windows of 2^31-1 do not lift the connection's 65,535 bytes: the answers
    # (8,004 bytes each, the upstream echoing the target) stop there, until a
    # WINDOW_UPDATE on stream 0 lets 3 bytes more go.
    conn = h2({INITIAL_WINDOW_SIZE: MAX_WINDOW})
    ids = [conn.new_stream() for _ in range(9)]
    conn.send(*(headers(conn, s, get(b"/up/" + b"w" * 8000)) for s in ids))

    def sent() -> int:
        return sum(sum(data_lengths(conn, s)) for s in ids)

    conn.wait(lambda: sent() >= 65535, WAIT_S)
    assert_no_error(conn)
    assert sent() == 65535
    conn.send(window_update(0, 3))
    conn.wait(lambda: sent() > 65535, WAIT_S)
    assert_no_error(conn)
    assert sent() == 65538


# ================================================================ 6.9.2 initial window size
def test_6_9_2_1_initial_window_size_changed_after_headers(h2):
    conn = h2({INITIAL_WINDOW_SIZE: 0})
    sid = conn.request(get())
    conn.wait(lambda: conn.streams[sid].status, WAIT_S)
    conn.send(settings((INITIAL_WINDOW_SIZE, 1)))
    conn.wait(lambda: data_lengths(conn, sid), WAIT_S)
    assert data_lengths(conn, sid) == [1]


def test_6_9_2_2_window_made_negative_by_settings(h2):
    conn = h2({INITIAL_WINDOW_SIZE: 3})
    sid = conn.request(get())
    conn.wait(lambda: data_lengths(conn, sid), WAIT_S)
    assert data_lengths(conn, sid) == [3]
    conn.send(settings((INITIAL_WINDOW_SIZE, 2)))       # the window is now -1
    assert_no_error(conn)
    assert data_lengths(conn, sid) == [3]
    conn.send(window_update(sid, 2))                     # and now 1
    conn.wait(lambda: len(data_lengths(conn, sid)) > 1, WAIT_S)
    assert data_lengths(conn, sid) == [3, 1]


def test_6_9_2_3_initial_window_size_past_the_maximum(h2):
    conn = h2()
    conn.send(raw_frame(SETTINGS, 0, 0, b"\x00\x04\x80\x00\x00\x00"))
    assert_connection_error(conn, goaway(FLOW_CONTROL_ERROR))


def test_6_9_2_settings_pushing_an_open_window_past_the_maximum(h2):
    conn, sid = open_stream(h2)                 # our window on it: 65,535
    conn.send(window_update(sid, MAX_WINDOW - 65535 - 5))
    assert_no_error(conn)
    conn.send(settings((INITIAL_WINDOW_SIZE, 65535 + 6)))
    assert_connection_error(conn, goaway(FLOW_CONTROL_ERROR))


# ================================================================ 6.10 CONTINUATION
def test_6_10_1_several_continuations(h2):
    conn = h2()
    block = conn.block(get())
    conn.send(raw_frame(HEADERS, END_STREAM, 1, block[:2]),
              *(raw_frame(CONTINUATION, 0, 1, block[i:i + 1]) for i in range(2, len(block) - 1)),
              raw_frame(CONTINUATION, END_HEADERS, 1, block[-1:]))
    conn.next_id = 3
    assert stream_outcome(conn, 1) == "200"


@pytest.mark.parametrize("frames", [
    pytest.param(lambda c, b: [raw_frame(HEADERS, END_STREAM, 1, b[:3]),
                               raw_frame(CONTINUATION, 0, 1, b[3:5]), data(1)],
                 id="6.10-2-continuation-then-data"),
    pytest.param(lambda c, b: [raw_frame(HEADERS, END_STREAM, 1, b[:3]),
                               raw_frame(CONTINUATION, END_HEADERS, 0, b[3:])],
                 id="6.10-3-on-stream-0"),
    pytest.param(lambda c, b: [raw_frame(HEADERS, END_STREAM | END_HEADERS, 1, b),
                               raw_frame(CONTINUATION, END_HEADERS, 1, b"\x82")],
                 id="6.10-4-after-headers-with-end-headers"),
    pytest.param(lambda c, b: [raw_frame(HEADERS, END_STREAM, 1, b[:3]),
                               raw_frame(CONTINUATION, END_HEADERS, 1, b[3:]),
                               raw_frame(CONTINUATION, END_HEADERS, 1, b"\x82")],
                 id="6.10-5-after-continuation-with-end-headers"),
    pytest.param(lambda c, b: [raw_frame(HEADERS, END_HEADERS, 1, b), data(1, b"x", 0),
                               raw_frame(CONTINUATION, END_HEADERS, 1, b"\x82")],
                 id="6.10-6-after-data"),
    pytest.param(lambda c, b: [raw_frame(HEADERS, END_STREAM, 1, b[:3]),
                               raw_frame(CONTINUATION, END_HEADERS, 3, b[3:])],
                 id="6.10-on-another-stream"),
])
def test_6_10_continuation_errors(h2, frames):
    conn = h2()
    conn.send(*frames(conn, conn.block(post(b"/up/c"))))
    assert_connection_error(conn, goaway(PROTOCOL_ERROR))


# ================================================================ 7 error codes
def test_7_1_goaway_with_unknown_error_code(h2):
    conn = h2()
    conn.send(goaway_frame(0, 0xFF), ping(b"after-ga"))
    # Nothing special: the server may end the connection as after any GOAWAY, or
    # answer the PING; never with an error of its own.
    conn.wait(lambda: _acked(conn, b"after-ga") or conn.closed, WAIT_S)
    assert _acked(conn, b"after-ga") or connection_outcome(conn) in (
        "closed without GOAWAY", goaway(NO_ERROR))


def test_7_2_rst_stream_with_unknown_error_code(h2):
    conn, sid = open_stream(h2)
    conn.send(rst_stream(sid, 0xFF))
    assert_no_error(conn)
    assert survives(conn)


# ================================================================ 8.1 request/response
def test_8_1_1_second_headers_without_end_stream(h2):
    conn, sid = open_stream(h2)
    conn.send(data(sid, b"x", 0), headers(conn, sid, [(b"x-t", b"1")], flags=END_HEADERS))
    assert_stream_error(conn, sid, MALFORMED)


def test_8_1_trailers_after_headers_that_ended_nothing(h2):
    # HEADERS, then a trailer block straight away: no body at all, still a request.
    conn, sid = open_stream(h2, b"/up/no-body")
    conn.send(headers(conn, sid, [(b"x-t", b"1")]))
    assert answered(conn, sid) == ("200", b"/up/no-body")


@pytest.mark.parametrize("declared,chunks", [
    pytest.param(b"4", [(b"tes", END_STREAM)], id="8.1.1-1-less-in-one-DATA"),
    pytest.param(b"4", [(b"te", 0), (b"s", 0), (b"", END_STREAM)],
                 id="8.1.1-2-less-in-several-DATA"),
    pytest.param(b"4", [(b"tests", END_STREAM)], id="8.1.1-more-in-one-DATA"),
    pytest.param(b"4", [(b"tes", 0), (b"ts", END_STREAM)], id="8.1.1-more-in-several-DATA"),
    pytest.param(b"0", [(b"x", END_STREAM)], id="8.1.1-zero-declared"),
    pytest.param(b"4", [(b"te", 0), (None, 0)], id="8.1.1-less-then-trailers"),
])
def test_8_1_1_content_length_differs_from_the_data(h2, declared, chunks):
    conn = h2()
    sid = conn.request(post(b"/up/cl", [(b"content-length", declared)]), end=False)
    conn.send(*(data(sid, c, f) if c is not None else headers(conn, sid, [(b"x-t", b"1")])
                for c, f in chunks))
    assert_stream_error(conn, sid, MALFORMED)


def test_8_1_1_content_length_matching_the_data(h2):
    conn = h2()
    sid = conn.request(post(b"/up/cl-ok", [(b"content-length", b"4")]), end=False)
    conn.send(data(sid, b"te", 0), raw_frame(DATA, PADDED, sid, b"\x03st\0\0\0"),
              data(sid, b"", END_STREAM))
    assert answered(conn, sid) == ("200", b"/up/cl-ok")


def test_8_1_1_content_length_without_any_data(h2):
    conn = h2()
    sid = conn.request(get() + [(b"content-length", b"4")])
    assert_stream_error(conn, sid, MALFORMED)


# ================================================================ 8.2 fields
@pytest.mark.parametrize("extra", [
    pytest.param([(b"X-Test", b"a")], id="8.2-1-uppercase-name"),
    pytest.param([(b"x-TEST", b"a")], id="8.2-uppercase-letter-inside"),
    pytest.param([(b"x-a", b"a\x00b")], id="8.2.1-nul-in-value"),
    pytest.param([(b"x-a", b"a\rb")], id="8.2.1-cr-in-value"),
    pytest.param([(b"x-a", b"a\nb")], id="8.2.1-lf-in-value"),
    pytest.param([(b"x-a", b" a")], id="8.2.1-leading-space"),
    pytest.param([(b"x-a", b"a\t")], id="8.2.1-trailing-tab"),
    pytest.param([(b"x a", b"a")], id="8.2.1-space-in-name"),
    pytest.param([(b"x:a", b"a")], id="8.2.1-colon-in-name"),
    pytest.param([(b"", b"a")], id="8.2.1-empty-name"),
    pytest.param([(b"connection", b"keep-alive")], id="8.2.2-1-connection"),
    pytest.param([(b"keep-alive", b"timeout=5")], id="8.2.2-keep-alive"),
    pytest.param([(b"proxy-connection", b"keep-alive")], id="8.2.2-proxy-connection"),
    pytest.param([(b"transfer-encoding", b"chunked")], id="8.2.2-transfer-encoding"),
    pytest.param([(b"upgrade", b"h2c")], id="8.2.2-upgrade"),
    pytest.param([(b"te", b"trailers, deflate")], id="8.2.2-2-te-not-trailers"),
    pytest.param([(b"te", b"gzip")], id="8.2.2-te-gzip"),
])
def test_8_2_malformed_fields(h2, extra):
    conn = h2()
    sid = conn.request(get() + extra)
    assert_stream_error(conn, sid, MALFORMED)


@pytest.mark.parametrize("extra", [
    pytest.param([(b"te", b"trailers")], id="8.2.2-te-trailers"),
    pytest.param([(b"x-empty", b"")], id="8.2.1-empty-value"),
    pytest.param([(b"x-inner", b"a b\tc")], id="8.2.1-inner-whitespace"),
    pytest.param([(b"cookie", b"a=1"), (b"cookie", b"b=2")], id="8.2.3-split-cookie"),
    pytest.param([(b"host", b"localhost")], id="8.3.1-host-same-as-authority"),
])
def test_8_2_fields_allowed(h2, extra):
    conn = h2()
    sid = conn.request(get() + extra)
    assert stream_outcome(conn, sid) == "200"


# ================================================================ 8.3 pseudo-fields
GET = dict(get())


def request(*names: bytes, extra=(), **values: bytes) -> list:
    """Pseudo-fields named (in order, from the GET's values or `values`) then `extra`."""
    fields = [(n, values.get(n[1:].decode(), GET.get(n, b""))) for n in names]
    return fields + list(extra)


M, S, P, A = b":method", b":scheme", b":path", b":authority"


@pytest.mark.parametrize("fields", [
    pytest.param(request(M, S, P, A, b":foo"), id="8.3-1-unknown-pseudo-field"),
    pytest.param(request(M, S, P, A, b":status", status=b"200"),
                 id="8.3-2-response-pseudo-field-in-a-request"),
    pytest.param(request(M, S, A, extra=[(b"x-a", b"1"), (P, b"/hello")]),
                 id="8.3-4-pseudo-field-after-regular"),
    pytest.param(request(M, S, P, A, path=b""), id="8.3.1-1-empty-path"),
    pytest.param(request(S, P, A), id="8.3.1-2-no-method"),
    pytest.param(request(M, P, A), id="8.3.1-3-no-scheme"),
    pytest.param(request(M, S, A), id="8.3.1-4-no-path"),
    pytest.param(request(M, M, S, P, A), id="8.3.1-5-duplicated-method"),
    pytest.param(request(M, S, S, P, A), id="8.3.1-6-duplicated-scheme"),
    pytest.param(request(M, S, P, P, A), id="8.3.1-7-duplicated-path"),
    pytest.param(request(M, S, P, A, A), id="8.3.1-duplicated-authority"),
    pytest.param(request(M, S, P, A, path=b"hello"), id="8.3.1-relative-path"),
    pytest.param(request(M, S, P, A, extra=[(b"host", b"other.test")]),
                 id="8.3.1-host-differs-from-authority"),
])
def test_8_3_malformed_pseudo_fields(h2, fields):
    conn = h2()
    sid = conn.request(fields)
    assert_stream_error(conn, sid, MALFORMED)


def test_8_3_3_pseudo_field_in_trailers(h2):
    conn, sid = open_stream(h2)
    conn.send(data(sid, b"x", 0), headers(conn, sid, [(b":method", b"GET"), (b"x-t", b"1")]))
    assert_stream_error(conn, sid, MALFORMED)


def test_8_3_1_authority_from_host(h2):
    conn = h2()
    sid = conn.request(request(M, S, P, extra=[(b"host", b"localhost")]))
    assert stream_outcome(conn, sid) == "200"


# ================================================================ 8.4 server push
def test_8_4_push_promise_from_a_client(h2):
    conn, sid = open_stream(h2)
    conn.send(raw_frame(PUSH_PROMISE, END_HEADERS, sid, (2).to_bytes(4, "big") +
                        conn.block(get())))
    assert_connection_error(conn, goaway(PROTOCOL_ERROR))


# ================================================================ HPACK (RFC 7541)
def _bad_blocks():
    base = static_request()
    yield "hpack-2.3.3-index-past-both-tables", base + hp_int(70, 7, 0x80)
    yield "hpack-2.3.3-index-past-the-dynamic-table", \
        hp_int(4, 6, 0x40) + hp_str(b"/hello") + b"\x82\x87" + literal(1, b"x") + b"\xbf"
    yield "hpack-2.3.3-name-index-past-both-tables", base + hp_int(99, 6, 0x40) + hp_str(b"v")
    yield "hpack-6.1-index-0", base + b"\x80"
    yield "hpack-4.2-table-size-update-past-the-maximum", hp_int(4097, 5, 0x20) + base
    yield "hpack-4.2-table-size-update-at-the-end", base + b"\x21"
    yield "hpack-6.3-table-size-update-after-a-field", b"\x82\x20" + base[1:]
    # x-test: test, with the value Huffman-coded three wrong ways (as h2spec's 5.2).
    yield "hpack-5.2-1-padding-longer-than-7-bits", \
        base + b"\x00\x85\xf2\xb2\x4a\x84\xff\x84\x49\x50\x9f\xff"
    yield "hpack-5.2-2-padding-not-all-ones", base + b"\x00\x85\xf2\xb2\x4a\x84\xff\x83\x49\x50\x90"
    yield "hpack-5.2-3-eos-symbol", base + b"\x00\x85\xf2\xb2\x4a\x87\xff\xff\xff\xfd\x25\x42\x7f"
    yield "hpack-5.2-string-longer-than-the-block", base + b"\x00\x05x-a\x10abc"
    yield "hpack-5.1-integer-past-the-block", base + b"\xff\xff\xff"


@pytest.mark.parametrize("block", [pytest.param(b, id=i) for i, b in _bad_blocks()])
def test_hpack_decoding_errors(h2, block):
    conn = h2()
    conn.send(raw_frame(HEADERS, END_STREAM | END_HEADERS, 1, block))
    assert_connection_error(conn, goaway(COMPRESSION_ERROR))


def test_hpack_decoding_error_in_a_continuation(h2):
    conn = h2()
    block = static_request() + b"\xff\x80\x01"
    conn.send(raw_frame(HEADERS, END_STREAM, 1, block[:5]),
              raw_frame(CONTINUATION, END_HEADERS, 1, block[5:]))
    assert_connection_error(conn, goaway(COMPRESSION_ERROR))


def test_hpack_dynamic_table_shared_across_streams_and_evicted(h2):
    # A table size update to 0 empties the table: the entry added before is gone.
    conn = h2()
    first = conn.new_stream()
    conn.send(raw_frame(HEADERS, END_STREAM | END_HEADERS, first, b"\x82\x87" +
                        literal(1, b"localhost") + hp_int(4, 6, 0x40) + hp_str(b"/up/dyn")))
    assert answered(conn, first) == ("200", b"/up/dyn")
    again = conn.new_stream()
    conn.send(raw_frame(HEADERS, END_STREAM | END_HEADERS, again,
                        b"\x82\x87" + literal(1, b"localhost") + b"\xbe"))
    assert answered(conn, again) == ("200", b"/up/dyn")
    emptied = conn.new_stream()
    conn.send(raw_frame(HEADERS, END_STREAM | END_HEADERS, emptied,
                        b"\x20\x3f\xe1\x1f\x82\x87" + literal(1, b"localhost") + b"\xbe"))
    assert_connection_error(conn, goaway(COMPRESSION_ERROR))


def test_hpack_stream_error_keeps_the_table(h2):
    # A block on a stream that ends in a stream error still updated the table (4.3).
    conn = h2()
    bad = conn.new_stream()
    conn.send(raw_frame(HEADERS, END_STREAM | END_HEADERS | PRIORITY_FLAG, bad,
                        bad.to_bytes(4, "big") + b"\x10\x82\x87" + literal(1, b"localhost") +
                        hp_int(4, 6, 0x40) + hp_str(b"/up/kept")))
    assert stream_outcome(conn, bad) == reset(PROTOCOL_ERROR)
    good = conn.new_stream()
    conn.send(raw_frame(HEADERS, END_STREAM | END_HEADERS, good,
                        b"\x82\x87" + literal(1, b"localhost") + b"\xbe"))
    assert answered(conn, good) == ("200", b"/up/kept")
