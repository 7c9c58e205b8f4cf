"""Requests hidden after a body the server refused to wait for.

A request that says `Expect: 100-continue` and is answered at once (a ready answer,
no 100 sent) ends the connection: the client may or may not send its body now, so
nothing after the answer can be told apart from body bytes (RFC 9110 10.1.1). The
HTTP/1.1 engine used to go on parsing what followed and answered the requests in it
after it had closed the connection (the bytes were dropped, the work was done:
every hidden request was routed and counted). Now nothing after the answer is read:
one answer, `connection: close`, the end of the connection, none of the hidden
requests counted, and the worker keeps its size.
"""

from __future__ import annotations

import socket
import time

from conftest import BASIC_SITE, poll, scrape, still_serves

READ_SECONDS = 5.0
HIDDEN = 2000                     # requests sent where the body would be
RSS_GROWTH_BOUND_KIB = 8 * 1024

# The basic site, with the admin listener whose metrics count the answers.
CONFIG = BASIC_SITE.replace("[[site]]", '[admin]\naddress = "127.0.0.1:0"\n\n[[site]]', 1)


def answered(admin: int) -> float:
    """Requests the site has answered, from the worker's metrics."""
    return sum(value for labels, value in scrape(admin)[2].get("nestgate_requests_total", [])
               if labels.get("route") == "/hello")


def test_requests_after_an_answer_that_refused_an_expected_body_are_not_read(start_server):
    server = start_server(CONFIG)
    port = server.port()
    still_serves(port)
    start = server.worker_rss_kib()
    attack = (b"POST /hello HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n"
              b"Expect: 100-continue\r\n\r\ndata"
              + b"GET /hello HTTP/1.1\r\nHost: a\r\n\r\n" * HIDDEN)
    received = b""
    with socket.create_connection(("127.0.0.1", port), timeout=READ_SECONDS) as sock:
        try:
            sock.sendall(attack)
        except (BrokenPipeError, ConnectionResetError):
            pass                         # the server closed while the rest was on its way
        deadline = time.monotonic() + READ_SECONDS
        ended = False
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                ended = True
                break
            if not chunk:
                ended = True
                break
            received += chunk
    assert ended, "the connection was not ended after the answer"
    assert received.count(b"HTTP/1.1 ") == 1, received[:400]
    head = received.split(b"\r\n\r\n", 1)[0].lower()
    assert b"connection: close" in head
    growth = server.worker_rss_kib() - start
    # The first visit, the refused POST and nothing else (metrics are published twice
    # a second: wait for the POST's count, then for a later publication).
    admin = server.admin_port()
    assert poll(lambda: answered(admin), lambda n: n >= 2) == 2
    time.sleep(1.0)
    assert answered(admin) == 2, "requests hidden after the refused body were read"
    assert growth < RSS_GROWTH_BOUND_KIB, f"worker grew {growth / 1024:.1f} MiB"
    still_serves(port)
