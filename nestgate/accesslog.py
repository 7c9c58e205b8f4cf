"""The request log: records appended in memory, formatted and written on a timer.

One record per request; nothing is written per request. JSON lines (default) or
the combined format, to a file or stdout. `reopen()` serves logrotate (SIGUSR1).
Header values other than the User-Agent are never logged, so cookies and tokens
stay out of the log.
"""

from __future__ import annotations

import json
import os
import time

from nestgate.clock import CLOCK

_MAX_BUFFERED = 10_000      # records; a burst above this is flushed early
_PIPE_CHUNK = 4096          # stdout may be a pipe shared by workers: keep writes atomic


class AccessLog:
    def __init__(self, cfg) -> None:
        self.format = cfg.format
        self.path = cfg.path
        self.log_loopback = cfg.log_loopback
        self.fd = -1
        self._records: list[tuple] = []
        self.reopen()

    def reopen(self) -> None:
        if self.path in ("-", ""):
            self.fd = 1
            return
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        old, self.fd = self.fd, fd
        if old > 2:
            os.close(old)

    def record(self, client, method, host, path, status, sent, t0, headers, route) -> None:
        duration_us = int((time.perf_counter() - t0) * 1_000_000) if t0 else 0
        self._records.append((CLOCK.wall, client, method, host, path, status, sent,
                              duration_us, headers, route))
        if len(self._records) >= _MAX_BUFFERED:
            self.flush()

    def flush(self) -> None:
        if not self._records:
            return
        records, self._records = self._records, []
        render = _json_line if self.format == "json" else _combined_line
        lines = [render(r) for r in records]
        self._write(lines)

    def _write(self, lines: list[bytes]) -> None:
        batch, size = [], 0
        for line in lines:
            if size + len(line) > _PIPE_CHUNK and batch:
                _write_all(self.fd, b"".join(batch))
                batch, size = [], 0
            batch.append(line)
            size += len(line)
        if batch:
            _write_all(self.fd, b"".join(batch))

    def close(self) -> None:
        self.flush()
        if self.fd > 2:
            os.close(self.fd)
            self.fd = -1


def _write_all(fd: int, data: bytes) -> None:
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:
        pass        # a full disk or closed stdout must not take the server down


def should_log(log_loopback: bool, client: str) -> bool:
    return log_loopback or not (client.startswith("127.") or client == "::1")


def _user_agent(headers) -> str:
    for name, value in headers:
        if name == b"user-agent":
            return value.decode("latin-1")
    return ""


def _text(value) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value


def _json_line(r: tuple) -> bytes:
    wall, client, method, host, path, status, sent, duration_us, headers, route = r
    return json.dumps({
        "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(wall)) + "Z",
        "client": client, "method": _text(method), "host": _text(host), "path": path,
        "status": status, "bytes": sent, "duration_us": duration_us,
        "user_agent": _user_agent(headers), "route": route,
    }, ensure_ascii=False).encode() + b"\n"


# As nginx does: '"', '\\' and control characters as \xHH, so a field (the decoded path
# may hold "%0A" as a newline) can neither end its quotes nor start a new line.
_ESCAPES = {c: f"\\x{c:02X}" for c in (*range(0x20), *range(0x7F, 0xA0), 0x22, 0x5C)}


def _esc(value) -> str:
    return _text(value).translate(_ESCAPES)


def _combined_line(r: tuple) -> bytes:
    wall, client, method, host, path, status, sent, duration_us, headers, route = r
    stamp = time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(wall))
    ua = _esc(_user_agent(headers))
    referer = "-"
    for name, value in headers:
        if name == b"referer":
            referer = _esc(value)
    return (f'{client} - - [{stamp}] "{_esc(method)} {_esc(path)} HTTP/1.1" {status} {sent} '
            f'"{referer}" "{ua}" host="{_esc(host)}" route="{_esc(route)}" '
            f'us={duration_us}\n').encode()
