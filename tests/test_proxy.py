"""The reverse proxy end to end: real nestgate processes, real upstream servers."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import socket
import ssl
import time

import pytest

from conftest import WS_HANDSHAKE, refused_port, rss_kib


def gateway(routes: str, top: str = "", site: str = "") -> str:
    return f"""
[server]
workers = 1
{top}
[[listen]]
address = "127.0.0.1:0"

[[site]]
hosts = ["*"]
{site}
{routes}
"""


def _toml(value) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value)


def route(upstream, prefix: str = "/", extra: str = "") -> str:
    targets = _toml(upstream)
    return f"""
[[site.route]]
prefix = "{prefix}"
type = "proxy"
upstream = {targets}
{extra}
"""


def get(port, path, method="GET", headers=None, body=None, conn=None, host="app.test"):
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    hdrs = {"Host": host}
    hdrs.update(headers or {})
    conn.request(method, path, body=body, headers=hdrs)
    resp = conn.getresponse()
    return resp, resp.read(), conn


def get_lines(port, path, lines, conn=None, host="app.test"):
    """A GET with these header field lines, in order: a name may come more than once."""
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.putrequest("GET", path, skip_host=True, skip_accept_encoding=True)
    conn.putheader("Host", host)
    for name, value in lines:
        conn.putheader(name, value)
    conn.endheaders()
    resp = conn.getresponse()
    return resp, resp.read(), conn


# ------------------------------------------------------------------ forwarding


def test_forwarding_headers_both_ways(start_server, upstream):
    up = upstream()
    server = start_server(gateway(route(up.url)))
    resp, body, _ = get(server.port(), "/echo?q=1", headers={
        "Connection": "keep-alive, X-Drop-Me", "X-Drop-Me": "1", "Keep-Alive": "timeout=9",
        "X-Forwarded-For": "203.0.113.9", "X-Custom": "kept", "TE": "trailers"})
    seen = json.loads(body)
    names = [n for n, _ in seen["headers"]]
    hdr = dict(seen["headers"])
    assert resp.status == 200 and seen["target"] == "/echo?q=1"
    assert hdr["host"] == "app.test"                              # preserved by default
    assert hdr["x-custom"] == "kept"
    for hop in ("x-drop-me", "keep-alive", "te"):
        assert hop not in names
    # The peer is not a trusted proxy: its X-Forwarded-For is replaced, not extended.
    assert hdr["x-forwarded-for"] == "127.0.0.1"
    assert hdr["x-forwarded-proto"] == "http" and hdr["x-forwarded-host"] == "app.test"
    # Response side: hop-by-hop and the headers named by Connection are gone.
    assert resp.getheader("x-upstream") == "up"
    assert resp.getheader("x-hop") is None and resp.getheader("keep-alive") is None
    assert resp.getheader("server") == "nestgate"


def test_each_client_is_named_in_x_forwarded_for(start_server, upstream):
    # The usual request's X-Forwarded-* lines are made once per client: each client,
    # and each Host it asks for, still gets its own.
    up = upstream()
    server = start_server(gateway(route(up.url)))
    for source, host in (("127.0.0.1", "app.test"), ("127.0.0.2", "app.test"),
                         ("127.0.0.2", "other.test"), ("127.0.0.1", "app.test")):
        conn = http.client.HTTPConnection("127.0.0.1", server.port(), timeout=10,
                                          source_address=(source, 0))
        resp, body, _ = get(server.port(), "/echo", conn=conn, host=host)
        hdr = dict(json.loads(body)["headers"])
        assert resp.status == 200 and hdr["x-forwarded-for"] == source
        assert hdr["x-forwarded-host"] == host and hdr["x-forwarded-proto"] == "http"
        conn.close()


def test_every_connection_line_names_hop_by_hop_request_headers(start_server, upstream):
    # Connection is a list: its names may come on several field lines (RFC 9110 7.6.1).
    up = upstream()
    server = start_server(gateway(route(up.url)))
    lines = [("Connection", "X-Hop-A"), ("X-Hop-A", "1"), ("Connection", "keep-alive, X-Hop-B"),
             ("X-Hop-B", "2"), ("X-Custom", "kept")]
    conn = None
    for _ in range(2):     # a new upstream connection, then a kept-alive one (callbacks)
        resp, body, conn = get_lines(server.port(), "/echo", lines, conn=conn)
        hdr = dict(json.loads(body)["headers"])
        assert resp.status == 200 and hdr["x-custom"] == "kept"
        assert "x-hop-a" not in hdr and "x-hop-b" not in hdr and "connection" not in hdr
    assert up.connections == 1


def test_every_connection_line_names_hop_by_hop_response_headers(start_server, upstream):
    up = upstream()
    server = start_server(gateway(route(up.url)))
    conn = None
    for _ in range(2):
        resp, body, conn = get(server.port(), "/connection-lines", conn=conn)
        assert resp.status == 200 and body == b"ok"
        assert resp.getheader("x-end-to-end") == "kept"
        assert resp.getheader("x-hop-one") is None and resp.getheader("x-hop-two") is None
    assert up.connections == 1       # "keep-alive" on the second line still counts


CLIENT_CLAIMS = {"Forwarded": "for=198.51.100.7;proto=https", "X-Real-IP": "198.51.100.7",
                 "X-Forwarded-For": "198.51.100.7", "X-Forwarded-Proto": "https",
                 "True-Client-IP": "198.51.100.7", "X-Forwarded-Prefix": "/elsewhere",
                 "X-Original-URL": "/admin/"}


def test_client_claims_of_its_address_are_dropped(start_server, upstream):
    # X-Forwarded-* are nestgate's: an untrusted client's Forwarded and X-Real-IP would
    # otherwise tell the upstream another address or scheme.
    up = upstream()
    server = start_server(gateway(route(up.url)))
    conn = None
    for _ in range(2):
        resp, body, conn = get(server.port(), "/echo", headers=CLIENT_CLAIMS, conn=conn)
        hdr = dict(json.loads(body)["headers"])
        assert resp.status == 200 and "forwarded" not in hdr and "x-real-ip" not in hdr
        assert not {"true-client-ip", "x-forwarded-prefix", "x-original-url"} & set(hdr)
        assert hdr["x-forwarded-for"] == "127.0.0.1" and hdr["x-forwarded-proto"] == "http"


@pytest.mark.parametrize("top, extra", [('[client_ip]\ntrusted_proxies = ["127.0.0.1"]', ""),
                                        ("", "forwarded = false")],
                         ids=["trusted-proxy", "forwarded-off"])
def test_client_claims_pass_from_trusted_proxies_or_when_not_forwarding(start_server, upstream,
                                                                         top, extra):
    up = upstream()
    server = start_server(gateway(route(up.url, extra=extra), top=top))
    resp, body, _ = get(server.port(), "/echo", headers=CLIENT_CLAIMS)
    hdr = dict(json.loads(body)["headers"])
    assert resp.status == 200 and hdr["forwarded"] == CLIENT_CLAIMS["Forwarded"]
    assert hdr["x-real-ip"] == "198.51.100.7" and hdr["x-forwarded-proto"] == "https"
    assert hdr["true-client-ip"] == "198.51.100.7"
    assert (hdr["x-forwarded-prefix"], hdr["x-original-url"]) == ("/elsewhere", "/admin/")


def test_upstream_connections_are_kept_alive(start_server, upstream):
    up = upstream()
    server = start_server(gateway(route(up.url)))
    conn = None
    for _ in range(20):
        resp, _body, conn = get(server.port(), "/echo", conn=conn)
        assert resp.status == 200
    assert up.connections == 1 and len(up.requests) == 20


def test_host_and_longest_prefix_routing_with_strip(start_server, upstream):
    a, b, c = upstream("a"), upstream("b"), upstream("c")
    server = start_server(f"""
[server]
workers = 1
[[listen]]
address = "127.0.0.1:0"
[[site]]
hosts = ["app.test"]
{route(a.url)}
{route(b.url, "/api/", "strip_prefix = true")}
[[site]]
hosts = ["other.test"]
{route(c.url, "/", 'host_header = "target"')}
""")
    port = server.port()
    _r, body, _ = get(port, "/page")
    assert json.loads(body)["upstream"] == "a"
    _r, body, _ = get(port, "/api/v1/echo?x=2")
    seen = json.loads(body)
    assert seen["upstream"] == "b" and seen["target"] == "/v1/echo?x=2"
    _r, body, _ = get(port, "/x", host="other.test")
    seen = json.loads(body)
    assert seen["upstream"] == "c" and dict(seen["headers"])["host"] == f"127.0.0.1:{c.port}"
    assert dict(seen["headers"])["x-forwarded-host"] == "other.test"


def test_head_and_interim_and_close_delimited(start_server, upstream):
    up = upstream()
    server = start_server(gateway(route(up.url)))
    resp, body, conn = get(server.port(), "/big?n=5000", method="HEAD")
    assert resp.status == 200 and body == b"" and resp.getheader("content-length") == "5000"
    resp, body, conn = get(server.port(), "/big?n=5000", conn=conn)
    assert resp.status == 200 and len(body) == 5000
    resp, body, conn = get(server.port(), "/big?n=5000", method="HEAD", conn=conn)   # remembered
    assert resp.status == 200 and body == b"" and resp.getheader("content-length") == "5000"
    resp, body, conn = get(server.port(), "/close", conn=conn)   # same client connection
    assert resp.status == 200 and body == b"until the end"
    resp, body, conn = get(server.port(), "/echo", conn=conn)
    assert resp.status == 200


def test_a_body_after_a_head_answer_never_reaches_the_next_request(start_server, upstream):
    # An upstream that sends a body after its answer to HEAD (RFC 9110 9.3.2 says it
    # must not): those bytes must not be read as the next response on that connection.
    up = upstream()
    server = start_server(gateway(route(up.url)))
    conn = None
    for _ in range(3):
        resp, body, conn = get(server.port(), "/head-with-body", method="HEAD", conn=conn)
        assert resp.status == 200 and body == b""
        # Asked at once: the stray body comes before the upstream reads this request.
        resp, body, conn = get(server.port(), "/echo", conn=conn)
        assert resp.status == 200 and json.loads(body)["target"] == "/echo"


def test_interim_responses_are_not_forwarded(start_server, upstream):
    up = upstream()
    server = start_server(gateway(route(up.url)))
    sock = socket.create_connection(("127.0.0.1", server.port()), timeout=5)
    sock.sendall(b"GET /interim HTTP/1.1\r\nHost: app.test\r\n\r\n")
    data = b""
    while not data.endswith(b"\r\n\r\nok"):
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head = data.partition(b"\r\n\r\n")[0].lower()
    assert head.startswith(b"http/1.1 200") and b"x-final: yes" in head
    assert b"link:" not in head and data.count(b"HTTP/1.1") == 1
    sock.close()


def test_response_head_arriving_in_pieces(start_server, upstream):
    # Each twice: parsed, then with its head remembered (see Exchange._remembered).
    up = upstream()
    server = start_server(gateway(route(up.url)))
    conn = None
    for _ in range(2):
        resp, body, conn = get(server.port(), "/trickle-head", conn=conn)
        assert resp.status == 200 and body == b"slowly!"
        assert resp.getheader("x-trickled") == "all the way" and resp.getheader("x-hop") is None
    for _ in range(2):
        resp, body, conn = get(server.port(), "/late-body", conn=conn)
        assert resp.status == 200 and body == b"0123456789"
    resp, body, conn = get(server.port(), "/echo", conn=conn)
    assert resp.status == 200 and json.loads(body)["target"] == "/echo"
    assert up.connections == 1


def test_each_response_keeps_its_own_header_values(start_server, upstream):
    # Heads are remembered by their bytes: any difference is a head of its own.
    up = upstream()
    server = start_server(gateway(route(up.url)))
    conn = None
    for value in ("one", "two", "one", "three", "two"):
        resp, body, conn = get(server.port(), f"/vary?v={value}", conn=conn)
        assert resp.status == 200 and body == b"ok" and resp.getheader("x-vary") == value


# ------------------------------------------------------------------ streaming


@pytest.mark.parametrize("chunked, remembered", [(False, False), (False, True), (True, False)])
def test_large_download_streams_in_bounded_memory(start_server, upstream, chunked, remembered):
    up = upstream()
    server = start_server(gateway(route(up.url)))
    worker = server.worker_pids()[0]
    n = 96 * 1024 * 1024
    get(server.port(), f"/big?n={n}" if remembered else "/echo", method="HEAD")
    before = rss_kib(worker)
    conn = http.client.HTTPConnection("127.0.0.1", server.port(), timeout=30)
    conn.request("GET", f"/big?n={n}" + ("&chunked" if chunked else ""))
    resp = conn.getresponse()
    digest, size = hashlib.sha256(), 0
    while chunk := resp.read(1 << 20):
        digest.update(chunk)
        size += len(chunk)
        if size == 1 << 20:
            time.sleep(0.2)               # a slow reader: the proxy must hold back
    block = bytes(range(256)) * 256
    expected = hashlib.sha256(block * (n // len(block))).hexdigest()
    assert size == n and digest.hexdigest() == expected
    assert rss_kib(worker) - before < 24 * 1024, "the download was buffered"


@pytest.mark.parametrize("chunked", [False, True])
def test_large_upload_streams_in_bounded_memory(start_server, upstream, chunked):
    up = upstream()
    server = start_server(gateway(route(up.url), site="") .replace(
        "workers = 1", "workers = 1\n[limits]\nmax_body = \"1GiB\"", 1))
    worker = server.worker_pids()[0]
    get(server.port(), "/echo")
    before = rss_kib(worker)
    part = os.urandom(1 << 20)
    total = 64

    def parts():
        for _ in range(total):
            yield part

    conn = http.client.HTTPConnection("127.0.0.1", server.port(), timeout=30)
    headers = {"Host": "app.test"}
    if not chunked:
        headers["Content-Length"] = str(total * len(part))
    conn.request("POST", "/echo", body=parts(), headers=headers, encode_chunked=chunked)
    resp = conn.getresponse()
    seen = json.loads(resp.read())
    assert seen["size"] == total * len(part)
    assert seen["sha256"] == hashlib.sha256(part * total).hexdigest()
    assert rss_kib(worker) - before < 24 * 1024, "the upload was buffered"


# ------------------------------------------------------------------ failures


def test_refused_is_502_and_garbage_is_502(start_server, upstream):
    up = upstream()
    server = start_server(gateway(route(f"http://127.0.0.1:{refused_port()}", "/down/")
                                  + route(up.url)))
    resp, body, conn = get(server.port(), "/down/x")
    assert resp.status == 502 and b"502" in body
    resp, body, conn = get(server.port(), "/garbage", conn=conn)
    assert resp.status == 502
    resp, body, conn = get(server.port(), "/echo", conn=conn)   # the client connection lives on
    assert resp.status == 200


def read_until_quiet(sock, quiet: float = 0.3) -> bytes:
    """Every byte the server sends until it has been silent for `quiet` seconds."""
    sock.settimeout(quiet)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        pass
    return data


@pytest.mark.parametrize("kind", ["whole", "partial", "late", "no-content"])
@pytest.mark.parametrize("method", ["GET", "POST"])      # answered from callbacks, or a task
@pytest.mark.parametrize("remembered", [False, True])    # the head parsed, or remembered
def test_bytes_after_a_response_never_reach_the_next_client(start_server, upstream, kind,
                                                             method, remembered):
    # An upstream that sends more than the response it owes must not have the rest
    # read as the next request's answer: the response stands, the connection is closed.
    # Read from a raw socket: http.client would drop what follows a response.
    up = upstream()
    server = start_server(gateway(route(up.url)))
    sock = socket.create_connection(("127.0.0.1", server.port()), timeout=5)
    if remembered:          # the same head as the overrun's first response
        sock.sendall(b"GET /hi HTTP/1.1\r\nHost: app.test\r\n\r\n")
        assert read_until_quiet(sock).endswith(b"\r\n\r\nhi")
    body = b"x" if method == "POST" else b""
    sock.sendall(b"%s /overrun/%s HTTP/1.1\r\nHost: app.test\r\ncontent-length: %d\r\n\r\n%s"
                 % (method.encode(), kind.encode(), len(body), body))
    answer = read_until_quiet(sock)
    assert answer.count(b"HTTP/1.1 ") == 1 and b"x-evil" not in answer.lower()
    assert answer.startswith(b"HTTP/1.1 204") if kind == "no-content" else \
        answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"\r\n\r\nhi")
    sock.sendall(b"GET /echo HTTP/1.1\r\nHost: app.test\r\n\r\n")
    answer = read_until_quiet(sock)
    assert answer.startswith(b"HTTP/1.1 200") and b"x-evil" not in answer.lower()
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["target"] == "/echo"
    sock.close()
    resp, body, _ = get(server.port(), "/echo")         # another client
    assert resp.status == 200 and resp.getheader("x-evil") is None
    assert up.connections == 2       # the spoilt one closed, its successor kept alive


def test_endless_response_head_is_502(start_server, upstream):
    # httptools holds an unfinished header line: the proxy bounds the bytes a response
    # head may take (64 KiB) and answers 502 at once, instead of buffering the
    # upstream's megabyte and waiting for the line to end (504 after read_timeout).
    up = upstream()
    server = start_server(gateway(route(up.url, extra='read_timeout = "3s"')))
    resp, body, conn = get(server.port(), "/endless-header")
    assert resp.status == 502 and b"502" in body
    resp, body, conn = get(server.port(), "/echo", conn=conn)
    assert resp.status == 200


def test_stall_before_headers_is_504(start_server, upstream):
    up = upstream()
    server = start_server(gateway(route(up.url, extra='read_timeout = "300ms"')))
    t0 = time.monotonic()
    resp, _body, _ = get(server.port(), "/stall")
    assert resp.status == 504 and time.monotonic() - t0 < 5


def test_stall_on_a_kept_alive_upstream_connection_is_504(start_server, upstream):
    # The second request goes out on the pooled connection (answered from callbacks,
    # no coroutine): the timeout watch must still find it.
    up = upstream()
    server = start_server(gateway(route(up.url, extra='read_timeout = "300ms"')))
    resp, _body, conn = get(server.port(), "/echo")
    assert resp.status == 200
    t0 = time.monotonic()
    resp, _body, conn = get(server.port(), "/stall", conn=conn)
    assert resp.status == 504 and time.monotonic() - t0 < 5
    assert up.connections == 1
    resp, _body, conn = get(server.port(), "/echo", conn=conn)     # on a new upstream connection
    assert resp.status == 200 and up.connections == 2


def test_break_after_headers_cuts_the_client(start_server, upstream):
    up = upstream()
    server = start_server(gateway(route(up.url, extra='read_timeout = "300ms"')))
    # Each twice: the second time the head is remembered and the body counted.
    for path in ("/reset-mid-body", "/reset-mid-body", "/slow-body", "/slow-body"):
        conn = http.client.HTTPConnection("127.0.0.1", server.port(), timeout=10)
        conn.request("GET", path, headers={"Host": "app.test"})
        resp = conn.getresponse()
        assert resp.status == 200                        # the headers had gone out
        with pytest.raises(http.client.IncompleteRead):
            resp.read()                                  # then the connection was cut
    up.unblock()


def test_connect_timeout_is_504(start_server):
    # A listener whose accept queue is full drops further SYNs: connect hangs.
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(0)
    fill = []
    for _ in range(3):
        c = socket.socket()
        c.setblocking(False)
        try:
            c.connect(sock.getsockname())
        except BlockingIOError:
            pass
        fill.append(c)
    server = start_server(gateway(route(f"http://127.0.0.1:{sock.getsockname()[1]}",
                                        extra='connect_timeout = "300ms"\nretries = 0')))
    t0 = time.monotonic()
    resp, _body, _ = get(server.port(), "/")
    assert resp.status == 504 and time.monotonic() - t0 < 5
    for c in fill + [sock]:
        c.close()


# ------------------------------------------------------------------ retries and balancing


def test_retry_only_for_idempotent_methods(start_server, upstream):
    good = upstream("good")
    dead = f"http://127.0.0.1:{refused_port()}"
    server = start_server(gateway(route([dead, good.url], extra="max_fails = 0")))
    port = server.port()
    # Round-robin starts with the dead target: GET moves on, POST must not.
    resp, body, _ = get(port, "/echo")
    assert resp.status == 200 and json.loads(body)["upstream"] == "good"
    statuses = [get(port, "/echo", method="POST", body=b"x")[0].status for _ in range(4)]
    assert statuses.count(502) == 2 and statuses.count(200) == 2


def test_passive_health_ejects_a_failing_target(start_server, upstream):
    good = upstream("good")
    dead = f"http://127.0.0.1:{refused_port()}"
    server = start_server(gateway(route([dead, good.url],
                                        extra='max_fails = 1\nfail_timeout = "30s"')))
    port = server.port()
    get(port, "/echo")                         # the dead target fails once: ejected
    statuses = [get(port, "/echo", method="POST", body=b"x")[0].status for _ in range(6)]
    assert statuses == [200] * 6


def test_stale_kept_alive_connection_is_replaced_for_idempotent_requests(start_server,
                                                                          upstream):
    up = upstream()
    server = start_server(gateway(route(up.url)))
    resp, _body, conn = get(server.port(), "/then-close")
    resp, body, conn = get(server.port(), "/echo", conn=conn)     # GET: tried again, fresh
    assert resp.status == 200 and up.connections == 2
    assert [r.get("dropped", False) for r in up.requests] == [False, True, False]
    resp, _body, conn = get(server.port(), "/then-close", conn=conn)
    resp, _body, conn = get(server.port(), "/echo", method="POST", body=b"x", conn=conn)
    assert resp.status == 502                                      # POST: never repeated


def test_weighted_round_robin(start_server, upstream):
    a, b = upstream("a"), upstream("b")
    server = start_server(gateway(route([{"url": a.url, "weight": 2}, b.url])))
    conn = None
    seen = []
    for _ in range(30):
        _r, body, conn = get(server.port(), "/echo", conn=conn)
        seen.append(json.loads(body)["upstream"])
    assert seen.count("a") == 20 and seen.count("b") == 10


def test_least_connections_prefers_the_idle_target(start_server, upstream):
    a, b = upstream("a"), upstream("b")
    server = start_server(gateway(route([a.url, b.url], extra='balance = "least_conn"')))
    # Hold one request open on whichever target gets it; the next ones go elsewhere.
    busy = http.client.HTTPConnection("127.0.0.1", server.port(), timeout=10)
    busy.request("GET", "/slow-body", headers={"Host": "app.test"})
    first = busy.getresponse()
    held = "a" if a.requests else "b"
    others = [json.loads(get(server.port(), "/echo")[1])["upstream"] for _ in range(3)]
    assert others == ["b" if held == "a" else "a"] * 3
    a.unblock(), b.unblock()
    assert first.read() == b"0123456789abcdefghij"


def test_active_health_check_takes_a_target_out(start_server, upstream):
    a, b = upstream("a"), upstream("b")
    server = start_server(gateway(route(
        [a.url, b.url], extra='health_path = "/health"\nhealth_interval = "100ms"')))
    a.healthy = False
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:        # bounded: until a check ran
        if any(r["target"] == "/health" for r in a.requests[1:]):
            break
        time.sleep(0.05)
    time.sleep(0.2)
    seen = {json.loads(get(server.port(), "/echo")[1])["upstream"] for _ in range(6)}
    assert seen == {"b"}


# ------------------------------------------------------------------ TLS upstream


def test_https_upstream_verified(start_server, upstream, ca, certs):
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(*certs["local"])
    up = upstream("tls", ssl=ctx)
    server = start_server(gateway(
        route(up.url, "/verified/", f'ca_file = "{certs["ca"]}"\nstrip_prefix = true')
        + route(up.url, "/default/", "strip_prefix = true")))
    resp, body, _ = get(server.port(), "/verified/echo")
    assert resp.status == 200 and json.loads(body)["upstream"] == "tls"
    resp, _body, _ = get(server.port(), "/default/echo")    # unknown CA: refused
    assert resp.status == 502


# ------------------------------------------------------------------ upgrade


def test_websocket_upgrade_tunnel(start_server, upstream):
    up = upstream()
    server = start_server(gateway(route(up.url)))
    sock = socket.create_connection(("127.0.0.1", server.port()), timeout=5)
    sock.sendall(b"GET /ws HTTP/1.1\r\nHost: app.test\r\nConnection: Upgrade\r\n"
                 b"Upgrade: websocket\r\n" + WS_HANDSHAKE + b"\r\nearly")
    data = b""
    while not data.endswith(b"helloEARLY"):
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101") and b"x-tunnel: yes" in head.lower()
    assert b"upgrade: websocket" in head.lower()
    assert rest == b"helloEARLY"
    payload = os.urandom(512 * 1024).hex().encode()        # both ways, with backpressure
    sock.sendall(payload)
    got = b""
    while len(got) < len(payload):
        chunk = sock.recv(1 << 20)
        assert chunk
        got += chunk
    assert got == payload.upper(), "tunnel bytes differ"
    sock.close()
    # The upstream side of the tunnel goes when the client does.
    deadline = time.monotonic() + 5
    while up.writers and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not up.writers
    sock2 = socket.create_connection(("127.0.0.1", server.port()), timeout=5)
    sock2.sendall(b"GET /echo HTTP/1.1\r\nHost: app.test\r\n\r\n")
    assert sock2.recv(65536).startswith(b"HTTP/1.1 200")


def test_upgrade_refused_by_upstream_is_a_normal_answer(start_server, upstream):
    up = upstream()
    server = start_server(gateway(route(up.url)))
    sock = socket.create_connection(("127.0.0.1", server.port()), timeout=5)
    sock.sendall(b"GET /status/426 HTTP/1.1\r\nHost: app.test\r\nConnection: Upgrade\r\n"
                 b"Upgrade: websocket\r\n\r\n")
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    assert data.startswith(b"HTTP/1.1 426") and b"connection: close" in data.lower()


def test_upstream_switching_to_a_protocol_not_asked_for_is_502(start_server, upstream):
    # Asked for websocket, the upstream answers 101 to h2c: nothing is tunnelled.
    up = upstream()
    server = start_server(gateway(route(up.url)))
    sock = socket.create_connection(("127.0.0.1", server.port()), timeout=5)
    sock.sendall(b"GET /ws-h2c HTTP/1.1\r\nHost: app.test\r\nConnection: Upgrade\r\n"
                 b"Upgrade: websocket\r\n\r\nafter")
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    assert data.startswith(b"HTTP/1.1 502") and data.count(b"HTTP/1.1 ") == 1, data[:200]
    assert b"AFTER" not in data


@pytest.mark.parametrize("offer, forwarded", [
    pytest.param(b"websocket", "websocket", id="websocket"),
    pytest.param(b"h2c, WebSocket/13", "WebSocket/13", id="only-the-named-one"),
    pytest.param(b"h2c", None, id="none-named: a plain request"),
    pytest.param(b"x-custom", None, id="other"),
])
def test_only_the_upgrades_a_route_names_go_upstream(start_server, upstream, offer, forwarded):
    up = upstream()
    server = start_server(gateway(route(up.url)))
    sock = socket.create_connection(("127.0.0.1", server.port()), timeout=5)
    sock.sendall(b"GET /echo HTTP/1.1\r\nHost: app.test\r\nConnection: Upgrade\r\n"
                 b"Upgrade: " + offer + b"\r\n\r\n")
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    assert data.startswith(b"HTTP/1.1 200") and b"connection: close" in data.lower()
    headers = dict(up.requests[0]["headers"])
    assert headers.get("upgrade") == forwarded
    assert headers.get("connection") == ("upgrade" if forwarded else None)


# ------------------------------------------------------------------ limits and HTTP/2


def test_max_connections_per_target(start_server, upstream):
    up = upstream()
    server = start_server(gateway(route(up.url, extra="max_connections = 1")))
    busy = http.client.HTTPConnection("127.0.0.1", server.port(), timeout=10)
    busy.request("GET", "/slow-body", headers={"Host": "app.test"})
    first = busy.getresponse()                    # holds the only connection
    assert get(server.port(), "/echo")[0].status == 503
    up.unblock()
    assert first.read() == b"0123456789abcdefghij"
    assert get(server.port(), "/echo")[0].status == 200


def test_request_timeout_covers_the_whole_exchange(start_server, upstream):
    up = upstream()
    server = start_server(gateway(route(up.url, extra='request_timeout = "300ms"')))
    t0 = time.monotonic()
    assert get(server.port(), "/stall")[0].status == 504
    assert time.monotonic() - t0 < 5


def h2_gateway(start_server, up, certs):
    """A one-worker gateway to `up` on an HTTPS listener (HTTP/2 by ALPN)."""
    cert, key = certs["local"]
    return start_server(f"""
[server]
workers = 1
[[listen]]
address = "127.0.0.1:0"
[[listen.certificate]]
cert = "{cert}"
key = "{key}"
[[site]]
hosts = ["*"]
{route(up.url)}
""")


def test_proxy_over_http2(start_server, upstream, certs):
    from h2client import H2Client
    up = upstream()
    server = h2_gateway(start_server, up, certs)
    client = H2Client(server.port("https"), certs["ca"])
    try:
        status, headers, body = client.request("POST", "/echo", body=b"x" * 16000)
        seen = json.loads(body)
        assert status == 200 and seen["size"] == 16000 and headers["x-upstream"] == "up"
        assert dict(seen["headers"])["x-forwarded-proto"] == "https"
        status, _headers, body = client.request("GET", "/big?n=300000&chunked")
        assert status == 200 and len(body) == 300000
    finally:
        client.close()


def test_an_h2_cookie_in_pieces_goes_upstream_as_one_line(start_server, upstream, certs):
    # RFC 9113 8.2.3: an HTTP/2 client may send its Cookie as several fields; on to
    # HTTP/1.1 they are joined by "; " into one line (they went as several, and an
    # upstream reading one line lost the rest). HTTP/1.1's repeated lines likewise.
    from h2client import H2Client
    up = upstream()
    server = h2_gateway(start_server, up, certs)
    client = H2Client(server.port("https"), certs["ca"])
    try:
        status, _headers, body = client.request(
            "GET", "/echo", headers=[(b"cookie", b"a=1"), (b"x-b", b"2"),
                                     (b"cookie", b"b=2; c=3"), (b"cookie", b"d=4")])
        assert status == 200
        cookies = [v for n, v in json.loads(body)["headers"] if n == "cookie"]
        assert cookies == ["a=1; b=2; c=3; d=4"]
    finally:
        client.close()
    conn = http.client.HTTPSConnection("127.0.0.1", server.port("https"), timeout=5,
                                       context=ssl.create_default_context(cafile=certs["ca"]))
    conn.putrequest("GET", "/echo")
    conn.putheader("Cookie", "a=1")
    conn.putheader("Cookie", "b=2")
    conn.endheaders()
    seen = json.loads(conn.getresponse().read())
    conn.close()
    assert [v for n, v in seen["headers"] if n == "cookie"] == ["a=1; b=2"]


def test_proxied_heads_over_http2_each_their_own_after_the_encoded_ones_are_kept(
        start_server, upstream, certs):
    # An upstream head is encoded for HTTP/2 once and kept, bounded: every answer still
    # carries its own fields, a Date, nestgate's Server and its length, including
    # after more distinct heads than are kept.
    from h2client import H2Client
    up = upstream()
    server = h2_gateway(start_server, up, certs)
    from nestgate.wire.h2stream import _RAW_BLOCK_MAX, _RAW_BLOCKS_LIMIT
    client = H2Client(server.port("https"), certs["ca"])
    try:
        long = "L" * (_RAW_BLOCK_MAX + 100)          # encoded for each answer, not kept
        for value in ["a", "b", "a", long, long] + \
                [f"n{i}" for i in range(_RAW_BLOCKS_LIMIT + 44)] + ["b"]:
            status, headers, body = client.request("GET", f"/vary?v={value}")
            assert (status, headers["x-vary"], body) == (200, value, b"ok"), value
            assert headers["server"] == "nestgate" and headers["content-length"] == "2"
            assert headers["date"].endswith(" GMT")
        # A remembered head whose body comes in two reads, and one followed by bytes
        # the upstream does not owe (the answer stands, the connection is not reused).
        for _ in range(3):
            assert client.request("GET", "/late-body")[::2] == (200, b"0123456789")
        for _ in range(3):
            assert client.request("GET", "/overrun/whole")[::2] == (200, b"hi")
        status, headers, body = client.request("GET", "/big?n=5000")
        assert status == 200 and headers["content-length"] == "5000" and len(body) == 5000
        status, headers, body = client.request("HEAD", "/big?n=5000")
        assert (status, headers["content-length"], body) == (200, "5000", b"")
        assert client.request("GET", "/status/204")[0] == 204
    finally:
        client.close()


# ------------------------------------------------------------------ response heads


def test_response_head_read_once_and_remembered_within_bounds():
    from nestgate.handlers.proxy import upstream as up
    head = (b'HTTP/1.1 200 OK\r\nServer: nginx\r\nDate: Wed, 02 Dec 2026 22:28:17 GMT\r\n'
            b'Content-Length: 2\r\nConnection: keep-alive, X-A\r\nx-a: 1\r\nETag: "x"')
    block, length, chunked, upgrade, lines, counted, keep_alive, absolute = \
        up._read_head(head, 200, True)
    assert (block, length, chunked, upgrade, counted, keep_alive, absolute) == \
        (b'ETag: "x"\r\n', 2, False, b"", 200, True, False)
    assert lines == b'HTTP/1.1 200 OK\r\nserver: nestgate\r\nETag: "x"\r\ncontent-length: 2\r\n'
    assert up._HEADS[head][0] == b'ETag: "x"\r\n'
    # Bodies that are not counted: chunked, none (304), or a length the parser decides.
    chunked_head = b"HTTP/1.1 200 OK\r\nx-n: 7\r\ntransfer-encoding: chunked"
    assert up._read_head(chunked_head, 200, True) == \
        (b"x-n: 7\r\n", None, True, b"", None, 0, True, False)
    # A Location with a URL: read for each response (`_redirected`), never counted.
    moved = up._read_head(b"HTTP/1.1 302 Found\r\nLocation: http://a/\r\ncontent-length: 0",
                          302, True)
    assert moved[4:6] == (None, 0) and moved[7] is True
    assert up._read_head(b"HTTP/1.1 304 Not Modified\r\ncontent-length: 9", 304, True)[5] == 0
    for i in range(up._HEADS_LIMIT * 3):
        up._read_head(b"HTTP/1.1 200 OK\r\nx-n: %d\r\ntransfer-encoding: chunked" % i, 200, True)
        assert len(up._HEADS) <= up._HEADS_LIMIT
    long = b"HTTP/1.1 200 OK\r\nset-cookie: " + b"c" * up._HEAD_MEMO_MAX
    assert up._read_head(long, 200, True)[0] == long[17:] + b"\r\n"
    assert long not in up._HEADS


def test_a_remembered_head_for_a_stream_reset_meanwhile_fails_the_exchange_quietly():
    # The client's HTTP/2 stream is reset in the same turn of the loop as the upstream's
    # answer arrives, before the stream's task is cancelled: the head cannot be sent,
    # and the exchange fails as it would in the parser's callback (no exception out of
    # the upstream socket's data_received).
    from types import SimpleNamespace
    from nestgate.base.flow import Reading
    from nestgate.wire.h2engine import StreamClosedError
    from nestgate.handlers.proxy import upstream as up

    class ResetStream:
        relays_bytes = False
        head_only = False
        connection = None
        sent = 0

        def start_raw(self, status, block, length):
            raise StreamClosedError("stream 1 is closed")

    head = b"HTTP/1.1 200 OK\r\nx-kind: remembered\r\ncontent-length: 2"
    up._read_head(head, 200, True)                 # known, as after a first response
    conn = SimpleNamespace(target=SimpleNamespace(private=False, compress=False),
                           closed=False, exchange=None, reading=Reading())
    conn.close = lambda: setattr(conn, "closed", True)
    ex = up.Exchange(conn, ResetStream())
    ex.feed(head + b"\r\n\r\nok")
    assert ex.error == 502 and conn.closed and conn.exchange is None and not ex.relay.out


def test_a_site_written_with_the_proxy_and_static_shorthands_serves(start_server, upstream,
                                                                    tmp_path):
    up = upstream()
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "index.html").write_text("<p>home</p>")
    server = start_server(f"""
[[listen]]
address = "127.0.0.1:0"

[[site]]
hosts = ["app.test"]
proxy = "{up.url}"

[[site]]
hosts = ["files.test"]
static = "{tmp_path / 'www'}"
""")
    resp, _body, _ = get(server.port(), "/some/page?x=1")
    assert resp.status == 200 and up.requests[-1]["target"] == "/some/page?x=1"
    resp, body, _ = get(server.port(), "/", host="files.test")
    assert resp.status == 200 and body == b"<p>home</p>"
