"""The notes API (JSON), guarded by a bearer token.

    GET    {api}            list, newest first: ?page=N&per_page=K (drafts included)
    POST   {api}            create; slug from the body or from the time (20260620160514)
    GET    {api}/{slug}     one note with its Markdown
    PUT    {api}/{slug}     create or replace
    DELETE {api}/{slug}     remove

A body is JSON ({"title", "body", "date", "tags", "draft", "summary", "slug"}) or, with
`Content-Type: text/markdown`, a note file as it would be on disk (front matter +
Markdown). Bad input -> 422 naming the field (a summary over SUMMARY_MAX characters,
more than MAX_TAGS tags, a note whose rendered page would be over `max_page_bytes`
included); a path other than `{api}/{slug}` exactly (`{slug}/`) -> 404; a body over
`max_note_bytes` -> 413; no or a wrong token -> 401; a failed write -> 507 (disk full)
or 500, the old note intact.
The token is compared in constant time and never logged. CORS: the configured origins,
with preflight answered without a token (browsers send none).
"""

from __future__ import annotations

import datetime as dt
import hmac
import json
import os
from urllib.parse import parse_qs

from nestgate.base.errors import HandlerError
from nestgate.base.jsonbody import read_json
from nestgate.handlers.notes.render import PageTooLarge
from nestgate.handlers.notes.store import SLUG, BadNote, StoreError, make_note, split_front_matter
from nestgate.base.tally import TALLY

TOKEN_ENV = "NESTGATE_NOTES_TOKEN"
JSON = "application/json"
_FIELDS = {"slug", "title", "body", "date", "tags", "draft", "summary"}
_MAX_PER_PAGE = 100
SUMMARY_MAX = 1000             # characters


class ApiError(HandlerError):
    """A refused API call: answered here as JSON (`{"error": message, "field": ...}`)."""

    def __init__(self, status: int, message: str, field: str | None = None, headers=()):
        super().__init__(status, message)
        self.message, self.field, self.headers = message, field, headers


class NotesApi:
    """Both API routes: the collection (`item=False`) and `{api}/{slug}` (`item=True`)."""

    is_async = True

    def __init__(self, pages, headers, item: bool) -> None:
        self.pages = pages
        self.store = pages.store
        self.notes = pages.notes
        self.item = item
        token = self.notes.token or os.environ.get(TOKEN_ENV, "")
        self._token = token.encode()
        self.headers = [("content-type", JSON), ("cache-control", "no-store"), *headers]
        origins = self.notes.cors_origins
        self._any_origin = "*" in origins
        self._origins = frozenset(o.encode() for o in origins)

    async def handle(self, request) -> None:
        cors = self._cors(request.header(b"origin"))
        try:
            if request.method == b"OPTIONS":
                await self._preflight(request, cors)
                return
            self._authorize(request)
            status, payload, extra = await self._dispatch(request)
        except ApiError as exc:
            status, extra = exc.status, list(exc.headers)
            payload = {"error": exc.message}
            if exc.field:
                payload["field"] = exc.field
        body = b"" if payload is None else json.dumps(payload, ensure_ascii=False).encode()
        await request.send(status, self.headers + cors + extra, body)

    # ------------------------------------------------------------ guards
    def _cors(self, origin: bytes | None) -> list:
        if not self._origins:
            return []
        if self._any_origin:
            return [("access-control-allow-origin", "*")]
        if origin is not None and origin in self._origins:
            return [("access-control-allow-origin", origin), ("vary", "origin")]
        return [("vary", "origin")]

    async def _preflight(self, request, cors: list) -> None:
        headers = list(cors)
        if any(name == "access-control-allow-origin" for name, _ in cors):
            headers += [("access-control-allow-methods", "GET, POST, PUT, DELETE, OPTIONS"),
                        ("access-control-allow-headers", "authorization, content-type"),
                        ("access-control-max-age", "600")]
        headers.append(("allow", self._allowed()))
        await request.send(204, headers, b"")

    def _allowed(self) -> str:
        return "GET, PUT, DELETE, OPTIONS" if self.item else "GET, POST, OPTIONS"

    def _authorize(self, request) -> None:
        challenge = [("www-authenticate", 'Bearer realm="notes"')]
        if not self._token:
            raise ApiError(401, f"the notes API is off: set [site.notes] token or {TOKEN_ENV}",
                           headers=challenge)
        value = request.header(b"authorization") or b""
        scheme, _, given = value.partition(b" ")
        if scheme.lower() != b"bearer" or not hmac.compare_digest(given.strip(), self._token):
            raise ApiError(401, "missing or wrong bearer token", headers=challenge)

    # ------------------------------------------------------------ routes
    async def _dispatch(self, request):
        method = request.method
        loop = request.loop
        if not self.item:
            if method in (b"GET", b"HEAD"):
                return 200, await loop.run_in_executor(None, self._list, request.query), []
            if method == b"POST":
                meta, body = await self._read_note(request)
                answer = await loop.run_in_executor(None, self._create, meta, body)
                await self.pages.prerender(loop, answer[1]["slug"])
                return answer
            raise ApiError(405, "method not allowed", headers=[("allow", self._allowed())])
        slug = request.params["slug"]
        if request.path != self._location(slug):
            # The route's pattern ignores trailing slashes ("x/", "x//"): only the one
            # spelling is a note's address, so one note never answers at several.
            raise ApiError(404, "not a note's address: no slash after the slug")
        if method in (b"GET", b"HEAD"):
            note = await loop.run_in_executor(None, self.store.read, slug) \
                if SLUG.match(slug) else None
            if note is None:
                raise ApiError(404, f"no note {slug!r}")
            return 200, note.as_json(), []
        if method == b"PUT":
            meta, body = await self._read_note(request)
            answer = await loop.run_in_executor(None, self._put, slug, meta, body)
            await self.pages.prerender(loop, slug)    # the next GET of it is a cache hit
            return answer
        if method == b"DELETE":
            if not SLUG.match(slug) or not await loop.run_in_executor(None, self._delete, slug):
                raise ApiError(404, f"no note {slug!r}")
            return 204, None, []
        raise ApiError(405, "method not allowed", headers=[("allow", self._allowed())])

    def _list(self, query: bytes) -> dict:
        args = parse_qs(query.decode("latin-1"))
        page = _int_arg(args, "page", 1, 1, 10**6)
        per_page = _int_arg(args, "per_page", self.notes.page_size, 1, _MAX_PER_PAGE)
        notes = sorted(self.store.scan(), key=lambda n: (n.date, n.slug), reverse=True)
        chunk = notes[(page - 1) * per_page: page * per_page]
        return {"notes": [n.as_json(with_body=False) for n in chunk], "page": page,
                "per_page": per_page, "total": len(notes)}

    def _create(self, meta: dict, body: str):
        given = meta.pop("slug", None)
        if given is not None:
            note = self._validated(given, meta, body)
            try:
                self._save(note, create_only=True)
            except FileExistsError:
                raise ApiError(409, f"note {given!r} exists: PUT replaces it", "slug") from None
            return 201, note.as_json(), [("location", self._location(note.slug))]
        stamp = dt.datetime.now().strftime("%Y%m%d%H%M%S")      # lily-nest's slugs
        for attempt in range(1, 100):
            slug = stamp if attempt == 1 else f"{stamp}-{attempt}"
            note = self._validated(slug, dict(meta), body)
            try:
                self._save(note, create_only=True)
            except FileExistsError:
                continue
            return 201, note.as_json(), [("location", self._location(slug))]
        raise ApiError(409, "too many notes created this second", "slug")

    def _put(self, slug: str, meta: dict, body: str):
        if "slug" in meta and meta.pop("slug") != slug:
            raise ApiError(422, "the slug in the body differs from the one in the path", "slug")
        if meta.get("date") is None and SLUG.match(slug):
            old = self.store.read(slug)
            if old is not None:
                meta["date"] = old.date               # replacing keeps the note's date
        note = self._validated(slug, meta, body)
        created = self._save(note)
        return (201 if created else 200), note.as_json(), \
            [("location", self._location(slug))] if created else []

    def _delete(self, slug: str) -> bool:
        try:
            deleted = self.store.delete(slug)
        except StoreError as exc:
            raise ApiError(exc.status, str(exc)) from None
        self.pages.forget(slug)
        if deleted:
            TALLY.event("notes_deleted")
            self.pages.written(slug)
        return deleted

    def _save(self, note, create_only: bool = False) -> bool:
        try:
            created = self.store.write(note, create_only)
        except StoreError as exc:
            raise ApiError(exc.status, str(exc)) from None
        TALLY.event("notes_written")
        self.pages.written(note.slug)
        return created

    def _validated(self, slug: str, meta: dict, body: str):
        summary = meta.get("summary")
        if isinstance(summary, str) and len(summary) > SUMMARY_MAX:
            # Lists and the feed repeat every summary: a long one multiplies there.
            raise ApiError(422, f"summary is at most {SUMMARY_MAX} characters", "summary")
        try:
            note = make_note(slug, meta, body)
        except BadNote as exc:
            raise ApiError(422, str(exc), exc.field) from None
        path = self.pages.note_path(slug)
        taken = self.pages.taken_by(path)
        if taken is not None:
            # The site's route keeps its path: the note's page would never be shown.
            raise ApiError(409, f"the note's page {path} is the site's route {taken!r}: "
                                "choose another slug", "slug")
        limit = self.notes.max_page_bytes
        try:
            self.pages.renderer.note_page_within(note, limit)
        except PageTooLarge:
            # A page held in every worker's cache and repeated by the feed: refused
            # before it is written, so it is never served.
            raise ApiError(422, f"the note's page would be over max_page_bytes ({limit} "
                                "bytes)", "body") from None
        return note

    def _location(self, slug: str) -> str:
        return f"{self.notes.api_path}/{slug}"

    # ------------------------------------------------------------ bodies
    async def _read_note(self, request) -> tuple[dict, str]:
        raw = await self._read_body(request)
        ctype = (request.header(b"content-type") or b"").split(b";")[0].strip().lower()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ApiError(422, "the body is not UTF-8", "body") from None
        if ctype in (b"text/markdown", b"text/plain"):
            try:
                meta, body = split_front_matter(text)
            except BadNote as exc:
                raise ApiError(422, str(exc), exc.field) from None
            if "title" not in meta:
                raise ApiError(422, "front matter needs a title", "title")
            return {k: v for k, v in meta.items() if k in _FIELDS - {"body"}}, body
        try:
            data = read_json(raw)
        except ValueError as exc:
            raise ApiError(422, f"the body is not valid JSON (or send text/markdown): {exc}",
                           "body") from None
        if not isinstance(data, dict):
            raise ApiError(422, "the body must be a JSON object", "body")
        unknown = sorted(set(data) - _FIELDS)
        if unknown:
            raise ApiError(422, f"unknown field {unknown[0]!r}", unknown[0])
        for required in ("title", "body"):
            if not isinstance(data.get(required), str):
                raise ApiError(422, f"{required} is required and must be a string", required)
        body = data.pop("body")
        return data, body

    async def _read_body(self, request) -> bytes:
        if request.body is None:
            return b""
        limit = self.notes.max_note_bytes
        length = request.header(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise ApiError(413, f"a note is at most {limit} bytes")
        parts, size = [], 0
        while chunk := await request.body.read():
            size += len(chunk)
            if size > limit:
                request.keep_alive = False       # the rest is not worth reading
                raise ApiError(413, f"a note is at most {limit} bytes")
            parts.append(chunk)
        return b"".join(parts)


def _int_arg(args: dict, name: str, default: int, low: int, high: int) -> int:
    values = args.get(name)
    if not values:
        return default
    if not (values[0].isascii() and values[0].isdigit()) or len(values[0]) > 9 \
            or not low <= int(values[0]) <= high:
        raise ApiError(422, f"{name} must be an integer {low}..{high}", name)
    return int(values[0])
