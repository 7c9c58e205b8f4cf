"""An upstream's answer that llhttp reads but no client may be given as it is.

A status under 100 (`000`, `099`) is no status at all (RFC 9110 15), but llhttp reads
it as a final response with a body; nestgate took every status under 200 for an
interim one it does not forward, so the body went to the client with no head before
it: raw bytes an HTTP/1.1 client read as the answer (an upstream could write any head
it liked past nestgate's, or answers to requests still to come on the connection),
DATA before HEADERS to an HTTP/2 client. Now it is a 502.

A 204 with a Content-Length (RFC 9110 8.6: a server must not send one) went out with
it; llhttp reads no body after a 204, so a client that believed the length waited
for bytes that never came, or took the next answer for them, and HTTP/2 clients
reset the stream. The length is now dropped, as nginx does.

A Transfer-Encoding other than `chunked` alone (`gzip`, `chunked, gzip`, `xchunked`,
`identity`) makes llhttp read the body to the connection's end: it went to the client
re-chunked and still coded, and never ended while the upstream held the connection.
Now it is a 502, as nginx answers ("upstream sent unknown Transfer-Encoding").

A malformed chunk in the read that carried the head (a chunk size that is not hex, a
chunk longer than its size said) went out as the head and then a cut connection (an
HTTP/2 stream reset), though no byte of the answer had reached the client: now it is a
502, as nginx answers ("upstream sent invalid chunked response").

Each time the upstream connection is not reused, and the next client gets its own answer.
"""

from __future__ import annotations

import socket

import pytest

from conftest import read_all
from h2client import H2Client
from rawupstream import RawUpstream, cleartext_gateway

NEXT = b"HTTP/1.1 200 OK\r\ncontent-length: 8\r\n\r\npoisoned"
ANSWERS = {
    "/status-000": b"HTTP/1.1 000 X\r\ncontent-length: %d\r\n\r\n%b" % (len(NEXT), NEXT),
    "/status-099": b"HTTP/1.1 099 X\r\ncontent-length: %d\r\n\r\n%b" % (len(NEXT), NEXT),
    "/no-content": b"HTTP/1.1 204 No Content\r\ncontent-length: %d\r\n\r\n%b"
                   % (len(NEXT), NEXT),
}
# Bodies llhttp refuses, whole in the read that carries the head.
BAD_CHUNKS = {"not-hex": b"zz\r\nhello\r\n0\r\n\r\n",
              "longer-than-said": b"3\r\nhello\r\n0\r\n\r\n"}
for name, body in BAD_CHUNKS.items():
    ANSWERS[f"/chunk/{name}"] = \
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n%b" % body
# Codings llhttp reads to the connection's end (the upstream here keeps it open).
CODINGS = {"gzip": b"\x1f\x8b\x08\x00", "chunked, gzip": b"4\r\n\x1f\x8b\x08\x00\r\n0\r\n\r\n",
           "xchunked": b"2\r\nok\r\n0\r\n\r\n", "identity": b"ok"}
for coding, body in CODINGS.items():
    ANSWERS[f"/coding/{coding.replace(', ', '-')}"] = \
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: %b\r\n\r\n%b" % (coding.encode(), body)


@pytest.fixture(scope="module")
def gateway(request, tmp_path_factory):
    up = RawUpstream(ANSWERS)
    server = cleartext_gateway(request, tmp_path_factory, up)
    yield server, up
    server.stop()
    up.stop()


def exchange(port: int, target: str) -> bytes:
    """What an HTTP/1.1 client is sent for `target` followed by `/after` on the same
    connection (which closes after it)."""
    with socket.create_connection(("127.0.0.1", port), timeout=3) as sock:
        sock.sendall(b"GET %b HTTP/1.1\r\nHost: a\r\n\r\n" % target.encode()
                     + b"GET /after HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        return read_all(sock)


def answers(raw: bytes) -> list[tuple[bytes, dict, bytes]]:
    """The responses in `raw`, each (status line, header dict, body), read strictly."""
    out = []
    while raw:
        head, _, raw = raw.partition(b"\r\n\r\n")
        status, *lines = head.split(b"\r\n")
        assert status.startswith(b"HTTP/1.1 "), status
        fields = dict(line.lower().split(b": ", 1) for line in lines)
        size = int(fields.get(b"content-length", b"0"))
        out.append((status, fields, raw[:size]))
        raw = raw[size:]
    return out


def is_502_and_not_reused(server, up: RawUpstream, target: str) -> None:
    """`target` is a 502 over HTTP/1.1, its upstream connection is not reused, and
    the request behind it gets its own answer."""
    first, after = answers(exchange(server.port(), target))
    assert first[0] == b"HTTP/1.1 502 Bad Gateway"
    assert after[2] == b"/after"
    taken = up.take()
    assert [r["target"] for r in taken] == [target, "/after"]
    assert taken[0]["conn"] != taken[1]["conn"]


@pytest.mark.parametrize("target", ["/status-000", "/status-099"])
def test_a_status_under_100_is_502(gateway, target):
    is_502_and_not_reused(*gateway, target)


@pytest.mark.parametrize("target", ["/status-000", "/status-099"])
def test_a_status_under_100_is_502_over_http2(gateway, target):
    server, up = gateway
    client = H2Client(server.port(), None)
    try:
        status, _headers, _body = client.request("GET", target)
        assert status == 502
        assert client.request("GET", "/after")[2] == b"/after"
    finally:
        client.close()
    taken = up.take()
    assert taken[0]["conn"] != taken[1]["conn"]


@pytest.mark.parametrize("target", [f"/coding/{c.replace(', ', '-')}" for c in CODINGS])
def test_a_transfer_coding_other_than_chunked_is_502(gateway, target):
    # The answer was forwarded with its body re-chunked to the client, still coded
    # (gzip bytes without a Content-Encoding), and never ended while the upstream kept
    # the connection open: the client waited, then got a cut connection.
    is_502_and_not_reused(*gateway, target)


def test_a_204_goes_without_its_length(gateway):
    server, up = gateway
    first, after = answers(exchange(server.port(), "/no-content"))
    assert first[0] == b"HTTP/1.1 204 No Content"
    assert b"content-length" not in first[1] and b"transfer-encoding" not in first[1]
    assert after[2] == b"/after"
    taken = up.take()
    assert taken[0]["conn"] != taken[1]["conn"]     # its bytes after the 204: not reused


def test_a_204_goes_without_its_length_over_http2(gateway):
    server, up = gateway
    client = H2Client(server.port(), None)
    try:
        status, headers, body = client.request("GET", "/no-content")
        assert (status, body) == (204, b"")
        assert "content-length" not in headers
        assert client.request("GET", "/after")[2] == b"/after"
    finally:
        client.close()
    taken = up.take()
    assert taken[0]["conn"] != taken[1]["conn"]     # its bytes after the 204: not reused


@pytest.mark.parametrize("target", [f"/chunk/{name}" for name in BAD_CHUNKS])
def test_a_malformed_chunk_before_anything_went_out_is_502(gateway, target):
    # Before: the head went out and the connection was cut (an empty read here).
    is_502_and_not_reused(*gateway, target)


@pytest.mark.parametrize("target", [f"/chunk/{name}" for name in BAD_CHUNKS])
def test_a_malformed_chunk_before_anything_went_out_is_502_over_http2(gateway, target):
    # Before: the stream was reset (INTERNAL_ERROR) after its HEADERS.
    server, up = gateway
    client = H2Client(server.port(), None)
    try:
        assert client.request("GET", target)[0] == 502
        assert client.request("GET", "/after")[2] == b"/after"
    finally:
        client.close()
    taken = up.take()
    assert [r["target"] for r in taken] == [target, "/after"]
    assert taken[0]["conn"] != taken[1]["conn"]
