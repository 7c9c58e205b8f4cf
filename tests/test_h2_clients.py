"""Real HTTP/2 clients against a real server: curl, httpx, h2load and headless Chromium
load a home page, a note and a proxied page over h2, and the request log says HTTP/2;
they, Go's net/http client and nginx (its grpc module, h2c to nestgate) lose no request
across reloads.

Each client speaks with its own HTTP/2 stack (nghttp2 in curl and h2load, the h2
library under httpx, Chromium's own, Go's, nginx's), so the server's engine meets the
settings, header compression, flow control and GOAWAY handling of each.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import signal
import subprocess
import ssl
import threading
import time

import httpx
import pytest

from browser import Browser
from conftest import REPO, free_port
from nestgate.bench.ports import is_listening
from nestgate.wire.h2phases import DRAIN_BUSY_GRACE

HOME = b"<!doctype html><title>Home</title><h1>Welcome home</h1>\n"
NOTE = "---\ntitle: Hello\ndate: 2026-05-01\n---\n\nA note read over **HTTP/2**.\n"
BIG = bytes(range(256)) * 1024          # 256 KiB: past the first stream window


class _App(http.server.BaseHTTPRequestHandler):
    """The proxied service: a page, a large answer and an echo of a posted body."""
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        body = BIG if self.path == "/app/big" else \
            b"<!doctype html><title>App</title><p>proxied page</p>\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/html" if len(body) < 1000 else
                         "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[::-1])

    def log_message(self, *args):
        pass


@pytest.fixture
def site(start_server, certs, tmp_path):
    """A TLS listener with h2 and a plain one taking h2c, a home page, a note and a
    proxied service; the request log (JSON lines, loopback included) in a file."""
    root, notes = tmp_path / "www", tmp_path / "notes"
    root.mkdir()
    notes.mkdir()
    (root / "index.html").write_bytes(HOME)
    (notes / "hello.md").write_text(NOTE)
    app = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _App)
    threading.Thread(target=app.serve_forever, daemon=True).start()
    log = tmp_path / "requests.log"
    chain, key = certs["local"]
    server = start_server(f"""
[server]
workers = 1

[log]
path = "{log}"
log_loopback = true
flush_interval = "100ms"

[limits]
max_body = "1MiB"

[[listen]]
address = "127.0.0.1:0"
http2_cleartext = true

[[listen]]
address = "127.0.0.1:0"
[[listen.certificate]]
cert = "{chain}"
key = "{key}"
names = ["localhost", "127.0.0.1"]

[[site]]
hosts = ["*"]

[site.notes]
dir = "{notes}"

[[site.route]]
prefix = "/app/"
type = "proxy"
upstream = "http://127.0.0.1:{app.server_address[1]}"

[[site.route]]
prefix = "/"
type = "static"
root = "{root}"
""")
    server.log = log
    yield server
    app.shutdown()
    app.server_close()


def _records(log, *, wanted: int, timeout: float = 5.0) -> list[dict]:
    """The request log's records, once at least `wanted` are written."""
    deadline = time.monotonic() + timeout
    while True:
        text = log.read_text() if log.exists() else ""
        records = [json.loads(line) for line in text.splitlines() if line]
        if len(records) >= wanted or time.monotonic() > deadline:
            return records
        time.sleep(0.05)


def test_curl_over_h2_gets_the_same_answers_as_over_http1(site, certs):
    url = f"https://localhost:{site.port('https')}"
    for path in ("/", "/notes/hello", "/app/page"):
        answers = {}
        for flag in ("--http2", "--http1.1"):
            run = subprocess.run(
                ["curl", "-sS", flag, "--cacert", certs["ca"], "--resolve",
                 f"localhost:{site.port('https')}:127.0.0.1", "-w", "\n%{http_version} %{http_code}",
                 url + path], capture_output=True, timeout=20)
            body, _, tail = run.stdout.rpartition(b"\n")
            answers[flag] = (tail, body)
        assert answers["--http2"][0] == b"2 200", (path, run.stderr)
        assert answers["--http1.1"][0] == b"1.1 200"
        assert answers["--http2"][1] == answers["--http1.1"][1], path
    records = _records(site.log, wanted=6)
    h2 = [r["path"] for r in records if r["protocol"] == "HTTP/2"]
    assert sorted(h2) == ["/", "/app/page", "/notes/hello"]


def test_httpx_streams_bodies_both_ways_over_h2(site, certs):
    with httpx.Client(http2=True, verify=ssl.create_default_context(cafile=certs["ca"]),
                      timeout=20,
                      base_url=f"https://localhost:{site.port('https')}") as client:
        home = client.get("/")
        assert (home.http_version, home.status_code, home.content) == ("HTTP/2", 200, HOME)
        note = client.get("/notes/hello")
        assert note.status_code == 200 and b"A note read over <strong>HTTP/2</strong>" \
            in note.content
        big = client.get("/app/big")              # more than the client's first window
        assert (big.http_version, big.content) == ("HTTP/2", BIG)
        posted = bytes(range(256)) * 2000         # 500 KiB upload, several windows
        echo = client.post("/app/echo", content=posted)
        assert (echo.status_code, echo.content) == (200, posted[::-1])
        ranged = client.get("/", headers={"range": "bytes=0-14"})
        assert (ranged.status_code, ranged.content) == (206, HOME[:15])
        etag = home.headers["etag"]
        again = client.get("/", headers={"if-none-match": etag})
        assert (again.status_code, again.content) == (304, b"")
        missing = client.get("/no-such-file")
        assert missing.status_code == 404 and missing.http_version == "HTTP/2"


@pytest.mark.skipif(shutil.which("h2load") is None, reason="h2load is installed by make test")
def test_h2load_requests_all_succeed(site):
    run = subprocess.run(
        ["h2load", "-n", "600", "-c", "3", "-m", "10",
         f"https://127.0.0.1:{site.port('https')}/", f"https://127.0.0.1:{site.port('https')}/notes/hello",
         f"https://127.0.0.1:{site.port('https')}/app/page"], capture_output=True, text=True, timeout=60)
    assert "600 succeeded, 0 failed, 0 errored" in run.stdout, run.stdout + run.stderr
    assert "600 2xx" in run.stdout
    assert "h2" in run.stdout                     # "Application protocol: h2"


def test_chromium_loads_pages_over_h2(site):
    base = f"https://localhost:{site.port('https')}"
    browser = Browser(base + "/", args=["--ignore-certificate-errors"])
    try:
        for path, text in (("/", "Welcome home"), ("/notes/hello", "A note read over"),
                           ("/app/page", "proxied page")):
            if path != "/":
                browser.evaluate(f"location.href = {json.dumps(base + path)}")
            assert browser.wait_for(
                f"document.body && document.body.innerText.includes({json.dumps(text)})"), path
            protocol = browser.evaluate(
                "performance.getEntriesByType('navigation')[0].nextHopProtocol")
            assert protocol == "h2", (path, protocol)
    finally:
        browser.close()
    # The log holds the other tests' records too: wait for the browser's own.
    deadline = time.monotonic() + 5
    while True:
        chrome = {r["path"]: r for r in _records(site.log, wanted=0)
                  if "Chrome" in r["user_agent"]}
        if {"/", "/notes/hello", "/app/page"} <= chrome.keys() or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for path in ("/", "/notes/hello", "/app/page"):
        assert chrome[path]["protocol"] == "HTTP/2" and chrome[path]["status"] == 200, path


def _reloads(server, count: int) -> None:
    """`count` graceful reloads one after another, each waited for, then the end of every
    previous generation: a client that never pauses keeps its connection to an old
    worker up to DRAIN_BUSY_GRACE, and only then meets the GOAWAY."""
    start = len(server.lines)
    for _ in range(count):
        mark = len(server.lines)
        server.signal(signal.SIGHUP)
        server.wait_for("reloaded", start=mark)
        time.sleep(0.3)
    deadline = time.monotonic() + DRAIN_BUSY_GRACE + 10
    while sum("previous workers finished" in line for line in server.lines[start:]) < count:
        assert time.monotonic() < deadline, "\n".join(server.lines[start:])
        time.sleep(0.1)


def _during_reloads(server, load, clients: int = 3, reloads: int = 3) -> tuple[int, list]:
    """Run `load(stop)` in `clients` threads while the server reloads; each returns its
    (answered, failures). Returns the answers counted and every failure seen."""
    stop = threading.Event()
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(load(stop))) for _ in range(clients)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(0.5)
        _reloads(server, reloads)
        time.sleep(0.5)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    answered = sum(r[0] for r in results)
    failures = [f for r in results for f in r[1]]
    return answered, failures


def test_httpx_loses_no_request_across_reloads(site, certs):
    """The graceful stop's GOAWAY comes in an order the h2 library takes: no request of
    an httpx client is lost across reloads, whether it was in flight or about to go.
    Each thread has its own client (one connection each): httpx threads that share one
    connection race among themselves on a GOAWAY whoever sends it."""
    context = ssl.create_default_context(cafile=certs["ca"])
    url = f"https://localhost:{site.port('https')}"

    def load(stop):
        answered, failures = 0, []
        with httpx.Client(http2=True, verify=context, timeout=20, base_url=url) as client:
            while not stop.is_set():
                try:
                    reply = client.get("/app/page")
                    if reply.status_code == 200 and reply.http_version == "HTTP/2":
                        answered += 1
                    else:
                        failures.append((reply.http_version, reply.status_code))
                except Exception as exc:  # noqa: BLE001 - the h2 library raises its own
                    failures.append(repr(exc))
        return answered, failures

    answered, failures = _during_reloads(site, load)
    assert failures == [] and answered > 50, (answered, failures[:5])


def test_curl_loses_no_request_across_reloads(site, certs):
    """curl (nghttp2) multiplexing four streams at a time on one connection, through
    reloads: every transfer answered 200 over HTTP/2."""
    port = site.port("https")

    def load(stop):
        answered, failures = 0, []
        while not stop.is_set():
            run = subprocess.run(
                ["curl", "-sS", "--http2", "--parallel", "--parallel-max", "4",
                 "--cacert", certs["ca"], "--resolve", f"localhost:{port}:127.0.0.1",
                 "-w", "%{http_version} %{http_code}\n",
                 *[arg for n in range(40)
                   for arg in (f"https://localhost:{port}/app/page?{n}", "-o", "/dev/null")]],
                capture_output=True, text=True, timeout=30)
            codes = run.stdout.split("\n")[:-1]
            answered += codes.count("2 200")
            failures += [c for c in codes if c != "2 200"]
            if run.returncode != 0 or len(codes) != 40:
                failures.append((run.returncode, len(codes), run.stderr[-300:]))
        return answered, failures

    answered, failures = _during_reloads(site, load, clients=2)
    assert failures == [] and answered > 100, (answered, failures[:5])


def test_chromium_loses_no_request_across_reloads(site):
    """A page fetching over h2 in a loop (four at a time) while the server reloads:
    no fetch fails."""
    base = f"https://localhost:{site.port('https')}"
    browser = Browser(base + "/", args=["--ignore-certificate-errors"])
    try:
        assert browser.wait_for("document.body && document.body.innerText.includes('Welcome')")
        browser.evaluate("""
            window.tally = {answered: 0, failures: [], protocols: new Set(), running: true};
            const one = async (n) => {
              while (window.tally.running) {
                try {
                  const reply = await fetch('/app/page?' + n + '-' + Math.random());
                  await reply.text();
                  if (reply.status === 200) window.tally.answered++;
                  else window.tally.failures.push(reply.status);
                } catch (e) { window.tally.failures.push(String(e)); }
              }
            };
            for (let n = 0; n < 4; n++) one(n);
            0;   // the value, not the last promise, which the call would await
        """)
        time.sleep(0.5)
        _reloads(site, 3)
        time.sleep(0.5)
        browser.evaluate("window.tally.running = false")
        time.sleep(0.3)
        answered = browser.evaluate("window.tally.answered")
        failures = browser.evaluate("window.tally.failures")
        protocol = browser.evaluate(
            "performance.getEntriesByType('resource').slice(-1)[0].nextHopProtocol")
    finally:
        browser.close()
    assert failures == [] and answered > 50 and protocol == "h2", (answered, failures[:5])


@pytest.fixture(scope="module")
def goclient(tmp_path_factory):
    """tests/goclient built with Debian's Go (standard library only), its build cache in
    a folder of the test run's: no network, no writable home needed."""
    go = shutil.which("go")
    assert go, "Go is missing: make debian-deps installs golang-go"
    folder = tmp_path_factory.mktemp("goclient")
    env = {**os.environ, "GOCACHE": str(folder / "cache"), "GOPATH": str(folder / "path"),
           "GOPROXY": "off", "GOFLAGS": ""}
    run = subprocess.run([go, "build", "-o", str(folder / "goclient"), "main.go"],
                         cwd=REPO / "tests" / "goclient", env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return folder / "goclient"


def test_go_loses_no_request_across_reloads(site, certs, goclient):
    """Go's net/http client, four goroutines multiplexed on one h2 connection, through
    reloads: every request answered 200 over HTTP/2, on a new connection after each
    GOAWAY."""
    url = f"https://127.0.0.1:{site.port('https')}/app/page"
    client = subprocess.Popen(
        [str(goclient), "-url", url, "-ca", certs["ca"], "-want", "proxied page",
         "-workers", "4", "-max", "60s"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)
        _reloads(site, 3)
        time.sleep(0.5)
    finally:
        out, err = client.communicate(input="", timeout=30)   # stdin closed: it stops
    assert client.returncode == 0, err
    tally = json.loads(out)
    assert tally["failed"] == 0 and tally["ok"] > 50, tally
    assert tally["connections"] > 1, tally       # a GOAWAY moved it to a new connection


def _nginx_grpc_conf(prefix, port: int, upstream_port: int) -> str:
    """nginx on `port` handing every request to nestgate's h2c listener with its grpc
    module (nginx 1.22 has no HTTP/2 proxy_pass), over kept-alive h2 connections."""
    temp = " ".join(f"{key} {prefix / 'temp'};" for key in (
        "client_body_temp_path", "proxy_temp_path", "fastcgi_temp_path", "uwsgi_temp_path",
        "scgi_temp_path"))
    # As root, nginx would switch its worker to `nobody`, who cannot enter pytest's folders.
    user = "user root;" if os.geteuid() == 0 else ""
    return f"""{user}
worker_processes 1;
pid {prefix / 'nginx.pid'};
error_log {prefix / 'error.log'} warn;
events {{ worker_connections 256; }}
http {{
  access_log off;
  {temp}
  upstream nestgate {{ server 127.0.0.1:{upstream_port}; keepalive 8; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{ grpc_pass grpc://nestgate; }}
  }}
}}
"""


@pytest.fixture
def nginx_front(site, tmp_path):
    """nginx in front of the site's h2c listener; yields (its port, its error log)."""
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    assert os.access(nginx, os.X_OK), "nginx is missing: make debian-deps installs it"
    prefix = tmp_path / "nginx"
    (prefix / "temp").mkdir(parents=True)
    port = free_port()
    conf = prefix / "nginx.conf"
    conf.write_text(_nginx_grpc_conf(prefix, port, site.port("http")))
    error_log = prefix / "error.log"
    proc = subprocess.Popen([nginx, "-c", str(conf), "-p", str(prefix), "-e", str(error_log),
                             "-g", "daemon off;"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while not is_listening(port):
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "nginx never listened"
            time.sleep(0.05)
        yield port, error_log
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_nginx_grpc_module_loses_no_request_across_reloads(site, nginx_front):
    """nginx's grpc module speaks h2 (prior knowledge) to nestgate over connections it
    keeps alive and reuses one stream at a time; clients reach nginx over HTTP/1.1.
    Through reloads every request is answered 200, and each reached nestgate over h2."""
    port, error_log = nginx_front

    def load(stop):
        answered, failures = 0, []
        with httpx.Client(timeout=20, base_url=f"http://127.0.0.1:{port}") as client:
            while not stop.is_set():
                try:
                    reply = client.get("/app/page")
                    if reply.status_code == 200 and b"proxied page" in reply.content:
                        answered += 1
                    else:
                        failures.append((reply.status_code, reply.text[:200]))
                except httpx.HTTPError as exc:
                    failures.append(repr(exc))
        return answered, failures

    answered, failures = _during_reloads(site, load)
    errors = error_log.read_text() if error_log.exists() else ""
    # A few seconds of load on a busy 2-core machine: the count shows it ran all along.
    assert failures == [] and answered > 30, \
        f"{answered} answered, {len(failures)} failed: {failures[:3]}\nnginx's log:\n{errors[-2000:]}"
    records = _records(site.log, wanted=answered)
    assert {r["protocol"] for r in records if r["path"] == "/app/page"} == {"HTTP/2"}
