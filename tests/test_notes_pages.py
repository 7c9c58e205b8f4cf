"""Notes pages end to end: rendering, lists, tags, feed, drafts, outside edits, templates."""

from __future__ import annotations

import http.client
import signal
import time
import xml.etree.ElementTree as ET

import pytest

from conftest import note, notes_get

SITE = """
[server]
workers = 1

[[listen]]
address = "127.0.0.1:0"

[[site]]
hosts = ["*"]
{site_extra}

[site.notes]
dir = "{notes}"
page_size = 2
{notes_extra}
"""

RICH = """---
title: Rich <note>
date: 2026-05-01T10:00:00+02:00
tags: [code, "c++"]
---

| lang | speed |
|------|-------|
| C    | fast  |

~~old~~ new

- [x] done
- [ ] todo

```python
print("<hi>")
```

<script>alert(1)</script>

[bad](javascript:alert(1)) and <img src=x onerror=alert(1)>
"""


def serve(start_server, notes, site_extra="", notes_extra=""):
    return start_server(SITE.format(notes=notes, site_extra=site_extra, notes_extra=notes_extra))


@pytest.fixture
def notes(tmp_path):
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "rich.md").write_text(RICH)
    note(folder, "older", "Older", "2026-01-01", ["code"])
    note(folder, "oldest", "Oldest", "2025-01-01")
    note(folder, "secret", "Secret draft", "2026-06-01", ["code"], draft=True)
    (folder / "broken.md").write_text("---\ntitle: [unclosed\n---\nx\n")
    (folder / "not-a-note.txt").write_text("x")
    return folder


def test_note_page_renders_gfm_and_escapes_html(start_server, notes):
    server = serve(start_server, notes)
    status, headers, body = notes_get(server.port(), "/notes/rich")
    assert status == 200 and headers["content-type"] == "text/html; charset=utf-8"
    assert headers["x-content-type-options"] == "nosniff"
    page = body.decode()
    assert "<title>Rich &lt;note&gt;" in page
    assert "<table>" in page and "<td>fast</td>" in page
    assert "<s>old</s>" in page
    assert 'class="task-list-item-checkbox" checked="checked"' in page
    assert '<code class="language-python">print(&quot;&lt;hi&gt;&quot;)' in page
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<img" not in page and 'href="javascript' not in page
    assert 'href="/notes/tag/c%2B%2B"' in page


def test_raw_html_when_the_owner_allows_it(start_server, notes):
    server = serve(start_server, notes, notes_extra="raw_html = true")
    assert b"<script>alert(1)</script>" in notes_get(server.port(), "/notes/rich")[2]


def test_list_newest_first_paginated_drafts_hidden(start_server, notes):
    server = serve(start_server, notes)
    port = server.port()
    status, _, body = notes_get(port, "/notes")
    page = body.decode()
    assert status == 200
    assert page.index("/notes/rich") < page.index("/notes/older")
    assert "/notes/oldest" not in page and "Secret" not in page and "broken" not in page
    assert 'href="/notes/page/2"' in page
    status, _, body = notes_get(port, "/notes/page/2")
    assert status == 200 and b"/notes/oldest" in body and b'href="/notes"' in body
    assert notes_get(port, "/notes/page/3")[0] == 404
    assert notes_get(port, "/notes/page/1")[0] == 404
    assert notes_get(port, "/notes/page/x")[0] == 404
    assert notes_get(port, "/notes/secret")[0] == 404          # drafts are not published
    assert notes_get(port, "/notes/broken")[0] == 404
    assert notes_get(port, "/notes/missing")[0] == 404
    status, headers, _ = notes_get(port, "/notes/rich/")
    assert status == 308 and headers["location"] == "/notes/rich"


def test_tags(start_server, notes):
    server = serve(start_server, notes)
    port = server.port()
    status, _, body = notes_get(port, "/notes/tag/code")
    assert status == 200 and b"/notes/rich" in body and b"/notes/older" in body
    assert b"Secret" not in body
    assert notes_get(port, "/notes/tag/c%2B%2B")[0] == 200
    assert notes_get(port, "/notes/tag/c++")[0] == 200
    assert notes_get(port, "/notes/tag/nothing")[0] == 404
    assert notes_get(port, "/notes/tag/code/page/2")[0] == 404      # two notes, page size two


def test_atom_feed(start_server, notes):
    server = serve(start_server, notes, site_extra='base_url = "https://lily.example"')
    status, headers, body = notes_get(server.port(), "/notes/feed.xml")
    assert status == 200 and headers["content-type"] == "application/atom+xml; charset=utf-8"
    ns = {"a": "http://www.w3.org/2005/Atom"}
    feed = ET.fromstring(body)
    entries = feed.findall("a:entry", ns)
    assert [e.find("a:title", ns).text for e in entries] == ["Rich <note>", "Older", "Oldest"]
    assert entries[0].find("a:id", ns).text == "https://lily.example/notes/rich"
    assert "<table>" in entries[0].find("a:content", ns).text


def test_edit_on_disk_is_served_soon(start_server, notes):
    server = serve(start_server, notes)
    port = server.port()
    assert b"Older" in notes_get(port, "/notes/older")[2]
    notes_get(port, "/notes")
    note(notes, "older", "Edited outside", "2026-01-01")
    note(notes, "brand-new", "Brand new", "2026-07-01")
    deadline = time.monotonic() + 10
    while b"Edited outside" not in notes_get(port, "/notes/older")[2]:
        assert time.monotonic() < deadline, "outside edit never served"
        time.sleep(0.1)
    assert b"Brand new" in notes_get(port, "/notes")[2]
    assert notes_get(port, "/notes/brand-new")[0] == 200
    (notes / "brand-new.md").unlink()
    while notes_get(port, "/notes/brand-new")[0] != 404:
        assert time.monotonic() < deadline, "deletion never seen"
        time.sleep(0.1)


def test_small_page_cache_still_serves_everything(start_server, notes):
    for i in range(10):
        note(notes, f"n{i}", f"Note {i}", f"2024-01-{i + 1:02d}")
    server = serve(start_server, notes, notes_extra="cache_pages = 2")
    for _ in range(2):
        for i in range(10):
            status, _, body = notes_get(server.port(), f"/notes/n{i}")
            assert status == 200 and f"Note {i}".encode() in body


def test_owner_templates_override_builtin(start_server, notes, tmp_path):
    own = tmp_path / "templates"
    own.mkdir()
    (own / "note.html").write_text("<p>custom {{ note.title }}</p>{{ body_html }}")
    server = serve(start_server, notes, site_extra=f'templates = "{own}"')
    status, _, body = notes_get(server.port(), "/notes/older")
    assert body.startswith(b"<p>custom Older</p>")
    assert b"<!doctype html>" in notes_get(server.port(), "/notes")[2]     # others stay built in


def test_pages_answer_405_to_other_methods(start_server, notes):
    server = serve(start_server, notes)
    for path in ("/notes", "/notes/rich", "/notes/tag/code", "/notes/never-written"):
        notes_get(server.port(), path)                 # cached or not, the answer is the same
        for method in ("POST", "DELETE", "PUT"):
            conn = http.client.HTTPConnection("127.0.0.1", server.port(), timeout=10)
            conn.request(method, path, body=b"x")
            resp = conn.getresponse()
            resp.read()
            assert resp.status == 405 and resp.getheader("allow") == "GET, HEAD", (method, path)
            conn.close()


def test_rendered_markdown_is_kept_and_checked_against_the_note(start_server, notes):
    server = serve(start_server, notes)
    status, _, page = notes_get(server.port(), "/notes/older")
    assert status == 200
    kept = list((notes / ".nestgate-html").glob("older.*.html"))
    assert len(kept) == 1
    key, _, html = kept[0].read_bytes().partition(b"\n")
    assert key.startswith(b"nestgate-html ") and html in page
    # A kept rendering that does not match the note file is not used.
    kept[0].write_bytes(key + b"\n<p>forged</p>\n")
    note(notes, "older", "Older", "2026-01-01", ["code"], body="edited on disk")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        page = notes_get(server.port(), "/notes/older")[2]
        if b"edited on disk" in page:
            break
        time.sleep(0.2)
    assert b"edited on disk" in page and b"forged" not in page


def test_a_new_sites_pages_are_styled_by_the_built_in_assets(start_server, notes):
    import re
    server = serve(start_server, notes)
    _, _, page = notes_get(server.port(), "/notes/older")
    linked = re.findall(rb'href="(/__nestgate__/[^"]+)"', page)
    assert b"/__nestgate__/style.css" in linked
    for path in linked:
        status, headers, body = notes_get(server.port(), path.decode())
        assert status == 200 and body, path
    status, headers, _ = notes_get(server.port(), "/__nestgate__/style.css")
    assert headers["content-type"].startswith("text/css")
    assert notes_get(server.port(), "/__nestgate__/../nestgate.toml")[0] == 404


def test_a_reload_renders_with_the_new_configs_settings(start_server, notes):
    """The supervisor builds each site's renderer before forking the workers
    (nestgate.sites.build.build_shared); a reload's workers render with the new config's."""
    server = serve(start_server, notes)
    assert b"&lt;script&gt;" in notes_get(server.port(), "/notes/rich")[2]
    server.config_path.write_text(SITE.format(notes=notes, site_extra="",
                                              notes_extra="raw_html = true"))
    mark = len(server.lines)
    server.signal(signal.SIGHUP)
    server.wait_for("reloaded", start=mark)
    deadline = time.monotonic() + 10     # the old workers stop accepting a moment later
    while b"<script>alert(1)</script>" not in notes_get(server.port(), "/notes/rich")[2]:
        assert time.monotonic() < deadline, "the reloaded workers still escape raw HTML"
        time.sleep(0.1)
