"""Response compression: which coding a client gets, which bodies are worth it, and
the encoders (brotli, zstd, gzip).

Theory of operation
-------------------
`negotiate` reads Accept-Encoding (RFC 9110 12.5.3) with its q-values: the coding the
client rates highest among those offered wins, ties going to the server's order
(br, zstd, gzip: smallest first); q=0 refuses a coding, `*` rates every coding not
named, and `identity` is the answer when nothing offered is acceptable (a client that
refuses identity too gets it anyway, as nginx does, rather than a 406).

`worth_compressing` decides from the response alone: a compressible type (text, JSON,
JavaScript, XML, SVG, icons and the uncompressed font formats; never PNG, JPEG,
WebP, WOFF2, archives, media or wasm, which are compressed already), at least `MIN_BYTES`,
and no `Cache-Control: no-transform`. A Range answer (206) is never compressed: the
range is of the identity bytes.

`Encoded` is one server-built answer (a `return` route's body, a rendered page) kept
in identity and each coding worth sending, compressed once when it is built: a request
picks one by its Accept-Encoding, so a hit costs a header scan and a dict lookup and
never a compression. `StreamEncoder` compresses a proxied body as it passes.

This module does no I/O and holds no state but bounded memos of parsed headers.
"""

from __future__ import annotations

import gzip
import zlib

import brotli
import zstandard

from nestgate.base.handler import ReadyChoice
from nestgate.base.responses import Prebuilt

# Like nginx's gzip_min_length, but 256 rather than 20: below a few hundred bytes the
# coding's own header and the lost TCP packet budget outweigh the gain.
MIN_BYTES = 256
PREFERENCE = ("br", "zstd", "gzip")            # ties in q go to the smallest output
_MEMO_MAX = 256
VARY = ("vary", "accept-encoding")
VARY_LINE = b"vary: accept-encoding"

_TEXT_TYPES = frozenset((
    "application/json", "application/javascript", "application/xml",
    "application/xhtml+xml", "application/rss+xml", "application/atom+xml",
    "application/manifest+json", "application/ld+json", "application/geo+json",
    "application/x-javascript", "image/svg+xml", "image/x-icon",
    "application/vnd.ms-fontobject", "font/ttf", "font/otf",
))


def compressible(content_type: str) -> bool:
    """Text formats: text/*, the JSON/XML families, JavaScript, SVG."""
    media = content_type.partition(";")[0].strip().lower()
    return media.startswith("text/") or media in _TEXT_TYPES \
        or media.endswith(("+json", "+xml"))


def worth_compressing(content_type: str, size: int, cache_control: str = "") -> bool:
    return size >= MIN_BYTES and compressible(content_type) \
        and "no-transform" not in cache_control.lower()


def parse_accept(accept: bytes) -> dict[str, float]:
    """{coding: q} for each coding listed; a malformed q counts as 0 (refused)."""
    rated = {}
    for part in accept.decode("latin-1").lower().split(","):
        name, _, params = part.partition(";")
        name = name.strip()
        if not name:
            continue
        q = 1.0
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key.strip() == "q":
                try:
                    q = min(max(float(value.strip()), 0.0), 1.0)
                except ValueError:
                    q = 0.0
        rated[name] = q
    return rated


def negotiate(accept: bytes | None, available=PREFERENCE) -> str:
    """The coding to send among `available` ("" for identity)."""
    if accept is None:
        return ""
    rated = parse_accept(accept)
    star = rated.get("*", 0.0)
    best, best_q = "", 0.0
    for coding in PREFERENCE:
        if coding in available:
            q = rated.get(coding, star)
            if q > best_q:
                best, best_q = coding, q
    identity_q = rated.get("identity")
    if identity_q is not None and identity_q > best_q:
        return ""                              # the client rates identity higher
    return best


class Negotiator:
    """`negotiate` with parsed headers kept: browsers send only a few distinct values."""

    def __init__(self) -> None:
        self._memo: dict[tuple, str] = {}

    def pick(self, accept: bytes | None, available) -> str:
        if accept is None:
            return ""
        key = (accept, available)
        coding = self._memo.get(key)
        if coding is None:
            if len(self._memo) >= _MEMO_MAX:
                self._memo.clear()
            coding = self._memo[key] = negotiate(accept, available)
        return coding


_NEGOTIATOR = Negotiator()


def compress(coding: str, data: bytes) -> bytes:
    """The whole body in one coding (for bodies compressed once and kept)."""
    if coding == "br":
        return brotli.compress(data, quality=6)
    if coding == "zstd":
        return zstandard.ZstdCompressor(level=6).compress(data)
    if coding == "gzip":
        return gzip.compress(data, compresslevel=6, mtime=0)
    raise ValueError(f"unknown content coding {coding!r}")


def recode_head(block: bytes, status: int, length: int | None,
                accept: bytes | None) -> tuple[str, bytes] | None:
    """A proxied response head on a compressing route: (coding, the header lines to
    send) when its body is a kind worth compressing, coding "" when this client takes
    none of ours (the lines still gain `Vary`, so a shared cache keeps both); None when
    the response goes as it is. `block` is the kept header lines, each ending in CRLF.
    A 304 has no body to compress but carries the Vary its 200 would (RFC 9110
    15.4.5), coding "": its length is the 200's, and a 304 without a Content-Type
    (the usual one) gets it too, since a cache that kept a coded 200 under a 304
    without Vary would hand it to clients that never asked for the coding."""
    if status < 200 or status in (204, 206):
        return None
    not_modified = status == 304
    if length is not None and length < MIN_BYTES and not not_modified:
        return None
    lines = block.split(b"\r\n")
    media = b""
    vary_named = False
    for line in lines:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-type":
            media = value
        elif name == b"content-encoding" or name == b"content-range":
            return None                         # coded already, or a part of something
        elif name == b"cache-control" and value.lower().find(b"no-transform") >= 0:
            return None
        elif name == b"vary":
            vary_named = vary_named or any(t.strip() in (b"*", b"accept-encoding")
                                           for t in value.lower().split(b","))
    if not_modified:
        if vary_named or (media and not compressible(media.decode("latin-1"))):
            return None
        return "", block + VARY_LINE + b"\r\n"
    if not compressible(media.decode("latin-1")):
        return None
    coding = _NEGOTIATOR.pick(accept, PREFERENCE) if accept is not None else ""
    out = [line for line in lines if line]
    if coding:
        for i, line in enumerate(out):
            name, _, value = line.partition(b":")
            value = value.strip()
            if name.strip().lower() == b"etag" and not value.startswith(b"W/"):
                out[i] = b"etag: W/" + value    # its bytes are no longer the upstream's
        out.append(b"content-encoding: " + coding.encode())
    if not vary_named:
        out.append(VARY_LINE)
    out.append(b"")
    return coding, b"\r\n".join(out)


class StreamEncoder:
    """One body compressed as it passes (a proxied response): `feed` then `finish`."""

    def __init__(self, coding: str) -> None:
        self.coding = coding
        if coding == "br":
            self._enc = brotli.Compressor(quality=4)
        elif coding == "zstd":
            self._enc = zstandard.ZstdCompressor(level=3).compressobj()
        elif coding == "gzip":
            self._enc = zlib.compressobj(1, zlib.DEFLATED, 31)
        else:
            raise ValueError(f"unknown content coding {coding!r}")

    def feed(self, data: bytes) -> bytes:
        if self.coding == "br":
            return self._enc.process(data) + self._enc.flush()
        if self.coding == "zstd":
            return self._enc.compress(data) + self._enc.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
        return self._enc.compress(data) + self._enc.flush(zlib.Z_SYNC_FLUSH)

    def finish(self) -> bytes:
        return self._enc.finish() if self.coding == "br" else self._enc.flush()


def weak(etag: str) -> str:
    """A compressed variant's validator: weak, since its bytes are not the file's."""
    return etag if etag.startswith("W/") else "W/" + etag




class Encoded(ReadyChoice):
    """One ready answer in identity and every coding worth sending, picked by
    Accept-Encoding."""

    __slots__ = ("identity", "by_coding", "codings")

    def __init__(self, status: int, body: bytes, content_type: str, headers=(),
                 cache_control: str = "") -> None:
        headers = list(headers)
        if not worth_compressing(content_type, len(body), cache_control):
            self.identity = Prebuilt(status, body, content_type, headers)
            self.by_coding = {"": self.identity}
        else:
            headers.append(VARY)
            self.identity = Prebuilt(status, body, content_type, headers)
            self.by_coding = {"": self.identity}
            for coding in PREFERENCE:
                data = compress(coding, body)
                if len(data) < len(body):
                    self.by_coding[coding] = Prebuilt(
                        status, data, content_type, [*headers, ("content-encoding", coding)])
        self.codings = tuple(self.by_coding)

    @property
    def status(self) -> int:
        return self.identity.status

    def choose(self, headers) -> Prebuilt:
        """The variant for a request's headers ((lower-case name, value) pairs)."""
        if len(self.codings) == 1:
            return self.identity
        for name, value in headers:
            if name == b"accept-encoding":
                return self.by_coding[_NEGOTIATOR.pick(value, self.codings)]
        return self.identity
