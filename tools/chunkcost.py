"""What a request body of many tiny chunks costs a nestgate worker, in CPU time.

Starts `python -m nestgate serve` (one worker, on 127.0.0.1:0) with three routes and a
raw upstream, sends a chunked body of N chunks of SIZE bytes to each, and reads the
worker's CPU time (every thread's run time from /proc/PID/task/*/schedstat, in ns)
before and after each request. The same body bytes sent as one chunk are measured
alongside, so the figure per chunk is what the chunking costs over the bytes.

  proxy    /up/ forwards to an upstream that reads the whole body, then answers 200
  notes    PUT /api/v1/notes/x (the notes write API reads the body, then answers)
  refused  /gone: a ready 404 that reads the body and drops it

    .venv/bin/python tools/chunkcost.py [--chunks 200000] [--size 1] [--runs 3]
        [--h2]   (the same over HTTP/2 cleartext with one DATA frame per chunk)
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import httptools

CONFIG = """
[server]
workers = 1

[[listen]]
address = "127.0.0.1:0"
{h2c}

[limits]
max_body = "64MiB"
{limits}

[[site]]
hosts = ["*"]

[site.notes]
dir = "{notes}"
token = "tok"
max_note_bytes = "64MiB"

[[site.route]]
prefix = "/up/"
type = "proxy"
upstream = "{upstream}"
"""


def cpu_ns(pid: int) -> int:
    """The run time of every thread of `pid` so far, in ns."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except OSError:
            pass
    return total


class SinkUpstream:
    """Reads each request whole with httptools, answers 200 with the body's size."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = "http://127.0.0.1:%d" % self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            conn, _ = self.sock.accept()
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        class Callbacks:
            size = 0
            done = False

            def on_body(self, body: bytes) -> None:
                self.size += len(body)

            def on_message_complete(self) -> None:
                self.done = True
        with conn:
            while True:
                got = Callbacks()
                parser = httptools.HttpRequestParser(got)
                while not got.done:
                    data = conn.recv(1 << 20)
                    if not data:
                        return
                    parser.feed_data(data)
                body = b"%d" % got.size
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%b"
                             % (len(body), body))


def start(upstream: str, folder: Path, h2c: bool, limits: str):
    notes = folder / "notes"
    notes.mkdir(exist_ok=True)
    path = folder / "nestgate.toml"
    path.write_text(textwrap.dedent(CONFIG.format(
        notes=notes, upstream=upstream, h2c="http2_cleartext = true" if h2c else "",
        limits=limits)))
    env = dict(os.environ, NESTGATE_ADMIN="127.0.0.1:0")
    proc = subprocess.Popen([sys.executable, "-m", "nestgate", "serve", "--config", str(path)],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env,
                            text=True)
    port = None
    deadline = time.monotonic() + 20
    while port is None and time.monotonic() < deadline:
        line = proc.stderr.readline()
        found = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        if found:
            port = int(found.group(1))
    threading.Thread(target=proc.stderr.read, daemon=True).start()
    time.sleep(0.5)
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    workers = [int(c) for c in children
               if Path(f"/proc/{c}/comm").read_text().strip() != "nestgate-admin"]
    return proc, port, workers[0]


def h1_request(port: int, method: str, target: str, chunks: int, size: int) -> tuple[bytes, float]:
    piece = b"x" * size
    head = (f"{method} {target} HTTP/1.1\r\nhost: a\r\nauthorization: Bearer tok\r\n"
            "content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n").encode()
    if chunks == 1:
        body = b"%x\r\n%b\r\n" % (size, piece)
    else:
        body = (b"%x\r\n%b\r\n" % (size, piece)) * chunks
    data = head + body + b"0\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        t0 = time.monotonic()
        sender = threading.Thread(target=_send_quietly, args=(sock, data))
        sender.start()
        answer = b""
        while b"\r\n\r\n" not in answer:
            got = sock.recv(65536)
            if not got:
                break
            answer += got
        sender.join(60)
        return answer.split(b"\r\n", 1)[0], time.monotonic() - t0


def _send_quietly(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
    except OSError:
        pass


def h2_request(port: int, target: str, chunks: int, size: int) -> tuple[bytes, float]:
    """One request over h2c (prior knowledge) whose body goes as `chunks` DATA frames
    of `size` bytes, sent as the server's windows allow; frames made by hand."""
    import hpack
    head = struct.Struct(">I B I")       # length << 8 | type, flags, stream

    def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
        return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) \
            + stream.to_bytes(4, "big") + payload
    block = hpack.Encoder().encode([(":method", "PUT"), (":scheme", "http"),
                                    (":authority", "a"), (":path", target),
                                    ("authorization", "Bearer tok")])
    decoder = hpack.Decoder()
    data_frame = frame(0, 0, 1, b"x" * size)
    window = stream_window = 65535
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0)
                     + frame(1, 4, 1, block))
        t0 = time.monotonic()
        sent, answer, buf = 0, None, b""
        while answer is None:
            n = min(chunks - sent, window // size, stream_window // size, 4096)
            if n > 0:
                sent += n
                window -= n * size
                stream_window -= n * size
                out = data_frame * n
                if sent == chunks:
                    out += frame(0, 1, 1)             # END_STREAM
                sock.sendall(out)
                continue
            got = sock.recv(65536)
            if not got:
                break
            buf += got
            while len(buf) >= 9:
                word, flags, stream = head.unpack_from(buf)
                length, kind = word >> 8, word & 0xFF
                if len(buf) < 9 + length:
                    break
                payload, buf = buf[9:9 + length], buf[9 + length:]
                if kind == 4 and not flags & 1:        # SETTINGS: ack, note the window
                    for i in range(0, length, 6):
                        key, value = struct.unpack_from(">HI", payload, i)
                        if key == 4:
                            stream_window += value - 65535
                    sock.sendall(frame(4, 1, 0))
                elif kind == 8:                        # WINDOW_UPDATE
                    inc = int.from_bytes(payload, "big") & 0x7FFFFFFF
                    if stream:
                        stream_window += inc
                    else:
                        window += inc
                elif kind == 1:
                    answer = dict(decoder.decode(payload, raw=True))[b":status"]
                elif kind in (3, 7):                   # RST_STREAM, GOAWAY
                    answer = b"reset" if kind == 3 else b"goaway"
        return answer or b"none", time.monotonic() - t0


def main() -> None:
    args = argparse.ArgumentParser()
    args.add_argument("--chunks", type=int, default=200_000)
    args.add_argument("--size", type=int, default=1)
    args.add_argument("--runs", type=int, default=3)
    args.add_argument("--h2", action="store_true")
    args.add_argument("--limits", default="", help="extra [limits] lines")
    args.add_argument("--only", default="", help="comma-separated case names")
    opts = args.parse_args()
    up = SinkUpstream()
    with tempfile.TemporaryDirectory() as folder:
        proc, port, worker = start(up.url, Path(folder), opts.h2, opts.limits)
        cases = [("proxy", "PUT", "/up/x"), ("notes", "PUT", "/api/v1/notes/x"),
                 ("refused", "PUT", "/gone")]
        if opts.only:
            cases = [c for c in cases if c[0] in opts.only.split(",")]
        try:
            for name, method, target in cases:
                for run in range(opts.runs):
                    figures = []
                    total = opts.chunks * opts.size
                    # The same bytes in big pieces: one chunk, or 8000-byte DATA frames
                    # (a frame is at most 16 KiB).
                    whole = (max(1, total // 8000), min(total, 8000)) if opts.h2 \
                        else (1, total)
                    for chunks, size in (whole, (opts.chunks, opts.size)):
                        before = cpu_ns(worker)
                        if opts.h2:
                            status, wall = h2_request(port, target, chunks, size)
                        else:
                            status, wall = h1_request(port, method, target, chunks, size)
                        figures.append((status, (cpu_ns(worker) - before) / 1e6, wall))
                    (s1, one, _), (sn, many, wall) = figures
                    print(f"{name:8} run {run}: one chunk {one:8.1f} ms cpu ({s1.decode()}); "
                          f"{opts.chunks} chunks {many:8.1f} ms cpu, {wall:.2f} s wall "
                          f"({sn.decode()}); {(many - one) * 1000 / opts.chunks:.2f} us/chunk",
                          flush=True)
        finally:
            proc.terminate()
            proc.wait(20)


if __name__ == "__main__":
    main()
