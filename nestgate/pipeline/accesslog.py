"""The request log: records appended in memory, formatted and written on a timer.

One record per request; nothing is written per request. JSON lines (default) or
the combined format, to a file or stdout. `reopen()` serves logrotate (SIGUSR1).
Of the request's headers only the User-Agent is logged, and in the combined format
the Referer without its query, so cookies and tokens (also `?token=` in a referring
URL) stay out of the log. Every record is one line whatever its fields hold: JSON is
written as ASCII (`\u2028` escaped, never raw) and the combined format escapes
control characters and Unicode line separators as nginx escapes control characters.
With [geoip], each record carries the client's country, looked up when the records are
written (a memo per address, nestgate.pipeline.geoip), not while the request is answered.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import time
import unicodedata

from nestgate.base.clock import CLOCK

_MAX_BUFFERED = 10_000      # records; a burst above this is flushed early
_PIPE_CHUNK = 4096          # stdout may be a pipe shared by workers: keep writes atomic
# POSIX keeps a write of at most PIPE_BUF bytes to a pipe whole; a longer one may be
# cut by another worker's write to the same pipe (or socket: journald's stdout), which
# splices two records into one line and breaks both. On such an output a record longer
# than this has its longest client-written fields shortened until it fits.
_WHOLE_LINE = _PIPE_CHUNK
_FIELD_START = 1024         # characters a shortened field keeps at first; halved until it fits
_CUT = "..."

log = logging.getLogger("nestgate.accesslog")


class AccessLog:
    def __init__(self, cfg) -> None:
        self.format = cfg.format
        self.path = cfg.path
        self.log_loopback = cfg.log_loopback
        self.fd = -1
        self.dropped = 0            # records lost to write errors (full disk, closed pipe)
        self._records: list[tuple] = []
        self.geo = None             # nestgate.pipeline.geoip.GeoLookup: records name the country
        self.reopen()

    def reopen(self) -> None:
        if self.path in ("-", ""):
            self.fd = 1
        else:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
            old, self.fd = self.fd, fd
            if old > 2:
                os.close(old)
        # Appends to a regular file are whole whatever their size; only a pipe or a
        # socket (stdout under systemd, Docker, a shell pipe) needs short records.
        try:
            self.fit_lines = not stat.S_ISREG(os.fstat(self.fd).st_mode)
        except OSError:
            self.fit_lines = True

    def record(self, client, method, host, path, status, sent, t0, headers, route,
               protocol: str = "HTTP/1.1") -> None:
        duration_us = int((time.perf_counter() - t0) * 1_000_000) if t0 else 0
        self._records.append((CLOCK.wall, client, method, host, path, status, sent,
                              duration_us, headers, route, protocol))
        if len(self._records) >= _MAX_BUFFERED:
            self.flush()

    def pending(self) -> bool:
        """Records wait for the next flush."""
        return bool(self._records)

    def flush(self) -> None:
        if not self._records:
            return
        records, self._records = self._records, []
        render = _json_line if self.format == "json" else _combined_line
        geo = self.geo
        lines = [render(r, geo.country(r[1]) if geo is not None else None) for r in records]
        if self.fit_lines:
            lines = [line if len(line) <= _WHOLE_LINE else
                     _fitted(r, render, geo.country(r[1]) if geo is not None else None)
                     for r, line in zip(records, lines)]
        self._write(lines)

    def _write(self, lines: list[bytes]) -> None:
        batch, size = [], 0
        for line in lines:
            if size + len(line) > _PIPE_CHUNK and batch:
                self._write_batch(batch)
                batch, size = [], 0
            batch.append(line)
            size += len(line)
        if batch:
            self._write_batch(batch)

    def _write_batch(self, batch: list[bytes]) -> None:
        error = _write_all(self.fd, b"".join(batch))
        if error is not None:
            # A full disk or a closed stdout must not take the server down; say so
            # once per run of failures, and count what was lost.
            if not self.dropped:
                log.warning("request log %s: %s; records are dropped until writes work",
                            self.path, error)
            self.dropped += len(batch)
        elif self.dropped:
            log.warning("request log %s writable again; %d records were dropped",
                        self.path, self.dropped)
            self.dropped = 0

    def close(self) -> None:
        self.flush()
        if self.fd > 2:
            os.close(self.fd)
            self.fd = -1


def _write_all(fd: int, data: bytes) -> OSError | None:
    """Writes `data`; the error that stopped it, if any. A line cut short by the error
    is ended, so the next record starts on a line of its own."""
    written = 0
    try:
        while written < len(data):
            written += os.write(fd, data[written:])
    except OSError as exc:
        if written and data[written - 1:written] != b"\n":
            try:
                os.write(fd, b"\n")
            except OSError:
                pass
        return exc
    return None


def _fitted(r: tuple, render, country) -> bytes:
    """The record rendered within `_WHOLE_LINE` bytes: host, path, User-Agent and Referer
    (the fields a client writes at length) cut to a shorter and shorter prefix, each
    cut marked with "...". Escaping can make a character six bytes, hence the loop."""
    keep = _FIELD_START
    while True:
        wall, client, method, host, path, status, sent, duration_us, headers, route, protocol = r
        headers = [(name, _cut(value, keep)) for name, value in headers
                   if name in (b"user-agent", b"referer")]
        line = render((wall, client, method, _cut(host, keep), _cut(path, keep), status, sent,
                       duration_us, headers, route, protocol), country)
        if len(line) <= _WHOLE_LINE or keep <= 16:
            return line
        keep //= 2


def _cut(value, keep: int):
    if len(value) <= keep:
        return value
    return value[:keep] + (_CUT.encode() if isinstance(value, bytes) else _CUT)


def should_log(log_loopback: bool, client: str) -> bool:
    return log_loopback or not (client.startswith("127.") or client == "::1")


def _user_agent(headers) -> str:
    for name, value in headers:
        if name == b"user-agent":
            return value.decode("latin-1")
    return ""


def _text(value) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value


def _json_line(r: tuple, country: str | None = None) -> bytes:
    """One JSON record; `country` (None: no [geoip]) goes in after the client."""
    wall, client, method, host, path, status, sent, duration_us, headers, route, protocol = r
    record = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(wall)) + "Z",
              "client": client}
    if country is not None:
        record["country"] = country
    record.update({
        "method": _text(method), "host": _text(host), "path": path,
        "protocol": protocol, "status": status, "bytes": sent, "duration_us": duration_us,
        "user_agent": _user_agent(headers), "route": route,
    })
    return json.dumps(record).encode() + b"\n"


# As nginx does: '"', '\\' and control characters as \xHH, so a field (the decoded path
# may hold "%0A" as a newline) can neither end its quotes nor start a new line.
_ESCAPES = {c: f"\\x{c:02X}" for c in (*range(0x20), *range(0x7F, 0xA0), 0x22, 0x5C)}
_ESCAPES.update({c: f"\\u{c:04X}" for c in (0x2028, 0x2029)})   # Unicode line separators
# Invisible format characters (category Cf): the bidi overrides and isolates (U+202A-E,
# U+2066-9) make a terminal or log viewer show the rest of a line reordered, so a path
# could display as another path, status or client; zero-width ones hide text.
_ESCAPES.update({c: f"\\u{c:04X}" for c in (*range(0x10000), *range(0xE0000, 0xE0080))
                 if unicodedata.category(chr(c)) == "Cf"})


def _esc(value) -> str:
    return _text(value).translate(_ESCAPES)


def _combined_line(r: tuple, country: str | None = None) -> bytes:
    wall, client, method, host, path, status, sent, duration_us, headers, route, protocol = r
    stamp = time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(wall))
    ua = _esc(_user_agent(headers))
    referer = "-"
    for name, value in headers:
        if name == b"referer":
            referer = _esc(value.partition(b"?")[0])     # a query may carry a token
    return (f'{client} - - [{stamp}] "{_esc(method)} {_esc(path)} {protocol}" {status} {sent} '
            f'"{referer}" "{ua}" host="{_esc(host)}" route="{_esc(route)}" '
            f'us={duration_us}{_country_field(country)}\n').encode()


def _country_field(country: str | None) -> str:
    return "" if country is None else f' country="{_esc(country) or "-"}"'
