"""Markdown and templates -> page bytes. Pure CPU: no disk after start, no HTTP.

Markdown is CommonMark plus GFM tables, strikethrough and task lists (markdown-it-py);
raw HTML in a note is escaped unless the site owner turns `raw_html` on, so a note
cannot inject a script. Pages come from Jinja2 templates with autoescape on; a site's
own template directory is searched before the built-in one, so an owner overrides
one template by writing a file of the same name.
"""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path

import jinja2
from markdown_it import MarkdownIt
from markupsafe import Markup
from mdit_py_plugins.tasklists import tasklists_plugin

BUILTIN_TEMPLATES = Path(__file__).resolve().parent.parent / "templates"


def markdown_renderer(raw_html: bool = False) -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": raw_html})
    md.enable(["table", "strikethrough"])
    md.use(tasklists_plugin)
    return md


class Renderer:
    """One site's templates and Markdown settings."""

    def __init__(self, site_config) -> None:
        notes, home = site_config.notes, site_config.home
        loaders = [jinja2.FileSystemLoader(str(BUILTIN_TEMPLATES))]
        if site_config.templates:
            loaders.insert(0, jinja2.FileSystemLoader(site_config.templates))
        self.env = jinja2.Environment(
            loader=jinja2.ChoiceLoader(loaders),
            autoescape=jinja2.select_autoescape(["html", "xml"]),
            trim_blocks=True, lstrip_blocks=True, auto_reload=False)
        self.md = markdown_renderer(notes.raw_html if notes else False)
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
            note.html = self.md.render(note.body)
        return Markup(note.html)

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
