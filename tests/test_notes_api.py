"""The notes API end to end: token, validation, limits, atomic writes, two workers."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import time

import pytest

TOKEN = "t0ken-for-tests"

SITE = """
[server]
workers = {workers}

[[listen]]
address = "127.0.0.1:0"

[[site]]
hosts = ["*"]

[site.notes]
dir = "{notes}"
token = "{token}"
max_note_bytes = "{max_bytes}"
cors_origins = ["https://editor.example"]
"""


def serve(start_server, notes, workers=1, token=TOKEN, max_bytes="64KiB"):
    return start_server(SITE.format(notes=notes, workers=workers, token=token,
                                    max_bytes=max_bytes))


def call(port, method, path, body=None, token=TOKEN, headers=None, conn=None):
    own = conn is None
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    sent = dict(headers or {})
    if token:
        sent["Authorization"] = f"Bearer {token}"
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
        sent.setdefault("Content-Type", "application/json")
    conn.request(method, path, body=body, headers=sent)
    resp = conn.getresponse()
    data = resp.read()
    if own:
        conn.close()
    headers = {k.lower(): v for k, v in resp.getheaders()}
    parsed = json.loads(data) if data and headers.get("content-type") == "application/json" \
        else data
    return resp.status, headers, parsed


@pytest.fixture
def notes(tmp_path):
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "first.md").write_text("---\ntitle: First\ndate: 2026-01-02\ntags: [a]\n---\n\n"
                                     "Hello *world*.\n")
    return folder


def test_token_required_and_constant_time_compare(start_server, notes):
    server = serve(start_server, notes)
    port = server.port()
    status, headers, body = call(port, "GET", "/api/v1/notes", token=None)
    assert status == 401 and headers["www-authenticate"].startswith("Bearer")
    assert body["error"] == "missing or wrong bearer token"
    assert call(port, "GET", "/api/v1/notes", token="wrong")[0] == 401
    assert call(port, "GET", "/api/v1/notes", token=TOKEN + "x")[0] == 401
    assert call(port, "GET", "/api/v1/notes",
                headers={"Authorization": f"Basic {TOKEN}"}, token=None)[0] == 401
    status, _, body = call(port, "GET", "/api/v1/notes")
    assert status == 200 and body["total"] == 1
    assert TOKEN not in "\n".join(server.lines)


def test_token_from_environment(start_server, notes, monkeypatch):
    monkeypatch.setenv("NESTGATE_NOTES_TOKEN", "from-env")
    server = serve(start_server, notes, token="")
    assert call(server.port(), "GET", "/api/v1/notes", token="from-env")[0] == 200
    assert call(server.port(), "GET", "/api/v1/notes")[0] == 401


def test_crud(start_server, notes):
    server = serve(start_server, notes)
    port = server.port()
    status, headers, body = call(port, "PUT", "/api/v1/notes/second",
                                 {"title": "Second", "body": "Some **text**",
                                  "tags": ["x", "y"], "date": "2026-03-04T05:06:07+08:00"})
    assert status == 201 and headers["location"] == "/api/v1/notes/second"
    assert body["slug"] == "second" and body["tags"] == ["x", "y"]
    text = (notes / "second.md").read_text()
    assert text.startswith("---\ntitle: Second\n") and text.endswith("Some **text**\n")
    # The write rendered the page already (the first GET is a cache hit), and kept the
    # rendered Markdown for the other workers.
    assert len(list((notes / ".nestgate-html").glob("second.*.html"))) == 1
    status, _, body = call(port, "GET", "/api/v1/notes/second")
    assert status == 200 and body["body"] == "Some **text**\n"
    assert body["date"] == "2026-03-04T05:06:07+08:00"
    # Replacing keeps the date when none is given.
    status, _, body = call(port, "PUT", "/api/v1/notes/second",
                           {"title": "Second, again", "body": "new"})
    assert status == 200 and body["date"] == "2026-03-04T05:06:07+08:00"
    status, _, body = call(port, "GET", "/api/v1/notes?per_page=1&page=1")
    assert [n["slug"] for n in body["notes"]] == ["second"] and body["total"] == 2
    assert "body" not in body["notes"][0]
    status, _, body = call(port, "GET", "/api/v1/notes?per_page=1&page=2")
    assert [n["slug"] for n in body["notes"]] == ["first"]
    assert call(port, "DELETE", "/api/v1/notes/second")[0] == 204
    assert not (notes / "second.md").exists()
    assert not list((notes / ".nestgate-html").glob("second.*"))
    assert call(port, "DELETE", "/api/v1/notes/second")[0] == 404
    assert call(port, "GET", "/api/v1/notes/second")[0] == 404


def test_post_with_and_without_slug(start_server, notes):
    server = serve(start_server, notes)
    port = server.port()
    status, headers, body = call(port, "POST", "/api/v1/notes", {"title": "T", "body": "b"})
    assert status == 201 and len(body["slug"]) == 14 and body["slug"].isdigit()
    status, _, second = call(port, "POST", "/api/v1/notes", {"title": "T", "body": "b"})
    assert status == 201 and second["slug"].startswith(body["slug"][:10])
    assert second["slug"] != body["slug"]
    status, _, body = call(port, "POST", "/api/v1/notes",
                           {"slug": "given", "title": "T", "body": "b"})
    assert status == 201 and body["slug"] == "given"
    status, _, body = call(port, "POST", "/api/v1/notes",
                           {"slug": "given", "title": "T", "body": "b"})
    assert status == 409 and body["field"] == "slug"


def test_markdown_body(start_server, notes):
    server = serve(start_server, notes)
    note = "---\ntitle: From a file\ntags: [md]\ndraft: true\n---\n\n# Heading\n"
    status, _, body = call(server.port(), "PUT", "/api/v1/notes/file", note.encode(),
                           headers={"Content-Type": "text/markdown"})
    assert status == 201 and body["draft"] is True and body["title"] == "From a file"


@pytest.mark.parametrize("payload, field", [
    ({"body": "x"}, "title"),
    ({"title": "", "body": "x"}, "title"),
    ({"title": "t"}, "body"),
    ({"title": "t", "body": "x", "tags": "a/b"}, "tags"),
    ({"title": "t", "body": "x", "tags": [1]}, "tags"),
    ({"title": "t", "body": "x", "draft": "yes"}, "draft"),
    ({"title": "t", "body": "x", "date": "yesterday"}, "date"),
    ({"title": "t", "body": "x", "colour": "red"}, "colour"),
    ({"title": "t", "body": "x", "slug": "other"}, "slug"),
    ([1, 2], "body"),
])
def test_bad_input_names_the_field(start_server, notes, payload, field):
    server = serve(start_server, notes)
    status, _, body = call(server.port(), "PUT", "/api/v1/notes/ok", payload)
    assert status == 422 and body["field"] == field, body


def test_bad_slug_and_json(start_server, notes):
    server = serve(start_server, notes)
    port = server.port()
    status, _, body = call(port, "PUT", "/api/v1/notes/bad.slug", {"title": "t", "body": "x"})
    assert status == 422 and body["field"] == "slug"
    status, _, body = call(port, "PUT", "/api/v1/notes/page", {"title": "t", "body": "x"})
    assert status == 422 and body["field"] == "slug"
    status, _, body = call(port, "PUT", "/api/v1/notes/ok", b"{not json",
                           headers={"Content-Type": "application/json"})
    assert status == 422 and body["field"] == "body"
    status, _, body = call(port, "GET", "/api/v1/notes?page=x")
    assert status == 422 and body["field"] == "page"


def test_slug_with_trailing_slashes_is_not_a_note(start_server, notes):
    server = serve(start_server, notes)
    port = server.port()
    for path in ("/api/v1/notes/x/", "/api/v1/notes/x//", "/api/v1/notes/first/"):
        status, _, body = call(port, "PUT", path, {"title": "t", "body": "x"})
        assert status == 404, (path, body)
        assert call(port, "GET", path)[0] == 404
        assert call(port, "DELETE", path)[0] == 404
    assert not (notes / "x.md").exists() and (notes / "first.md").exists()
    assert call(port, "GET", "/api/v1/notes/first")[0] == 200


def test_summary_is_limited(start_server, notes):
    server = serve(start_server, notes, max_bytes="1MiB")
    port = server.port()
    status, _, body = call(port, "PUT", "/api/v1/notes/long",
                           {"title": "t", "body": "x", "summary": "s" * 500_000})
    assert status == 422 and body["field"] == "summary", body
    note = "---\ntitle: T\nsummary: " + "s" * 1001 + "\n---\n\nx\n"
    status, _, body = call(port, "PUT", "/api/v1/notes/long", note.encode(),
                           headers={"Content-Type": "text/markdown"})
    assert status == 422 and body["field"] == "summary", body
    assert not (notes / "long.md").exists()
    status, _, body = call(port, "PUT", "/api/v1/notes/long",
                           {"title": "t", "body": "x", "summary": "s" * 1000})
    assert status == 201 and len(body["summary"]) == 1000


def test_tags_are_limited_in_number_and_length(start_server, notes):
    server = serve(start_server, notes)
    port = server.port()
    for tags in ([f"t{i}" for i in range(33)], ["x" * 65]):
        status, _, body = call(port, "PUT", "/api/v1/notes/tagged",
                               {"title": "t", "body": "x", "tags": tags})
        assert status == 422 and body["field"] == "tags", body
        assert "at most 32 tags" in body["error"] and "64 characters" in body["error"]
    note = "---\ntitle: T\ntags: [" + ", ".join(f"t{i}" for i in range(33)) + "]\n---\n\nx\n"
    status, _, body = call(port, "PUT", "/api/v1/notes/tagged", note.encode(),
                           headers={"Content-Type": "text/markdown"})
    assert status == 422 and body["field"] == "tags", body
    assert not (notes / "tagged.md").exists()
    most = [f"t{i}" for i in range(31)] + ["y" * 64]
    status, _, body = call(port, "PUT", "/api/v1/notes/tagged",
                           {"title": "t", "body": "x", "tags": most})
    assert status == 201 and body["tags"] == most


PAGE_LIMITED = SITE + """max_page_bytes = "64KiB"
"""


def test_a_note_whose_page_would_be_too_large_is_refused(start_server, notes):
    server = start_server(PAGE_LIMITED.format(notes=notes, workers=1, token=TOKEN,
                                              max_bytes="1MiB"))
    port = server.port()
    # One link target defined once and used 2,000 times: 8 KB of Markdown that would
    # render to 4 MB.
    bomb = "[x]: /" + "u" * 2000 + "\n\n" + "[x]" * 2000
    for text in (bomb, "words " * 20_000):          # and 120 KB of plain text
        status, _, body = call(port, "PUT", "/api/v1/notes/big", {"title": "t", "body": text})
        assert status == 422 and body["field"] == "body", body
        assert body["error"] == "the note's page would be over max_page_bytes (65536 bytes)"
    assert not (notes / "big.md").exists()
    status, _, body = call(port, "PUT", "/api/v1/notes/big",
                           {"title": "t", "body": "words " * 8_000})
    assert status == 201
    assert len(call(port, "GET", "/notes/big", token=None)[2]) <= 64 * 1024


def test_oversize_body_is_413(start_server, notes):
    server = serve(start_server, notes, max_bytes="1KiB")
    status, _, body = call(server.port(), "PUT", "/api/v1/notes/big",
                           {"title": "t", "body": "x" * 5000})
    assert status == 413
    assert not (notes / "big.md").exists()
    assert [p.name for p in notes.iterdir() if p.name.endswith(".tmp")] == []


def test_cors(start_server, notes):
    server = serve(start_server, notes)
    port = server.port()
    status, headers, _ = call(port, "OPTIONS", "/api/v1/notes/x", token=None, headers={
        "Origin": "https://editor.example", "Access-Control-Request-Method": "PUT",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert status == 204
    assert headers["access-control-allow-origin"] == "https://editor.example"
    assert "PUT" in headers["access-control-allow-methods"]
    assert "authorization" in headers["access-control-allow-headers"]
    status, headers, _ = call(port, "OPTIONS", "/api/v1/notes", token=None,
                              headers={"Origin": "https://evil.example"})
    assert status == 204 and "access-control-allow-origin" not in headers
    _, headers, _ = call(port, "GET", "/api/v1/notes",
                         headers={"Origin": "https://editor.example"})
    assert headers["access-control-allow-origin"] == "https://editor.example"
    assert headers["vary"] == "origin"


def test_write_through_one_worker_is_seen_by_every_worker(start_server, notes):
    server = serve(start_server, notes, workers=2)
    port = server.port()
    pids = set(server.worker_pids())
    assert len(pids) == 2
    seen_pids = set()
    for i in range(6):
        title = f"Version {i}"
        assert call(port, "PUT", "/api/v1/notes/shared", {"title": title, "body": f"v{i}"})[0] \
            == (201 if i == 0 else 200)
        # Fresh connections: the kernel spreads them over both workers.
        for _ in range(6):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", "/notes/shared")
            resp = conn.getresponse()
            page = resp.read()
            assert resp.status == 200 and f"<h1>{title}</h1>".encode() in page, i
            conn.request("GET", "/api/v1/health")
            seen_pids.add(json.loads(conn.getresponse().read())["pid"])
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", "/notes")
            listing = conn.getresponse().read()
            assert title.encode() in listing
            conn.close()
    assert seen_pids == pids, "both workers should have answered"
    assert call(port, "DELETE", "/api/v1/notes/shared")[0] == 204
    for _ in range(6):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/notes/shared")
        assert conn.getresponse().status == 404
        conn.close()


@pytest.fixture
def tiny_disk(tmp_path):
    """A 64 KiB tmpfs as the notes directory, when this process may mount one."""
    folder = tmp_path / "tiny"
    folder.mkdir()
    if os.geteuid() != 0 or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)],
            capture_output=True).returncode != 0:
        pytest.skip("needs permission to mount a small tmpfs")
    yield folder
    subprocess.run(["umount", "-l", str(folder)], check=False)


def test_disk_full_is_507_and_the_old_note_survives(start_server, tiny_disk):
    (tiny_disk / "keep.md").write_text("---\ntitle: Keep\n---\n\noriginal\n")
    server = serve(start_server, tiny_disk, max_bytes="1MiB")
    port = server.port()
    status, _, body = call(port, "PUT", "/api/v1/notes/keep",
                           {"title": "Keep", "body": "y" * 300_000})
    assert status == 507 and "disk is full" in body["error"]
    assert (tiny_disk / "keep.md").read_text().endswith("original\n")
    assert sorted(p.name for p in tiny_disk.iterdir()) == [".nestgate-generation", "keep.md"]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/notes/keep")
    assert b"original" in conn.getresponse().read()


def test_write_failure_is_500_and_leaves_nothing(notes, monkeypatch):
    """A failing fsync (an I/O error) through the store itself."""
    from nestgate.handlers.notes.store import NoteStore, StoreError, make_note
    store = NoteStore(str(notes))
    before = (notes / "first.md").read_bytes()

    def broken(fd):
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(StoreError) as err:
        store.write(make_note("first", {"title": "New"}, "new"))
    assert err.value.status == 500 and "Input/output error" in str(err.value)
    assert (notes / "first.md").read_bytes() == before
    assert not [p for p in notes.iterdir() if p.name.endswith(".tmp")]


def test_directory_fsync_failure_after_the_rename_reports_it_and_serves_the_new_note(
        notes, monkeypatch):
    """Past the rename the new note is in place: every worker must see it (the
    generation moves on) and the client learns it was not confirmed on disk."""
    from nestgate.handlers.notes import store as module
    store = module.NoteStore(str(notes))
    generation = store.generation()

    def broken(directory):
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(module, "_fsync_dir", broken)
    with pytest.raises(module.StoreError) as err:
        store.write(module.make_note("first", {"title": "New"}, "new text"))
    assert err.value.status == 500 and "saved, but the disk did not confirm" in str(err.value)
    assert b"new text" in (notes / "first.md").read_bytes()
    assert store.generation() != generation
    generation = store.generation()
    with pytest.raises(module.StoreError) as err:
        store.delete("first")
    assert "deleted, but the disk did not confirm" in str(err.value)
    assert not (notes / "first.md").exists() and store.generation() != generation


ROUTE_BESIDE_NOTES = SITE + """
[[site.route]]
path = "/notes/about"
type = "return"
body = "the configured page"
"""


def test_a_note_that_would_shadow_a_configured_route_is_refused(start_server, notes):
    """A note whose page would be /notes/about, where the site has a route of its own:
    refused with 409 naming the route, by PUT and by POST, nothing written, and the
    route keeps answering in every worker; another slug is written as usual."""
    server = start_server(ROUTE_BESIDE_NOTES.format(notes=notes, workers=2, token=TOKEN,
                                                    max_bytes="64KiB"))
    port = server.port()
    note = {"title": "About", "body": "a note"}
    for method, path, sent in (("PUT", "/api/v1/notes/about", note),
                               ("POST", "/api/v1/notes", {**note, "slug": "about"})):
        status, _, body = call(port, method, path, sent)
        assert (status, body["field"]) == (409, "slug")
        assert body["error"] == ("the note's page /notes/about is the site's route "
                                 "'/notes/about': choose another slug")
    assert not (notes / "about.md").exists()
    assert call(port, "GET", "/api/v1/notes/about")[0] == 404
    for _ in range(12):                         # new connections: both workers answer
        status, _, page = call(port, "GET", "/notes/about", token=None)
        assert (status, page) == (200, b"the configured page")
    status, _, body = call(port, "PUT", "/api/v1/notes/about-us", note)
    assert (status, body["slug"]) == (201, "about-us")
    assert call(port, "GET", "/notes/about-us", token=None)[0] == 200


def test_a_note_file_that_is_skipped_is_logged_once_per_version(start_server, notes):
    """A file with bad front matter (or not UTF-8) is left off the site, which it cannot
    break; the log names the file and what is wrong, once per version of the file, not
    at each list that reads it again. Before, nothing was logged."""
    broken = notes / "broken.md"
    broken.write_text("---\ntitle: [unclosed\n---\nx\n")
    (notes / "latin.md").write_bytes(b"---\ntitle: Caf\xe9\n---\n")
    server = serve(start_server, notes)
    port = server.port()
    for _ in range(5):                        # each list scans the folder again
        status, _, body = call(port, "GET", "/api/v1/notes")
        assert status == 200 and body["total"] == 1
    first = server.wait_for("broken.md: skipped")
    assert str(broken) in first and "front_matter: front matter is not valid YAML" in first
    assert "line 2, column 1" in first                 # YAML's own words, on one line
    assert "not UTF-8 text (byte" in server.wait_for("latin.md: skipped")
    # A new version with another fault: one more line, saying what it is now.
    broken.write_text("---\ntitle: Fine\ndraft: maybe\n---\nx\n")
    for _ in range(3):
        assert call(port, "GET", "/api/v1/notes")[2]["total"] == 1
    assert "draft: true or false" in server.wait_for("draft: true or false")
    # One worker writes its lines in order: the five lists before logged one line.
    skipped = [line for line in server.lines if "broken.md: skipped" in line]
    assert len(skipped) == 2, skipped
    assert len([line for line in server.lines if "latin.md: skipped" in line]) == 1
    # Mended: shown again.
    broken.write_text("---\ntitle: Mended\n---\nx\n")
    assert call(port, "GET", "/api/v1/notes")[2]["total"] == 2
