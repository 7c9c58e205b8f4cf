"""TLS session resumption: a browser that comes back resumes its TLS 1.3 session with a
ticket instead of a full handshake, whichever worker it reaches (the ticket keys belong
to the listener's context, made once by the supervisor before the workers fork)."""

from __future__ import annotations

import json
import socket
import ssl

CONFIG = """
[server]
workers = 2

[[listen]]
address = "127.0.0.1:0"
[[listen.certificate]]
cert = "{cert}"
key = "{key}"
names = ["localhost"]

[[site]]
hosts = ["*"]
"""


def health(port: int, ctx: ssl.SSLContext, session=None):
    """(worker pid, whether the session was resumed, the session to resume next)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost", session=session) as tls:
            tls.sendall(b"GET /api/v1/health HTTP/1.1\r\nHost: localhost\r\n"
                        b"Connection: close\r\n\r\n")
            data = b""
            while chunk := tls.recv(65536):
                data += chunk
            # TLS 1.3 tickets arrive after the handshake: the session is complete now.
            return json.loads(data.partition(b"\r\n\r\n")[2])["pid"], tls.session_reused, \
                tls.session


def test_a_returning_client_resumes_its_session_on_every_worker(start_server, certs):
    server = start_server(CONFIG.format(cert=certs["local"][0], key=certs["local"][1]))
    port = server.port("https")
    ctx = ssl.create_default_context(cafile=certs["ca"])
    ctx.set_alpn_protocols(["http/1.1"])
    first_pid, reused, session = health(port, ctx)
    assert not reused and session is not None and session.has_ticket
    resumed_on = set()
    for _ in range(40):                 # new connections spread over both workers
        pid, reused, _next = health(port, ctx, session)
        assert reused, "a full handshake where the ticket should have resumed"
        resumed_on.add(pid)
        if len(resumed_on | {first_pid}) == 2 and resumed_on - {first_pid}:
            break
    assert resumed_on - {first_pid}, "never reached the other worker"
    assert set(server.worker_pids()) == resumed_on | {first_pid}
