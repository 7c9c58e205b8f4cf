"""ALPN without a protocol in common: the no_application_protocol alert (RFC 7301 3.2).

A client that offers ALPN protocols, none of them one the listener speaks ("h3" alone,
"spdy/1"), is answered with the fatal no_application_protocol alert, as nginx answers
it; before, its handshake completed with no protocol and the connection went on as
HTTP/1.1. A client that offers no ALPN at all is served HTTP/1.1, and one whose offer
includes a protocol of ours gets it. The same over the socket's TLS, the event loop's
TLS, and after a PROXY header; with a Python client and with `openssl s_client`.
"""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess

import pytest

from conftest import TEMPLATE, read_all, tls_block, v1



def config(certs, http2: str = "true", proxy: str = "") -> str:
    """conftest's TEMPLATE site on one TLS listener with `http2` and `proxy` set."""
    return TEMPLATE.format(tls=f"http2 = {http2}\n{proxy}\n{tls_block(certs)}")


NO_PROTOCOL_ALERT = "tlsv1 alert no application protocol"   # OpenSSL's words for alert 120
SETUPS = {
    "socket-tls": ({"NESTGATE_LOOP_TLS": "0"}, "", b""),
    "loop-tls": ({"NESTGATE_LOOP_TLS": "1"}, "", b""),
    "after-proxy-header": ({}, 'proxy_protocol_from = ["127.0.0.1/32"]', v1("10.1.2.3")),
}


@pytest.fixture(params=list(SETUPS))
def setup(request, start_server, certs):
    """(port, bytes to send in clear before the ClientHello)."""
    env, proxy, preamble = SETUPS[request.param]
    server = start_server(config(certs, proxy=proxy), env=env)
    return server.port("https"), preamble


def handshake(port: int, ca: str, alpn: list[str] | None, preamble: bytes = b""):
    """(selected ALPN protocol, the answer to GET /hello) over a new TLS connection."""
    ctx = ssl.create_default_context(cafile=ca)
    if alpn is not None:
        ctx.set_alpn_protocols(alpn)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        raw.sendall(preamble)
        with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
            selected = tls.selected_alpn_protocol()
            tls.sendall(b"GET /hello HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            return selected, read_all(tls)


@pytest.mark.parametrize("offer", [["h3"], ["spdy/1"], ["spdy/1", "h3", "hq-interop"]])
def test_an_offer_with_nothing_in_common_gets_the_alert(offer, setup, certs):
    port, preamble = setup
    with pytest.raises(ssl.SSLError) as refused:
        handshake(port, certs["ca"], offer, preamble)
    assert NO_PROTOCOL_ALERT in str(refused.value), refused.value


def test_no_offer_is_http1_and_an_offer_in_common_is_taken(setup, certs):
    port, preamble = setup
    selected, answer = handshake(port, certs["ca"], None, preamble)
    assert selected is None
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"hello\n")
    selected, answer = handshake(port, certs["ca"], ["h3", "http/1.1"], preamble)
    assert selected == "http/1.1"
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"hello\n")
    assert handshake(port, certs["ca"], ["h2", "http/1.1"], preamble)[0] == "h2"


def test_h2_is_refused_where_the_listener_does_not_offer_it(start_server, certs):
    server = start_server(config(certs, http2="false"))
    with pytest.raises(ssl.SSLError) as refused:
        handshake(server.port("https"), certs["ca"], ["h2"])
    assert NO_PROTOCOL_ALERT in str(refused.value), refused.value
    assert handshake(server.port("https"), certs["ca"], ["h2", "http/1.1"])[0] == "http/1.1"


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl command")
@pytest.mark.parametrize("loop_tls", ["0", "1"])
def test_openssl_s_client_offering_h3_gets_the_alert(loop_tls, start_server, certs):
    server = start_server(config(certs), env={"NESTGATE_LOOP_TLS": loop_tls})
    run = subprocess.run(["openssl", "s_client", "-connect",
                          f"127.0.0.1:{server.port('https')}", "-servername", "localhost",
                          "-alpn", "h3"], input=b"", capture_output=True, timeout=20)
    output = (run.stdout + run.stderr).decode(errors="replace")
    assert "alert no application protocol" in output, output
    assert "SSL alert number 120" in output, output
