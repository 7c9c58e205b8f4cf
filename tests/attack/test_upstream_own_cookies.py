"""An upstream's answer that sets one of nestgate's own cookies.

The session cookie is taken out of every request an upstream gets, so that an app,
or whoever compromises it, never holds a token it could replay. The other way was
open: an app's `Set-Cookie: nestgate_session=...` reached the browser, which then sent
the app's chosen session to nestgate — the visitor signed in as someone else (their
notes and uploads going to that account), on every site under `cookie_domain` when
the app named the domain; or signed out, or handed a CSRF nonce or ceremony cookie
of the app's making. nestgate's own cookie names (`[auth] cookie_name`, the sign-in
form's CSRF cookie, the passkey ceremony's, the OpenID flow's) are now dropped from
every proxied answer's `Set-Cookie` lines; the app's own cookies pass.
"""

from __future__ import annotations

import socket

import h2.events
import pytest

from conftest import PASSWORD_HASH, read_all
from h2client import H2Client
from rawupstream import RawUpstream, proxy_toml

SET = (b"HTTP/1.1 200 OK\r\n"
       b"Set-Cookie: home_session=planted; Path=/; Domain=example.test; HttpOnly\r\n"
       b"Set-Cookie:  nestgate_csrf =planted; Path=/__auth__/\r\n"
       b"Set-Cookie: nestgate_webauthn=planted\r\n"
       b"set-cookie: nestgate_oidc=planted\r\n"
       b"Set-Cookie: app=1; Path=/\r\n"
       b"Set-Cookie: home_session_theme=dark\r\n"
       b"content-length: 2\r\n\r\nok")
KEPT = ["app=1; Path=/", "home_session_theme=dark"]


@pytest.fixture
def gateway(start_server, tmp_path):
    up = RawUpstream({"/set": SET})
    server = start_server(proxy_toml(up.url, listeners="http2_cleartext = true") + f"""
        [auth]
        store = "{tmp_path / 'state.db'}"
        cookie_name = "home_session"

        [[auth.user]]
        name = "demo"
        password = "{PASSWORD_HASH}"
        """.replace("\n        ", "\n"))
    yield server
    up.stop()


def test_an_upstream_cannot_set_nestgates_cookies(gateway):
    for _ in range(2):                      # read, then from the remembered head
        with socket.create_connection(("127.0.0.1", gateway.port()), timeout=5) as sock:
            sock.sendall(b"GET /set HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            head = read_all(sock).split(b"\r\n\r\n")[0].decode()
        assert head.startswith("HTTP/1.1 200 ")
        cookies = [line.split(":", 1)[1].strip() for line in head.split("\r\n")
                   if line.lower().startswith("set-cookie:")]
        assert cookies == KEPT


def test_an_upstream_cannot_set_nestgates_cookies_over_http2(gateway):
    client = H2Client(gateway.port(), None)
    try:
        stream = client.h2.get_next_available_stream_id()
        client.h2.send_headers(stream, [(b":method", b"GET"), (b":path", b"/set"),
                                        (b":scheme", b"http"), (b":authority", b"a")],
                               end_stream=True)
        client.send(client.h2.data_to_send())
        events = []
        while not any(isinstance(e, h2.events.StreamEnded) for e in events):
            events += client.h2.receive_data(client.recv())
        fields = next(e.headers for e in events if isinstance(e, h2.events.ResponseReceived))
        assert [v.decode() for k, v in fields if k == b"set-cookie"] == KEPT
    finally:
        client.close()
