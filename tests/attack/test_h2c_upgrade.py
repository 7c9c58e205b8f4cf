"""`Upgrade: h2c` through the proxy, to an upstream that speaks it (Hypercorn).

A proxy route used to pass any Upgrade token and forward `HTTP2-Settings`: an
h2c-capable upstream answered `101`, and the HTTP/2 requests the client sent inside
the tunnel reached paths the route's access list refuses, unlogged and unlimited.
A route now passes only the protocols it names (`upgrade = ["websocket"]` by
default; `h2c` can never be named) and never forwards `HTTP2-Settings`: the request
goes upstream as a plain HTTP/1.1 request, is answered as one, and the connection
ends after the answer, so what the client sent after it is never read.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import h2.config
import h2.connection
import pytest
from hypercorn.asyncio import serve
from hypercorn.config import Config

from rawupstream import proxy_toml

RSS_GROWTH_BOUND_KIB = 8 * 1024


class H2cUpstream:
    """Hypercorn on 127.0.0.1:0 (its own thread and loop) serving an app that
    records every request it gets (path, HTTP version, header names) and answers 200
    with the path as the body."""

    def __init__(self) -> None:
        self.seen: list[dict] = []
        sock = socket.create_server(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.fd = sock.detach()             # Hypercorn takes the socket (and closes it)
        self.url = f"http://127.0.0.1:{self.port}"
        self.loop = asyncio.new_event_loop()
        self.stopped: asyncio.Event | None = None
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self.thread.start()
        assert ready.wait(5)

    async def app(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        self.seen.append({"path": scope["path"], "http_version": scope["http_version"],
                          "headers": {n.decode().lower() for n, _v in scope["headers"]}})
        body = scope["path"].encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.stopped = asyncio.Event()
        config = Config()
        config.bind = [f"fd://{self.fd}"]
        config.accesslog = config.errorlog = None
        self.loop.call_soon(ready.set)
        self.loop.run_until_complete(serve(self.app, config, shutdown_trigger=self.stopped.wait))

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.stopped.set)
        self.thread.join(5)


@pytest.fixture
def h2c_upstream():
    up = H2cUpstream()
    yield up
    up.stop()


def gateway(url: str, route_extra: str = "") -> str:
    """The proxy gateway (`route_extra` keys on its "/" route) and an /admin/ route
    this client may not reach."""
    return proxy_toml(url, routes=f"""
{route_extra}

[[site.route]]
prefix = "/admin/"
type = "proxy"
upstream = "{url}"
allow = ["192.0.2.1"]
""")


def h2c_attack(path: str = "/public") -> bytes:
    """An HTTP/1.1 request asking to switch to h2c (RFC 7540 3.2), followed at once by
    the HTTP/2 preface and a request for /admin/secret, which the route refuses."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    settings = conn.initiate_upgrade_connection()
    conn.send_headers(3, [(":method", "GET"), (":scheme", "http"), (":path", "/admin/secret"),
                          (":authority", "app.test")], end_stream=True)
    upgrade = (f"GET {path} HTTP/1.1\r\nHost: app.test\r\n"
               "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
               f"HTTP2-Settings: {settings.decode()}\r\n\r\n").encode()
    return upgrade + conn.data_to_send()


def exchange(port: int, data: bytes, seconds: float = 5.0) -> tuple[bytes, bool]:
    """Send `data`, read until the peer closes (True) or `seconds` pass (False)."""
    got = b""
    with socket.create_connection(("127.0.0.1", port), timeout=seconds) as sock:
        sock.sendall(data)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = sock.recv(65536)
            except socket.timeout:
                return got, False
            except ConnectionResetError:
                return got, True
            if not chunk:
                return got, True
            got += chunk
    return got, False


def test_the_upstream_switches_to_h2c_when_asked_directly(h2c_upstream):
    # What the proxy must never let through: asked itself, the upstream switches and
    # answers the refused path over HTTP/2.
    got, _closed = exchange(h2c_upstream.port, h2c_attack(), seconds=2)
    assert got.startswith(b"HTTP/1.1 101 "), got[:200]
    assert any(r["path"] == "/admin/secret" and r["http_version"] == "2"
               for r in h2c_upstream.seen), h2c_upstream.seen


@pytest.mark.parametrize("route_extra", [
    pytest.param("", id="default"),
    pytest.param("websocket = true", id="websocket-true"),
    pytest.param('upgrade = ["websocket"]', id="upgrade-websocket"),
    pytest.param("websocket = false", id="websocket-false"),
])
def test_h2c_upgrade_is_never_tunnelled(start_server, h2c_upstream, route_extra):
    server = start_server(gateway(h2c_upstream.url, route_extra))
    port = server.port()
    start = server.worker_rss_kib()
    got, closed = exchange(port, h2c_attack())
    assert got.startswith(b"HTTP/1.1 200 "), got[:200]
    assert got.count(b"HTTP/1.1 ") == 1 and got.endswith(b"\r\n\r\n/public"), got[-200:]
    assert b"connection: close" in got.lower()
    assert closed, "the connection stayed open after the answer to an upgrade request"
    # One plain HTTP/1.1 request reached the upstream, without the upgrade's fields.
    time.sleep(0.2)
    assert [(r["path"], r["http_version"]) for r in h2c_upstream.seen] == [("/public", "1.1")]
    headers = h2c_upstream.seen[0]["headers"]
    assert "upgrade" not in headers and "http2-settings" not in headers, headers
    assert "connection" not in headers, headers
    # The refused path stays refused when asked openly.
    got, _closed = exchange(port, b"GET /admin/secret HTTP/1.1\r\nHost: app.test\r\n"
                                  b"Connection: close\r\n\r\n")
    assert got.startswith(b"HTTP/1.1 403 ")
    assert len(h2c_upstream.seen) == 1
    assert server.worker_rss_kib() - start < RSS_GROWTH_BOUND_KIB


def test_http2_settings_is_never_forwarded(start_server, h2c_upstream):
    # Without an upgrade request at all, the field still stays behind.
    server = start_server(gateway(h2c_upstream.url))
    got, _closed = exchange(server.port(), b"GET /plain HTTP/1.1\r\nHost: app.test\r\n"
                                           b"HTTP2-Settings: AAMAAABkAAQAAP__\r\n"
                                           b"Connection: close\r\n\r\n")
    assert got.startswith(b"HTTP/1.1 200 ")
    assert [r["path"] for r in h2c_upstream.seen] == ["/plain"]
    assert "http2-settings" not in h2c_upstream.seen[0]["headers"]
