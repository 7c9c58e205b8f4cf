"""An HTTP/2 or HTTP/3 request's :method and :scheme against what HTTP/1.1 allows:
real nestgate (h2c, TLS h2 and HTTP/3 listeners) proxying to a strict upstream.

HTTP/1.1 reaches nestgate through llhttp, which takes a fixed set of methods and
refuses any other (`get`, `FOO`) with 400. Over HTTP/2 and HTTP/3 a method only had to
be a token: `get` went upstream as it came, and a strict upstream (here httptools, as
llhttp) refused it, a 502 for the client and a broken request in the upstream's log.
Each such method is now the same 400 on every protocol, nothing forwarded, the
connection and its other streams going on; every method HTTP/1.1 takes still goes
upstream from each protocol.

A :scheme that is not a URI scheme (RFC 3986 3.1) or not one nestgate serves is a 400
too. One it serves need not be the connection's (a proxy ending TLS speaks h2c and says
https), and it never tells the upstream anything: X-Forwarded-Proto is the connection's.
"""

from __future__ import annotations

import asyncio
import socket

import httptools
import pytest

import h3client
from conftest import Server
from h2raw import RawH2
from nestgate.wire.fieldhead import METHODS
from rawupstream import RawUpstream, proxy_toml, refused_corpus_stays_bounded

PROTOCOL_ERROR = 0x1
STREAM_PROTOCOLS = ("h2c", "h2", "h3")
# Every method name llhttp knows (its METHODS: HTTP's, RTSP's and ICE's), and a few it
# does not: which of them HTTP/1.1 takes is asked of httptools itself.
LLHTTP_NAMES = (
    "DELETE GET HEAD POST PUT CONNECT OPTIONS TRACE COPY LOCK MKCOL MOVE PROPFIND "
    "PROPPATCH SEARCH UNLOCK BIND REBIND UNBIND ACL REPORT MKACTIVITY CHECKOUT MERGE "
    "M-SEARCH NOTIFY SUBSCRIBE UNSUBSCRIBE PATCH PURGE MKCALENDAR LINK UNLINK SOURCE PRI "
    "DESCRIBE ANNOUNCE SETUP PLAY PAUSE TEARDOWN GET_PARAMETER SET_PARAMETER REDIRECT "
    "RECORD FLUSH QUERY").split()
REFUSED_METHODS = ["get", "Get", "post", "FOO", "GET_PARAMETER", "DESCRIBE", "PRI", "CONNECT",
                   "G-E-T", "get2"]
BAD_SCHEMES = ["1http", "ht tp", "http:", "https://x", "", "+http", "ftp", "wss", "h2c",
               "httpss"]
# The worker's memory after the refused corpus, several times over, may grow by this.
RSS_GROWTH_KIB = 8 * 1024


class _Probe:
    complete = False

    def on_message_complete(self) -> None:
        self.complete = True


def http1_takes(method: str) -> bool:
    """Whether httptools (llhttp, as nestgate's HTTP/1.1 reads requests) parses a request
    with `method` whole."""
    probe = _Probe()
    try:
        httptools.HttpRequestParser(probe).feed_data(
            method.encode() + b" / HTTP/1.1\r\nhost: a\r\n\r\n")
    except httptools.HttpParserUpgrade:
        return True                          # CONNECT: parsed, the rest is a tunnel
    except httptools.HttpParserError:
        return False
    return probe.complete


TAKEN = [m for m in LLHTTP_NAMES if http1_takes(m) and m != "CONNECT"]
assert "GET" in TAKEN and "QUERY" in TAKEN and "DESCRIBE" not in TAKEN
assert not any(http1_takes(m) for m in REFUSED_METHODS if m != "CONNECT")


def test_the_methods_streams_take_are_the_ones_http1_takes():
    # Every llhttp method name but CONNECT that HTTP/1.1 parses, and no other name.
    assert METHODS == {m.encode() for m in TAKEN}


@pytest.fixture(scope="module")
def upstream():
    up = RawUpstream()
    yield up
    up.stop()


@pytest.fixture(scope="module")
def gateway(upstream, certs, tmp_path_factory):
    """One nestgate forwarding everything to `upstream`: a plain listener taking h2c by
    prior knowledge, and a TLS one with h2 (ALPN) and HTTP/3 on the same port."""
    path = tmp_path_factory.mktemp("gateway") / "nestgate.toml"
    path.write_text(proxy_toml(upstream.url, listeners=f"""
        http2_cleartext = true

        [[listen]]
        address = "127.0.0.1:0"
        http3 = true
        [[listen.certificate]]
        cert = "{certs["local"][0]}"
        key = "{certs["local"][1]}"
        """))
    server = Server(path)
    yield server
    server.stop()


@pytest.fixture
def up(upstream, gateway):
    upstream.take()                     # nothing left over from an earlier test
    return upstream


def fields(method: bytes = b"GET", scheme: bytes = b"https", path: bytes = b"/x"):
    return [(b":method", method), (b":scheme", scheme), (b":path", path),
            (b":authority", b"localhost")]


def exchange(gateway, certs, protocol: str, first, then):
    """Two requests on one connection of `protocol`, `first` then `then` (each a
    (method, scheme, path)): their (status, reset code, body) and whether the server
    ended the connection."""
    if protocol == "h3":
        replies = asyncio.run(h3client.requests(
            gateway.port("https"), certs["ca"],
            [(m.decode(), p.decode(), (), None) for m, _s, p in (first, then)],
            schemes=[s.decode() for _m, s, _p in (first, then)]))
        return [(r.status, r.reset, r.body) for r in replies], False
    conn = RawH2(gateway.port("https"), certs["ca"], timeout=5) if protocol == "h2" \
        else RawH2(gateway.port("http"), None, timeout=5)
    try:
        one = conn.request(fields(*first))
        answers = conn.answers([one], timeout=5)
        two = conn.request(fields(*then))
        answers.update(conn.answers([two], timeout=5))
    finally:
        conn.close()
    return [(answers[s].status, answers[s].reset, bytes(answers[s].data))
            for s in (one, two)], conn.goaway is not None


def http1(gateway, method: bytes, path: bytes = b"/x") -> tuple[int, bytes]:
    """(status, body) of one HTTP/1.1 request with `method` on the plain listener."""
    with socket.create_connection(("127.0.0.1", gateway.port("http")), timeout=5) as sock:
        sock.sendall(method + b" " + path + b" HTTP/1.1\r\nhost: localhost\r\n"
                     b"connection: close\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


@pytest.mark.parametrize("protocol", STREAM_PROTOCOLS)
@pytest.mark.parametrize("method", REFUSED_METHODS)
def test_a_method_http1_refuses_is_a_400_on_every_protocol(gateway, up, certs, protocol,
                                                         method):
    after = b"/after-" + method.encode()
    answers, ended = exchange(gateway, certs, protocol, (method.encode(), b"https", b"/x"),
                              (b"GET", b"https", after))
    assert answers[0][:2] == (400, None), answers[0]
    assert answers[1] == (200, None, after), "the connection was left broken"
    assert not ended
    assert [r["target"] for r in up.take()] == [after.decode()], "it reached the upstream"
    if method != "CONNECT":              # (HTTP/1.1's CONNECT is authority-form)
        assert http1(gateway, method.encode())[0] == 400      # the same answer as HTTP/1.1
        assert up.take() == []


@pytest.mark.parametrize("protocol", ("http/1.1",) + STREAM_PROTOCOLS)
def test_every_method_http1_takes_goes_upstream_from_every_protocol(gateway, up, certs,
                                                                    protocol):
    seen = []
    for method in TAKEN:
        path = b"/m/" + method.encode()
        if protocol == "http/1.1":
            status, _body = http1(gateway, method.encode(), path)
        else:
            status = exchange(gateway, certs, protocol, (method.encode(), b"https", path),
                              (b"GET", b"https", b"/next"))[0][0][0]
        seen.append((method, status))
    assert [m for m, status in seen if status != 200] == []
    got = [(r["target"], r["method"]) for r in up.take() if r["target"] != "/next"]
    assert got == [(f"/m/{m}", m) for m in TAKEN]


@pytest.mark.parametrize("protocol", STREAM_PROTOCOLS)
@pytest.mark.parametrize("scheme", BAD_SCHEMES)
def test_a_scheme_nestgate_does_not_serve_is_a_400(gateway, up, certs, protocol, scheme):
    answers, ended = exchange(gateway, certs, protocol, (b"GET", scheme.encode(), b"/x"),
                              (b"GET", b"https", b"/after"))
    assert answers[0][:2] == (400, None), answers[0]
    assert answers[1] == (200, None, b"/after")
    assert not ended
    assert [r["target"] for r in up.take()] == ["/after"]


@pytest.mark.parametrize("protocol,said,expected", [
    ("h2c", b"https", "http"), ("h2c", b"HTTPS", "http"), ("h2c", b"http", "http"),
    ("h2", b"http", "https"), ("h2", b"https", "https"), ("h2", b"Http", "https"),
    ("h3", b"http", "https"), ("h3", b"https", "https"),
])
def test_the_upstream_hears_the_connections_scheme_not_the_clients(gateway, up, certs,
                                                                   protocol, said, expected):
    answers, _ended = exchange(gateway, certs, protocol, (b"GET", said, b"/s"),
                               (b"GET", said, b"/s2"))
    assert [a[0] for a in answers] == [200, 200]
    seen = up.take()
    assert sorted(r["target"] for r in seen) == ["/s", "/s2"]   # (HTTP/3 sends both at once)
    for request in seen:
        protos = [v for n, v in request["headers"] if n == "x-forwarded-proto"]
        assert protos == [expected]


def test_the_refused_corpus_leaves_the_worker_memory_bounded(gateway, up, certs):
    def corpus() -> None:
        for protocol in ("h2c", "h2"):
            for method in REFUSED_METHODS:
                answers, _ = exchange(gateway, certs, protocol,
                                      (method.encode(), b"https", b"/x"),
                                      (b"GET", b"ftp", b"/y"))
                assert [a[0] for a in answers] == [400, 400]

    refused_corpus_stays_bounded(gateway, up, corpus, RSS_GROWTH_KIB)
