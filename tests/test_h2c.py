"""HTTP/2 in clear with prior knowledge (`http2_cleartext = true` on a plain listener),
for a nestgate behind a proxy that ends TLS: the preface picks HTTP/2, anything else
is HTTP/1.1 on the same port, and a connection that says nothing is closed."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time

import pytest

from nestgate.cli import main as nestgate_main

CONFIG = """
[server]
workers = 1

[limits]
header_timeout = "1s"

[[listen]]
address = "127.0.0.1:0"
{option}

[[site]]
hosts = ["*"]

[[site.route]]
path = "/hello"
type = "return"
body = "hello\\n"
"""


@pytest.fixture
def h2c_server(start_server):
    return start_server(CONFIG.format(option="http2_cleartext = true"))


def test_curl_with_prior_knowledge_speaks_http2(h2c_server):
    run = subprocess.run(["curl", "-sS", "--http2-prior-knowledge", "-w", " %{http_version}",
                          f"http://127.0.0.1:{h2c_server.port()}/hello"],
                         capture_output=True, timeout=20)
    assert run.stdout == b"hello\n 2", run.stderr


@pytest.mark.skipif(shutil.which("h2load") is None, reason="h2load is installed by make test")
def test_h2load_in_clear_all_succeed(h2c_server):
    run = subprocess.run(["h2load", "-n", "400", "-c", "4", "-m", "10",
                          f"http://127.0.0.1:{h2c_server.port()}/hello"],
                         capture_output=True, text=True, timeout=60)
    assert "400 succeeded, 0 failed, 0 errored" in run.stdout, run.stdout + run.stderr
    assert "Application protocol: h2c" in run.stdout


def _ask(port: int, request: bytes, byte_by_byte: bool = False) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        if byte_by_byte:
            for i in range(len(request)):
                sock.sendall(request[i:i + 1])
                time.sleep(0.002)
        else:
            sock.sendall(request)
        return sock.recv(65536)


def test_http1_still_answers_on_the_same_port(h2c_server):
    port = h2c_server.port()
    answer = _ask(port, b"GET /hello HTTP/1.1\r\nHost: a\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200 OK") and answer.endswith(b"hello\n")
    # "P" could begin the preface ("PRI * HTTP/2.0"): a PUT sent a byte at a time is
    # HTTP/1.1 as soon as a byte differs.
    answer = _ask(port, b"PUT /hello HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n",
                  byte_by_byte=True)
    assert answer.startswith(b"HTTP/1.1 ") and b"hello\n" in answer


def test_a_connection_that_says_nothing_is_closed_after_header_timeout(h2c_server):
    with socket.create_connection(("127.0.0.1", h2c_server.port()), timeout=5) as sock:
        sock.sendall(b"PRI * HTTP")            # the preface begun, never finished
        start = time.monotonic()
        assert sock.recv(100) == b""
        assert time.monotonic() - start < 3


def test_off_by_default(start_server):
    server = start_server(CONFIG.format(option=""))
    answer = _ask(server.port(), b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 4")    # llhttp refuses it as HTTP/1.1


def test_check_refuses_it_on_a_tls_listener(tmp_path, certs, capsys):
    path = tmp_path / "nestgate.toml"
    path.write_text(CONFIG.format(option=(
        f'http2_cleartext = true\n[[listen.certificate]]\ncert = "{certs["local"][0]}"\n'
        f'key = "{certs["local"][1]}"\nnames = ["localhost"]')))
    assert nestgate_main(["check", "--config", str(path)]) != 0
    err = capsys.readouterr().err
    assert "http2_cleartext" in err and str(path) in err
