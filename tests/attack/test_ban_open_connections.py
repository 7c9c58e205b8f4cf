"""A ban reaches the connections its client already has open, on every protocol.

A scanner (or a password sprayer) opens keep-alive HTTP/1.1 and HTTP/2 connections
first, then trips a rule on yet another connection: refusing only new connections at
accept would leave it the ones it holds, to go on with for as long as it keeps them busy.
The same for a ban the operator makes (the store, another instance, CrowdSec) while the
client is connected. Each worker looks its open connections up again when the shared
table changes: they get the page and, with `ban_answer = "close"`, are closed.

And the other way round: a trusted proxy is never banned for what a client behind it
does, even where the client is counted under the proxy's address (a head refused before
X-Forwarded-For is read): banning it would close every client's connections."""

from __future__ import annotations

import asyncio
import http.client
import socket
import ssl
import time

import h2.events
import pytest

from conftest import HELLO, config, get_from, tls_block
from h2client import H2Client
from nestgate.bans.store import open_bans

pytestmark = pytest.mark.attack

SCANNER = "127.0.0.70"
RULE = """
[[ban]]
name = "scanners"
on = "scanner"
paths = ["*.php"]
count = 3
window = "1m"
ban_for = ["1h"]
ban_loopback = true
ban_answer = "{answer}"
"""


def gateway(store, answer: str = "close", listen: str = "http2_cleartext = true",
            top: str = "") -> str:
    toml = config('\n[[site]]\nhosts = ["*"]\n' + HELLO + f'\n[bans]\nstore = "{store}"\n'
                  + RULE.format(answer=answer), listen, "workers = 2\n" + top)
    return toml.replace("workers = 1\n", "", 1)


def keep_alive(port: int, source: str) -> http.client.HTTPConnection:
    """A kept-alive HTTP/1.1 connection from `source`, with one request served on it."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5,
                                      source_address=(source, 0))
    conn.request("GET", "/hello")
    resp = conn.getresponse()
    assert (resp.status, resp.read()) == (200, b"hello")
    return conn


def closed_by_server(sock: socket.socket, timeout: float = 5.0) -> bool:
    """True once the server has closed `sock` (read to its end), within `timeout`; what
    came before the end (a GOAWAY, a last answer) is read and dropped."""
    sock.settimeout(timeout)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if not sock.recv(65536):
                return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False
    return False


def goaway_then_close(client: H2Client, timeout: float = 5.0) -> bool:
    """True when the server sends GOAWAY on `client`'s connection and closes it."""
    client.sock.settimeout(timeout)
    deadline, goaway = time.monotonic() + timeout, False
    try:
        while time.monotonic() < deadline:
            data = client.sock.recv(65536)
            if not data:
                return goaway
            for event in client.h2.receive_data(data):
                goaway = goaway or isinstance(event, h2.events.ConnectionTerminated)
    except ConnectionResetError:
        return goaway
    except socket.timeout:
        return False
    return goaway


def scan(port: int, source: str) -> None:
    """Trip the rule from new connections: three 404s on scanners' paths."""
    for path in ("/a.php", "/b.php", "/c.php"):
        try:
            get_from(port, path, source=source)
        except (ConnectionResetError, IndexError, ValueError):
            pass


def test_a_rule_ban_closes_the_clients_open_http1_and_http2_connections(
        start_server, tmp_path):
    server = start_server(gateway(tmp_path / "s.db"))
    port = server.port()
    rss_before = server.worker_rss_kib()
    kept = [keep_alive(port, SCANNER) for _ in range(3)]
    h2c = H2Client(port, None, source=SCANNER)
    assert h2c.request("GET", "/hello")[0] == 200
    bystander = keep_alive(port, "127.0.0.71")
    scan(port, SCANNER)
    server.wait_for(f"banned {SCANNER}/32 (scanners")
    # Every connection it held is ended by the server (over HTTP/2 with a GOAWAY),
    # whichever worker holds it, without it sending anything more.
    assert all(closed_by_server(conn.sock) for conn in kept)
    assert goaway_then_close(h2c)
    h2c.close()
    # Another client's kept-alive connection is served on.
    bystander.request("GET", "/hello")
    assert bystander.getresponse().status == 200
    bystander.close()
    assert server.worker_rss_kib() - rss_before < 8 * 1024


def test_an_operator_ban_gives_open_connections_the_page(start_server, tmp_path, certs):
    """A ban that comes through the store (`nestgate ban add`, the admin API, another
    instance) while the client is connected: its next request on any open connection,
    over HTTP/1.1, HTTP/2 and HTTP/3, is the page saying until when."""
    import h3client
    listen = "http3 = true\n" + tls_block(certs)
    server = start_server(gateway(tmp_path / "s.db", answer="403", listen=listen))
    port, ca = server.port("https"), certs["ca"]
    client = "127.0.0.1"                   # HTTP/3's source: aioquic binds no address
    bans = open_bans(str(tmp_path / "s.db"))

    def page(status_and_body) -> bool:
        status, body = status_and_body
        return status == 403 and b"banned until" in body and b"(abuse report)" in body

    async def attack() -> None:
        async with await h3client.session(port, ca) as quic:
            async def h3_get():
                reply = await asyncio.wait_for(
                    quic.send_request("GET", "/hello", "localhost"), 5)
                return reply.status, reply.body
            assert await h3_get() == (200, b"hello")
            h2 = H2Client(port, ca, source=client)
            assert h2.request("GET", "/hello")[0] == 200
            context = ssl.create_default_context(cafile=ca)
            h1 = http.client.HTTPSConnection("127.0.0.1", port, timeout=5, context=context,
                                             source_address=(client, 0))
            h1.request("GET", "/hello", headers={"Host": "localhost"})
            assert h1.getresponse().read() == b"hello"

            def h1_get():
                h1.request("GET", "/hello", headers={"Host": "localhost"})
                resp = h1.getresponse()
                return resp.status, resp.read()

            bans.ban(client, (3600.0,), 0.0, "operator", "", "abuse report", "403")
            deadline = time.monotonic() + 5
            seen = {}
            while len(seen) < 3 and time.monotonic() < deadline:
                for name, answer in (("h1", h1_get()), ("h2", h2.request("GET", "/hello")[::2]),
                                     ("h3", await h3_get())):
                    if page(answer):
                        seen[name] = answer
                    else:
                        assert answer == (200, b"hello"), (name, answer)
                await asyncio.sleep(0.2)
            assert set(seen) == {"h1", "h2", "h3"}, seen
            h1.close()
            h2.close()

    asyncio.run(attack())
    bans.close()


def test_a_trusted_proxy_is_never_banned_for_a_client_behind_it(start_server, tmp_path):
    """Malformed heads sent through a trusted proxy are counted before X-Forwarded-For
    is read, under the proxy's own address: the proxy is exempt, so its connections,
    and every client's requests on them, go on being served."""
    proxy = "127.0.0.60"
    rules = """
[[ban]]
name = "malformed"
on = "malformed"
count = 3
window = "1m"
ban_for = ["10m"]
ban_loopback = true
"""
    top = f'[client_ip]\ntrusted_proxies = ["{proxy}"]\n'
    toml = config('\n[[site]]\nhosts = ["*"]\n' + HELLO
                  + f'\n[bans]\nstore = "{tmp_path / "s.db"}"\n' + rules, "", top)
    server = start_server(toml)
    port = server.port()

    def through_proxy(head: bytes) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=5,
                                      source_address=(proxy, 0)) as sock:
            sock.sendall(head)
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
            return data

    bad = (b"GET /hello HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 198.51.100.2\r\n"
           b"Bad : space\r\n\r\n")
    answers = [through_proxy(bad)[:12] for _ in range(8)]
    assert answers == [b"HTTP/1.1 400"] * 8, answers
    good = (b"GET /hello HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 198.51.100.3\r\n"
            b"Connection: close\r\n\r\n")
    assert through_proxy(good).startswith(b"HTTP/1.1 200")
    assert not [line for line in server.lines if "banned" in line]
