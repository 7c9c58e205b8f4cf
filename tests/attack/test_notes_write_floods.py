"""Notes written to grow the workers: a note with 100,000 tags (each a link on its page,
in the lists and the feed, and a tag page of its own: 5 MB pages, both workers +100 MB)
and a note of one long link target used thousands of times (a 92 KB note rendered to a
60 MB page). Both are refused before anything is written (422 naming the field), and
neither worker grows.
"""

from __future__ import annotations

import http.client
import json
import time

from conftest import NOTES_SITE

TOKEN = "t0ken-for-attacks"
WRITES = 4                          # on new connections, so both workers take some
RSS_GROWTH_BOUND_KIB = 16 * 1024    # per worker; the accepted notes grew each by ~100 MB
DEADLINE_S = 60

# conftest's two-worker notes site, with the write API's token.
CONFIG = NOTES_SITE + 'token = "{token}"\n'


def write(port: int, slug: str, note: dict) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("PUT", f"/api/v1/notes/{slug}", body=json.dumps(note),
                 headers={"Authorization": f"Bearer {TOKEN}",
                          "Content-Type": "application/json"})
    resp = conn.getresponse()
    body = json.loads(resp.read())
    conn.close()
    return resp.status, body


def get(port: int, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", path)
    resp = conn.getresponse()
    resp.read()
    conn.close()
    return resp.status


def flood(start_server, tmp_path, note: dict, field: str) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    server = start_server(CONFIG.format(notes=notes, token=TOKEN))
    port = server.port()
    for path in ("/notes", "/notes/feed.xml"):
        assert get(port, path) == 200
    workers = server.worker_pids()
    from conftest import rss_kib
    before = {pid: rss_kib(pid) for pid in workers}
    deadline = time.monotonic() + DEADLINE_S
    for i in range(WRITES):
        assert time.monotonic() < deadline, "the writes took too long"
        status, body = write(port, f"flood{i}", note)
        assert (status, body.get("field")) == (422, field), body
        for path in ("/notes", "/notes/feed.xml", f"/notes/flood{i}"):
            assert get(port, path) == (404 if path.endswith(f"flood{i}") else 200)
    assert sorted(p.name for p in notes.iterdir() if p.suffix == ".md") == []
    grown = {pid: rss_kib(pid) - before[pid] for pid in workers}
    assert all(kib < RSS_GROWTH_BOUND_KIB for kib in grown.values()), f"grew {grown} KiB"


def test_a_note_with_100000_tags_is_refused(start_server, tmp_path):
    tags = [f"t{i}" for i in range(100_000)]             # about 1 MB of JSON
    flood(start_server, tmp_path, {"title": "tags", "body": "x", "tags": tags}, "tags")


def test_a_note_of_one_link_target_used_thousands_of_times_is_refused(start_server, tmp_path):
    bomb = "[x]: /" + "u" * 2000 + "\n\n" + "[x]" * 30_000   # 92 KB -> a 60 MB page
    flood(start_server, tmp_path, {"title": "links", "body": bomb}, "body")
