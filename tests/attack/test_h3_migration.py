"""An HTTP/3 client that changes address on an open QUIC connection (RFC 9000 section 9)
is judged where it is, as a TCP client that reconnected from there would be.

aioquic follows a client to a new address, and nestgate used to keep judging it by the
address it connected from: a phone that opened a connection on the one network let in
(`allow`) went on being served after it left, from anywhere, for as long as it kept the
connection busy; a client banned at its new address was not refused there; the request
log named the old address. Now the new address, once aioquic has validated it (the
client answered a challenge sent there), is the connection's client: bans, access lists
and the log are its. A request that comes from an address not validated yet is rejected
with H3_REQUEST_REJECTED (the client may send it again): a datagram's source address is
the sender's to write, so a request judged by it could be a client's that never sees
the answer, passing itself off as an address let in.

On loopback every 127.0.0.0/8 address is the machine's own: the client binds 127.0.0.2,
then moves to 127.0.0.3."""

from __future__ import annotations

import asyncio

import pytest
from aioquic.h3.connection import ErrorCode
from aioquic.quic.connection import QuicConnection
from aioquic.quic.packet import QuicErrorCode

import h3client
from conftest import Server, tls_block
from nestgate.bans.store import open_bans

pytestmark = pytest.mark.attack

HOME, AWAY = "127.0.0.2", "127.0.0.3"
RSS_GROWTH_KIB = 16 * 1024


class _Recorder(h3client.RecordingUpstream):
    seen: list = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"] or 0))
        self.seen.append((self.path, body))
        self.answer_ok()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, certs):
    """One worker (so every address reaches the one that knows the connection); only
    HOME is let in; a ban store the tests write operator bans into."""
    folder = tmp_path_factory.mktemp("h3move")
    store = folder / "bans.db"
    routes = f'allow = ["{HOME}"]\n' + h3client.HELLO_AND_APP + f'\n[bans]\nstore = "{store}"\n'
    for server in h3client.serve_with_upstream(folder, certs, _Recorder, 1, routes):
        server.bans = open_bans(str(store))
        yield server
        server.bans.close()


class _Moving:
    """An aioquic client on a socket bound to `HOME`, that can move to another."""

    def __init__(self, port: int, ca_file: str) -> None:
        self.port, self.ca_file = port, ca_file

    async def open(self, source: str) -> None:
        loop = asyncio.get_running_loop()
        self.quic = h3client._Client(QuicConnection(
            configuration=h3client.client_configuration(self.ca_file)))
        self.socket, _ = await loop.create_datagram_endpoint(
            lambda: self.quic, local_addr=(source, 0))
        self.quic.connect(("127.0.0.1", self.port))
        await asyncio.wait_for(self.quic.wait_connected(), 10)

    async def move(self, source: str) -> None:
        """From now on the client sends from, and reads at, `source`."""
        old = self.socket
        self.socket, _ = await asyncio.get_running_loop().create_datagram_endpoint(
            lambda: self.quic, local_addr=(source, 0))
        old.close()

    async def get(self, path: str = "/hello", method: str = "GET", body=None):
        return await asyncio.wait_for(
            self.quic.send_request(method, path, "localhost", body=body), 5)

    async def get_once_served(self, path: str = "/hello"):
        """The answer to `path`, sent again while it is rejected for an address not
        validated yet (a handful of round trips on loopback)."""
        for _ in range(20):
            reply = await self.get(path)
            if reply.reset != ErrorCode.H3_REQUEST_REJECTED:
                return reply
            await asyncio.sleep(0.05)
        raise AssertionError("rejected for ever")

    def close(self) -> None:
        self.quic.close()
        self.socket.close()


def test_a_client_that_moves_away_is_judged_at_its_new_address(gateway, certs):
    """Let in at HOME; moved to AWAY on the same connection: 403, as a new connection
    from AWAY gets. Before: 200 from AWAY for as long as the connection lasted."""
    rss_before = gateway.worker_rss_kib()

    async def attack():
        client = _Moving(gateway.port("https"), certs["ca"])
        await client.open(HOME)
        assert (await client.get()).status == 200
        await client.move(AWAY)
        replies = [await client.get_once_served() for _ in range(3)]
        assert [r.status for r in replies] == [403] * 3
        assert AWAY.encode() in replies[0].body       # the page names the address seen
        client.close()

    asyncio.run(attack())
    assert h3client.fetch(gateway.port("https"), certs["ca"]).status == 403   # from 127.0.0.1
    assert gateway.worker_rss_kib() - rss_before < RSS_GROWTH_KIB


def test_a_request_sent_from_an_address_not_validated_is_not_served(gateway, certs):
    """The client is at AWAY (refused); one datagram carrying a POST goes out with the
    source HOME, from a socket whose datagrams nobody reads, so the server's challenge
    there is never answered: the POST must not reach the upstream as HOME's (nor as
    AWAY's), and the connection goes on being AWAY's."""
    _Recorder.seen.clear()

    async def attack():
        client = _Moving(gateway.port("https"), certs["ca"])
        await client.open(AWAY)
        assert (await client.get()).status == 403
        loop = asyncio.get_running_loop()
        forged, _ = await loop.create_datagram_endpoint(
            asyncio.DatagramProtocol, local_addr=(HOME, 0))
        real = client.quic._transport
        client.quic._transport = forged          # the next datagram's source is HOME
        posted = client.quic.send_request("POST", "/app/forged", "localhost",
                                          body=b"x" * 100)
        client.quic._transport = real
        await asyncio.sleep(0.5)                 # the POST's datagram is in (loopback)
        assert (await client.get_once_served("/app/real")).status == 403
        forged.close()
        posted.cancel()
        client.close()

    asyncio.run(attack())
    assert _Recorder.seen == []


def test_a_client_that_moves_to_a_banned_address_is_refused_there(gateway, certs):
    """A ban on the new address ends the connection as it refuses a new one from there
    (CONNECTION_REFUSED). Before: the old address's connection went on being served."""
    gateway.bans.ban(AWAY, (3600.0,), 0.0, "operator", "", "moved", "close")
    try:
        async def refused_at_away() -> bool:
            client = _Moving(gateway.port("https"), certs["ca"])
            try:
                await client.open(AWAY)
                await client.get()
            except (ConnectionError, asyncio.TimeoutError):
                return client.quic.closed_with == QuicErrorCode.CONNECTION_REFUSED
            finally:
                client.socket.close()
            return False

        async def attack():
            for _ in range(50):                  # until the worker's table has the ban
                if await refused_at_away():
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("the ban never reached the worker")
            client = _Moving(gateway.port("https"), certs["ca"])
            await client.open(HOME)
            assert (await client.get()).status == 200
            await client.move(AWAY)
            with pytest.raises(ConnectionError):
                for _ in range(20):
                    reply = await client.get()
                    assert reply.reset == ErrorCode.H3_REQUEST_REJECTED, reply
                    await asyncio.sleep(0.05)
            assert client.quic.closed_with == QuicErrorCode.CONNECTION_REFUSED
            client.socket.close()

        asyncio.run(attack())
    finally:
        gateway.bans.unban(AWAY)
