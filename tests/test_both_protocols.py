"""One behaviour set, asked over HTTP/1.1, HTTP/2 over TLS, HTTP/2 in clear (h2c) and
HTTP/3 over QUIC:
every handler and access decision (allow and deny lists, sign-in with and without a
session, the local exemption, rate limits) must answer the same status, body and
content headers whichever protocol carries the request, and log the same record. A difference between the protocols
(as when rendered note pages escaped a site's access list over one of them) shows up
as a failing case here, named by its request.
"""

from __future__ import annotations

import http.client
import http.server
import json
import re
import socket
import ssl
import threading
import time

import h2.config
import h2.connection
import h2.events
import pytest

from nestgate.handlers.auth.passwords import hash_password

import h3client
from conftest import Browser, poll

HOME = b"<!doctype html><title>Files</title><p>static home</p>\n"
TEXT = b"0123456789abcdef" * 64                      # 1 KiB
NOTE = "---\ntitle: Plans\ndate: 2026-05-01\n---\n\nthe plans, in **bold**\n"
OUTSIDER = "203.0.113.9"
PROTOCOLS = ("http/1.1", "h2", "h2c", "h3")
OTHERS = PROTOCOLS[1:]                       # each compared with HTTP/1.1
LOGGED_AS = {"http/1.1": "HTTP/1.1", "h2": "HTTP/2", "h2c": "HTTP/2", "h3": "HTTP/3"}
# What differs between two asks by nature: a fresh CSRF token, the health's uptime (a
# second may pass between the protocols' requests on a loaded machine).
_VARYING = re.compile(rb'name="csrf" value="[^"]*"|"uptime_s": ?[0-9.]+')
# The headers that must agree; others (date, connection, framing) may differ.
COMPARED = ("content-type", "content-length", "content-range", "location", "etag",
            "last-modified", "cache-control", "vary", "www-authenticate", "allow",
            "retry-after", "accept-ranges", "content-encoding")


class _Upstream(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _answer(self, status: int, body: bytes, ctype: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Upstream", "yes")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self):
        self._answer(200, f"upstream saw {self.path}".encode())

    do_HEAD = do_GET

    def do_POST(self):
        # An HTTP/2 request without content-length reaches the upstream chunked.
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = b""
            while size := int(self.rfile.readline().split(b";")[0], 16):
                body += self.rfile.read(size)
                self.rfile.readline()
            self.rfile.readline()
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._answer(201, body[::-1], "application/octet-stream")

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server(tmp_path_factory, ca):
    """One server for the module: the same site on a plain listener with h2c and on a
    TLS listener with h2, a static root, notes with an API token, a proxied service,
    a protected prefix behind sign-in and an allow-listed one."""
    from conftest import Server
    folder = tmp_path_factory.mktemp("both")
    (folder / "www").mkdir()
    (folder / "www" / "index.html").write_bytes(HOME)
    (folder / "www" / "text.txt").write_bytes(TEXT)
    (folder / "notes").mkdir()
    (folder / "notes" / "plans.md").write_text(NOTE)
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert.private_key_pem.write_to_path(str(folder / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(folder / "cert.pem"))
    ca.cert_pem.write_to_path(str(folder / "ca.pem"))
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    config = folder / "nestgate.toml"
    config.write_text(f"""
[server]
workers = 1

[limits]
max_body = "16KiB"

[client_ip]
trusted_proxies = ["127.0.0.1"]

[log]
path = "{folder / 'access.log'}"
format = "json"
flush_interval = "0.1s"

[auth]
store = "{folder / 'state.db'}"
[[auth.user]]
name = "demo"
password = "{hash_password('demo-password')}"

[[listen]]
address = "127.0.0.1:0"
http2_cleartext = true

[[listen]]
address = "127.0.0.1:0"
http3 = true
[[listen.certificate]]
cert = "{folder / 'cert.pem'}"
key = "{folder / 'key.pem'}"
names = ["localhost", "127.0.0.1"]

[[site]]
hosts = ["*"]

[site.notes]
dir = "{folder / 'notes'}"
token = "tok"

[[site.route]]
path = "/hello"
type = "return"
body = "hello\\n"

[[site.route]]
path = "/old"
type = "redirect"
to = "/hello"
status = 301

[[site.route]]
prefix = "/app/"
type = "proxy"
upstream = "http://127.0.0.1:{upstream.server_address[1]}"

[[site.route]]
prefix = "/files/"
type = "static"
root = "{folder / 'www'}"

[[site]]
hosts = ["private.test"]
protected = true

[[site.route]]
prefix = "/"
type = "proxy"
upstream = "http://127.0.0.1:{upstream.server_address[1]}"

[[site]]
hosts = ["office.test"]
allow = ["10.0.0.0/8"]
deny = ["10.9.0.0/16"]

[[site.route]]
prefix = "/"
type = "return"
body = "office only\\n"

[[site]]
hosts = ["lan.test"]
protected = true
exempt_local = true

[[site.route]]
prefix = "/"
type = "proxy"
upstream = "http://127.0.0.1:{upstream.server_address[1]}"

[[site]]
hosts = ["limited.test"]
rate_limit = {{ rate = "1/m", burst = 1 }}

[[site.route]]
prefix = "/"
type = "return"
body = "limited\\n"
""")
    started = Server(config, ())
    started.ca = str(folder / "ca.pem")
    started.log = folder / "access.log"
    yield started
    started.stop()
    upstream.shutdown()
    upstream.server_close()


def _h1(server, method, path, headers, body):
    conn = http.client.HTTPConnection("127.0.0.1", server.port("http"), timeout=10)
    try:
        conn.request(method, path, body=body or None,
                     headers={"host": "localhost", **dict(headers)})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def _h2(sock, method, path, headers, body, scheme):
    client = h2.connection.H2Connection(h2.config.H2Configuration(
        client_side=True, header_encoding=None))
    client.initiate_connection()
    fields = dict(headers)
    authority = fields.pop("host", "localhost").encode()
    client.send_headers(1, [(b":method", method.encode()), (b":path", path.encode()),
                            (b":scheme", scheme), (b":authority", authority),
                            *[(n.encode(), v.encode()) for n, v in fields.items()]],
                        end_stream=not body)
    for start in range(0, len(body), 16384):           # the default frame size
        client.send_data(1, body[start:start + 16384], end_stream=start + 16384 >= len(body))
    sock.sendall(client.data_to_send())
    status, answer, data = 0, {}, b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before the answer ended")
        for event in client.receive_data(chunk):
            if isinstance(event, h2.events.ResponseReceived):
                answer = {k.decode(): v.decode() for k, v in event.headers}
                status = int(answer.pop(":status"))
            elif isinstance(event, h2.events.DataReceived):
                data += event.data
                client.acknowledge_received_data(event.flow_controlled_length, 1)
            elif isinstance(event, h2.events.StreamEnded):
                return status, answer, data
            elif isinstance(event, h2.events.StreamReset):
                raise ConnectionError(f"stream reset ({event.error_code})")
        sock.sendall(client.data_to_send())


def ask(server, protocol, method, path, headers=(), body=b""):
    """(status, headers, body) of one request over `protocol` on a new connection."""
    if protocol == "http/1.1":
        return _h1(server, method, path, headers, body)
    if protocol == "h3":
        fields = dict(headers)
        authority = fields.pop("host", "localhost")
        reply = h3client.fetch(server.port("https"), server.ca, path, method,
                               tuple(fields.items()), body or None, authority=authority)
        return reply.status, reply.headers, reply.body
    if protocol == "h2c":
        with socket.create_connection(("127.0.0.1", server.port("http")), timeout=10) as s:
            return _h2(s, method, path, headers, body, b"http")
    ctx = ssl.create_default_context(cafile=server.ca)
    ctx.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", server.port("https")), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
            assert tls.selected_alpn_protocol() == "h2"
            return _h2(tls, method, path, headers, body, b"https")


NOTE_JSON = json.dumps({"title": "Fresh", "body": "written over the API"})
CASES = {
    "health": ("GET", "/api/v1/health", (), b""),
    "return": ("GET", "/hello", (), b""),
    "return HEAD": ("HEAD", "/hello", (), b""),
    "redirect": ("GET", "/old", (), b""),
    "static file": ("GET", "/files/text.txt", (), b""),
    "static index": ("GET", "/files/", (), b""),
    "static range": ("GET", "/files/text.txt", (("range", "bytes=10-19"),), b""),
    "static range past the end": ("GET", "/files/text.txt", (("range", "bytes=5000-"),), b""),
    "static not modified": ("GET", "/files/text.txt", (("if-modified-since",
                                                        "Fri, 01 Jan 2100 00:00:00 GMT"),), b""),
    "static missing": ("GET", "/files/none.txt", (), b""),
    "static gzip asked": ("GET", "/files/text.txt", (("accept-encoding", "gzip"),), b""),
    "static escape": ("GET", "/files/..%2f..%2fetc/passwd", (), b""),
    "static POST": ("POST", "/files/text.txt", (("content-length", "2"),), b"hi"),
    "note page": ("GET", "/notes/plans", (), b""),
    "notes list": ("GET", "/notes", (), b""),
    "note missing": ("GET", "/notes/none", (), b""),
    "notes API read": ("GET", "/api/v1/notes/plans", (("authorization", "Bearer tok"),), b""),
    "notes API no token": ("GET", "/api/v1/notes/plans", (), b""),
    "notes API bad JSON": ("PUT", "/api/v1/notes/broken",
                           (("authorization", "Bearer tok"), ("content-type", "application/json")),
                           b"{not json"),
    "proxy GET": ("GET", "/app/page?q=1", (), b""),
    "proxy POST": ("POST", "/app/echo", (("content-type", "application/octet-stream"),
                                         ("content-length", "10240")), bytes(range(256)) * 40),
    "proxy POST without length": ("POST", "/app/echo", (), bytes(range(256)) * 40),
    "protected, no session": ("GET", "/x", (("host", "private.test"),
                                            ("accept", "text/html")), b""),
    "protected, JSON client": ("GET", "/x", (("host", "private.test"),
                                             ("accept", "application/json")), b""),
    "protected, bad session": ("GET", "/x", (("host", "private.test"),
                                             ("cookie", "nestgate_session=forged")), b""),
    "allow list, outsider": ("GET", "/x", (("host", "office.test"),
                                           ("x-forwarded-for", OUTSIDER)), b""),
    "allow list, inside": ("GET", "/x", (("host", "office.test"),
                                         ("x-forwarded-for", "10.1.2.3")), b""),
    "deny list inside the allow list": ("GET", "/x", (("host", "office.test"),
                                                      ("x-forwarded-for", "10.9.1.1")), b""),
    "protected, local visitor exempt": ("GET", "/x", (("host", "lan.test"),
                                                      ("x-forwarded-for", "192.168.1.5")), b""),
    "protected with exemption, outsider": ("GET", "/x", (("host", "lan.test"),
                                                         ("accept", "text/html"),
                                                         ("x-forwarded-for", OUTSIDER)), b""),
    # The first site takes every Host ("*"): a name no other site has lands there.
    "a Host only the catch-all site takes": ("GET", "/hello", (("host", "nobody.invalid"),), b""),
    "unknown path": ("GET", "/nothing-here", (), b""),
    # A ready answer takes every method, as nginx's `return` does.
    "DELETE on health": ("DELETE", "/api/v1/health", (), b""),
    "body over max_body": ("POST", "/app/echo", (("content-length", "20480"),), b"x" * 20480),
}


# What each case answers, over every protocol: its status and, where the body is ours to
# know, the body (b"" for none). None: a page whose text is checked elsewhere.
EXPECTED = {
    "health": (200, None),
    "return": (200, b"hello\n"),
    "return HEAD": (200, b""),
    "redirect": (301, None),
    "static file": (200, TEXT),
    "static index": (200, HOME),
    "static range": (206, TEXT[10:20]),
    "static range past the end": (416, None),
    "static not modified": (304, b""),
    "static missing": (404, None),
    "static gzip asked": (200, None),
    "static escape": (400, None),            # an encoded "/" is refused by the engine
    "static POST": (405, None),
    "note page": (200, None),
    "notes list": (200, None),
    "note missing": (404, None),
    "notes API read": (200, None),
    "notes API no token": (401, None),
    "notes API bad JSON": (422, None),
    "proxy GET": (200, b"upstream saw /app/page?q=1"),
    "proxy POST": (201, (bytes(range(256)) * 40)[::-1]),
    "proxy POST without length": (201, (bytes(range(256)) * 40)[::-1]),
    "protected, no session": (401, None),    # the sign-in page, as 401
    "protected, JSON client": (401, None),
    "protected, bad session": (401, None),
    "allow list, outsider": (403, None),
    "allow list, inside": (200, b"office only\n"),
    "deny list inside the allow list": (403, None),
    "protected, local visitor exempt": (200, b"upstream saw /x"),
    "protected with exemption, outsider": (401, None),
    "a Host only the catch-all site takes": (200, b"hello\n"),
    "unknown path": (404, None),
    "DELETE on health": (200, None),
    "body over max_body": (413, None),
}
assert set(EXPECTED) == set(CASES)


@pytest.mark.parametrize("case", list(CASES))
def test_every_protocol_answers_as_http1(server, case):
    method, path, headers, body = CASES[case]
    answers = {p: ask(server, p, method, path, headers, body) for p in PROTOCOLS}
    status, first_headers, first_body = answers["http/1.1"]
    expected_status, expected_body = EXPECTED[case]
    assert status == expected_status, (case, status, first_body[:200])
    if expected_body is not None:
        assert first_body == expected_body, (case, first_body[:200])
    for protocol in OTHERS:
        other_status, other_headers, other_body = answers[protocol]
        assert other_status == status, (case, protocol)
        assert _VARYING.sub(b"", other_body) == _VARYING.sub(b"", first_body), \
            (case, protocol, other_body[:300], first_body[:300])
        for name in COMPARED:
            assert other_headers.get(name) == first_headers.get(name), (case, protocol, name)


def test_a_signed_in_visitor_passes_on_every_protocol(server):
    browser = Browser(server.port("http"))
    resp, _ = browser.sign_in(next_url="/x")
    assert resp.status == 303 and browser.jar
    cookie = "; ".join(f"{k}={v}" for k, v in browser.jar.items())
    answers = {p: ask(server, p, "GET", "/x", (("host", "private.test"), ("cookie", cookie)))
               for p in PROTOCOLS}
    assert {p: (status, body) for p, (status, _, body) in answers.items()} == {
        p: (200, b"upstream saw /x") for p in PROTOCOLS}


def test_a_rate_limit_refuses_alike_on_every_protocol(server):
    # Each protocol's client (named by X-Forwarded-For) has a burst of one: its second
    # request is refused, with the same status and headers whichever protocol asks.
    refused = {}
    for n, protocol in enumerate(PROTOCOLS):
        headers = (("host", "limited.test"), ("x-forwarded-for", f"198.51.100.{n + 1}"))
        first = ask(server, protocol, "GET", "/", headers)
        second = ask(server, protocol, "GET", "/", headers)
        assert (first[0], first[2]) == (200, b"limited\n"), protocol
        assert second[0] == 429, protocol
        refused[protocol] = second
    for protocol in OTHERS:
        for name in ("cache-control", "content-type", "retry-after"):
            assert refused[protocol][1].get(name) == refused["http/1.1"][1].get(name), \
                (protocol, name)
        assert refused[protocol][2] == refused["http/1.1"][2]


# What a record must agree on across protocols (time and duration differ). A request
# refused while its head is read (a body over max_body) is logged for its client with
# its status; what else of it was read differs by protocol.
SERVED_FIELDS = ("client", "method", "host", "path", "status", "bytes", "route")
LOGGED = {"return": SERVED_FIELDS, "static file": SERVED_FIELDS, "proxy GET": SERVED_FIELDS,
          "unknown path": SERVED_FIELDS, "allow list, outsider": SERVED_FIELDS,
          "notes API no token": SERVED_FIELDS, "body over max_body": ("client", "status")}


def _records(log_path, agent):
    lines = log_path.read_text().splitlines() if log_path.exists() else []
    return [r for r in map(json.loads, lines) if r.get("user_agent") == agent]


@pytest.mark.parametrize("case", list(LOGGED))
def test_the_request_log_records_alike_on_every_protocol(server, case):
    method, path, headers, body = CASES[case]
    if not any(name == "x-forwarded-for" for name, _ in headers):
        headers = (*headers, ("x-forwarded-for", "198.51.100.77"))   # loopback is not logged
    agents = {p: f"both-{p}-{case}-{time.monotonic_ns()}" for p in PROTOCOLS}
    for protocol in PROTOCOLS:
        ask(server, protocol, method, path, (*headers, ("user-agent", agents[protocol])), body)
    records = poll(lambda: {p: _records(server.log, agents[p]) for p in PROTOCOLS},
                   lambda got: all(len(r) == 1 for r in got.values()))
    assert all(len(r) == 1 for r in records.values()), (case, records)
    first = records["http/1.1"][0]
    assert first["protocol"] == "HTTP/1.1"
    for protocol in OTHERS:
        record = records[protocol][0]
        assert record["protocol"] == LOGGED_AS[protocol], protocol
        assert {k: record[k] for k in LOGGED[case]} == \
            {k: first[k] for k in LOGGED[case]}, (case, protocol)


def test_https_answers_name_the_http3_port(server):
    # The TLS listener serves HTTP/3 on its own port number: its HTTP/2 answers say so,
    # ready and handler-made alike; the plain listener's answers do not.
    port = server.port("https")
    for path in ("/hello", "/app/page"):
        status, headers, _ = ask(server, "h2", "GET", path)
        assert status == 200 and headers.get("alt-svc") == f'h3=":{port}"; ma=86400', path
        assert ask(server, "http/1.1", "GET", path)[1].get("alt-svc") is None, path
