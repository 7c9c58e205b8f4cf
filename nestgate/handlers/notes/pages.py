"""The home page and the notes pages of one site, cached as complete responses.

Theory of operation
-------------------
Every page that exists (home, /notes, /notes/page/N, /notes/<slug>, /notes/tag/<tag>,
/notes/feed.xml) is a `CachedPage` registered as an exact route with `is_async = PEEK`:
the engine calls its `peek` from the parser callback, which returns the page while it
was rendered at the current generation (a warm hit is the route lookup, a generation
read and a kept coding picked by Accept-Encoding, no Request and no task), 405 for
methods other than GET and HEAD, and None when the page is missing or stale; the engine then runs `handle`, which
rebuilds the page off the loop.

The generation is the store's shared counter (bumped by any worker's write) plus a
local count of outside edits, noticed by a directory check that each worker runs
every `DIR_CHECK_INTERVAL` in the executor, from its first page request on: an edit
on disk is served by every worker within that interval, and per request the cost is
a memory read.
Pages are bounded (`cache_pages`): the oldest rendered is dropped first and renders
again on its next request.

A write through the API renders the note's page before it is answered (`prerender`),
so the first request after a write is a cache hit in the writing worker. The rendered
Markdown is also kept beside the notes (`.nestgate-html/`, keyed by the note file's
inode, mtime and size), so the other workers build the page from it instead of
parsing the Markdown again.

Pages not yet registered (a note written by another worker, a tag page never asked
for) reach a `PageFallback` pattern route, which validates the name, renders, and
registers the page when it exists. A page whose note is gone unregisters itself.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
from urllib.parse import quote

from nestgate.base.compress import Encoded
from nestgate.base.control import CONTROLS
from nestgate.base.errors import RouteTaken
from nestgate.base.tally import TALLY
from nestgate.base.handler import PEEK
from nestgate.handlers.notes.render import renderer_for
from nestgate.handlers.notes.store import SLUG, NoteStore
from nestgate.base.responses import Prebuilt, html_page

log = logging.getLogger("nestgate.notes")

HTML = "text/html; charset=utf-8"
ATOM = "application/atom+xml; charset=utf-8"
DIR_CHECK_INTERVAL = 1.0          # seconds between checks for edits made outside nestgate


class SitePages:
    """Per worker and site: the notes index, the renderer and the page cache."""

    def __init__(self, site_config, headers, not_found: Prebuilt) -> None:
        self.home = site_config.home
        self.site_name = site_config.name
        self.notes = site_config.notes
        self.store = NoteStore(self.notes.dir) if self.notes else None
        self.renderer = renderer_for(site_config, self.store.dir if self.store else None)
        self.headers = [("cache-control", "no-cache"), *headers]
        self.not_found = not_found
        self.method_not_allowed = Prebuilt(405, b"method not allowed\n",
                                           "text/plain; charset=utf-8",
                                           [("allow", "GET, HEAD"), *headers])
        self.routes = None
        self.rendered: collections.OrderedDict[CachedPage, None] = collections.OrderedDict()
        self.registered: dict[str, CachedPage] = {}
        self.building: dict[tuple, tuple] = {}   # page key -> (generation, future)
        self.limit = self.notes.cache_pages if self.notes else 16
        self._index_lock = threading.Lock()
        self._index_gen = None
        self.public: list = []              # newest first, drafts left out
        self.by_slug: dict = {}
        self.by_tag: dict[str, list] = {}
        self._watching = False
        self.broadcast = None            # NotesBroadcast: writes told to other instances
        CONTROLS.pages.append(self)      # the operator can purge them (admin API)
        self.hits = self.misses = 0      # pages answered from memory in `peek`; built
        TALLY.caches.append(self)

    # ------------------------------------------------------------ wiring
    def attach(self, routes) -> None:
        """Register the fixed pages and the fallbacks in the site's route table."""
        self.routes = routes
        if self.home:
            self._register(CachedPage(self, ("home",), self.home.path))
        if self.notes:
            base = self.notes.path
            self._register(CachedPage(self, ("list", 1), base))
            self._register(CachedPage(self, ("feed",), base + "/feed.xml"))
            routes.add_exact(base + "/{slug}", PageFallback(self, "note"), base + "/{slug}")
            routes.add_exact(base + "/page/{n}", PageFallback(self, "list"), base + "/page/{n}")
            routes.add_exact(base + "/tag/{tag}", PageFallback(self, "tag"), base + "/tag/{tag}")
            routes.add_exact(base + "/tag/{tag}/page/{n}", PageFallback(self, "tag"),
                             base + "/tag/{tag}/page/{n}")

    def _register(self, page: CachedPage) -> None:
        """Make `page` an exact route. RouteTaken when another route has its path: at
        load that is a config clash (`check` names it); see `_publish` for later."""
        if page.path in self.registered or len(self.registered) >= 4 * self.limit + 8:
            return
        self.routes.add_exact(page.path, page, page.label)
        self.registered[page.path] = page

    def note_path(self, slug: str) -> str:
        return f"{self.notes.path}/{slug}"

    def taken_by(self, path: str) -> str | None:
        """The label of another route of the site on `path` (a configured route, the
        health check, the notes API), which a page there could never shadow; None when
        the path is free or already this site's page."""
        held = self.routes.holder(path) if self.routes is not None else None
        if held is None or held[0] is self.registered.get(path):
            return None
        return held[1]

    def _publish(self, page: CachedPage) -> None:
        """Register a page rendered while serving. A note or tag whose page would take
        the path of another route of the site (a configured route, the health check,
        the notes API) is not published there: that route keeps answering, and the
        log says why the page is not."""
        try:
            self._register(page)
        except RouteTaken as exc:
            log.warning("site %s: page %s is not published: the path is the route %r",
                        self.site_name or "-", page.path, exc.taken_by)

    def _unregister(self, page: CachedPage) -> None:
        if self.registered.get(page.path) is page:
            del self.registered[page.path]
            self.routes.remove_exact(page.path, page)

    # ------------------------------------------------------------ freshness
    def generation(self) -> int:
        """Called on every request for a cached page: a memory read (the first call
        starts the directory check)."""
        if self.store is None:
            return 0
        if not self._watching:
            self._watch()
        return self.store.generation()

    def _watch(self) -> None:
        """Check the notes directory for outside edits every DIR_CHECK_INTERVAL, on a
        timer rather than on a request: a check a request started would only help the
        request after it, and a worker asked rarely would serve an old page."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._watching = True

        def check() -> None:
            done = loop.run_in_executor(None, self.store.notice_outside_edits)
            done.add_done_callback(lambda _: loop.call_later(DIR_CHECK_INTERVAL, check))
        check()

    def _ensure_index(self) -> int:
        """The generation the index now reflects (runs in the executor)."""
        gen = self.store.generation() if self.store else 0
        with self._index_lock:
            if self._index_gen == gen:
                return gen
            if self.store is not None:
                notes = [n for n in self.store.scan() if not n.draft]
                notes.sort(key=lambda n: (n.date, n.slug), reverse=True)
                by_tag: dict[str, list] = {}
                for note in notes:
                    for tag in note.tags:
                        by_tag.setdefault(tag, []).append(note)
                self.public, self.by_tag = notes, by_tag
                self.by_slug = {n.slug: n for n in notes}
            self._index_gen = gen
            return gen

    # ------------------------------------------------------------ building
    def build(self, key: tuple) -> tuple[int, Encoded | None]:
        """(generation, page) for a page key; page None when it does not exist.
        Runs in the executor: reads the disk when the index is stale, then renders."""
        gen = self._ensure_index()
        kind = key[0]
        r = self.renderer
        if kind == "home":
            body = r.home_page(self.public[: self.home.latest] if self.notes else [])
        elif kind == "note":
            note = self.by_slug.get(key[1])
            body = r.note_page(note) if note else None
        elif kind == "list":
            body = r.list_page(self.public, key[1], self.notes.path, self.notes.title)
        elif kind == "tag":
            tagged = self.by_tag.get(key[1])
            body = r.list_page(tagged, key[2], self.tag_path(key[1]), f"#{key[1]}") \
                if tagged else None
        elif kind == "feed":
            return gen, Encoded(200, r.feed(self.public), ATOM, self.headers)
        else:
            body = None
        # Compressed here, off the loop, once per rendering: a hit picks a kept coding.
        return gen, None if body is None else Encoded(200, body, HTML, self.headers)

    async def prerender(self, loop, slug: str) -> None:
        """After a write through this worker: render the note's page now, so the first
        request for it is a hit. Other pages (lists, tags, feed, home) are cheap and
        render on their next request."""
        if not self.notes or not SLUG.match(slug):
            return
        page = self.page_for("note", {"slug": slug})
        if page is None:
            return
        try:
            await self.render(loop, page)
        except Exception:                     # the write stands; the GET will say why
            log.exception("rendering note %s after its write failed", slug)

    async def render(self, loop, page: CachedPage) -> Encoded | None:
        """Build `page` in the executor and keep it; None when it does not exist.
        Requests arriving while the same page builds at the same generation wait for
        that build instead of starting their own."""
        gen_now = self.generation()
        building = self.building.get(page.key)
        if building is None or building[0] != gen_now:
            self.misses += 1
            future = loop.run_in_executor(None, self.build, page.key)
            building = (gen_now, future)
            self.building[page.key] = building
            future.add_done_callback(lambda _, key=page.key, b=building:
                                     self.building.pop(key, None) if
                                     self.building.get(key) is b else None)
        gen, response = await asyncio.shield(building[1])
        if response is None:
            self.drop(page)
        else:
            self.keep(page, gen, response)
        return response

    def written(self, slug: str) -> None:
        """A note was written or deleted through this worker: the other instances
        are told (through Redis, when the state is there)."""
        if self.broadcast is not None:
            self.broadcast.published(self.site_name, slug)

    def changed_elsewhere(self, slug: str) -> None:
        """Another instance wrote or deleted `slug` (runs in the executor): what this
        worker read and rendered of it is forgotten, and its pages are stale."""
        if self.store is not None and SLUG.match(slug):
            self.renderer.forget(slug)
            self.store.forget(slug)

    def forget(self, slug: str) -> None:
        """A note deleted through this worker: its kept Markdown rendering goes too
        (runs in the executor)."""
        self.renderer.forget(slug)

    def keep(self, page: CachedPage, gen: int, response: Encoded) -> None:
        page.page, page.gen = response, gen
        self.rendered.pop(page, None)
        self.rendered[page] = None
        while len(self.rendered) > self.limit:
            old, _ = self.rendered.popitem(last=False)
            old.page = None
        self._publish(page)

    def reread(self) -> None:
        """The admin API's re-read: every note parsed and rendered again, their kept
        renderings included."""
        if self.store is not None:
            for slug in self.store.reread():
                self.renderer.forget(slug)

    def cache_figures(self) -> list:
        size = sum(len(p.page.identity.body) for p in self.rendered if p.page is not None)
        return ["pages", self.site_name, self.notes.path if self.notes else self.home.path,
                self.hits, self.misses, size]

    def purge(self) -> None:
        """Forget every rendered page (the admin API's purge): each renders again on
        its next request."""
        for page in self.rendered:
            page.page = None
        self.rendered.clear()

    def drop(self, page: CachedPage) -> None:
        page.page = None
        self.rendered.pop(page, None)
        if page.key[0] not in ("home", "feed") and page.key != ("list", 1):
            self._unregister(page)

    # ------------------------------------------------------------ names
    def tag_path(self, tag: str) -> str:
        return f"{self.notes.path}/tag/{tag}"

    def page_for(self, kind: str, params: dict) -> CachedPage | None:
        base = self.notes.path
        n = params.get("n", "1")
        if not (n.isascii() and n.isdigit()) or len(n) > 6 or not 1 <= int(n) <= 100_000 \
                or (n != "1" and n.startswith("0")):
            return None
        n = int(n)
        if kind == "note":
            slug = params["slug"]
            if not SLUG.match(slug):
                return None
            key, path = ("note", slug), self.note_path(slug)
        elif kind == "list":
            if n < 2:
                return None
            key, path = ("list", n), f"{base}/page/{n}"
        else:
            tag = params["tag"]
            key = ("tag", tag, n)
            path = self.tag_path(tag) + (f"/page/{n}" if n > 1 else "")
            if n == 1 and "n" in params:
                return None                      # /tag/x/page/1 is /tag/x
        return self.registered.get(path) or CachedPage(self, key, path)


class CachedPage:
    """One page as an exact route; see the module docstring for `peek`."""

    __slots__ = ("site", "key", "path", "label", "page", "gen")
    is_async = PEEK

    def __init__(self, site: SitePages, key: tuple, path: str) -> None:
        self.site, self.key, self.path = site, key, path
        self.label = path if key[0] in ("home", "feed", "list") else \
            f"{site.notes.path}/{{{key[0]}}}"
        self.page: Encoded | None = None
        self.gen = -1

    def peek(self, path: str, method: bytes, headers):
        if method != b"GET" and method != b"HEAD":
            return self.site.method_not_allowed
        page = self.page
        if page is not None and self.gen == self.site.generation():
            self.site.hits += 1
            return page.choose(headers)
        return None

    async def handle(self, request) -> None:
        if request.method not in (b"GET", b"HEAD"):
            await request.send_prebuilt(self.site.method_not_allowed)
            return
        response = await self.site.render(request.loop, self)
        await request.send_prebuilt(self.site.not_found if response is None
                                    else response.choose(request.headers))


class PageFallback:
    """Pattern routes under the notes path: pages not (yet) registered."""

    is_async = PEEK

    def __init__(self, site: SitePages, kind: str) -> None:
        self.site, self.kind = site, kind

    def peek(self, path: str, method: bytes, headers):
        if method == b"GET" or method == b"HEAD":
            return None
        return self.site.method_not_allowed

    async def handle(self, request) -> None:
        page = self.site.page_for(self.kind, request.params)
        if page is None:
            await request.send_prebuilt(self.site.not_found)
            return
        if request.path != page.path:
            if request.path.rstrip("/") != page.path:
                await request.send_prebuilt(self.site.not_found)
                return
            location = quote(page.path)
            await request.send(308, [("location", location), ("content-type", HTML)],
                               html_page(308, location))
            return
        await page.handle(request)
