"""A note whose title, summary, tag or text holds a character XML does not allow (a C0
control other than tab, LF and CR), written through the API, where strict JSON takes
`\\u000b` as it takes any escape.

The Atom feed holds every recent note: before, one such character anywhere made the
whole feed a document no XML parser (so no feed reader) takes, for every subscriber,
until the note was edited. Now each such character is written as U+FFFD, on the feed
and the pages alike, and the note itself keeps what was sent."""

from __future__ import annotations

import http.client
import json
import xml.etree.ElementTree as ET

import pytest

from conftest import notes_get

pytestmark = pytest.mark.attack

TOKEN = "feed-token"
SITE = """
[server]
workers = 1

[[listen]]
address = "127.0.0.1:0"

[[site]]
hosts = ["*"]
base_url = "https://notes.example"

[site.notes]
dir = "{notes}"
token = "{token}"
"""
NOTE = {"title": "bad\u000btitle", "summary": "sum\u001fmary", "tags": ["t\u0001ag"],
        "body": "text \u0002 here, and \u0000 too, and a tab\tstays\n"}


def test_control_characters_in_a_note_leave_the_feed_well_formed(start_server, tmp_path):
    (tmp_path / "notes").mkdir()
    server = start_server(SITE.format(notes=tmp_path / "notes", token=TOKEN))
    conn = http.client.HTTPConnection("127.0.0.1", server.port(), timeout=10)
    conn.request("PUT", "/api/v1/notes/controls", body=json.dumps(NOTE),
                 headers={"Authorization": f"Bearer {TOKEN}",
                          "Content-Type": "application/json"})
    created = conn.getresponse()
    assert (created.status, created.read()[:1]) == (201, b"{")

    status, _headers, body = notes_get(server.port(), "/notes/feed.xml")
    assert status == 200
    atom = {"a": "http://www.w3.org/2005/Atom"}
    entry = ET.fromstring(body).find("a:entry", atom)             # before: ParseError
    assert entry.find("a:title", atom).text == "bad\ufffdtitle"
    assert entry.find("a:category", atom).get("term") == "t\ufffdag"
    assert "text \ufffd here" in entry.find("a:content", atom).text
    assert "a tab\tstays" in entry.find("a:content", atom).text

    status, _headers, page = notes_get(server.port(), "/notes/controls")
    assert status == 200 and b"bad\xef\xbf\xbdtitle" in page
    assert not set(page) & (set(range(0, 9)) | {11, 12} | set(range(14, 32)))

    conn.request("GET", "/api/v1/notes/controls", headers={"Authorization": f"Bearer {TOKEN}"})
    kept = json.loads(conn.getresponse().read())
    assert (kept["title"], kept["tags"]) == (NOTE["title"], NOTE["tags"])    # nothing lost
    conn.close()
