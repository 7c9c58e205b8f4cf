"""The bytes a scenario serves, generated once per scenario into a work directory.

Content is deterministic (seeded) so two runs of the harness serve the same bytes, and the
same files are handed to every peer. Certificates are made here too: one for all peers.
"""

import gzip
import json
import random
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import brotli

from nestgate.base.private import create_private_file

from . import BenchError, tools

STATIC_FILES = {"f12b.txt": 12, "f10k.bin": 10 * 1024, "f100k.bin": 100 * 1024,
                "f1m.bin": 1024 * 1024}
PAGE_BYTES = 11 * 1024
BACKEND_BODIES = {"2b": b"ok", "4k": b"x" * 4096}
CIDR_ENTRIES = 1000


@dataclass(frozen=True)
class Certificate:
    cert: Path      # PEM chain
    key: Path


def write_all(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    page = page_html(PAGE_BYTES)
    (root / "page.html").write_bytes(page)
    # The precompressed siblings nginx (gzip_static) and Caddy (precompressed) serve.
    (root / "page.html.gz").write_bytes(gzip.compress(page, compresslevel=9, mtime=0))
    (root / "page.html.br").write_bytes(brotli.compress(page, quality=11))
    static = root / "static"
    static.mkdir(exist_ok=True)
    rng = random.Random(5)
    for name, size in STATIC_FILES.items():
        data = b"hello nest!\n"[:size] if name.endswith(".txt") else rng.randbytes(size)
        (static / name).write_bytes(data)
    write_notes(root / "notes")
    backend = root / "backend"
    backend.mkdir(exist_ok=True)
    for name, body in BACKEND_BODIES.items():
        (backend / name).write_bytes(body)


def page_html(size: int) -> bytes:
    head = b"<!doctype html><html><head><meta charset=utf-8><title>bench page</title></head><body>\n"
    tail = b"</body></html>\n"
    para = b"<p>The quick brown fox jumps over the lazy dog; a page of about eleven kilobytes.</p>\n"
    body = (para * (size // len(para) + 1))[: size - len(head) - len(tail)]
    return head + body + tail


LONG_NOTE_SECTIONS = 80          # about 20 KB of Markdown, a 25 KB page
MEDIUM_NOTE_SECTIONS = 27        # a page of about 10 KB


def note_markdown(i: int, sections: int, revision: int = 0) -> str:
    """Hugo-style note: front matter, then sections with text, a table and code.
    `revision` changes every section, so a rewritten note shares no block with the last."""
    section = ("## Section {j}\n\nSome *text* with `code` and a [link](https://example.com), "
               "revision {r}.\n\n| a | b |\n|---|---|\n| {j} | {r} |\n\n"
               "```python\nprint({j}, {r})\n```\n\n")
    body = "".join(section.format(j=j, r=revision) for j in range(sections))
    return f"---\ntitle: Note {i}\ndate: 2025-01-{1 + i % 28:02d}\ntags: [bench]\n---\n\n{body}"


def write_notes(notes: Path, count: int = 30) -> None:
    """30 notes: the long one (~20 KB of Markdown), a medium one (a ~10 KB page), the
    rest short."""
    notes.mkdir(parents=True, exist_ok=True)
    named = {0: ("long-note", LONG_NOTE_SECTIONS), 1: ("medium-note", MEDIUM_NOTE_SECTIONS)}
    for i in range(count):
        slug, sections = named.get(i, (f"note-{i:03d}", 3))
        (notes / f"{slug}.md").write_text(note_markdown(i, sections))


def health_json(length: int) -> str:
    """A JSON object of exactly `length` bytes, for a peer that must match nestgate's health."""
    base = json.dumps({"status": "ok", "version": "peer", "uptime_s": 0, "pid": 0},
                      separators=(",", ":"))
    if length <= len(base):
        return '{"status":"ok"}'.ljust(length)
    # Whitespace is valid JSON; padding inside the object keeps it one line.
    return base[:-1] + " " * (length - len(base)) + "}"


def cidr_list(count: int = CIDR_ENTRIES) -> list[str]:
    """`count` distinct networks; the loopback client matches only the last one (worst case)."""
    nets = [f"10.{i // 256}.{i % 256}.0/24" for i in range(count - 1)]
    return nets + ["127.0.0.0/8"]


def certificate(root: Path) -> Certificate:
    """RSA-2048 self-signed certificate for localhost/127.0.0.1 (openssl, or trustme)."""
    cert, key = root / "cert.pem", root / "key.pem"
    if cert.exists() and key.exists():
        return Certificate(cert, key)
    root.mkdir(parents=True, exist_ok=True)
    key.unlink(missing_ok=True)
    create_private_file(key)            # 0600 before a byte of the key is written
    if tools.which("openssl"):
        subprocess.run([tools.require("openssl"), "req", "-x509", "-newkey", "rsa:2048", "-nodes",
                        "-keyout", str(key), "-out", str(cert), "-days", "7",
                        "-subj", "/CN=localhost",
                        "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                       check=True, capture_output=True)
        return Certificate(cert, key)
    try:
        import trustme
    except ImportError as exc:
        raise BenchError("need openssl (apt-get install openssl) or trustme to make a "
                         "certificate") from exc
    issued = trustme.CA().issue_cert("localhost", "127.0.0.1")
    cert.write_bytes(b"".join(pem.bytes() for pem in issued.cert_chain_pems))
    key.write_bytes(issued.private_key_pem.bytes())
    return Certificate(cert, key)


def remove(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
