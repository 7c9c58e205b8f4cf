"""Markdown and templates -> page bytes. Pure CPU: no disk after start, no HTTP.

Markdown is CommonMark plus GFM tables, strikethrough and task lists (markdown-it-py);
raw HTML in a note is escaped unless the site owner turns `raw_html` on, so a note
cannot inject a script. Pages come from Jinja2 templates with autoescape on; a site's
own template directory is searched before the built-in one, so an owner overrides
one template by writing a file of the same name.

A note's rendered Markdown is kept in `<notes dir>/.nestgate-html/<slug>.<flavour>.html`,
whose first line names the note file it came from (inode, mtime, size) and the
renderer's settings: a worker that did not render it itself (another worker took the
write) reads it back instead of parsing the Markdown again. It is a cache: written
without fsync, checked on every read (key line and length), rebuilt when it does not
match, and nothing breaks when the directory is read-only.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import math
import os
import re
import threading

import jinja2
import markdown_it
from markdown_it import MarkdownIt
from markupsafe import Markup
from mdit_py_plugins.tasklists import tasklists_plugin

from nestgate import PACKAGE_DIR

BUILTIN_TEMPLATES = PACKAGE_DIR / "templates"
HTML_CACHE_DIR = ".nestgate-html"
_RENDER_VERSION = 1          # bump when markdown_renderer's output changes


# The key of a render's `env` holding how many more bytes of link and image targets it
# may write (absent: no limit).
LINK_BUDGET = "nestgate_link_budget"


# Characters XML 1.0 does not allow (C0 controls but tab, LF and CR; U+FFFE, U+FFFF):
# one of them in a note's title, summary, tag or text made the Atom feed, which holds
# every recent note, a document no feed reader takes. Markdown and JSON let them through.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def xml_characters(value):
    """`value` as a template writes it: text with each character XML does not allow
    replaced by U+FFFD (the page shows where it was), still Markup when it was."""
    if isinstance(value, str) and _NOT_XML.search(value):
        cleaned = _NOT_XML.sub("\ufffd", value)
        return Markup(cleaned) if isinstance(value, Markup) else cleaned
    return value


class PageTooLarge(Exception):
    """A note's rendered page would be over the limit it was rendered against."""


def markdown_renderer(raw_html: bool = False) -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": raw_html})
    md.enable(["table", "strikethrough"])
    md.use(tasklists_plugin)
    for name in ("link", "image"):
        rule = next(r.fn for r in md.inline.ruler.__rules__ if r.name == name)
        md.inline.ruler.at(name, _budgeted(rule))
    return md


def _budgeted(rule):
    """`rule` (link or image) charged for the target and title each use writes out.
    A reference defined once and used N times is copied N times: a 62 KB note of one
    2 KB target used 20,000 times rendered to 20 MB. Everything else Markdown makes
    grows a few times at most, so this is the one growth bounded while rendering
    (before the page exists), against `LINK_BUDGET` when the render has one."""
    def budgeted(state, silent: bool) -> bool:
        before = len(state.tokens)
        if not rule(state, silent):
            return False
        left = state.env.get(LINK_BUDGET) if isinstance(state.env, dict) else None
        if left is not None and not silent:
            for token in state.tokens[before:]:
                if token.attrs:
                    left -= sum(len(str(value)) for value in token.attrs.values())
            state.env[LINK_BUDGET] = left
            if left < 0:
                raise PageTooLarge
        return True
    return budgeted


class Renderer:
    """One site's templates and Markdown settings."""

    def __init__(self, site_config, notes_dir: str | None = None) -> None:
        notes, home = site_config.notes, site_config.home
        loaders = [jinja2.FileSystemLoader(str(BUILTIN_TEMPLATES))]
        if site_config.templates:
            loaders.insert(0, jinja2.FileSystemLoader(site_config.templates))
        self.env = jinja2.Environment(
            loader=jinja2.ChoiceLoader(loaders),
            autoescape=jinja2.select_autoescape(["html", "xml"]), finalize=xml_characters,
            trim_blocks=True, lstrip_blocks=True, auto_reload=False)
        raw_html = notes.raw_html if notes else False
        self.md = markdown_renderer(raw_html)
        settings = f"{_RENDER_VERSION} {markdown_it.__version__} raw_html={raw_html}"
        self._flavour = hashlib.sha256(settings.encode()).hexdigest()[:12]
        self._cache_dir = os.path.join(notes_dir, HTML_CACHE_DIR) if notes_dir else None
        self._tmp_lock = threading.Lock()
        self._tmp_count = 0
        self.notes = notes
        self.home = home
        self.base_url = site_config.base_url
        self.common = {
            "lang": "en",
            "site_title": home.title if home else (notes.title if notes else site_config.name),
            "owner": home.owner if home else "",
            "home_path": home.path if home else (notes.path if notes else "/"),
            "notes_path": notes.path if notes else "",
            "notes_title": notes.title if notes else "",
            "base_url": site_config.base_url,
        }
        self.profile_html = Markup(self.md.render(home.profile)) if home and home.profile else ""

    def note_html(self, note) -> Markup:
        if note.html is None:
            html = self._kept(note)
            if html is None:
                html = self.md.render(note.body)
                self._keep(note, html)
            note.html = html
        return Markup(note.html)

    # ---- rendered Markdown shared through the notes directory (see the module doc)
    def _kept_path(self, slug: str) -> str:
        return os.path.join(self._cache_dir, f"{slug}.{self._flavour}.html")

    def _key(self, note, length: int) -> bytes:
        ino, mtime_ns, size = note.signature
        return f"nestgate-html {self._flavour} {ino} {mtime_ns} {size} {length}\n".encode()

    def _kept(self, note) -> str | None:
        if self._cache_dir is None or not note.signature:
            return None
        try:
            with open(self._kept_path(note.slug), "rb") as f:
                data = f.read()
        except OSError:
            return None
        newline = data.find(b"\n")
        if newline < 0 or data[:newline + 1] != self._key(note, len(data) - newline - 1):
            return None
        try:
            return data[newline + 1:].decode("utf-8")
        except UnicodeDecodeError:
            return None

    def _keep(self, note, html: str) -> None:
        if self._cache_dir is None or not note.signature:
            return
        body = html.encode("utf-8")
        with self._tmp_lock:
            self._tmp_count += 1
            tmp = os.path.join(self._cache_dir, f".{note.slug}.{os.getpid()}.{self._tmp_count}.tmp")
        try:
            os.makedirs(self._cache_dir, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(self._key(note, len(body)) + body)
            os.replace(tmp, self._kept_path(note.slug))
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass

    def forget(self, slug: str) -> None:
        if self._cache_dir is not None:
            try:
                os.unlink(self._kept_path(slug))
            except OSError:
                pass

    def note_page_within(self, note, limit: int) -> bytes:
        """The note's page, if it is at most `limit` bytes; PageTooLarge otherwise,
        raised while rendering as soon as its links alone would pass the limit."""
        note.html = self.md.render(note.body, {LINK_BUDGET: limit})
        page = self.note_page(note)
        if len(page) > limit:
            raise PageTooLarge
        return page

    def _page(self, template: str, **values) -> bytes:
        return self.env.get_template(template).render(**self.common, **values).encode("utf-8")

    def home_page(self, latest: list) -> bytes:
        return self._page("home.html", home=self.home, profile_html=self.profile_html,
                          notes=latest)

    def note_page(self, note) -> bytes:
        return self._page("note.html", note=note, body_html=self.note_html(note))

    def list_page(self, notes: list, page: int, base: str, heading: str) -> bytes | None:
        """Page `page` (from 1) of `notes`; None past the last page."""
        size = self.notes.page_size
        pages = max(1, math.ceil(len(notes) / size))
        if not 1 <= page <= pages:
            return None
        return self._page(
            "notes.html", notes=notes[(page - 1) * size: page * size], page=page, pages=pages,
            heading=heading,
            prev_url=(base if page == 2 else f"{base}/page/{page - 1}") if page > 1 else "",
            next_url=f"{base}/page/{page + 1}" if page < pages else "")

    def feed(self, notes: list) -> bytes:
        entries = notes[: self.notes.feed_entries]
        prefix = self.base_url + self.notes.path if self.base_url else "urn:nestgate:notes"
        updated = max((n.date for n in entries),
                      default=dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc))
        return self._page(
            "feed.xml", feed_id=prefix if self.base_url else prefix,
            updated=updated.isoformat(),
            entries=[{"note": n, "id": f"{prefix}/{n.slug}" if self.base_url
                      else f"{prefix}:{n.slug}", "html": str(self.note_html(n))}
                     for n in entries])


# Renderers the supervisor built before forking the workers (`keep_renderers`): a worker
# takes its site's instead of building one, so the Markdown parser, the Jinja environment
# and the rendered profile stay on pages every worker shares. Building them in each
# worker wrote about 2 MB of the supervisor's pages per worker (code run for the first
# time, objects it touched), each write a private copy.
_KEPT: dict[int, tuple[object, str | None, Renderer]] = {}


def keep_renderers(sites) -> None:
    """Build and keep a renderer for each (site config, notes folder) of `sites`, in
    place of those kept for an earlier config. A site whose renderer cannot be built is
    left to the workers, which report why."""
    kept = {}
    for site_config, notes_dir in sites:
        old = _KEPT.get(id(site_config))
        if old is not None and old[0] is site_config and old[1] == notes_dir:
            kept[id(site_config)] = old
            continue
        try:
            kept[id(site_config)] = (site_config, notes_dir, Renderer(site_config, notes_dir))
        except Exception:  # noqa: BLE001 - the worker builds it again and says why
            continue
    _KEPT.clear()
    _KEPT.update(kept)


def renderer_for(site_config, notes_dir: str | None) -> Renderer:
    """The renderer kept for this very site config and folder, else a new one."""
    old = _KEPT.get(id(site_config))
    if old is not None and old[0] is site_config and old[1] == notes_dir:
        return old[2]
    return Renderer(site_config, notes_dir)
