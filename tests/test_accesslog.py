"""The request log: one record per request, JSON or combined, loopback skipped by default."""

from __future__ import annotations

import http.client
import json
import socket

from hyperframe.frame import DataFrame

from conftest import read_all, tls_block
from h2raw import RawH2
from h2raw import get as h2get
from nestgate.pipeline.accesslog import AccessLog
from nestgate.config import LogConfig
from wire import Wire, config_dict


def logged_wire(tmp_path, peer, **log):
    path = tmp_path / "access.log"
    wire = Wire(config_dict(log={"path": str(path), **log}), peer=peer)
    return wire, path


def test_json_record_has_every_field(tmp_path):
    wire, path = logged_wire(tmp_path, ("203.0.113.7", 5000))
    wire.send(b"GET /hello?x=1 HTTP/1.1\r\nHost: Site.Test\r\nUser-Agent: probe/2\r\n"
              b"Authorization: Bearer s3cret\r\nCookie: session=abc\r\n\r\n")
    assert path.read_text() == ""                 # buffered, not written per request
    wire.worker.access_log.flush()
    record = json.loads(path.read_text())
    assert {k: record[k] for k in ("client", "method", "host", "path", "protocol", "status",
                                   "bytes", "user_agent", "route")} == {
        "client": "203.0.113.7", "method": "GET", "host": "Site.Test", "path": "/hello",
        "protocol": "HTTP/1.1", "status": 200, "bytes": 6, "user_agent": "probe/2", "route": "/hello"}
    assert record["duration_us"] >= 0 and record["time"].endswith("Z")
    text = path.read_text()
    assert "s3cret" not in text and "session=abc" not in text
    wire.close()


def test_combined_format(tmp_path):
    wire, path = logged_wire(tmp_path, ("203.0.113.8", 5000), format="combined")
    wire.send(b"GET /nope HTTP/1.1\r\nHost: a\r\nUser-Agent: probe/3\r\nReferer: http://r/\r\n\r\n")
    wire.worker.access_log.flush()
    line = path.read_text()
    assert line.startswith('203.0.113.8 - - [')
    assert '"GET /nope HTTP/1.1" 404 ' in line and '"http://r/" "probe/3"' in line
    wire.close()


def test_loopback_is_not_logged_unless_asked(tmp_path):
    (tmp_path / "q").mkdir()
    quiet, quiet_path = logged_wire(tmp_path / "q", ("127.0.0.1", 5000))
    quiet.send(b"GET /hello HTTP/1.1\r\nHost: a\r\n\r\n")
    quiet.worker.access_log.flush()
    assert quiet_path.read_text() == ""
    quiet.close()
    (tmp_path / "l").mkdir()
    loud, loud_path = logged_wire(tmp_path / "l", ("::1", 5000), log_loopback=True)
    loud.send(b"GET /hello HTTP/1.1\r\nHost: a\r\n\r\n")
    loud.worker.access_log.flush()
    assert json.loads(loud_path.read_text())["client"] == "::1"
    loud.close()


def test_ipv4_mapped_peer_is_normalised(tmp_path):
    wire, path = logged_wire(tmp_path, ("::ffff:198.51.100.4", 5000, 0, 0))
    wire.send(b"GET /hello HTTP/1.1\r\nHost: a\r\n\r\n")
    wire.worker.access_log.flush()
    assert json.loads(path.read_text())["client"] == "198.51.100.4"
    wire.close()


def test_records_are_flushed_at_shutdown(start_server, tmp_path):
    log = tmp_path / "out.log"
    server = start_server(f"""
[server]
workers = 1
[log]
path = "{log}"
log_loopback = true
flush_interval = "1h"
[[listen]]
address = "127.0.0.1:0"
[[site]]
hosts = ["*"]
""")
    conn = http.client.HTTPConnection("127.0.0.1", server.port(), timeout=5)
    for _ in range(3):
        conn.request("GET", "/api/v1/health")
        conn.getresponse().read()
    assert log.read_text() == ""                 # the timer is an hour away
    assert server.stop() == 0
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["route"] for r in records] == ["health"] * 3


def test_stdout_writes_stay_whole_lines(capfd):
    log = AccessLog(LogConfig(path="-"))
    for i in range(200):
        log.record("192.0.2.1", b"GET", b"h", f"/{i}", 200, 1, 0.0, [], "")
    log.flush()
    lines = capfd.readouterr().out.splitlines()
    assert [json.loads(l)["path"] for l in lines] == [f"/{i}" for i in range(200)]


def test_behind_a_trusted_local_proxy_each_request_is_logged_by_its_client(tmp_path):
    # The socket peer is loopback (not logged by default), but it is a trusted proxy:
    # the client it names in X-Forwarded-For decides, request by request.
    path = tmp_path / "access.log"
    data = config_dict(log={"path": str(path)})
    data["client_ip"] = {"trusted_proxies": ["127.0.0.1"]}
    wire = Wire(data, peer=("127.0.0.1", 5000))
    wire.send(b"GET /hello HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 203.0.113.9\r\n\r\n"
              b"GET /hello HTTP/1.1\r\nHost: a\r\n\r\n"
              b"GET /nope HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 198.51.100.4\r\n\r\n")
    wire.worker.access_log.flush()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["client"], r["path"], r["status"]) for r in records] == [
        ("203.0.113.9", "/hello", 200), ("198.51.100.4", "/nope", 404)]
    assert all(r["duration_us"] < 10_000_000 for r in records)     # timed from its own start
    wire.close()


def test_a_record_is_one_line_whatever_its_fields_hold(tmp_path):
    # NEL, U+2028 and CSI end a line for some readers (str.splitlines among them).
    for fmt in ("json", "combined"):
        (tmp_path / fmt).mkdir()
        wire, path = logged_wire(tmp_path / fmt, ("203.0.113.7", 5000), format=fmt)
        wire.send(b"GET /a%C2%85b%E2%80%A8c%C2%9Bd HTTP/1.1\r\nHost: a\r\n"
                  b"User-Agent: x\xe2\x80\xa9y\r\n\r\n")
        wire.worker.access_log.flush()
        raw = path.read_bytes()
        assert raw.count(b"\n") == 1 and len(raw.decode("utf-8").splitlines()) == 1, raw
        for sep in (b"\xc2\x85", b"\xe2\x80\xa8", b"\xe2\x80\xa9", b"\xc2\x9b"):
            assert sep not in raw
        if fmt == "json":
            assert json.loads(raw)["path"] == "/a\x85b\u2028c\x9bd"
        wire.close()


def test_referer_is_logged_without_its_query(tmp_path):
    wire, path = logged_wire(tmp_path, ("203.0.113.8", 5000), format="combined")
    wire.send(b"GET /hello HTTP/1.1\r\nHost: a\r\nReferer: https://a/login?token=s3cret\r\n\r\n")
    wire.worker.access_log.flush()
    line = path.read_text()
    assert '"https://a/login"' in line and "s3cret" not in line
    wire.close()


def test_write_errors_drop_records_and_are_counted(caplog):
    log = AccessLog(LogConfig(path="/dev/full"))
    for i in range(3):
        log.record("192.0.2.1", b"GET", b"h", f"/{i}", 200, 1, 0.0, [], "")
    log.flush()                                 # must not raise: the server goes on
    assert log.dropped == 3
    assert any("records are dropped" in r.getMessage() for r in caplog.records)


# ---- behind a trusted proxy, each request's client and log decision are its own
def trusted_proxy_gateway(start_server, log, up_url, certs):
    return start_server(f"""
[server]
workers = 1
[log]
path = "{log}"
[client_ip]
trusted_proxies = ["127.0.0.1"]
[limits]
max_body = "1KiB"
[[listen]]
address = "127.0.0.1:0"
[[listen]]
address = "127.0.0.1:0"
{tls_block(certs)}
[[site]]
hosts = ["*"]
[[site.route]]
prefix = "/"
type = "proxy"
upstream = "{up_url}"
[[site.route]]
path = "/hello"
type = "return"
body = "hello\\n"
""")


def logged(server, log) -> list[tuple[str, str, int]]:
    """(client, path, status) of every record, once the server has stopped (and so
    flushed its log)."""
    assert server.stop() == 0
    return sorted((r["client"], r["path"], r["status"])
                  for r in map(json.loads, log.read_text().splitlines()))


def test_pipelined_requests_are_logged_each_for_its_own_client(start_server, upstream,
                                                                tmp_path, certs):
    # The first two are answered by the proxy in turn, after the third's head (a ready
    # answer) was read: each is still logged, or not, for the client its own
    # X-Forwarded-For named (none: the proxy itself, loopback, not logged).
    log = tmp_path / "access.log"
    server = trusted_proxy_gateway(start_server, log, upstream().url, certs)
    with socket.create_connection(("127.0.0.1", server.port("http")), timeout=5) as sock:
        sock.sendall(b"GET /echo HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 203.0.113.5\r\n\r\n"
                     b"GET /echo HTTP/1.1\r\nHost: a\r\n\r\n"
                     b"GET /hello HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 198.51.100.4\r\n"
                     b"Connection: close\r\n\r\n")
        answers = read_all(sock)
    assert answers.count(b"HTTP/1.1 200 ") == 3, answers[-300:]
    assert logged(server, log) == [("198.51.100.4", "/hello", 200),
                                   ("203.0.113.5", "/echo", 200)]


def test_an_h2_stream_refused_413_is_logged_for_its_own_client(start_server, upstream,
                                                               tmp_path, certs):
    # Stream 1's body goes past max_body after stream 3 (the proxy's own request, not
    # logged) was read: the 413 is logged for stream 1's client.
    log = tmp_path / "access.log"
    server = trusted_proxy_gateway(start_server, log, upstream().url, certs)
    conn = RawH2(server.port("https"), certs["ca"])
    first = conn.request(h2get(b"/echo", method=b"POST")
                         + [(b"x-forwarded-for", b"203.0.113.5")], end=False)
    second = conn.request(h2get(b"/hello"))
    assert conn.answers([second])[second].status == 200
    conn.send(DataFrame(first, b"x" * 2048, flags={"END_STREAM"}))
    assert conn.answers([first])[first].status == 413
    conn.close()
    assert logged(server, log) == [("203.0.113.5", "/echo", 413)]


def test_the_combined_format_escapes_characters_that_reorder_or_hide_text(tmp_path):
    # A right-to-left override in a path (decoded from UTF-8) made a terminal show the
    # rest of the line reversed (the status, the User-Agent, the host read as something
    # else); a zero-width space hides text. Both reached the combined log raw. Header
    # values are read as Latin-1, so their UTF-8 bytes never form these characters.
    wire, path = logged_wire(tmp_path, ("203.0.113.7", 5000), format="combined")
    wire.send(b"GET /a%E2%80%AEb%E2%81%A6c%E2%80%8Bd%EF%BB%BFe HTTP/1.1\r\nHost: a\r\n"
              b"User-Agent: x\xe2\x80\xaey\r\n\r\n")
    wire.worker.access_log.flush()
    line = path.read_text()
    assert '"GET /a\\u202Eb\\u2066c\\u200Bd\\uFEFFe HTTP/1.1"' in line, line
    assert not any(0x200B <= ord(c) <= 0x206F or c == "\ufeff" for c in line)
    wire.close()
