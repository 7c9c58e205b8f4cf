"""Upstream servers the proxy tests talk to, and checks that they behave.

`Upstream` is a small HTTP/1.1 server on asyncio streams + httptools, run on its
own thread and loop, bound to 127.0.0.1:0. What it answers depends on the path:

  /echo            JSON: method, target, headers, body size and sha256
  /hi, /cached     "hi"; /cached with its own Cache-Control: max-age=60
  /big?n=N&chunked  N bytes (Content-Length, or chunked)
  /slow-body       headers, 10 bytes, then waits until released (a stall mid-body)
  /stall           reads the request, never answers
  /garbage         answers bytes that are not HTTP
  /overrun/KIND    a whole 2-byte response "hi", then in the same write bytes it does
                   not owe: KIND "whole" a second response, "partial" the start of one,
                   "late" a second response after the body's last byte, which comes a
                   moment after its first; "no-content" a 204 followed by a body (the
                   connection stays open)
  /endless-header  a status line, 1 MiB of one header line, then waits until released
  /reset-mid-body  promises 100000 bytes, sends 1000, then resets the connection
  /close           a body delimited by closing the connection (no length)
  /ws              101 Switching Protocols, then echoes every byte upper-cased
  /status/N        an empty response with status N
  /connection-lines  a 2-byte response whose Connection header takes two field lines,
                   each naming a header it also sends (x-hop-one, x-hop-two)
  /then-close      200, but the next request on that connection is dropped unanswered
                   (an upstream that closed a kept-alive connection as we reused it)
  /health          200, or 503 once `healthy` is False
  /interim         100 Continue and 103 Early Hints, then the response, each head
                   written apart (so it reaches the proxy in its own read)
  /trickle-head    a response whose head comes a few bytes per write
  /vary?v=X        a 2-byte response with the header `x-vary: X`
  /late-body       a 10-byte body, half written with the head, half a moment later
  /hi              "hi", with the same head as /overrun's first response

Every request is recorded in `requests`; `connections` counts accepted sockets.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import struct
import threading

import httptools
import pytest


class _Parsed:
    def __init__(self) -> None:
        self.url = b""
        self.headers: list[tuple[str, str]] = []
        self.size = 0
        self.digest = hashlib.sha256()
        self.done = False
        self.upgrade = False

    def on_url(self, url):
        self.url += url

    def on_header(self, name, value):
        self.headers.append((name.decode().lower(), value.decode("latin-1")))

    def on_body(self, body):
        self.size += len(body)
        self.digest.update(body)

    def on_message_complete(self):
        self.done = True


class Upstream:
    def __init__(self, name: str = "up", ssl=None) -> None:
        self.name = name
        self.ssl = ssl
        self.requests: list[dict] = []
        self.connections = 0
        self.writers = set()
        self.healthy = True
        self.release = None
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self.thread.start()
        assert ready.wait(5)

    def _run(self, ready) -> None:
        asyncio.set_event_loop(self.loop)

        async def start():
            self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0,
                                                     ssl=self.ssl)
            self.port = self.server.sockets[0].getsockname()[1]
            self.release = asyncio.Event()
            ready.set()
        self.loop.run_until_complete(start())
        self.loop.run_forever()

    @property
    def url(self) -> str:
        return f"{'https' if self.ssl else 'http'}://127.0.0.1:{self.port}"

    def unblock(self) -> None:
        self.loop.call_soon_threadsafe(self.release.set)

    def stop(self) -> None:
        async def close():
            self.server.close()
            for writer in list(self.writers):
                writer.transport.abort()
            self.release.set()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            if tasks:
                # Aborted sockets end the serving tasks; cancel only what is left.
                _done, left = await asyncio.wait(tasks, timeout=2)
                for task in left:
                    task.cancel()
        asyncio.run_coroutine_threadsafe(close(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

    async def _serve(self, reader, writer) -> None:
        self.connections += 1
        self.writers.add(writer)
        drop_next = False
        try:
            while True:
                parsed = _Parsed()
                parser = httptools.HttpRequestParser(parsed)
                tail = b""
                while not parsed.done:
                    data = await reader.read(65536)
                    if not data:
                        return
                    try:
                        parser.feed_data(data)
                    except httptools.HttpParserUpgrade as exc:
                        parsed.upgrade = True
                        tail = data[exc.args[0]:]
                        parsed.done = True
                method = parser.get_method().decode()
                record = {"method": method, "target": parsed.url.decode(),
                          "headers": parsed.headers, "size": parsed.size,
                          "sha256": parsed.digest.hexdigest(), "upstream": self.name}
                self.requests.append(record)
                if drop_next:
                    record["dropped"] = True
                    return
                drop_next = record["target"] == "/then-close"
                if not await self._answer(record, parser, reader, writer, tail):
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.writers.discard(writer)
            writer.close()

    async def _answer(self, record, parser, reader, writer, tail) -> bool:
        target = record["target"]
        path, _, query = target.partition("?")
        keep = parser.should_keep_alive()
        if path.startswith("/status/"):
            status = int(path.rsplit("/", 1)[1])
            writer.write(b"HTTP/1.1 %d X\r\ncontent-length: 0\r\n\r\n" % status)
        elif path == "/connection-lines":
            writer.write(b"HTTP/1.1 200 OK\r\nconnection: x-hop-one\r\nx-hop-one: 1\r\n"
                         b"x-hop-two: 2\r\nconnection: keep-alive, x-hop-two\r\n"
                         b"x-end-to-end: kept\r\ncontent-length: 2\r\n\r\nok")
        elif path == "/interim":
            for piece in (b"HTTP/1.1 100 Continue\r\n\r\n",
                          b"HTTP/1.1 103 Early Hints\r\nlink: </a.css>; rel=preload\r\n\r\n",
                          b"HTTP/1.1 200 OK\r\nx-final: yes\r\ncontent-length: 2\r\n\r\nok"):
                writer.write(piece)
                await writer.drain()
                await asyncio.sleep(0.02)
        elif path == "/trickle-head":
            answer = (b"HTTP/1.1 200 OK\r\nx-trickled: all the way\r\nconnection: x-hop\r\n"
                      b"x-hop: no\r\ncontent-length: 7\r\n\r\nslowly!")
            for i in range(0, len(answer), 9):
                writer.write(answer[i:i + 9])
                await writer.drain()
                await asyncio.sleep(0.005)
        elif path == "/late-body":
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n01234")
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(b"56789")
        elif path == "/hi":
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhi")
        elif path == "/cached":
            writer.write(b"HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\n"
                         b"content-length: 2\r\n\r\nhi")
        elif path == "/vary":
            writer.write(b"HTTP/1.1 200 OK\r\nx-vary: %s\r\ncontent-length: 2\r\n\r\nok"
                         % query.partition("=")[2].encode())
        elif path == "/health":
            status = 200 if self.healthy else 503
            writer.write(b"HTTP/1.1 %d X\r\ncontent-length: 2\r\n\r\nok" % status)
        elif path == "/big":
            params = dict(p.partition("=")[::2] for p in query.split("&") if p)
            n = int(params.get("n", "0"))
            chunked = "chunked" in params
            block = bytes(range(256)) * 256            # 64 KiB
            if chunked:
                writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n"
                             b"content-type: application/octet-stream\r\n\r\n")
            else:
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n"
                             b"content-type: application/octet-stream\r\n\r\n" % n)
            left = n
            while left > 0 and record["method"] != "HEAD":
                part = block[:min(left, len(block))]
                writer.write(b"%x\r\n%b\r\n" % (len(part), part) if chunked else part)
                left -= len(part)
                await writer.drain()
            if chunked:
                writer.write(b"0\r\n\r\n")
        elif path == "/slow-body":
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 20\r\n\r\n0123456789")
            await writer.drain()
            await self.release.wait()
            writer.write(b"abcdefghij")
        elif path == "/stall":
            await self.release.wait()
            return False
        elif path == "/garbage":
            writer.write(b"this is not HTTP at all\r\n\r\n")
            await writer.drain()
            return False
        elif path.startswith("/overrun/"):
            whole = (b"HTTP/1.1 200 OK\r\nx-evil: 1\r\ncontent-length: 22\r\n\r\n"
                     b"another user's answer!")
            kind = path.rsplit("/", 1)[1]
            extra = {"whole": whole, "partial": b"HTTP/1.1 200 OK\r\nx-ev", "late": whole,
                     "no-content": b""}[kind]
            if kind == "late":
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nh")
                await writer.drain()
                await asyncio.sleep(0.05)
                writer.write(b"i" + extra)
            elif extra:
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhi" + extra)
            else:
                writer.write(b"HTTP/1.1 204 No Content\r\n\r\nnot a body")
        elif path == "/endless-header":
            writer.write(b"HTTP/1.1 200 OK\r\nx-endless: ")
            try:
                for _ in range(64):
                    writer.write(b"e" * 16384)
                    await writer.drain()
            except ConnectionError:
                return False                # the proxy gave up on us: as it should
            await self.release.wait()
            return False
        elif path == "/reset-mid-body":
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n" + b"x" * 1000)
            await writer.drain()
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return False
        elif path == "/close":
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nuntil the end")
            await writer.drain()
            return False
        elif path == "/ws" and record.get("method") == "GET" and parser.should_upgrade():
            writer.write(b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n"
                         b"connection: upgrade\r\nx-tunnel: yes\r\n\r\nhello")
            if tail:
                writer.write(tail.upper())
            while data := await reader.read(65536):
                writer.write(data.upper())
                await writer.drain()
            return False
        else:
            body = json.dumps(record).encode()
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\nx-upstream: %s\r\nconnection: keep-alive, x-hop"
                         b"\r\nx-hop: secret\r\nkeep-alive: timeout=5\r\n\r\n%b"
                         % (len(body), self.name.encode(), body))
        await writer.drain()
        return keep


def refused_port() -> int:
    """A port nothing listens on (bound, then closed)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


@pytest.fixture
def upstream():
    servers = []

    def make(name: str = "up", ssl=None) -> Upstream:
        server = Upstream(name, ssl)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.unblock()
        server.stop()


def test_upstream_answers_echo(upstream):
    import http.client
    up = upstream()
    conn = http.client.HTTPConnection("127.0.0.1", up.port, timeout=5)
    conn.request("POST", "/echo?x=1", body=b"abc")
    data = json.loads(conn.getresponse().read())
    assert data["target"] == "/echo?x=1" and data["size"] == 3
