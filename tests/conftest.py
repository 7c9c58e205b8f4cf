"""Shared fixtures: real nestgate servers on 127.0.0.1:0, certificates from trustme.

A server is a real `python -m nestgate serve` process. Its listening sockets are
bound before the workers start, so the port printed on stderr accepts (into the
backlog) as soon as it is read; readiness is the "ready" line, never a sleep.
"""

from __future__ import annotations

import http.client
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import trustme

# A loopback port free now, never the same one twice in a run (for servers told their port).
from nestgate.bench.ports import free_port  # noqa: F401

REPO = Path(__file__).resolve().parent.parent
_LISTEN = re.compile(r"listening on (https?)://(\S+):(\d+)")
_ADMIN = re.compile(r"admin API on https?://\S+:(\d+) ")


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
        self.wait_for("ready", timeout=20)

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
                return int(m.group(1))
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
    """start_server(toml_text, *args) -> Server; stopped at the end of the test."""
    servers: list[Server] = []

    def start(toml: str, *args: str, name: str = "nestgate.toml") -> Server:
        path = tmp_path / name
        path.write_text(textwrap.dedent(toml))
        server = Server(path, args)
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


def scrape(port: int, token: str | None = None) -> tuple[int, str, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {token}"} if token else {})
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
