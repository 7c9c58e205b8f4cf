"""Processes: reload and graceful stop under load, worker restart, bad reloads, log reopen."""

from __future__ import annotations

import errno
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import BASIC_SITE, _env

CONFIG = """
[server]
workers = 2
shutdown_timeout = "5s"

[log]
log_loopback = true
flush_interval = "100ms"
path = "{log}"

[[listen]]
address = "127.0.0.1:0"

[[site]]
hosts = ["*"]

[[site.route]]
path = "/hello"
type = "return"
body = "{body}"
"""


class Load:
    """Keep-alive clients sending GET /hello until stopped; failures are counted.

    A request fails if it was sent on an accepted connection and got no complete
    200 answer. Once a stop is under way (`stopping`), new connections are refused,
    or reset if the kernel completed their handshake before the listening socket
    closed and no worker took them (nginx's stop does the same): that is the expected
    end, not a failure. A reset on a connection that was answered before is one."""

    def __init__(self, port: int, clients: int = 4) -> None:
        self.port = port
        self.stop = threading.Event()
        self.ok = 0
        self.bodies: list[bytes] = []
        self.failures: list = []
        self.refused = 0
        self.stopping = False
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]
        for t in self.threads:
            t.start()

    def _run(self) -> None:
        conn = None
        fresh = True                 # no answer came on this connection yet
        while not self.stop.is_set():
            if conn is None:
                fresh = True
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
                try:
                    conn.connect()
                except ConnectionRefusedError:
                    with self.lock:
                        self.refused += 1
                    conn = None
                    self.stop.wait(0.01)
                    continue
            try:
                conn.request("GET", "/hello")
                resp = conn.getresponse()
                body = resp.read()
                fresh = False
                with self.lock:
                    if resp.status == 200:
                        self.ok += 1
                        self.bodies.append(body)
                    else:
                        self.failures.append(f"status {resp.status}")
                if resp.will_close:
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException) as exc:
                with self.lock:
                    if fresh and self.stopping and isinstance(exc, ConnectionResetError):
                        self.refused += 1           # never taken by a worker: see above
                    else:
                        self.failures.append(("stopping" if self.stopping else "serving",
                                              "fresh" if fresh else "answered", repr(exc)))
                conn.close()
                conn = None

    def until(self, predicate, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, "load never reached the expected state"
            self.stop.wait(0.01)

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(15)


def test_reload_and_graceful_stop_under_load_lose_nothing(start_server, tmp_path):
    log = tmp_path / "access.log"
    server = start_server(CONFIG.format(log=log, body="v1"))
    old_workers = set(server.worker_pids())
    load = Load(server.port())
    load.until(lambda: load.ok > 200)

    server.config_path.write_text(CONFIG.format(log=log, body="v2"))
    mark = len(server.lines)
    server.signal(signal.SIGHUP)
    server.wait_for("reloaded", start=mark)
    load.until(lambda: load.bodies[-1:] == [b"v2"] and load.bodies[-50:].count(b"v2") == 50)
    server.wait_for("previous workers finished", start=mark)
    assert not old_workers & set(server.worker_pids())      # old generation drained away

    before_stop = load.ok
    load.stopping = True
    server.signal(signal.SIGTERM)
    assert server.proc.wait(15) == 0
    load.until(lambda: load.refused > 0)
    load.finish()
    assert load.failures == []
    assert load.ok > before_stop > 200


def test_in_flight_request_finishes_during_stop(start_server, tmp_path):
    server = start_server(CONFIG.format(log=tmp_path / "a.log", body="done"))
    sock = socket.create_connection(("127.0.0.1", server.port()), timeout=10)
    sock.sendall(b"GET /hello HTTP/1.1\r\nHost: x\r\n")        # half a request
    # The request is in flight once a worker holds the connection: the health
    # answer on a second connection proves workers are accepting.
    probe = http.client.HTTPConnection("127.0.0.1", server.port(), timeout=5)
    probe.request("GET", "/api/v1/health")
    probe.getresponse().read()
    probe.close()
    mark = len(server.lines)
    server.signal(signal.SIGTERM)
    server.wait_for("stopping", start=mark)
    sock.sendall(b"\r\n")
    data = sock.recv(65536)
    assert data.startswith(b"HTTP/1.1 200 OK") and data.endswith(b"done")
    assert sock.recv(65536) == b""          # then the draining worker closes the connection
    assert server.proc.wait(15) == 0


def test_killed_worker_is_restarted(start_server, tmp_path):
    server = start_server(CONFIG.format(log=tmp_path / "a.log", body="x"))
    victim = server.worker_pids()[0]
    mark = len(server.lines)
    os.kill(victim, signal.SIGKILL)
    line = server.wait_for("started (replacing", start=mark)
    assert f"replacing {victim}" in line
    new_pid = int(line.split("worker ")[1].split()[0])
    assert new_pid in server.worker_pids() and victim not in server.worker_pids()


def test_bad_reload_keeps_the_running_config(start_server, tmp_path):
    server = start_server(CONFIG.format(log=tmp_path / "a.log", body="good"))
    server.config_path.write_text("[limits]\nmax_body = \"lots\"\n[[listen]]\naddress='x'\n")
    mark = len(server.lines)
    server.signal(signal.SIGHUP)
    refused = server.wait_for("reload refused", start=mark)
    assert "running config stays" in refused
    # The reason follows, one problem a line.
    assert "expected a size" in server.wait_for("limits.max_body", start=mark)
    assert "expected HOST:PORT" in server.wait_for("listen[0].address", start=mark)
    conn = http.client.HTTPConnection("127.0.0.1", server.port(), timeout=5)
    conn.request("GET", "/hello")
    assert conn.getresponse().read() == b"good"


def test_sigusr1_reopens_the_request_log(start_server, tmp_path):
    log = tmp_path / "access.log"
    server = start_server(CONFIG.format(log=log, body="x"))
    conn = http.client.HTTPConnection("127.0.0.1", server.port(), timeout=5)

    def request(path: str) -> None:
        conn.request("GET", path, headers={"User-Agent": "probe/1"})
        conn.getresponse().read()

    request("/hello")
    wait_file(log, lambda text: "/hello" in text)
    rotated = tmp_path / "access.log.1"
    log.rename(rotated)
    server.signal(signal.SIGUSR1)
    # Every worker must have reopened before the next request lands on it; a few
    # requests over fresh connections reach both workers.
    wait_file(log, lambda text: True, must_exist=False) if log.exists() else None
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        c = http.client.HTTPConnection("127.0.0.1", server.port(), timeout=5)
        c.request("GET", "/after-rotate")
        c.getresponse().read()
        c.close()
        if log.exists() and "/after-rotate" in log.read_text():
            break
        time.sleep(0.05)
    record = json.loads(log.read_text().splitlines()[-1])
    assert record["path"] == "/after-rotate" and record["status"] == 404
    assert "/hello" in rotated.read_text() and "/after-rotate" not in rotated.read_text()


def wait_file(path: Path, predicate, timeout: float = 10, must_exist: bool = True) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            text = path.read_text()
            if predicate(text):
                return text
        time.sleep(0.05)
    raise AssertionError(f"{path} never reached the expected content")


def test_reload_naming_a_missing_body_file_keeps_the_running_config(start_server, tmp_path):
    server = start_server(CONFIG.format(log=tmp_path / "a.log", body="good"))
    server.config_path.write_text(CONFIG.format(log=tmp_path / "a.log", body="")
                                  + 'body_file = "nope.html"\n')
    mark = len(server.lines)
    server.signal(signal.SIGHUP)
    server.wait_for("reload refused", start=mark)
    assert "expected a path to a readable file" in server.wait_for("body_file", start=mark)
    assert server.proc.poll() is None
    conn = http.client.HTTPConnection("127.0.0.1", server.port(), timeout=5)
    conn.request("GET", "/hello")
    assert conn.getresponse().read() == b"good"


def answers(host: str, port: int) -> bytes:
    conn = http.client.HTTPConnection(host, port, timeout=5)
    conn.request("GET", "/hello")
    return conn.getresponse().read()


def refuses(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def test_reload_moving_the_listener_closes_the_old_one(start_server, tmp_path):
    log = tmp_path / "a.log"
    server = start_server(CONFIG.format(log=log, body="one"))
    old_port = server.port()
    server.config_path.write_text(CONFIG.format(log=log, body="two")
                                  .replace("127.0.0.1:0", "127.0.0.2:0"))
    mark = len(server.lines)
    server.signal(signal.SIGHUP)
    line = server.wait_for("listening on http://127.0.0.2:", start=mark)
    new_port = int(line.rsplit(":", 1)[1])
    server.wait_for("previous workers finished", start=mark)
    assert f"no longer listening on 127.0.0.1:{old_port}" in server.wait_for("no longer",
                                                                              start=mark)
    assert refuses("127.0.0.1", old_port)
    assert answers("127.0.0.2", new_port) == b"two"


def test_reload_that_cannot_bind_every_listener_keeps_none_of_them(start_server, tmp_path):
    log = tmp_path / "a.log"
    server = start_server(CONFIG.format(log=log, body="one"))
    taken = socket.create_server(("127.0.0.1", 0))
    with taken:
        server.config_path.write_text(
            CONFIG.format(log=log, body="two").replace("127.0.0.1:0", "127.0.0.2:0")
            + f'[[listen]]\naddress = "127.0.0.1:{taken.getsockname()[1]}"\n')
        mark = len(server.lines)
        server.signal(signal.SIGHUP)
        line = server.wait_for("listening on http://127.0.0.2:", start=mark)
        refused = server.wait_for("reload refused", start=mark)
        assert f"nestgate.toml: listen[1].address: cannot bind 127.0.0.1:" \
            f"{taken.getsockname()[1]} (Address already in use)" in refused
    assert refuses("127.0.0.2", int(line.rsplit(":", 1)[1]))
    assert answers("127.0.0.1", server.port()) == b"one"


@pytest.mark.parametrize("flag", [False, True])
def test_a_start_that_cannot_bind_names_the_address_and_the_key(tmp_path, flag):
    path = tmp_path / "nestgate.toml"
    with socket.create_server(("127.0.0.1", 0)) as taken:
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        config = CONFIG.format(log=tmp_path / "a.log", body="x")
        args = ["--listen", address] if flag else []
        if not flag:
            config = config.replace("127.0.0.1:0", address)
        path.write_text(config)
        result = subprocess.run([sys.executable, "-m", "nestgate", "serve", "--config",
                                 str(path), *args], env=_env(), capture_output=True,
                                text=True, timeout=30)
    where = f"--listen '{address}'" if flag else f"{path}: listen[0].address"
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr == f"nestgate: cannot start: {where}: cannot bind {address} " \
        "(Address already in use)\n"


def supervisor_with_fake_workers(monkeypatch):
    """A Supervisor whose forks only hand out pids; the signals it sends are recorded."""
    from nestgate.server import supervisor as module
    sup = module.Supervisor(None, None, None, None)
    pids = iter(range(1000, 2000))
    signalled: list[tuple[int, int]] = []

    def fork(gen, slot):
        slot.pid = next(pids)
        sup.by_pid[slot.pid] = (gen, slot)
    monkeypatch.setattr(sup, "fork", fork)
    monkeypatch.setattr(module, "_kill", lambda pid, sig: signalled.append((pid, sig)))
    return sup, signalled


def report_ready(sup, gen) -> None:
    os.write(sup.ready_w, b"".join(b"%d\n" % slot.pid for slot in gen.slots))
    sup.on_ready()


def test_two_reloads_close_together_end_on_the_last_config(monkeypatch):
    from nestgate.config import parse_config
    config = parse_config({"server": {"workers": 2}, "listen": [{"address": "127.0.0.1:0"}]})
    sup, _signalled = supervisor_with_fake_workers(monkeypatch)
    first = sup.start_generation(config)
    report_ready(sup, first)
    second = sup.start_generation(config)       # SIGHUP
    third = sup.start_generation(config)        # SIGHUP again before `second` is ready
    assert second.stopping and not first.stopping
    report_ready(sup, second)                   # its workers were already on their way
    assert not third.stopping and not first.stopping
    report_ready(sup, third)
    assert first.stopping and not third.stopping
    # A restarted worker reporting ready again changes nothing.
    report_ready(sup, third)
    assert not third.stopping
    # Numbers stay unique once finished generations are forgotten.
    for gen in (first, second):
        for slot in gen.slots:
            slot.pid = 0
    sup.forget_finished()
    assert sup.start_generation(config).number == 4


def test_a_generation_that_cannot_fork_every_worker_stops_and_the_running_one_serves_on(
        monkeypatch):
    from nestgate.config import parse_config
    config = parse_config({"server": {"workers": 3}, "listen": [{"address": "127.0.0.1:0"}]})
    sup, signalled = supervisor_with_fake_workers(monkeypatch)
    first = sup.start_generation(config)
    report_ready(sup, first)
    starting = sup.start_generation(config)     # a reload whose workers are on their way
    forked = sup.fork
    calls = []

    def fork_fails_second_time(gen, slot):
        calls.append(slot)
        if len(calls) == 2:
            raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
        forked(gen, slot)
    monkeypatch.setattr(sup, "fork", fork_fails_second_time)
    with pytest.raises(BlockingIOError):
        sup.start_generation(config)
    failed = sup.generations[-1]
    assert failed.stopping
    assert signalled == [(failed.slots[0].pid, signal.SIGTERM)]   # the one it forked
    assert not first.stopping and not starting.stopping
    report_ready(sup, starting)                 # the earlier reload still takes over
    assert first.stopping and not starting.stopping


def test_workers_that_never_start_make_the_server_exit_with_their_error(tmp_path):
    # /proc/self/mem passes validation (a readable regular file) but reading it
    # fails, so every worker dies building its 404 page.
    path = tmp_path / "nestgate.toml"
    path.write_text(CONFIG.format(log=tmp_path / "a.log", body="x").replace(
        "[server]\n", '[server]\nnot_found_page = "/proc/self/mem"\n'))
    result = subprocess.run([sys.executable, "-m", "nestgate", "serve", "--config", str(path)],
                            env=_env(), capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert "failed: OSError(5, 'Input/output error')" in result.stderr
    assert "giving up" in result.stderr and "\nnestgate: ready" not in result.stderr


def test_a_listener_only_an_outdated_generation_wanted_is_closed(monkeypatch):
    from nestgate.config import parse_config
    sup, _signalled = supervisor_with_fake_workers(monkeypatch)
    try:
        one = parse_config({"server": {"workers": 1}, "listen": [{"address": "127.0.0.1:0"}]})
        two = parse_config({"server": {"workers": 1}, "listen": [{"address": "127.0.0.2:0"}]})
        sup.bind(one)
        report_ready(sup, sup.start_generation(one))
        sup.bind(two)
        sup.start_generation(two)               # still starting when the next reload comes
        port = sup.sockets_for(two)[0][1].getsockname()[1]
        sup.start_generation(one)
        assert refuses("127.0.0.2", port)
    finally:
        for sock in sup.sockets.values():
            sock.close()


def test_two_sighups_back_to_back_serve_the_last_config(start_server, tmp_path):
    log = tmp_path / "a.log"
    server = start_server(CONFIG.format(log=log, body="one"))
    server.config_path.write_text(CONFIG.format(log=log, body="two"))
    mark = len(server.lines)
    server.signal(signal.SIGHUP)
    server.wait_for("generation 2 starting", start=mark)
    server.config_path.write_text(CONFIG.format(log=log, body="three"))
    server.signal(signal.SIGHUP)
    # The second reload usually comes while generation 2 is still starting. However
    # the two interleave, once one generation of 2 workers is left, it serves the
    # last config written.
    deadline = time.monotonic() + 20
    while not (answers("127.0.0.1", server.port()) == b"three"
               and len(server.worker_pids()) == 2):
        assert time.monotonic() < deadline, "\n".join(server.lines)
        time.sleep(0.05)
    assert {answers("127.0.0.1", server.port()) for _ in range(20)} == {b"three"}


def _wakeups(pid: int) -> int:
    """Times the process has slept and been woken (voluntary context switches)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError(f"no context switch count for {pid}")




def test_an_idle_server_wakes_about_once_a_second(start_server, tmp_path):
    """With nothing to do, the supervisor, the workers and the admin process sleep
    until a signal, a connection or their next deadline: once a second, as the admin
    report and the connections' sweep need (the supervisor woke ten times a second,
    each worker four). A home server should not keep its CPU out of deep sleep."""
    server = start_server(CONFIG.format(log=tmp_path / "a.log", body="x"))
    conn = http.client.HTTPConnection("127.0.0.1", server.port(), timeout=5)
    conn.request("GET", "/hello")
    assert conn.getresponse().read() == b"x"
    conn.close()                                    # served, then nothing open
    pids = [server.proc.pid, *server.children()]
    time.sleep(1.0)
    before = {pid: _wakeups(pid) for pid in pids}
    time.sleep(5.0)
    woken = {pid: _wakeups(pid) - before[pid] for pid in pids}
    # 5 wake-ups for the tick or the report, a few for whatever else the kernel or
    # the event loop does; four a second (20) and ten (50) are what this replaced.
    assert all(count <= 12 for count in woken.values()), woken


def test_the_first_request_after_an_idle_spell_has_a_current_date(start_server):
    """The idle tick sleeps up to a second (the log flushed, nothing open): the first
    connection after it reads the clock, so the `Date` it gets is not the second the
    worker fell asleep in."""
    from email.utils import parsedate_to_datetime
    server = start_server(BASIC_SITE)        # the log's flush and the tick: a second
    for _ in range(4):
        time.sleep(1.6)                         # no connection open: the idle step
        asked = int(time.time())
        with socket.create_connection(("127.0.0.1", server.port()), timeout=5) as sock:
            sock.sendall(b"GET /hello HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = sock.recv(4096)
                assert chunk, head
                head += chunk
        date = next(line.split(b":", 1)[1].strip() for line in head.split(b"\r\n")
                    if line.lower().startswith(b"date:"))
        assert parsedate_to_datetime(date.decode()).timestamp() >= asked, (date, asked)
