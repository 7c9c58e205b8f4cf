"""Long requests from many clients at once, logged by two workers into one stdout pipe.

A write of more than PIPE_BUF (4096) bytes to a pipe may be split by another process's
write: a record of 14 KB (a 7,000-byte path and User-Agent) from one worker was spliced
into another's, and the reader got lines that were neither record (36 of 240 lines
broken in the combined format). On a pipe or socket each record now fits in 4 KiB, its
longest client-written fields cut and marked with "..."; a regular file keeps them whole.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time

import pytest

from conftest import rss_kib

CONFIG = """
[server]
workers = 2

[[listen]]
address = "127.0.0.1:0"

[log]
format = "{fmt}"
log_loopback = true
flush_interval = "50ms"
{path}

[[site]]
hosts = ["*"]

[[site.route]]
prefix = "/"
type = "return"
body = "ok"
"""

CLIENTS, EACH = 8, 40
LONG = 7000
COMBINED = re.compile(r'^127\.0\.0\.1 - - \[[^\]]+\] "GET /(p+)(\.\.\.)? HTTP/1\.1" 200 2 '
                      r'"-" "(u+)(\.\.\.)?" host="h" route="/\*" us=\d+$')


def _ask(port: int, n: int) -> None:
    for i in range(n):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(f"GET /{'p' * LONG} HTTP/1.1\r\nHost: h\r\nUser-Agent: {'u' * LONG}\r\n"
                      "Connection: close\r\n\r\n".encode())
            while s.recv(65536):
                pass


def _flood(port: int) -> None:
    threads = [threading.Thread(target=_ask, args=(port, EACH)) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)


@pytest.mark.parametrize("fmt", ["json", "combined"])
def test_long_records_from_two_workers_stay_whole_lines_on_a_pipe(start_server, fmt):
    server = start_server(CONFIG.format(fmt=fmt, path=""))
    workers = server.worker_pids()
    before = sum(rss_kib(pid) for pid in workers)
    _flood(server.port())
    lines = server.wait_stdout(lambda got: len(got) >= CLIENTS * EACH, timeout=15)
    time.sleep(0.3)                      # nothing more may come: one line per request
    lines = list(server.stdout_lines)
    assert len(lines) == CLIENTS * EACH
    for line in lines:
        if fmt == "json":
            record = json.loads(line)
            path, agent = record["path"], record["user_agent"]
            assert set(path[1:].removesuffix("...")) == {"p"} and path.endswith("...")
            assert set(agent.removesuffix("...")) == {"u"} and agent.endswith("...")
        else:
            assert COMBINED.match(line), line[:200] + " ... " + line[-200:]
        assert len(line.encode()) < 4096, line[:200]
    assert sum(rss_kib(pid) for pid in workers) - before < 32 * 1024


def test_a_regular_file_keeps_long_records_whole(start_server, tmp_path):
    log = tmp_path / "access.log"
    server = start_server(CONFIG.format(fmt="json", path=f'path = "{log}"'))
    _ask(server.port(), 3)
    server.stop()
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(len(r["path"]), len(r["user_agent"])) for r in records] == [(LONG + 1, LONG)] * 3
