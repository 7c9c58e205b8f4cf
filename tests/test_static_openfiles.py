"""Large static files served from descriptors kept open between requests: a file
changed, renamed over, swapped for a symlink or deleted on disk is answered correctly
once `recheck` has passed; an answer sending when its file is replaced ends with the
bytes it began with; and the descriptors kept stay bounded. Over plain TCP
(`sendfile`) and TLS (reads)."""

from __future__ import annotations

import http.client
import os
import socket
import ssl
import time

import pytest

from conftest import poll, serve
from nestgate.handlers.openfiles import KEEP_OPEN_MAX

RECHECK = 0.2
_TLS = """
[[listen]]
address = "127.0.0.1:0"
[[listen.certificate]]
cert = "{cert}"
key = "{key}"
"""


@pytest.fixture
def root(tmp_path):
    site = tmp_path / "public"
    site.mkdir()
    return site


@pytest.fixture(params=["plain", "tls"])
def server(request, start_server, root, certs):
    """A one-worker server on `root` (large from 64 KiB, recheck 0.2 s) and how to
    reach it: (server, port, ssl context or None)."""
    if request.param == "plain":
        srv = serve(start_server, root, recheck=f"{RECHECK}s")
        return srv, srv.port(), None
    tls = _TLS.format(cert=certs["local"][0], key=certs["local"][1])
    srv = serve(start_server, root, recheck=f"{RECHECK}s", tls=tls)
    return srv, srv.port("https"), ssl.create_default_context(cafile=certs["ca"])


def get(reach, path, method="GET", headers=None):
    _, port, context = reach
    if context is not None:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)
    else:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def replace(path, data: bytes) -> None:
    """A deploy's way: a new file renamed over the old name."""
    fresh = path.with_name(path.name + ".new")
    fresh.write_bytes(data)
    os.replace(fresh, path)


def open_below(pid: int, folder) -> list[str]:
    """What the process has open below `folder` (from /proc/PID/fd)."""
    prefix = os.path.realpath(folder) + "/"
    found = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue                           # closed while listed
        if target.startswith(prefix):
            found.append(target[len(prefix):])
    return sorted(found)


def test_renamed_over_and_rewritten_files_are_served_new(server, root):
    first, second, third = os.urandom(200_000), os.urandom(150_000), os.urandom(180_000)
    (root / "big.bin").write_bytes(first)
    assert get(server, "/big.bin")[2] == first
    replace(root / "big.bin", second)
    answers = []
    status, headers, body = poll(lambda: answers.append(get(server, "/big.bin")) or answers[-1],
                                 lambda got: got[2] != first, timeout=5)
    assert (status, body) == (200, second)
    assert int(headers["content-length"]) == len(second)
    # Until then, the old file whole: a rename never mixes the two.
    assert all(got[:1] == (200,) and got[2] in (first, second) for got in answers)
    # The same inode written again in place (size and mtime change): the new bytes
    # once the re-check has seen the change.
    (root / "big.bin").write_bytes(third)
    status, _, body = poll(lambda: get(server, "/big.bin"),
                           lambda got: got[2] == third, timeout=5)
    assert (status, body) == (200, third)


def test_kept_file_answers_head_304_and_range(server, root):
    data = os.urandom(200_000)
    (root / "big.bin").write_bytes(data)
    status, headers, body = get(server, "/big.bin")
    assert (status, body) == (200, data)
    etag = headers["etag"]
    # Within recheck: each answered from the kept descriptor.
    status, headers, body = get(server, "/big.bin", "HEAD")
    assert (status, body, int(headers["content-length"])) == (200, b"", len(data))
    assert get(server, "/big.bin", headers={"If-None-Match": etag})[0] == 304
    status, headers, body = get(server, "/big.bin", headers={"Range": "bytes=1000-1999"})
    assert (status, body) == (206, data[1000:2000])
    assert headers["content-range"] == f"bytes 1000-1999/{len(data)}"
    assert get(server, "/big.bin", headers={"Range": "bytes=900000-"})[0] == 416


def test_deleted_file_is_404_and_its_descriptor_closed(server, root):
    srv = server[0]
    (root / "big.bin").write_bytes(os.urandom(200_000))
    assert get(server, "/big.bin")[0] == 200
    worker = srv.worker_pids()[0]
    assert open_below(worker, root) == ["big.bin"]      # kept open between requests
    (root / "big.bin").unlink()
    assert poll(lambda: get(server, "/big.bin")[0], lambda status: status == 404,
                timeout=5) == 404
    assert poll(lambda: open_below(worker, root), lambda files: not files, timeout=5) == []


def test_symlink_swapped_to_outside_is_404(server, root, tmp_path):
    inside, outside = os.urandom(200_000), os.urandom(200_000)
    (root / "real.bin").write_bytes(inside)
    (tmp_path / "secret.bin").write_bytes(outside)
    (root / "link.bin").symlink_to(root / "real.bin")
    assert get(server, "/link.bin")[2] == inside
    swap = root / "link.new"
    swap.symlink_to(tmp_path / "secret.bin")
    os.replace(swap, root / "link.bin")
    seen = []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        status, _, body = get(server, "/link.bin")
        seen.append((status, body == outside))
        if status == 404:
            break
        assert body == inside                  # the old file until the re-check
        time.sleep(0.05)
    assert seen[-1] == (404, False)
    assert not any(leaked for _, leaked in seen)
    assert get(server, "/real.bin")[2] == inside


def _start_slow_download(reach, path: str):
    """A GET whose reader takes almost nothing: returns (socket, Content-Length, the
    body bytes read so far) once the answer is well under way."""
    _, port, context = reach
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)    # no autotuned window
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port))
    if context is not None:
        sock = context.wrap_socket(sock, server_hostname="127.0.0.1")
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: a\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < 100_000:
        body += sock.recv(65536)
    return sock, length, body


def test_answer_under_way_ends_with_the_bytes_it_began_with(server, root):
    """16 MiB cannot fit in the socket buffers (4 MiB at most here), so the first
    answer is still sending while the file is replaced, re-checked, dropped from the
    kept files and the new one opened in its place."""
    old, new = os.urandom(16 << 20), os.urandom((16 << 20) + 4096)
    (root / "big.bin").write_bytes(old)
    sock, length, body = _start_slow_download(server, "/big.bin")
    try:
        assert length == len(old)
        replace(root / "big.bin", new)
        time.sleep(RECHECK + 0.1)
        status, headers, _ = poll(lambda: get(server, "/big.bin", "HEAD"),
                                  lambda got: int(got[1]["content-length"]) == len(new),
                                  timeout=5)
        assert int(headers["content-length"]) == len(new)
        for name in ("a.bin", "b.bin", "c.bin"):         # descriptors opened meanwhile
            (root / name).write_bytes(os.urandom(100_000))
            assert get(server, f"/{name}")[0] == 200
        while len(body) < length:
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            body += chunk
    finally:
        sock.close()
    assert len(body) == length and body == old
    assert get(server, "/big.bin")[2] == new


def test_kept_descriptors_are_bounded(server, root):
    srv = server[0]
    names = [f"f{i:03}.bin" for i in range(KEEP_OPEN_MAX + 16)]
    for name in names:
        (root / name).write_bytes(os.urandom(70_000))
    for name in names:
        assert get(server, f"/{name}")[0] == 200
    worker = srv.worker_pids()[0]
    # Kept: the most recently asked for, up to the bound; the others closed.
    kept = poll(lambda: open_below(worker, root),
                lambda files: len(files) <= KEEP_OPEN_MAX, timeout=5)
    assert kept == names[-KEEP_OPEN_MAX:]


def _answers(data: bytes) -> list[tuple[int, dict, bytes]]:
    """Pipelined HTTP/1.1 answers (all with Content-Length) split from `data`."""
    out = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        fields = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(fields["content-length"])
        out.append((int(lines[0].split()[1]), fields, rest[:length]))
        data = rest[length:]
    return out


def test_pipelined_answers_around_a_sent_file_keep_their_order(server, root):
    """A ready answer still waiting for the batch's end, then a kept large file sent
    around the transport (head and file on the socket itself), then more: one write
    of five requests, five answers in order, each whole."""
    small, big = os.urandom(3_000), os.urandom(300_000)
    (root / "small.bin").write_bytes(small)
    (root / "big.bin").write_bytes(big)
    assert get(server, "/small.bin")[2] == small        # cached: answered when parsed
    assert get(server, "/big.bin")[2] == big            # kept open
    _, port, context = server
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    if context is not None:
        sock = context.wrap_socket(sock, server_hostname="127.0.0.1")
    paths = ["/small.bin", "/big.bin", "/small.bin", "/big.bin", "/small.bin"]
    requests = [f"GET {p} HTTP/1.1\r\nHost: a\r\n" for p in paths]
    requests[3] += "Range: bytes=10-19\r\n"
    requests[-1] += "Connection: close\r\n"
    sock.sendall("".join(r + "\r\n" for r in requests).encode())
    data = b""
    with sock:
        while chunk := sock.recv(1 << 20):
            data += chunk
    answers = _answers(data)
    assert [a[0] for a in answers] == [200, 200, 200, 206, 200]
    assert [a[2] for a in answers] == [small, big, small, big[10:20], small]
    assert answers[1][1]["content-length"] == str(len(big))
