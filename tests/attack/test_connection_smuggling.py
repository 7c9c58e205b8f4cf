"""Request smuggling through the Connection header: real proxy, raw upstream.

A client's `Connection` names fields that are hop-by-hop (RFC 9110 7.6.1). A proxy
that obeys it for a field it frames, routes or attributes the request by, drops
that field and forwards the rest, makes the upstream read another message than
the one the proxy checked: `Connection: content-length` left the body on a pooled
upstream connection as a second request, past the access list of `/admin/`.

Every shape of the family (each such field, in three spellings, alone, in lists,
on a second Connection line) must be refused over HTTP/1.1 (400, connection
closed) and must send nothing upstream; over HTTP/2 a `connection` field is itself
malformed (RFC 9113 8.2.2), so whatever nestgate answers, nothing reaches the
upstream. The upstream (`RawUpstream`) reads each connection with one parser for
its whole life, so it sees every request nestgate's bytes make.
"""

from __future__ import annotations

import socket

import h2.exceptions
import httptools
import pytest

from h2client import H2Client
from rawupstream import RawUpstream, guarded_gateway

SMUGGLED = (b"POST /admin/delete-everything HTTP/1.1\r\nHost: localhost\r\n"
            b"X-Forwarded-For: 10.1.2.3\r\nContent-Length: 0\r\n\r\n")
MEANT = "/public/x"

# Fields the proxy frames, routes or attributes a request by; naming one in
# Connection must be refused. The X-Forwarded-* family, Forwarded and X-Real-IP are
# what the proxy sets or believes from trusted proxies only.
REFUSED_FIELDS = ("content-length", "transfer-encoding", "host", "x-forwarded-for",
                  "x-forwarded-proto", "x-forwarded-host", "forwarded", "x-real-ip")
SPELLINGS = {"lower": str.lower, "title": lambda f: "-".join(
    p.capitalize() for p in f.split("-")), "upper": str.upper}
# How the option appears: the Connection field lines that carry `f`.
PLACES = {
    "alone": lambda f: [f],
    "after-keep-alive": lambda f: ["keep-alive, " + f],
    "before-close": lambda f: [f + ", close"],
    "no-spaces": lambda f: ["Keep-Alive," + f + ",TE"],
    "empty-elements-and-tabs": lambda f: [", ,\t" + f + "\t, "],
    "second-line": lambda f: ["keep-alive", f],
}


def family():
    for field in REFUSED_FIELDS:
        for spelling, spell in SPELLINGS.items():
            for place, lines in PLACES.items():
                yield pytest.param(field, lines(spell(field)), id=f"{field}-{spelling}-{place}")


FAMILY = list(family())


@pytest.fixture(scope="module")
def upstream():
    up = RawUpstream()
    yield up
    up.stop()


@pytest.fixture(scope="module")
def gateway(request, upstream, certs, tmp_path_factory):
    """One nestgate for the module: plain HTTP/1.1 and TLS (h2) listeners, `/admin/`
    allowed only to 10.0.0.0/8, everything else forwarded to `upstream`."""
    server = guarded_gateway(request, tmp_path_factory, upstream, certs, "/admin/")
    yield server
    server.stop()


@pytest.fixture
def up(upstream, gateway):
    upstream.take()                     # nothing left over from an earlier test
    return upstream


# ------------------------------------------------------------------ clients
class _Answers:
    def __init__(self) -> None:
        self.done: list[tuple[int, bytes]] = []
        self.body = b""

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.done.append((0, self.body))
        self.body = b""


def h1_exchange(port: int, data: bytes, answers: int = 1):
    """Send `data` on a new connection: ([(status, body)] read, whether it closed)."""
    got = _Answers()
    parser = httptools.HttpResponseParser(got)
    statuses = []
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        closed = False
        while len(got.done) < answers:
            chunk = sock.recv(65536)
            if not chunk:
                closed = True
                break
            before = len(got.done)
            parser.feed_data(chunk)
            statuses += [parser.get_status_code()] * (len(got.done) - before)
        if not closed:
            sock.settimeout(0.3)        # an answered refusal closes right after it
            try:
                closed = sock.recv(1) == b""
            except socket.timeout:
                closed = False
    return [(s, body) for s, (_z, body) in zip(statuses, got.done)], closed


def attack_h1(field: str, lines: list[str]) -> bytes:
    """POST /public/x whose body is SMUGGLED, framed as a client would frame it
    (chunked when the field named is Transfer-Encoding), with these Connection lines."""
    head = [f"POST {MEANT} HTTP/1.1", "Host: localhost"]
    if field == "transfer-encoding":
        head.append("Transfer-Encoding: chunked")
        body = b"%x\r\n%b\r\n0\r\n\r\n" % (len(SMUGGLED), SMUGGLED)
    else:
        head.append(f"Content-Length: {len(SMUGGLED)}")
        body = SMUGGLED
    head += [f"Connection: {line}" for line in lines]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def h2_client(port: int, cafile: str) -> H2Client:
    client = H2Client(port, cafile)
    # The attacks send fields HTTP/2 forbids: the client's own checks are off.
    client.h2.config.validate_outbound_headers = False
    client.h2.config.normalize_outbound_headers = False
    return client


def h2_attempt(client: H2Client, lines: list[str]):
    """POST MEANT with body SMUGGLED and these `connection` fields: the status, or
    None when the stream or the connection was ended instead."""
    headers = [(b"content-length", b"%d" % len(SMUGGLED))]
    headers += [(b"connection", line.encode()) for line in lines]
    try:
        return client.request("POST", MEANT, SMUGGLED, headers)[0]
    except (ConnectionError, OSError, h2.exceptions.ProtocolError):
        return None


def outcome(answers, seen: list[dict]) -> str:
    """What became of one attack: refused (400, nothing upstream), forwarded (the
    one request meant, body intact), or smuggled (anything else reached upstream)."""
    if not seen:
        return "refused" if [s for s, _b in answers] in ([400], []) else "lost"
    if [r["target"] for r in seen] == [MEANT] and seen[0]["body"] == SMUGGLED:
        return "forwarded"
    return "smuggled"


# ------------------------------------------------------------------ the family
@pytest.mark.parametrize("field, lines", FAMILY)
def test_connection_naming_a_field_the_proxy_relies_on_is_refused_h1(gateway, up, field,
                                                                     lines):
    answers, closed = h1_exchange(gateway.port("http"), attack_h1(field, lines))
    seen = up.take()
    assert not [r for r in seen if r["target"] != MEANT], "a smuggled request reached upstream"
    assert outcome(answers, seen) == "refused"
    assert [s for s, _b in answers] == [400] and closed


@pytest.mark.parametrize("field, lines", FAMILY)
def test_connection_field_over_h2_sends_nothing_upstream(gateway, up, certs, field, lines):
    client = h2_client(gateway.port("https"), certs["ca"])
    try:
        status = h2_attempt(client, lines)
    finally:
        client.close()
    assert status in (None, 400)
    assert up.take() == []


@pytest.mark.parametrize("option", [":authority", "content length", "x-a;b", "host:"])
def test_connection_option_that_is_not_a_token_is_refused(gateway, up, option):
    # RFC 9110 7.6.1: a connection option is a token. A pseudo-header's name, or two
    # words a lenient reader may join, is malformed, not an option to obey or ignore.
    data = (f"GET {MEANT} HTTP/1.1\r\nHost: localhost\r\nConnection: keep-alive, {option}"
            "\r\n\r\n").encode()
    answers, closed = h1_exchange(gateway.port("http"), data)
    assert [s for s, _b in answers] == [400] and closed
    assert up.take() == []


def test_refusal_keeps_the_pooled_upstream_connection(gateway, up):
    # A request without a body is built on a pooled connection; refused, it must hand
    # that connection back unused rather than leak it or send it half a request.
    port = gateway.port("http")
    plain = f"GET {MEANT} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode()
    assert h1_exchange(port, plain)[0] == [(200, MEANT.encode())]
    before = up.connections
    refused = f"GET {MEANT} HTTP/1.1\r\nHost: localhost\r\nConnection: Host\r\n\r\n"
    answers, closed = h1_exchange(port, refused.encode())
    assert [s for s, _b in answers] == [400] and closed
    assert h1_exchange(port, plain)[0] == [(200, MEANT.encode())]
    assert up.connections == before
    assert [r["target"] for r in up.take()] == [MEANT, MEANT]


def test_smuggled_request_never_answers_the_next_client(gateway, up):
    # The report's impact: on a pooled upstream connection, the next clients got the
    # smuggled request's answer, or had their own request swallowed as its body.
    port = gateway.port("http")
    for attempt in range(6):
        h1_exchange(port, attack_h1("content-length", ["content-length"]))
        victim = f"/public/victim-{attempt}".encode()
        answers, _closed = h1_exchange(
            port, b"GET " + victim + b" HTTP/1.1\r\nHost: localhost\r\n"
                  b"Cookie: session=victim\r\n\r\n")
        assert answers == [(200, victim)]
    seen = up.take()
    assert [r["target"] for r in seen] == [f"/public/victim-{i}" for i in range(6)]


def test_admin_route_refuses_loopback(gateway, up):
    # The shape the smuggled request hides: asked openly, it never gets through.
    answers, _closed = h1_exchange(gateway.port("http"), SMUGGLED)
    assert [s for s, _b in answers] == [403]
    assert up.take() == []


# ------------------------------------------------------------------ what keeps working
def _one(up) -> dict:
    seen = up.take()
    assert len(seen) == 1, seen
    return seen[0]


@pytest.mark.parametrize("lines, extra, absent", [
    pytest.param(["close"], "", ("connection",), id="close"),
    pytest.param(["keep-alive"], "", ("connection",), id="keep-alive"),
    # Forwarded as an upgrade (nestgate writes `connection: upgrade` itself).
    pytest.param(["keep-alive, Upgrade"], "Upgrade: websocket\r\n", (), id="keep-alive-upgrade"),
    pytest.param(["TE"], "TE: trailers\r\n", ("connection", "te"), id="te-trailers"),
    pytest.param(["keep-alive", "X-Trace"], "X-Trace: 1\r\n", ("connection", "x-trace"),
                 id="custom-hop-by-hop-on-second-line"),
    # Only the sender's own credentials go: nothing the proxy decided on changes.
    pytest.param(["Cookie"], "Cookie: a=b\r\n", ("connection", "cookie"), id="cookie"),
])
def test_ordinary_connection_options_still_work(gateway, up, lines, extra, absent):
    data = (f"GET {MEANT} HTTP/1.1\r\nHost: localhost\r\n{extra}"
            + "".join(f"Connection: {line}\r\n" for line in lines) + "\r\n").encode()
    answers, _closed = h1_exchange(gateway.port("http"), data)
    assert answers == [(200, MEANT.encode())]
    names = {name for name, _v in _one(up)["headers"]}
    assert not names & set(absent)


@pytest.mark.parametrize("framing, body", [
    pytest.param(b"Content-Length: 010\r\n", b"0123456789", id="length-leading-zero"),
    pytest.param(b"Content-Length: 5 \r\n", b"abcde", id="length-trailing-space"),
    pytest.param(b"Transfer-Encoding: chunked\r\n", b"3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n",
                 id="chunked"),
])
def test_upstream_framing_is_nestgates_own(gateway, up, framing, body):
    data = b"POST " + MEANT.encode() + b" HTTP/1.1\r\nHost: localhost\r\n" + framing \
        + b"Connection: keep-alive\r\n\r\n" + body
    answers, _closed = h1_exchange(gateway.port("http"), data)
    assert answers == [(200, MEANT.encode())]
    seen = _one(up)
    framing_lines = [(n, v) for n, v in seen["headers"]
                     if n in ("content-length", "transfer-encoding")]
    if b"chunked" in framing:
        assert framing_lines == [("transfer-encoding", "chunked")]
        assert seen["body"] == b"abcdefg"
    else:
        assert framing_lines == [("content-length", str(len(body)))]
        assert seen["body"] == body


@pytest.mark.parametrize("with_length", [True, False], ids=["content-length", "no-length"])
def test_upstream_framing_over_h2(gateway, up, certs, with_length):
    client = h2_client(gateway.port("https"), certs["ca"])
    try:
        headers = [(b"content-length", b"%d" % len(SMUGGLED))] if with_length else []
        status, _h, body = client.request("POST", MEANT, SMUGGLED, headers)
    finally:
        client.close()
    assert (status, body) == (200, MEANT.encode())
    seen = _one(up)
    assert seen["body"] == SMUGGLED
    framing_lines = [(n, v) for n, v in seen["headers"]
                     if n in ("content-length", "transfer-encoding")]
    assert framing_lines == ([("content-length", str(len(SMUGGLED)))] if with_length
                             else [("transfer-encoding", "chunked")])
