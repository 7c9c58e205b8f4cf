"""Shared fixtures: real nestgate servers on 127.0.0.1:0, certificates from trustme;
and the helpers test modules share (`from conftest import ...`), so that no test
module imports another.

A server is a real `python -m nestgate serve` process. Its listening sockets are
bound before the workers start, so the port printed on stderr accepts (into the
backlog) as soon as it is read; readiness is the "ready" line, never a sleep.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import http.client
import json
import os
import re
import signal
import socket
import ssl
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from urllib.parse import urlencode

import httptools
import pytest
import trustme

from nestgate.handlers.auth import totp
from nestgate.handlers.auth.passwords import hash_password
from nestgate.base.clientip import V2_SIGNATURE

# A loopback port free now, never the same one twice in a run (for servers told their port).
from nestgate.bench.ports import free_port  # noqa: F401

REPO = Path(__file__).resolve().parent.parent
# The attack tests' raw clients (h2raw, rawupstream) serve other tests too, whichever
# directory pytest happens to collect first.
sys.path.insert(0, str(REPO / "tests" / "attack"))
_LISTEN = re.compile(r"listening on (https?)://(\S+):(\d+)")
_ADMIN = re.compile(r"admin API on https?://\S+:(\d+) ")
_ADMIN_TOKEN_FILE = re.compile(r"the token is in (\S+)\)")
# Admin port -> the token its server made at its first start (read from the file the
# server names), so that helpers reach the admin API of a server without a configured
# token the way `nestgate ctl` does.
ADMIN_TOKENS: dict[int, str] = {}


def admin_token(port: int) -> str:
    """The token a test server made for the admin listener on `port` ("" when its
    config sets one: the test passes it)."""
    return ADMIN_TOKENS.get(port, "")


class Server:
    """A running nestgate process and what it printed."""

    def __init__(self, config_path: Path, args=(), cwd=None, env=None) -> None:
        self.config_path = config_path
        cmd = [sys.executable, "-m", "nestgate", "serve", "--config", str(config_path), *args]
        self.proc = subprocess.Popen(cmd, cwd=cwd or config_path.parent, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env or _env())
        self.urls: list[tuple[str, str, int]] = []
        self.lines: list[str] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._read_stderr, daemon=True).start()
        self.stdout_lines: list[str] = []
        threading.Thread(target=self._read_stdout, daemon=True).start()
        # The supervisor's own line: "ready" alone is also in "Address already in use".
        self.wait_for("nestgate: ready (", timeout=20)

    def _read_stderr(self) -> None:
        for raw in self.proc.stderr:
            line = raw.decode(errors="replace").rstrip("\n")
            with self._cond:
                self.lines.append(line)
                m = _LISTEN.search(line)
                if m:
                    self.urls.append((m.group(1), m.group(2), int(m.group(3))))
                self._cond.notify_all()
        with self._cond:
            self.lines.append("<eof>")
            self._cond.notify_all()

    def _read_stdout(self) -> None:
        for raw in self.proc.stdout:
            with self._cond:
                self.stdout_lines.append(raw.decode(errors="replace").rstrip("\n"))
                self._cond.notify_all()

    def wait_for(self, text: str, timeout: float = 20, start: int = 0) -> str:
        """Block until a stderr line (from index `start`) contains `text`."""
        with self._cond:
            ok = self._cond.wait_for(
                lambda: any(text in l for l in self.lines[start:]) or "<eof>" in self.lines,
                timeout)
            found = [l for l in self.lines[start:] if text in l]
            if not ok or not found:
                raise AssertionError(f"server never printed {text!r}; stderr:\n"
                                     + "\n".join(self.lines))
            return found[0]

    def wait_stdout(self, predicate, timeout: float = 10) -> list[str]:
        with self._cond:
            self._cond.wait_for(lambda: predicate(self.stdout_lines), timeout)
            return list(self.stdout_lines)

    def port(self, scheme: str = "http") -> int:
        return next(p for s, _h, p in self.urls if s == scheme)

    def admin_port(self) -> int:
        for line in self.lines:
            m = _ADMIN.search(line)
            if m:
                port = int(m.group(1))
                made = _ADMIN_TOKEN_FILE.search(line)
                if made:
                    ADMIN_TOKENS[port] = Path(made.group(1)).read_text().strip()
                else:                       # the port may have served another test
                    ADMIN_TOKENS.pop(port, None)
                return port
        raise LookupError("no admin listener in the server's output")

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 20) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def children(self) -> list[int]:
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        return [int(p) for p in children.split()]

    def worker_pids(self) -> list[int]:
        """The supervisor's children but the admin process (named by its title)."""
        return [pid for pid in self.children() if not _is_admin(pid)]

    def admin_pid(self) -> int:
        return next(pid for pid in self.children() if _is_admin(pid))

    def worker_rss_kib(self) -> int:
        """Resident memory of the (first) worker, from /proc, in KiB."""
        return rss_kib(self.worker_pids()[0])


def rss_kib(pid: int) -> int:
    """VmRSS of a process from /proc/PID/status, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def cpu_seconds(pid: int) -> float:
    """The CPU time all threads of a process have used so far, from
    /proc/PID/task/*/schedstat (nanoseconds, where /proc/PID/stat counts 10 ms ticks)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            pass                           # a thread that ended meanwhile
    return total / 1e9


def _is_admin(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "nestgate-admin"
    except OSError:
        return False


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    # The admin listener is on by default at 127.0.0.1:7998; tests run many servers
    # at once, each with its own on a free port ("admin API on ..." names it).
    env.setdefault("NESTGATE_ADMIN", "127.0.0.1:0")
    return env


@pytest.fixture(scope="session")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="session")
def certs(ca, tmp_path_factory):
    """PEM files for localhost / 127.0.0.1, and a second pair for other.test."""
    folder = tmp_path_factory.mktemp("certs")
    out = {}
    for label, names in (("local", ["localhost", "127.0.0.1"]), ("other", ["other.test"])):
        cert = ca.issue_cert(*names)
        chain, key = folder / f"{label}.pem", folder / f"{label}.key"
        cert.private_key_pem.write_to_path(str(key))
        key.chmod(0o600)                    # as a deployment keeps it: no warning
        cert.cert_chain_pems[0].write_to_path(str(chain))
        for extra in cert.cert_chain_pems[1:]:
            chain.write_bytes(chain.read_bytes() + extra.bytes())
        out[label] = (str(chain), str(key))
    ca_file = folder / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    out["ca"] = str(ca_file)
    return out


@pytest.fixture
def start_server(tmp_path):
    """start_server(toml_text, *args, env={...}) -> Server, with `env` added to the
    usual environment; stopped at the end of the test."""
    servers: list[Server] = []

    def start(toml: str, *args: str, name: str = "nestgate.toml",
              env: dict | None = None) -> Server:
        path = tmp_path / name
        path.write_text(textwrap.dedent(toml))
        server = Server(path, args, env={**_env(), **env} if env else None)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


# Two workers answering "/" with a fixed body; `{admin}` is room for an [admin] table.
RETURN_SITE = """
[server]
workers = 2

[[listen]]
address = "127.0.0.1:0"

{admin}

[[site]]
hosts = ["*"]

[[site.route]]
path = "/"
type = "return"
body = "{body}"
"""


BASIC_SITE = """
[server]
workers = 1

[[listen]]
address = "127.0.0.1:0"

[[site]]
hosts = ["*"]

[[site.route]]
path = "/hello"
type = "return"
body = "hello\\n"
"""


def pytest_collection_modifyitems(items):
    # tests/attack holds no conftest of its own: a second `conftest` module would
    # shadow this one for the modules that import helpers from it.
    for item in items:
        if "/attack/" in str(item.fspath):
            item.add_marker(pytest.mark.attack)


def poll(produce, check, timeout: float = 10):
    deadline = time.monotonic() + timeout
    value = produce()
    while not check(value) and time.monotonic() < deadline:
        time.sleep(0.1)
        value = produce()
    return value


def still_serves(port: int) -> None:
    """A fresh connection still gets the `/hello` route's "hello\\n" (after an attack)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", "/hello")
    assert conn.getresponse().read() == b"hello\n"
    conn.close()


def admin_headers(port: int, token: str | None = None) -> dict:
    """Authorization for the admin API on `port`: `token`, else the one its server made
    (none when the config sets one and the test gives none)."""
    token = admin_token(port) if token is None else token
    return {"Authorization": f"Bearer {token}"} if token else {}


def scrape(port: int, token: str | None = None) -> tuple[int, str, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", "/metrics", headers=admin_headers(port, token))
    resp = conn.getresponse()
    text = resp.read().decode()
    conn.close()
    from prometheus_client.parser import text_string_to_metric_families
    samples = {}
    if resp.status == 200:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return resp.status, resp.getheader("content-type"), samples


def h2_protections(server) -> dict[str, float]:
    """The server's `nestgate_http2_protections_total` by reason, from its admin API."""
    _status, _type, samples = scrape(server.admin_port())
    return {labels["reason"]: value
            for labels, value in samples.get("nestgate_http2_protections_total", [])}


def tls_hello_config(certs, limits: str = "") -> str:
    """One worker, a TLS listener (h2 and http/1.1) for localhost, "/hello" answered
    "hello\\n", and `limits` (TOML lines) in [limits]: the server most HTTP/2 attack
    tests aim at."""
    chain, key = certs["local"]
    return f"""
[server]
workers = 1

[limits]
{limits}

[[listen]]
address = "127.0.0.1:0"
[[listen.certificate]]
cert = "{chain}"
key = "{key}"
names = ["localhost", "127.0.0.1"]

[[site]]
hosts = ["*"]

[[site.route]]
path = "/hello"
type = "return"
body = "hello\\n"
"""


# ---- HTTP/2 without sockets (tests/h2wire.py)
@pytest.fixture
def make_pump():
    """`h2wire.Pump(...)` closed at the end of the test."""
    import h2wire
    made = []

    def make(*args, **kwargs):
        made.append(h2wire.Pump(*args, **kwargs))
        return made[-1]
    yield make
    for pump in made:
        pump.close()


# ---- upstreams for proxy tests
# A WebSocket client's handshake lines: RFC 6455's sample key, and what answers it.
WS_KEY = b"dGhlIHNhbXBsZSBub25jZQ=="
WS_HANDSHAKE = b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: " + WS_KEY + b"\r\n"


def websocket_accept(key: bytes) -> bytes:
    """What a WebSocket server answers `key` with (RFC 6455 4.2.2)."""
    return base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())


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
    """A small HTTP/1.1 server on asyncio streams + httptools, run on its own
    thread and loop, bound to 127.0.0.1:0. What it answers depends on the path:

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
      /ws              101 Switching Protocols (its Sec-WebSocket-Accept answering the
                       request's key, RFC 6455 4.2.2), then echoes every byte
                       upper-cased; the tunnel's end is recorded in `tunnels_ended`
                       ("eof" when the proxy closed its side)
      /ws-h2c          101 Switching Protocols to h2c, whatever the request asked for
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
      /head-with-body  a 5-byte body for every method, HEAD too (a faulty upstream), a
                       moment after the head
      /hi              "hi", with the same head as /overrun's first response

    Every request is recorded in `requests`; `connections` counts accepted sockets.
    """

    def __init__(self, name: str = "up", ssl=None) -> None:
        self.name = name
        self.ssl = ssl
        self.requests: list[dict] = []
        self.connections = 0
        self.writers = set()
        self.healthy = True
        self.tunnels_ended: list[str] = []
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
        elif path == "/head-with-body":
            # A body whatever the method, HEAD too, a moment after the head: after the
            # proxy has finished the HEAD answer.
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n")
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(b"stray")
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
            key = dict(record["headers"]).get("sec-websocket-key", "")
            writer.write(b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n"
                         b"connection: upgrade\r\nsec-websocket-accept: %b\r\n"
                         b"x-tunnel: yes\r\n\r\nhello" % websocket_accept(key.encode()))
            if tail:
                writer.write(tail.upper())
            while data := await reader.read(65536):
                writer.write(data.upper())
                await writer.drain()
            self.tunnels_ended.append("eof")
            return False
        elif path == "/ws-h2c" and parser.should_upgrade():
            writer.write(b"HTTP/1.1 101 Switching Protocols\r\nupgrade: h2c\r\n"
                         b"connection: upgrade\r\n\r\n")
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


# ---- access control: a one-worker config, one request (after a PROXY header if given)
def config(sites: str, listen: str = "", top: str = "") -> str:
    return f"""
[server]
workers = 1
{top}
[[listen]]
address = "127.0.0.1:0"
{listen}
{sites}
"""


def ask(port: int, host: str = "app.test", path: str = "/hello", proxy: bytes = b"",
        headers: bytes = b"") -> tuple[int, bytes]:
    """One request on a new connection, optionally after a PROXY header."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(proxy + b"GET %s HTTP/1.1\r\nHost: %s\r\n%bConnection: close\r\n\r\n"
                     % (path.encode(), host.encode(), headers))
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    if not data:
        return 0, b""
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def v1(ip: str) -> bytes:
    family = b"TCP6" if ":" in ip else b"TCP4"
    dst = b"::1" if ":" in ip else b"127.0.0.1"
    return b"PROXY %s %s %s 40000 80\r\n" % (family, ip.encode(), dst)


def v2(ip: str) -> bytes:
    body = socket.inet_aton(ip) + socket.inet_aton("127.0.0.1") + struct.pack("!HH", 4000, 80)
    return V2_SIGNATURE + b"\x21\x11" + struct.pack("!H", len(body)) + body


HELLO = """
[[site.route]]
path = "/hello"
type = "return"
body = "hello"
"""


# ---- sign-in: a protected site, its users and a browser for it
PASSWORD_HASH = hash_password("demo-password")
TOTP_SECRET = totp.new_secret()
HTML = {"Accept": "text/html,application/xhtml+xml"}
# A fixed argon2id hash for configs that only need one to load.
HASH = ("$argon2id$v=19$m=65536,t=3,p=4$c8g/YgaM4wH4BBq0H2QTvg$"
        "IeV7kzhub6/NglonFM4gwRMzH74MGL89i1EnCIlEogY")


def protected(up_url: str, store: str, extra_auth: str = "", workers: int = 1,
              site_extra: str = "") -> str:
    return f"""
[server]
workers = {workers}

[[listen]]
address = "127.0.0.1:0"
proxy_protocol_from = ["127.0.0.1"]

[auth]
store = "{store}"
{extra_auth}

[[auth.user]]
name = "demo"
password = "{PASSWORD_HASH}"

[[auth.user]]
name = "otp"
password = "{PASSWORD_HASH}"
totp = "{TOTP_SECRET}"

[[site]]
hosts = ["private.test"]
protected = true
health = true                    # tests ask /api/v1/health which worker answers
{site_extra}

[[site.route]]
prefix = "/"
type = "proxy"
upstream = "{up_url}"

[[site]]
hosts = ["lan.test"]
allow = ["10.0.0.0/8"]

[[site.route]]
path = "/hello"
type = "return"
body = "hello"
"""


class Browser:
    """Just enough of a browser: one cookie jar, one Host. A new connection for each
    request, or with `keep` one kept-alive connection for all (so one worker).
    `headers` go with every request (what a proxy in front would add); with `tls` (an
    ssl.SSLContext) it speaks HTTPS."""

    def __init__(self, port: int, host: str = "private.test", keep: bool = False,
                 source: str = "127.0.0.1", headers: dict | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self.port, self.host = port, host
        self.source = (source, 0)        # the client's address: any of 127.0.0.0/8
        self.always = dict(headers or {})
        self.tls = tls
        self.jar: dict[str, str] = {}
        self.conn = None
        if keep:
            self.conn = self._connection()
            self.conn.connect()
            self.conn.auto_open = 0              # never quietly reconnect elsewhere

    def _connection(self) -> http.client.HTTPConnection:
        if self.tls is not None:
            return http.client.HTTPSConnection("127.0.0.1", self.port, timeout=10,
                                               source_address=self.source, context=self.tls)
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=10,
                                          source_address=self.source)

    def request(self, method: str, path: str, body: bytes | None = None, headers=None,
                cookies: bool = True):
        conn = self.conn or self._connection()
        hdrs = {"Host": self.host, **self.always}
        if cookies and self.jar:
            hdrs["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.jar.items())
        hdrs.update(headers or {})
        conn.request(method, path, body=body, headers=hdrs)
        resp = conn.getresponse()
        data = resp.read()
        for value in resp.msg.get_all("set-cookie") or []:
            name, _, rest = value.partition("=")
            val = rest.split(";", 1)[0]
            if "Max-Age=0" in value:
                self.jar.pop(name, None)
            else:
                self.jar[name] = val
        if conn is not self.conn:
            conn.close()
        return resp, data

    def form_token(self, path: str) -> str:
        """GET a form page; the CSRF token in it."""
        resp, page = self.request("GET", path, headers=HTML)
        assert resp.status == 200
        return re.search(rb'name="csrf" value="([0-9a-f]+)"', page).group(1).decode()

    def post_form(self, path: str, fields: dict, headers=None):
        hdrs = {"Content-Type": "application/x-www-form-urlencoded"}
        hdrs.update(headers or {})
        return self.request("POST", path, urlencode(fields).encode(), hdrs)

    def login_form(self, next_url: str = "/"):
        return self.form_token("/__auth__/login?" + urlencode({"next": next_url}))

    def sign_in(self, user="demo", password="demo-password", next_url="/", code=None,
                csrf=None, headers=None):
        token = self.login_form(next_url) if csrf is None else csrf
        fields = {"user": user, "password": password, "csrf": token, "next": next_url}
        if code is not None:
            fields["code"] = code
        return self.post_form("/__auth__/login", fields, headers)

    def sign_out(self, csrf=None, headers=None):
        token = self.form_token("/__auth__/logout") if csrf is None else csrf
        return self.post_form("/__auth__/logout", {"csrf": token}, headers)

    def worker_pid(self) -> int:
        """The worker answering (needs a session; meant for a `keep` browser)."""
        resp, body = self.request("GET", "/api/v1/health")
        assert resp.status == 200
        return json.loads(body)["pid"]


@pytest.fixture
def gate(start_server, upstream, tmp_path):
    up = upstream()

    def start(**kw):
        server = start_server(protected(up.url, str(tmp_path / "state.db"), **kw))
        return server, up
    return start


def settled_step(margin: float = 10.0) -> int:
    """The current TOTP step, first waiting for the next one when less than `margin`
    seconds of it are left: the codes of it and its neighbours keep their meaning to
    the server while a test runs. (A wait for the clock, not for a server.)"""
    left = totp.STEP - time.time() % totp.STEP
    if left < margin:
        time.sleep(left + 0.05)
    return int(time.time() // totp.STEP)


def otp_code(step: int) -> str:
    return totp.code_at(TOTP_SECRET, step)


# ---- TLS certificates for a listener, and the core end-to-end site
TEMPLATE = """
[server]
workers = 1

[limits]
header_timeout = "1s"
keepalive_timeout = "2s"
max_body = "1KiB"

[[listen]]
address = "127.0.0.1:0"
{tls}

[[site]]
name = "main"
hosts = ["localhost", "127.0.0.1", "*.example.test"]

[[site.route]]
path = "/hello"
type = "return"
body = "hello\\n"

[[site.route]]
prefix = "/docs/"
type = "return"
body = "docs\\n"

[[site.route]]
path = "/old"
type = "redirect"
to = "/hello"
status = 301
"""


def tls_block(certs) -> str:
    return (f'[[listen.certificate]]\ncert = "{certs["local"][0]}"\nkey = "{certs["local"][1]}"\n'
            f'names = ["localhost", "127.0.0.1"]\n'
            f'[[listen.certificate]]\ncert = "{certs["other"][0]}"\nkey = "{certs["other"][1]}"\n'
            f'names = ["other.test"]\n')


def read_all(sock) -> bytes:
    chunks = []
    while True:
        try:
            data = sock.recv(65536)
        except (ConnectionResetError, ssl.SSLError):
            break
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks)


def listeners(certs) -> str:
    """One worker, a plain and a TLS listener."""
    return ('[server]\nworkers = 1\n\n[[listen]]\naddress = "127.0.0.1:0"\n\n'
            f'[[listen]]\naddress = "127.0.0.1:0"\n{tls_block(certs)}\n')


# ---- rate limits: a two-worker site, requests from a chosen source, a load
RATE_LIMIT_SITE = """
[server]
workers = 2

[[listen]]
address = "127.0.0.1:0"
{listen}

[[site]]
hosts = ["*"]
{site}

[[site.route]]
path = "/"
type = "return"
body = "hello"

[[site.route]]
prefix = "/api/"
type = "return"
body = "api"
{route}
"""


def get_from(port: int, path: str = "/", headers: dict | None = None,
             source: str = "127.0.0.1"):
    """(status, headers, body) on a new connection from `source`."""
    with socket.create_connection(("127.0.0.1", port), timeout=5,
                                  source_address=(source, 0)) as sock:
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n{extra}\r\n"
                     .encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    fields = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), fields, body


def one_request(port: int, path: str = "/", host: str = "a", headers: dict | None = None,
                method: str = "GET", body: bytes | None = None, cookie: str = "",
                source: str = "127.0.0.1"):
    """One request on a new connection from `source` (http.client): (status, headers
    by lower-case name, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15,
                                      source_address=(source, 0))
    sent = {"Host": host, **(headers or {})}
    if cookie:
        sent["Cookie"] = cookie
    try:
        conn.request(method, path, body=body, headers=sent)
        resp = conn.getresponse()
        data = resp.read()
    finally:
        conn.close()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data


async def _load(port: int, connections: int, seconds: float) -> dict[int, int]:
    """Keep-alive requests on `connections` connections for `seconds`: statuses."""
    counts: dict[int, int] = {}
    deadline = time.monotonic() + seconds
    request = b"GET /api/x HTTP/1.1\r\nHost: a\r\n\r\n"

    async def one() -> None:
        while time.monotonic() < deadline:
            # A connection ends after keepalive_requests answers: open another.
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                while time.monotonic() < deadline:
                    writer.write(request)
                    head = (await reader.readuntil(b"\r\n\r\n")).lower()
                    status = int(head.split(b" ", 2)[1])
                    length = int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
                    await reader.readexactly(length)
                    counts[status] = counts.get(status, 0) + 1
                    if b"connection: close" in head:
                        break
            finally:
                writer.close()
    await asyncio.gather(*(one() for _ in range(connections)))
    return counts


# ---- notes pages: a two-worker notes site, a page fetch, a note on disk
NOTES_SITE = """
[server]
workers = 2

[[listen]]
address = "127.0.0.1:0"

[[site]]
hosts = ["*"]
base_url = "http://127.0.0.1"

[site.notes]
dir = "{notes}"
"""


def notes_get(port, path):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path)
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, body


def note(folder, slug, title, date, tags=(), draft=False, body="text"):
    tag_list = ", ".join(f'"{t}"' for t in tags)
    (folder / f"{slug}.md").write_text(
        f"---\ntitle: {title}\ndate: {date}\ntags: [{tag_list}]\ndraft: {str(draft).lower()}\n"
        f"---\n\n{body}\n")


# ---- static files: a site serving one folder
STATIC_SITE = """
[server]
workers = {workers}

[[listen]]
address = "127.0.0.1:0"
{tls}

[[site]]
hosts = ["*"]

[[site.route]]
prefix = "/"
type = "static"
root = "{root}"
sendfile_min = "64KiB"
recheck = "{recheck}"
{extra}
"""


def serve(start_server, root, extra="", recheck="1s", workers=1, tls=""):
    return start_server(STATIC_SITE.format(root=root, extra=extra, recheck=recheck,
                                           workers=workers, tls=tls))


def bench_summary(folder, *args: str, timeout: float) -> dict:
    """Run `nestgate bench ARGS --output folder --quiet` (one scenario) and return its
    summary.json; fails with the end of its stderr when it exits non-zero."""
    import json as _json
    out = subprocess.run([sys.executable, "-m", "nestgate", "bench", *args,
                          "--output", str(folder), "--quiet"],
                         capture_output=True, text=True, env=_env(), timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    [scenario] = [p for p in folder.iterdir() if p.is_dir()]
    summary = _json.loads((scenario / "summary.json").read_text())
    summary["folder"] = scenario
    return summary
