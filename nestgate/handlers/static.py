"""Static files from a directory: cached complete responses, `sendfile` for big files.

Theory of operation
-------------------
A request path (already percent-decoded once and dot-normalised by the engine) is
mapped below the route's prefix to a path relative to `root`. Small files are read
once, off the loop, into complete `Prebuilt` responses (one per encoding: identity,
`.br`, `.gz` siblings), kept in an LRU bounded by total bytes; a warm hit is a dict
lookup, a few header comparisons and one write. A cached file is stat-ed again at
most once per `recheck` interval, off the loop, so a change or deletion on disk is
served correctly soon after. Files at or above `sendfile_min` are never read into
memory: `os.sendfile` on the socket (plain TCP) or reads from an executor (TLS).
A large file's open descriptor, stat and header fields are kept (`openfiles`, at
most `KEEP_OPEN_MAX`, least recently used out first), so the next requests for it
within `recheck` open nothing and need no executor trip: only the `sendfile` (or the
TLS path's reads). After `recheck` the path is resolved and stat-ed again off the loop
and the descriptor kept only while the path still names the same file (inode, mtime,
size); else it is dropped, and closed once no answer sends from it. Only the identity
answer is kept: a precompressed sibling is looked for and opened per request as before.

Path safety: hidden segments (".git") are refused; the path is resolved with
`realpath` and must stay inside the resolved root; the file is opened with
O_NOFOLLOW and, after opening, /proc/self/fd confirms what was opened is inside the
root and is a regular file, so a directory swapped for a symlink between the check
and the open cannot lead outside. A name that vanishes or changes kind between two of
these steps (a deploy renaming a symlink over, removing the old release) is a 404,
never an error. A listing leaves out symlinks that lead outside the root.

This module must not block the loop: every open/stat/read runs in the executor.
"""

from __future__ import annotations

import asyncio
import collections
import html
import logging
import mimetypes
import os
import socket
import stat
from urllib.parse import quote

from nestgate.base import compress
from nestgate.base.clock import CLOCK
from nestgate.base.errors import HandlerError
from nestgate.base.handler import PEEK, Service
from nestgate.base.httpdate import http_date, parse_http_date
from nestgate.base.responses import (CONNECTION_ENDINGS, SERVER, STATUS_LINES, Prebuilt,
                                     header_block, header_pairs, html_page, lines_of,
                                     status_line)
from nestgate.base.sendwatch import cut
from nestgate.base.tally import TALLY
from nestgate.handlers.openfiles import KeptFile, OpenFiles

log = logging.getLogger("nestgate.static")

_READ_CHUNK = 256 * 1024
_SENDFILE_CHUNK = 4 * 1024 * 1024
_AF_INET, _SOCK_STREAM = int(socket.AF_INET), int(socket.SOCK_STREAM)
_ENCODINGS = (("br", ".br"), ("gzip", ".gz"))   # precompressed siblings, preference order
# Request headers that change the answer for a cached file, each with its slot in
# `_conditional_headers`; any other header is skipped with one dict lookup in `peek`.
_CONDITIONAL = {b"if-none-match": 0, b"if-modified-since": 1, b"range": 2, b"if-range": 3,
                b"accept-encoding": 4}

_TYPES = {
    ".html": "text/html; charset=utf-8", ".htm": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8", ".json": "application/json",
    ".txt": "text/plain; charset=utf-8", ".md": "text/markdown; charset=utf-8",
    ".xml": "application/xml", ".svg": "image/svg+xml", ".ico": "image/x-icon",
    ".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif",
    ".webp": "image/webp", ".avif": "image/avif", ".woff2": "font/woff2",
    ".woff": "font/woff", ".wasm": "application/wasm", ".pdf": "application/pdf",
    ".mp4": "video/mp4", ".webm": "video/webm",
}


def content_type(name: str) -> str:
    ext = os.path.splitext(name)[1].lower()
    known = _TYPES.get(ext)
    if known:
        return known
    guessed = mimetypes.guess_type(name, strict=False)[0]
    if not guessed:
        return "application/octet-stream"
    return guessed + "; charset=utf-8" if guessed.startswith("text/") else guessed


class Bodiless:
    """A ready response without a body or Content-Length (304): `Prebuilt`'s render API."""

    is_async = False
    __slots__ = ("status", "content_length", "body", "_head", "fields", "h2_cache")

    def __init__(self, status: int, headers) -> None:
        self.status = status
        self.content_length = 0
        self.body = b""
        self.h2_cache = None
        self.fields = header_pairs(headers)
        self._head = (STATUS_LINES.get(status) or status_line(status)) + SERVER.line \
            + lines_of(self.fields)

    def render(self, mode: int, head_only: bool = False) -> bytes:
        return self._head + CLOCK.date_line + CONNECTION_ENDINGS[mode]

    def write_to(self, transport, mode: int, head_only: bool = False) -> int:
        data = self._head + CLOCK.date_line + CONNECTION_ENDINGS[mode]
        transport.write(data)
        return len(data)


class FileShrank(HandlerError):
    """The file ended before the length its answer promised (it was truncated or
    rewritten while being sent): the answer cannot be completed, so the connection
    ends after what was sent (`dispatch.conclude` cuts an answer under way). Logged
    once, by `_shrank`, where the file's name is known: no traceback, it is not a fault
    of nestgate's."""

    def __init__(self) -> None:
        super().__init__(500, "file shrank while being sent")


def _shrank(request, real: str) -> None:
    log.warning("%s shrank while being sent to %s: the answer was cut after %d body bytes",
                real, request.client, request.sent)


class NotFound(Exception):
    pass


class Variant:
    """One encoding of a cached file: its 200, its 304 and its validators."""

    __slots__ = ("encoding", "etag", "full", "not_modified")

    def __init__(self, encoding, etag, full, not_modified) -> None:
        self.encoding, self.etag, self.full, self.not_modified = encoding, etag, full, not_modified


class Entry:
    __slots__ = ("real", "signature", "checked", "mtime", "body", "variants", "identity",
                 "size", "type", "last_modified", "weight", "codings")


class Opened:
    """A file opened off the loop and checked: fd, stat, path."""

    __slots__ = ("fd", "st", "real")

    def __init__(self, fd, st, real) -> None:
        self.fd, self.st, self.real = fd, st, real


def _etag(st, encoding: str = "") -> str:
    suffix = f"-{encoding}" if encoding else ""
    return f'"{st.st_mtime_ns:x}-{st.st_size:x}{suffix}"'


def _signature(st) -> tuple | None:
    return None if st is None else (st.st_ino, st.st_mtime_ns, st.st_size)


class StaticFiles(Service):
    """The `static` route type; its options are `routetypes.StaticOptions`.

    `peek` answers from the parser callback whatever a cached file can answer without
    the disk: its 200 (or the precompressed variant Accept-Encoding picks), its 304,
    and 405 for other methods. A Range request, a file not cached, or one due for its
    once-a-second stat returns None: `handle` then runs as a task.

    As a service, it closes the large files it keeps open when the worker stops."""

    is_async = PEEK

    def __init__(self, options, prefix: str, headers=(), not_found=None,
                 tls: bool = False, site: str = "") -> None:
        self.root = os.path.realpath(options.root)
        self._root_slash = self.root.rstrip("/") + "/"
        self.prefix = (prefix or "/").rstrip("/") + "/"
        self.index = options.index
        self.listing = options.listing
        self.cache_bytes = options.cache_bytes
        self.cache_file_max = min(options.cache_file_max, options.sendfile_min)
        self.sendfile_min = options.sendfile_min
        self.precompressed = options.precompressed
        self.compress = options.compress
        # Cache-Control: no-transform forbids changing the coding (RFC 9111 5.2.2.6).
        if "no-transform" in options.cache_control.lower():
            self.compress = False
        self.recheck = options.recheck
        self.extra = list(headers)
        if options.cache_control:
            self.extra.append(("cache-control", options.cache_control))
        # A listing changes with its folder and has no validator: `no-cache`, unless the
        # route says otherwise, always in one field (two, `no-cache` beside the route's
        # `max-age`, left caches to pick). A protected site's `private` joins it.
        given = [value for name, value in self.extra if name.lower() == "cache-control"]
        self.listing_headers = [
            ("content-type", "text/html; charset=utf-8"),
            ("cache-control", options.cache_control or ", ".join([*given, "no-cache"])),
            *[(name, value) for name, value in self.extra if name.lower() != "cache-control"]]
        self.not_found = not_found or Prebuilt(404, html_page(404), "text/html; charset=utf-8")
        self._cache: collections.OrderedDict[str, Entry] = collections.OrderedDict()
        self._cached_bytes = 0
        self._open_files = OpenFiles()
        self._negotiator = compress.Negotiator()
        self.hits = self.misses = 0     # answered from the cache in `peek`; loaded
        self.site, self.label = site, prefix + "*"      # for the cache metrics
        TALLY.caches.append(self)
        self.method_not_allowed = Prebuilt(405, b"method not allowed\n",
                                           "text/plain; charset=utf-8",
                                           [("allow", "GET, HEAD"), *self.extra])
        self.loop = None
        self._warm_key = (self.root, options, tuple(self.extra))
        if options.warm:
            self.warm()

    def stop(self) -> None:
        self._open_files.drop_all()

    def cache_figures(self) -> list:
        return ["static", self.site, self.label, self.hits, self.misses, self._cached_bytes]

    # ------------------------------------------------------------ the parser callback
    def peek(self, path: str, method: bytes, headers):
        """A ready response when memory holds the answer, else None (see the class)."""
        if method != b"GET" and method != b"HEAD":
            return self.method_not_allowed
        prefix = self.prefix
        if not path.startswith(prefix):
            return None
        # Only paths `_relative` accepted are ever cached, so a hit needs no checks.
        rel = path[len(prefix):]
        entry = self._cache.get(rel)
        if entry is None or CLOCK.now - entry.checked >= self.recheck:
            return None
        self._cache.move_to_end(rel)
        inm = ims = accept = None
        for name, value in headers:
            if name in _CONDITIONAL:
                if name == b"if-none-match":
                    inm = value
                elif name == b"accept-encoding":
                    accept = value
                elif name == b"if-modified-since":
                    ims = value
                else:
                    return None                  # Range, If-Range: the task path
        variant = entry.identity
        if accept is not None and len(entry.variants) > 1:
            variant = entry.variants[self._negotiator.pick(accept, entry.codings)]
        self.hits += 1
        if (inm is not None or ims is not None) and \
                _not_modified(inm, ims, variant.etag, entry.mtime):
            return variant.not_modified
        return variant.full

    # ------------------------------------------------------------ the request
    async def handle(self, request) -> None:
        if request.method not in (b"GET", b"HEAD"):
            await request.send_prebuilt(self.method_not_allowed)
            return
        rel = self._relative(request.path)
        if rel is None:
            await request.send_prebuilt(self.not_found)
            return
        self.loop = request.loop
        entry = self._cache.get(rel)
        if entry is not None and CLOCK.now - entry.checked < self.recheck:
            self._cache.move_to_end(rel)
            await self._answer_cached(request, entry)
            return
        kept = self._open_files.get(rel)
        if kept is not None and CLOCK.now - kept.checked < self.recheck:
            await self._answer_large(request, kept)
            return
        try:
            await self._slow(request, rel, entry, kept)
        except NotFound:
            await request.send_prebuilt(self.not_found)

    def _relative(self, path: str) -> str | None:
        """Path below the root ("" for the root itself, a trailing "/" kept), or None
        when it is not ours to serve (outside the prefix, or a hidden segment)."""
        if not path.startswith(self.prefix):
            return "" if path + "/" == self.prefix else None
        rel = path[len(self.prefix):]
        for segment in rel.split("/"):
            if segment.startswith("."):
                return None
        return rel

    async def _slow(self, request, rel: str, entry: Entry | None,
                    kept: KeptFile | None) -> None:
        loop = self.loop
        if kept is not None:
            same = await loop.run_in_executor(None, self._still_same, rel, kept,
                                              request.path.endswith("/"))
            # Dropped meanwhile (evicted, or replaced by another answer's open), it may
            # be closed already: found anew below.
            if same and not kept.dropped:
                kept.checked = CLOCK.now
                await self._answer_large(request, kept)
                return
            self._open_files.drop(rel, kept)
        if entry is not None:
            fresh = await loop.run_in_executor(None, self._still_fresh, entry)
            if fresh:
                entry.checked = CLOCK.now
                await self._answer_cached(request, entry)
                return
            self._forget(rel)
        found = await loop.run_in_executor(None, self._locate, rel, request.path.endswith("/"))
        if found[0] == "redirect":
            location = quote(request.path) + "/" + \
                ("?" + request.query.decode("latin-1") if request.query else "")
            await request.send(308, [("location", location), *self.extra,
                                     ("content-type", "text/html; charset=utf-8")],
                               html_page(308, location))
            return
        if found[0] == "listing":
            body = await loop.run_in_executor(None, self._listing, found[1], request.path)
            await request.send(200, self.listing_headers, body)
            return
        real, st = found[1], found[2]
        if st.st_size < self.cache_file_max:
            self.misses += 1
            entry = await loop.run_in_executor(None, self._load, real)
            if entry.weight <= self.cache_bytes:
                self._remember(rel, entry)
            await self._answer_cached(request, entry)
            return
        opened = await loop.run_in_executor(None, self._open, real)
        etag, headers = self._large_headers(opened.st, real, "")
        kept = KeptFile(opened.fd, opened.st, real, etag, headers, CLOCK.now)
        self._open_files.keep(rel, kept)
        await self._answer_large(request, kept)

    # ------------------------------------------------------------ cached files
    async def _answer_cached(self, request, entry: Entry) -> None:
        inm, ims, rng, if_range, accept = _conditional_headers(request.headers)
        variant = entry.identity
        if accept is not None and len(entry.variants) > 1 and rng is None:
            variant = entry.variants[self._negotiator.pick(accept, entry.codings)]
        if _not_modified(inm, ims, variant.etag, entry.mtime):
            await request.send_prebuilt(variant.not_modified)
            return
        if rng is not None and _range_applies(if_range, entry.identity.etag):
            span = parse_range(rng, entry.size)
            if span is False:
                await self._unsatisfiable(request, entry.size)
                return
            if span is not None:
                start, end = span
                await request.send(206, [
                    ("content-type", entry.type), ("etag", entry.identity.etag),
                    ("last-modified", entry.last_modified), ("accept-ranges", "bytes"),
                    ("content-range", f"bytes {start}-{end}/{entry.size}"), *self.extra,
                ], entry.body[start:end + 1])
                return
        await request.send_prebuilt(variant.full)

    async def _unsatisfiable(self, request, size: int) -> None:
        await request.send(416, [("content-range", f"bytes */{size}"), *self.extra,
                                 ("content-type", "text/plain; charset=utf-8")],
                           b"range not satisfiable\n")

    def _remember(self, rel: str, entry: Entry) -> None:
        self._forget(rel)
        self._cache[rel] = entry
        self._cached_bytes += entry.weight
        while self._cached_bytes > self.cache_bytes and self._cache:
            _, old = self._cache.popitem(last=False)
            self._cached_bytes -= old.weight

    def _forget(self, rel: str) -> None:
        old = self._cache.pop(rel, None)
        if old is not None:
            self._cached_bytes -= old.weight

    # ------------------------------------------------------------ large files
    async def _answer_large(self, request, kept: KeptFile) -> None:
        """From the kept descriptor, or a precompressed sibling Accept-Encoding picks.
        Held for the whole answer: a kept file dropped meanwhile stays open until then."""
        inm, ims, rng, if_range, accept = _conditional_headers(request.headers)
        sent_from = kept.real
        kept.hold()
        try:
            if self.precompressed and accept is not None and rng is None:
                # Files this big are never compressed here: only their siblings are sent.
                sibling = await self._open_sibling(kept.real, accept)
                if sibling is not None:
                    opened, encoding = sibling
                    sent_from = kept.real + dict(_ENCODINGS)[encoding]
                    try:
                        etag, headers = self._large_headers(opened.st, kept.real, encoding)
                        await self._send_file(request, opened.fd, opened.st, etag, headers,
                                              None, None, inm, ims)
                    finally:
                        os.close(opened.fd)
                    return
            await self._send_file(request, kept.fd, kept.st, kept.etag, kept.headers,
                                  rng, if_range, inm, ims, kept.block)
        except FileShrank:
            _shrank(request, sent_from)
            raise
        finally:
            kept.release()

    async def _open_sibling(self, real: str, accept: bytes) -> tuple[Opened, str] | None:
        siblings = dict(_ENCODINGS)
        while (enc := compress.negotiate(accept, tuple(siblings))):
            try:
                return await self.loop.run_in_executor(None, self._open, real + siblings[enc]), enc
            except NotFound:
                del siblings[enc]
        return None

    def _large_headers(self, st, real: str, encoding: str) -> tuple[str, list]:
        """A large file's ETag and its 200's header fields (Content-Length aside)."""
        etag = _etag(st, encoding)
        headers = [("content-type", content_type(real)), ("etag", etag),
                   ("last-modified", http_date(st.st_mtime)), ("accept-ranges", "bytes")]
        if encoding:
            headers.append(("content-encoding", encoding))
        if self.precompressed:
            headers.append(("vary", "accept-encoding"))
        return etag, headers + self.extra

    async def _send_file(self, request, fd: int, st, etag: str, headers: list, rng, if_range,
                         inm, ims, block: bytes | None = None) -> None:
        """The 200, 206, 304 or 416 for an open file; `headers` is not changed. `block`:
        the 200's header lines as bytes, when kept (a kept file's)."""
        if _not_modified(inm, ims, etag, st.st_mtime):
            request.start(304, [h for h in headers if h[0] != "content-type"], None)
            return
        start, length, status = 0, st.st_size, 200
        if rng is not None and _range_applies(if_range, etag):
            span = parse_range(rng, st.st_size)
            if span is False:
                await self._unsatisfiable(request, st.st_size)
                return
            if span is not None:
                start, length, status = span[0], span[1] - span[0] + 1, 206
                headers = [*headers,
                           ("content-range", f"bytes {span[0]}-{span[1]}/{st.st_size}")]
                block = None
        if block is None:
            block = header_block(headers)
        transport = request.sendfile_transport() \
            if length and not request.head_only else None
        if transport is not None:
            await self._sendfile(request, transport, fd, start, length, request.send_timeout,
                                 request.head_bytes(status, block, length))
            return
        request.start_raw(status, block, length)
        if request.head_only or not length:
            return
        await self._send_reads(request, fd, start, length)   # TLS or HTTP/2: through us

    async def _send_reads(self, request, fd: int, offset: int, length: int) -> None:
        loop = self.loop
        while length > 0:
            size = await request.room(min(_READ_CHUNK, length))
            chunk = await loop.run_in_executor(None, os.pread, fd, size, offset)
            if not chunk:
                raise FileShrank()
            await request.write(chunk)
            offset += len(chunk)
            length -= len(chunk)

    async def _sendfile(self, request, transport, fd: int, offset: int, length: int,
                        send_timeout: float, head: bytes) -> None:
        """Zero-copy, on the socket's own descriptor once the transport's buffer (an
        answer before this one) is empty (`_send_now`), waiting for writability when
        the socket is full. The wait watches a duplicate of the descriptor (the loop
        watches the original for the transport), made only then. The bytes bypass the
        transport, so the connection's send watch cannot see them wait: a client that
        takes nothing for `send_timeout` is cut off here.
        A client that goes away (reset, closed, cut off) ends the answer as any
        vanished client does (`ConnectionResetError`, see `dispatch.answer`): the
        usual end of an aborted download, worth a debug line, never a traceback."""
        loop = self.loop
        waiting = _WaitFd(transport.get_extra_info("socket").fileno())
        try:
            while transport.get_write_buffer_size():
                await waiting.writable(loop, send_timeout)
                await asyncio.sleep(0)
            while True:
                if transport.is_closing():
                    raise ConnectionResetError("client went away")
                head, offset, length = _send_now(request, transport, fd, head, offset,
                                                 length)
                if not head and not length:
                    return
                await waiting.writable(loop, send_timeout)
        except (BrokenPipeError, ConnectionResetError, TimeoutError) as exc:
            _gone(request, transport, exc)
            raise ConnectionResetError("client went away") from None
        finally:
            waiting.close()

    # ------------------------------------------------------------ from the callback
    def begin(self, request) -> bool:
        """A kept large file asked for plainly (GET, no condition, no Range, nothing to
        negotiate) over plain HTTP/1.1 is sent from the parser's callback, without a
        task, when the socket takes all of it at once, as it usually does (its buffer
        grows to a few MiB); a task sends what the socket did not take. Anything else
        is `handle`'s, in a task (False)."""
        if request.method != b"GET":
            return False
        rel = self._relative(request.path)
        if rel is None or rel in self._cache:
            return False
        kept = self._open_files.get(rel)
        if kept is None or CLOCK.now - kept.checked >= self.recheck or not kept.st.st_size:
            return False
        inm, ims, rng, _, accept = _conditional_headers(request.headers)
        if inm is not None or ims is not None or rng is not None or \
                (self.precompressed and accept is not None):
            return False
        transport = request.sendfile_transport()
        if transport is None or transport.get_write_buffer_size():
            return False
        self.loop = request.loop
        size = kept.st.st_size
        head = request.head_bytes(200, kept.block, size)
        kept.hold()
        try:
            head, offset, length = _send_now(request, transport, kept.fd, head, 0, size)
        except (BrokenPipeError, ConnectionResetError) as exc:
            kept.release()
            _gone(request, transport, exc)
            request.answered(500)          # bytes may be out: the connection is cut
            return True
        except FileShrank:
            kept.release()
            _shrank(request, kept.real)
            request.answered(500)          # bytes may be out: the connection is cut
            return True
        if head or length:
            request.task = self.loop.create_task(
                self._send_rest(request, transport, kept, head, offset, length))
        else:
            kept.release()
            request.answered()
        return True

    async def _send_rest(self, request, transport, kept: KeptFile, head: bytes,
                         offset: int, length: int) -> None:
        """What `begin` could not send at once, then the answer's end, as `dispatch`
        would conclude it."""
        status = 0
        try:
            await self._sendfile(request, transport, kept.fd, offset, length,
                                 request.send_timeout, head)
        except (asyncio.CancelledError, ConnectionResetError):
            status = 500                   # gone: `answered` then finds nothing to do
        except FileShrank:
            _shrank(request, kept.real)
            status = 500
        except Exception:
            log.exception("sending %s failed", kept.real)
            status = 500
        finally:
            kept.release()
        request.answered(status)

    # ------------------------------------------------------------ disk (executor)
    def _locate(self, rel: str, slash: bool):
        """("file", real, st) | ("redirect",) | ("listing", dir); NotFound otherwise.
        A directory asked for without its trailing slash is redirected to it, so the
        relative links of its index work."""
        real = self._contained(os.path.join(self.root, rel))
        try:
            st = os.stat(real)
        except OSError:
            raise NotFound() from None
        if stat.S_ISDIR(st.st_mode):
            if not slash:
                return ("redirect",)
            index = self._contained(os.path.join(real, self.index))
            try:
                ist = os.stat(index)
            except OSError:
                ist = None
            if ist is not None and stat.S_ISREG(ist.st_mode):
                return ("file", index, ist)
            if self.listing:
                return ("listing", real)
            raise NotFound()
        if not stat.S_ISREG(st.st_mode) or rel.endswith("/"):
            raise NotFound()
        return ("file", real, st)

    def _contained(self, path: str) -> str:
        # realpath lstat()s a name and then readlink()s it: a symlink renamed over, or
        # a release directory removed, in between is ENOENT or EINVAL. Either way the
        # name names nothing servable at this moment: 404, as a later request would get.
        try:
            real = os.path.realpath(path)
        except OSError:
            raise NotFound() from None
        if real != self.root and not real.startswith(self._root_slash):
            raise NotFound()
        return real

    def _open(self, path: str) -> Opened:
        """Open a regular file inside the root, checked after opening."""
        real = self._contained(path)
        try:
            fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            raise NotFound() from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise NotFound()
            try:
                opened_path = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                opened_path = real             # no /proc: the O_NOFOLLOW open stands
            if opened_path != self.root and not opened_path.startswith(self._root_slash):
                raise NotFound()
            return Opened(fd, st, real)
        except BaseException:
            os.close(fd)
            raise

    def _read(self, path: str) -> tuple[bytes, os.stat_result] | None:
        try:
            opened = self._open(path)
        except NotFound:
            return None
        try:
            parts, left = [], opened.st.st_size
            while left > 0:
                chunk = os.read(opened.fd, min(left, 1 << 20))
                if not chunk:
                    break
                parts.append(chunk)
                left -= len(chunk)
            return b"".join(parts), opened.st
        finally:
            os.close(opened.fd)

    def _load(self, real: str) -> Entry:
        got = self._read(real)
        if got is None:
            raise NotFound()
        body, st = got
        entry = Entry()
        entry.real = real
        entry.mtime = st.st_mtime
        entry.size = len(body)
        entry.body = body
        entry.type = content_type(real)
        entry.last_modified = http_date(st.st_mtime)
        sigs = [_signature(st)]
        encoded = []
        if self.precompressed:
            for encoding, ext in _ENCODINGS:
                sibling = self._read(real + ext)
                sigs.append(_signature(sibling[1]) if sibling else None)
                if sibling is not None:
                    encoded.append((encoding, sibling[0], sibling[1]))
        # Compressed once here, for every coding the client may pick, so a hit stays a
        # dict lookup; a precompressed sibling takes the place of its coding.
        made = []
        if self.compress and compress.worth_compressing(entry.type, len(body)):
            have = {encoding for encoding, _, _ in encoded}
            made = [(coding, compress.compress(coding, body))
                    for coding in compress.PREFERENCE if coding not in have]
        vary = [("vary", "accept-encoding")] \
            if self.precompressed or (self.compress and compress.compressible(entry.type)) \
            else []
        entry.identity = self._variant("", body, _etag(st), entry, vary)
        entry.variants = {"": entry.identity}
        for encoding, data, sst in encoded:
            entry.variants[encoding] = self._variant(encoding, data, _etag(sst, encoding),
                                                     entry, vary)
        for coding, data in made:
            entry.variants[coding] = self._variant(coding, data,
                                                   compress.weak(_etag(st, coding)), entry, vary)
        entry.codings = tuple(entry.variants)
        entry.signature = tuple(sigs)
        entry.weight = sum(v.full.content_length for v in entry.variants.values()) + 512
        entry.checked = CLOCK.now
        return entry

    def _variant(self, encoding, data, etag, entry, vary) -> Variant:
        validators = [("etag", etag), ("last-modified", entry.last_modified)]
        coding = [("content-encoding", encoding)] if encoding else []
        full = Prebuilt(200, data, entry.type,
                        validators + [("accept-ranges", "bytes")] + coding + vary + self.extra)
        return Variant(encoding, etag, full, Bodiless(304, validators + vary + self.extra))

    def _still_same(self, rel: str, kept: KeptFile, slash: bool) -> bool:
        """Whether `rel` still resolves, inside the root, to the kept file unchanged."""
        try:
            found = self._locate(rel, slash)
        except NotFound:
            return False
        return found[0] == "file" and found[1] == kept.real \
            and _signature(found[2]) == kept.signature

    def _still_fresh(self, entry: Entry) -> bool:
        sigs = [_signature(_stat(entry.real))]
        if self.precompressed:
            sigs += [_signature(_stat(entry.real + ext)) for _, ext in _ENCODINGS]
        return tuple(sigs) == entry.signature and sigs[0] is not None

    def _listing(self, real: str, path: str) -> bytes:
        try:
            names = sorted(self._listed_names(real))
        except OSError:                        # the directory went away after _locate
            raise NotFound() from None
        title = html.escape(path)
        rows = "".join(f'<li><a href="{quote(n)}">{html.escape(n)}</a></li>' for n in names)
        return (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>{title}</title>"
                f"</head><body><h1>{title}</h1><ul>{rows}</ul></body></html>\n").encode()

    def _listed_names(self, real: str):
        """Names a listing shows: not hidden, and not a symlink leading out of the
        root (its name alone tells what lies outside, and a click would be a 404)."""
        with os.scandir(real) as entries:
            for item in entries:
                if item.name.startswith("."):
                    continue
                if item.is_symlink():
                    try:
                        self._contained(item.path)
                    except NotFound:
                        continue
                yield item.name + ("/" if item.is_dir() else "")

    def warm(self) -> None:
        """Load small files into the cache before serving (runs before the loop serves):
        those the supervisor loaded when it warmed the same folder the same way before
        forking this worker (`keep_warm`), else from the disk."""
        kept = _WARMED.get(self._warm_key)
        if kept is not None:
            for rel, entry in kept:
                self._remember(rel, entry)
            return
        for folder, dirs, files in os.walk(self.root):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for name in sorted(files):
                if name.startswith(".") or name.endswith((".br", ".gz")):
                    continue
                real = os.path.join(folder, name)
                rel = os.path.relpath(real, self.root)
                try:
                    if os.stat(real).st_size >= self.cache_file_max:
                        continue
                    entry = self._load(os.path.realpath(real))
                except (NotFound, OSError):
                    continue
                if self._cached_bytes + entry.weight > self.cache_bytes:
                    return
                self._remember(rel, entry)
                if name == self.index:
                    self._remember(os.path.dirname(rel) + "/" if os.path.dirname(rel) else "",
                                   entry)


# What the supervisor's StaticFiles warmed before it forked the workers, by folder,
# options and headers (`keep_warm`): a worker's warm cache is then these entries, on
# pages every worker shares, instead of its own reading and compressing of each file
# (1.6 MB of pages written per worker for the embedded default's three files).
_WARMED: dict[tuple, tuple[tuple[str, Entry], ...]] = {}


def keep_warm(handlers) -> None:
    """Keep what each of `handlers` (StaticFiles with `warm`) loaded, in place of what
    was kept for an earlier config."""
    _WARMED.clear()
    for handler in handlers:
        _WARMED[handler._warm_key] = tuple(handler._cache.items())


def _stat(path: str):
    try:
        return os.stat(path)
    except OSError:
        return None


def _send_now(request, transport, fd: int, head: bytes, offset: int,
              length: int) -> tuple[bytes, int, int]:
    """As much of `head` and then of the file as the socket takes now, on its own
    descriptor: the head with MSG_MORE, so it leaves in the file's first segment
    rather than as a packet of its own that wakes the client for a few hundred bytes
    (nginx's `tcp_nopush`), then `os.sendfile`. What is left: (head, offset, length).
    FileShrank when the file is shorter than the length promised."""
    out = transport.get_extra_info("socket").fileno()
    # Borrowed, never closed (detached below): send() with flags needs a socket
    # object. Family and type as plain ints (the transport's socket gives enums, made
    # per call); they do not change what send() does on the descriptor.
    sock = socket.socket(_AF_INET, _SOCK_STREAM, 0, out)
    try:
        while head:
            head = head[sock.send(head, socket.MSG_MORE):]
        while length > 0:
            sent = os.sendfile(out, fd, offset, min(length, _SENDFILE_CHUNK))
            if sent == 0:
                # Fewer bytes than the length already promised: the response cannot
                # be completed, and the handler fails (the connection is cut after it).
                raise FileShrank()
            request.sent += sent
            offset += sent
            length -= sent
    except BlockingIOError:
        pass
    finally:
        sock.detach()
    return head, offset, length


def _gone(request, transport, exc: Exception) -> None:
    """The client went away during a sendfile: the connection ends here."""
    request.keep_alive = False
    if not transport.is_closing():      # else already closed: nothing to cut
        cut(transport)
    log.debug("client %s went away during sendfile after %d bytes: %s",
              request.client, request.sent, exc or "no bytes taken for send_timeout")


class _WaitFd:
    """A duplicate of a socket's descriptor to wait on for writability, made on the
    first wait (the loop refuses a watch on the descriptor a transport holds)."""

    __slots__ = ("of", "fd")

    def __init__(self, of: int) -> None:
        self.of, self.fd = of, -1

    async def writable(self, loop, timeout: float) -> None:
        if self.fd < 0:
            self.fd = os.dup(self.of)
        await _writable(loop, self.fd, timeout)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


async def _writable(loop, fd: int, timeout: float) -> None:
    """Until `fd` takes bytes again; TimeoutError after `timeout` seconds."""
    waiter = loop.create_future()
    loop.add_writer(fd, _wake, waiter)
    try:
        await asyncio.wait_for(waiter, timeout)
    finally:
        loop.remove_writer(fd)


def _wake(waiter) -> None:
    if not waiter.done():
        waiter.set_result(None)


# ------------------------------------------------------------ HTTP details


def _not_modified(inm: bytes | None, ims: bytes | None, etag: str, mtime: float) -> bool:
    if inm is not None:
        # RFC 9110 13.1.2: weak comparison; If-Modified-Since is ignored when present.
        tags = [t.strip().removeprefix("W/") for t in inm.decode("latin-1").split(",")]
        return "*" in tags or etag.removeprefix("W/") in tags
    if ims is not None:
        try:
            since = parse_http_date(ims.decode("latin-1"))
        except ValueError:
            return False
        return int(mtime) <= since
    return False


def _range_applies(if_range: bytes | None, etag: str) -> bool:
    return if_range is None or if_range.decode("latin-1").strip() == etag


def parse_range(value: bytes, size: int):
    """(start, end) inclusive; None to ignore the header (malformed or several ranges:
    RFC 9110 allows answering with the whole file); False when unsatisfiable."""
    text = value.decode("latin-1").strip()
    if not text.startswith("bytes=") or "," in text:
        return None
    first, sep, last = text[6:].strip().partition("-")
    if not sep or not (first or last) or not (first + last).isascii() \
            or (first and not first.isdigit()) or (last and not last.isdigit()):
        return None
    # No file has 19 digits of bytes; longer numbers only mean "past the end" (and
    # int() refuses more than 4300 digits).
    first = first and (first.lstrip("0") or "0")
    last = last and (last.lstrip("0") or "0")
    first = first if len(first) < 19 else "9" * 19
    last = last if len(last) < 19 else "9" * 19
    if not first:                              # suffix: the last N bytes
        n = int(last)
        if n == 0 or size == 0:
            return False
        return max(0, size - n), size - 1
    start = int(first)
    end = int(last) if last else size - 1
    if last and end < start:
        return None
    if start >= size:
        return False
    return start, min(end, size - 1)


def _conditional_headers(headers) -> list:
    """[If-None-Match, If-Modified-Since, Range, If-Range, Accept-Encoding] (None if absent)."""
    found = [None] * 5
    for name, value in headers:
        slot = _CONDITIONAL.get(name)
        if slot is not None:
            found[slot] = value
    return found
