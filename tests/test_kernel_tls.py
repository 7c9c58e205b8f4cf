"""Kernel TLS: detected at start and reported; where the kernel offers it, OpenSSL
hands a connection's records to it (TLS on the socket itself makes that possible)."""

from __future__ import annotations

import socket
import ssl

import pytest

from nestgate.wire.tls import OP_ENABLE_KTLS, kernel_tls_problem, server_context
from tlsserver import Server

SOL_TLS, TLS_TX = 282, 1

def test_the_start_says_whether_kernel_tls_is_used(start_server, certs):
    from conftest import tls_hello_config
    server = start_server(tls_hello_config(certs))
    problem = kernel_tls_problem()
    expected = "kernel TLS: on" if not problem else f"kernel TLS: off: {problem}"
    server.wait_for(expected)


def test_contexts_ask_openssl_for_kernel_tls_only_when_the_kernel_has_it(certs):
    class Listener:
        http2 = True
        certificates = [type("C", (), {"cert": certs["local"][0], "key": certs["local"][1],
                                       "names": ["localhost"], "managed": False})()]
    context = server_context(Listener())
    assert bool(context.options & OP_ENABLE_KTLS) == (not kernel_tls_problem())


@pytest.mark.skipif(bool(kernel_tls_problem()), reason=kernel_tls_problem() or "-")
def test_records_go_through_the_kernel_when_it_offers_tls(certs):
    server = Server(certs)
    server.context.options |= OP_ENABLE_KTLS
    server.context.set_ciphers("ECDHE+AESGCM")
    try:
        client = ssl.create_default_context(cafile=certs["ca"])
        client.maximum_version = ssl.TLSVersion.TLSv1_2      # kTLS TX in OpenSSL 3.0
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw:
            with client.wrap_socket(raw, server_hostname="localhost") as tls:
                tls.sendall(b"ping\n")
                assert tls.recv(100) == b"PING\n"
                sock = server.protocols[0].transport.get_extra_info("socket")
                # The kernel holds the transmit keys: the socket has a TLS_TX state.
                assert sock.getsockopt(SOL_TLS, TLS_TX, 64)
    finally:
        server.stop()
