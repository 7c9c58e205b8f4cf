"""A WebSocket tunnel opened with a sign-in session outlives that session no longer.

The tunnel is let through by its upgrade request; before, signing out (or the operator
revoking the session of a stolen cookie through the admin API) refused the session's
later requests while the tunnel it had open went on carrying bytes for as long as they
flowed. Now each worker asks the store about the sessions with a tunnel open (as a
request would, once a second) and cuts the tunnels of one that ended; the tunnel of a
live session goes on."""

from __future__ import annotations

import http.client
import socket
import time

import pytest

from conftest import WS_HANDSHAKE, Browser, admin_headers

pytestmark = pytest.mark.attack


def _open_tunnel(port: int, browser: Browser) -> socket.socket:
    cookie = "; ".join(f"{k}={v}" for k, v in browser.jar.items())
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(b"GET /ws HTTP/1.1\r\nHost: private.test\r\nConnection: Upgrade\r\n"
                 b"Upgrade: websocket\r\n%sCookie: %s\r\n\r\n"
                 % (WS_HANDSHAKE, cookie.encode()))
    data = b""
    while not data.endswith(b"hello"):
        chunk = sock.recv(65536)
        assert chunk, data                  # closed before the tunnel's greeting
        data += chunk
    assert data.startswith(b"HTTP/1.1 101")
    return sock


def _echoes(sock: socket.socket) -> bool:
    """The tunnel still carries bytes both ways (False once it is cut)."""
    try:
        sock.sendall(b"ping")
        return sock.recv(65536) == b"PING"
    except OSError:
        return False


def _cut_within(sock: socket.socket, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _echoes(sock):
            return True
        time.sleep(0.2)
    return False


def _revoke_all(server, user: str) -> None:
    port = server.admin_port()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("DELETE", f"/v1/users/{user}/sessions", headers=admin_headers(port))
    assert conn.getresponse().status == 200
    conn.close()


@pytest.mark.parametrize("ended_by", ["sign-out", "revocation"])
def test_a_tunnel_is_cut_when_its_session_ends(gate, ended_by):
    server, _up = gate()
    browser = Browser(server.port())
    assert browser.sign_in()[0].status == 303
    tunnel = _open_tunnel(server.port(), browser)
    assert _echoes(tunnel)
    if ended_by == "sign-out":
        assert browser.sign_out()[0].status == 303
    else:
        _revoke_all(server, "demo")
    assert _cut_within(tunnel, 5.0), "the tunnel went on after its session ended"
    tunnel.close()
    still_out = Browser(server.port())
    still_out.jar = dict(browser.jar)
    assert still_out.request("GET", "/echo")[0].status == 401


def test_the_tunnel_of_a_live_session_goes_on(gate):
    server, _up = gate()
    browser = Browser(server.port())
    assert browser.sign_in()[0].status == 303
    tunnel = _open_tunnel(server.port(), browser)
    other = Browser(server.port())
    assert other.sign_in()[0].status == 303
    other_tunnel = _open_tunnel(server.port(), other)
    assert other.sign_out()[0].status == 303            # another session ends
    assert _cut_within(other_tunnel, 5.0)
    deadline = time.monotonic() + 3.0                   # several store checks later
    while time.monotonic() < deadline:
        assert _echoes(tunnel)
        time.sleep(0.3)
    tunnel.close()
    other_tunnel.close()
