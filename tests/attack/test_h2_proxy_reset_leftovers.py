"""An HTTP/2 client resets a proxied stream while its handler waits for the client's
window, after the upstream's whole answer has arrived. The upstream connection is
sound and goes back to the pool; what the handler had not written yet (the rest of
that client's body) must go with the reset stream, never to the next request that
reuses the connection (it did: a 500 "write before start", or another client's bytes
in front of the next answer)."""

from __future__ import annotations

import http.server
import threading
import time

import pytest

from h2raw import SETTINGS_INITIAL_WINDOW_SIZE, RawH2, RstStreamFrame, get

pytestmark = pytest.mark.attack

FILL = 60_000             # leaves 5,535 bytes of the connection's 65,535 window
FIRST, REST = 10_000, 5_000
CANCEL = 0x8


class _Upstream(http.server.BaseHTTPRequestHandler):
    """`/two-part`: a body in two writes 0.3 s apart; anything else: its own path. The
    client port of each request shows which upstream connection carried it."""
    protocol_version = "HTTP/1.1"
    ports: dict[str, int] = {}

    def do_GET(self):
        self.ports[self.path] = self.client_address[1]
        if self.path == "/two-part":
            self.send_response(200)
            self.send_header("Content-Length", str(FIRST + REST))
            self.end_headers()
            self.wfile.write(b"A" * FIRST)
            self.wfile.flush()
            time.sleep(0.3)
            self.wfile.write(b"B" * REST)
            return
        body = self.path.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def upstream():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def test_a_reset_streams_unwritten_body_never_reaches_the_next_request(
        start_server, certs, tmp_path, upstream):
    files = tmp_path / "files"
    files.mkdir()
    (files / "fill.bin").write_bytes(b"f" * FILL)
    server = start_server(f"""
[server]
workers = 1

[[listen]]
address = "127.0.0.1:0"
[[listen.certificate]]
cert = "{certs["local"][0]}"
key = "{certs["local"][1]}"
names = ["localhost"]

[[site]]
hosts = ["*"]

[[site.route]]
prefix = "/files/"
type = "static"
root = "{files}"

[[site.route]]
prefix = "/"
type = "proxy"
upstream = "http://127.0.0.1:{upstream.server_address[1]}"
""")
    port = server.port("https")
    # Stream windows of 1 MiB, so the connection's window (never reopened) binds.
    client = RawH2(port, certs["ca"], settings={SETTINGS_INITIAL_WINDOW_SIZE: 1 << 20})
    fill = client.request(get(b"/files/fill.bin"))
    assert client.answers([fill])[fill].data == b"f" * FILL
    held = client.request(get(b"/two-part"))
    assert client.wait(lambda: len(client.streams[held].data) == 65_535 - FILL)
    time.sleep(0.8)                         # the rest arrived from the upstream
    client.pump(0.1)
    assert len(client.streams[held].data) == 65_535 - FILL      # and waits for the window
    client.send(RstStreamFrame(held, error_code=CANCEL))
    client.pump(0.3)
    next_client = RawH2(port, certs["ca"])
    try:
        nxt = next_client.request(get(b"/next"))
        answer = next_client.answers([nxt])[nxt]
        assert (answer.status, bytes(answer.data)) == (200, b"/next")
        # The same upstream connection carried both, or the test showed nothing.
        assert _Upstream.ports["/next"] == _Upstream.ports["/two-part"]
    finally:
        next_client.close()
        client.close()
