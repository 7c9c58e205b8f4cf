"""Sequential client for what wrk cannot measure: a cold render and the notes write path.

One keep-alive connection, one request at a time, timed with perf_counter: these scenarios
measure the latency of single expensive requests, not throughput under concurrency.
"""

import http.client
import os
import ssl
import time
from pathlib import Path

from .content import LONG_NOTE_SECTIONS, note_markdown
from .drivers import ERROR_KEYS, LATENCY_KEYS, RunResult, percentile


def _connect(scheme: str, port: int) -> http.client.HTTPConnection:
    if scheme == "https":
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        return http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=ctx)
    return http.client.HTTPConnection("127.0.0.1", port, timeout=10)


def note_text(i: int) -> bytes:
    return (f"---\ntitle: Bench write {i}\ndate: 2025-02-01\ntags: [bench]\n---\n\n"
            f"Written by the benchmark, revision {i}.\n").encode()


def _request(conn, method: str, path: str, body: bytes | None, token: str) -> tuple[int, int]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if body is not None:
        headers["Content-Type"] = "text/markdown; charset=utf-8"
    conn.request(method, path, body=body, headers=headers)
    resp = conn.getresponse()
    return resp.status, len(resp.read())


def run_result(latencies_ms: list[float], statuses: list[int], nbytes: int, elapsed_s: float,
               errors: dict | None = None, protocol: str = "http/1.1", **extra) -> RunResult:
    """A Python client's run as the drivers report theirs: latency percentiles, the
    answers counted by status class, the socket errors (none unless given)."""
    ordered = sorted(latencies_ms)
    latency = dict.fromkeys(LATENCY_KEYS)
    latency.update({f"p{p}": percentile(ordered, float(p)) for p in ("50", "90", "99", "99.9")})
    if ordered:
        latency.update(mean=sum(ordered) / len(ordered), max=ordered[-1])
    status: dict[str, int] = {}
    for code in statuses:
        status[f"{code // 100}xx"] = status.get(f"{code // 100}xx", 0) + 1
    return RunResult(len(statuses), elapsed_s, nbytes, latency,
                     dict.fromkeys(ERROR_KEYS, 0) if errors is None else errors,
                     status, protocol, extra)


def cold(scheme: str, port: int, page: str, write_path: str, token: str, duration_s: float,
         raw_path: Path) -> RunResult:
    """Rewrite the long note with new text in every section (invalidating its cached
    page), then time the first GET of it."""
    conn = _connect(scheme, port)
    latencies, statuses, nbytes, i = [], [], 0, 0
    started = time.perf_counter()
    while time.perf_counter() - started < duration_s:
        i += 1
        body = note_markdown(0, LONG_NOTE_SECTIONS, revision=i).encode()
        _request(conn, "PUT", write_path, body, token)
        t0 = time.perf_counter()
        status, size = _request(conn, "GET", page, None, "")
        latencies.append((time.perf_counter() - t0) * 1e3)
        statuses.append(status)
        nbytes += size
    conn.close()
    elapsed = time.perf_counter() - started
    raw_path.write_text("cold GETs after a PUT, ms:\n" + "\n".join(f"{x:.3f}" for x in latencies))
    return run_result(latencies, statuses, nbytes, elapsed)


def writes(scheme: str, port: int, write_path: str, token: str, duration_s: float,
           raw_path: Path) -> RunResult:
    """Sequential PUTs for `duration_s`: requests/s here is notes written (and fsynced) per s."""
    conn = _connect(scheme, port)
    latencies, statuses, i = [], [], 0
    started = time.perf_counter()
    while time.perf_counter() - started < duration_s:
        i += 1
        t0 = time.perf_counter()
        status, _ = _request(conn, "PUT", write_path, note_text(i), token)
        latencies.append((time.perf_counter() - t0) * 1e3)
        statuses.append(status)
    conn.close()
    elapsed = time.perf_counter() - started
    raw_path.write_text("PUT latencies, ms:\n" + "\n".join(f"{x:.3f}" for x in latencies))
    return run_result(latencies, statuses, 0, elapsed)


def fsync_rate(directory: Path, duration_s: float = 2.0) -> float:
    """The disk's own rate for what an atomic note write does: write, fsync, rename, fsync dir."""
    directory.mkdir(parents=True, exist_ok=True)
    target, tmp = directory / "fsync-probe.md", directory / ".fsync-probe.tmp"
    count, started = 0, time.perf_counter()
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        while time.perf_counter() - started < duration_s:
            with open(tmp, "wb") as f:
                f.write(note_text(count))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
            os.fsync(dir_fd)
            count += 1
    finally:
        os.close(dir_fd)
        target.unlink(missing_ok=True)
    return count / (time.perf_counter() - started)
