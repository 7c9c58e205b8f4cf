"""A note edited on disk (an editor, git pull) is served by every worker within the
documented interval, whichever worker a connection lands on and however long it
was since that worker was last asked."""

from __future__ import annotations

import time

from conftest import NOTES_SITE, note, notes_get

DIR_CHECK_INTERVAL_S = 1.0          # docs/site.md: "within a second"


def test_an_edit_on_disk_is_served_by_every_worker(start_server, tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    note(notes, "diary", "First words", "2026-01-01")
    port = start_server(NOTES_SITE.format(notes=notes)).port()
    for _ in range(20):                 # new connections: both workers cache the page
        assert b"First words" in notes_get(port, "/notes/diary")[2]
    for round_ in range(2):
        title = f"Rewritten {round_}"
        note(notes, "diary", title, "2026-01-01")
        time.sleep(DIR_CHECK_INTERVAL_S + 1.0)     # the interval, and time for the check
        served = [title.encode() in notes_get(port, "/notes/diary")[2] for _ in range(8)]
        assert all(served), f"round {round_}: fetches after the edit served {served}"


def test_a_note_on_disk_with_more_tags_than_the_api_takes_keeps_those_that_fit(
        start_server, tmp_path):
    """The API refuses more than 32 tags or one over 64 characters; a file edited on
    disk is not refused (the site would lose the note): the over-long tags are left
    out, the first 32 others kept, and the log says so."""
    notes = tmp_path / "notes"
    notes.mkdir()
    tags = [f"t{i}" for i in range(20)] + ["x" * 100] + [f"t{i}" for i in range(20, 40)]
    note(notes, "tagged", "Many tags", "2026-01-01", tags=tags)
    server = start_server(NOTES_SITE.format(notes=notes))
    status, _, page = notes_get(server.port(), "/notes/tagged")
    assert status == 200 and b"Many tags" in page
    shown = [t for t in tags if f'href="/notes/tag/{t}"'.encode() in page]
    assert shown == [f"t{i}" for i in range(32)]
    logged = server.wait_for("tagged.md: 41 tags")
    assert "1 of them over 64 characters: the first 32 that fit are kept" in logged
