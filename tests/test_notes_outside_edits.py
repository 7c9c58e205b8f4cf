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
