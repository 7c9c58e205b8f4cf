"""Security review: each test pins one defect found by attacking real servers."""

from __future__ import annotations

import pytest

from nestgate.handlers.static import parse_range


@pytest.mark.parametrize("value, expected", [
    (b"bytes=\xb2-", None),                  # "²" is str.isdigit() but not a number
    (b"bytes=0-\xb2", None),
    (b"bytes=-\xb3", None),
    (b"bytes=\xd9\xa1-2", None),             # Arabic-Indic digits once decoded
    (b"bytes=0-" + b"9" * 5000, (0, 9)),     # past int()'s 4300-digit limit
    (b"bytes=" + b"9" * 5000 + b"-", False),
    (b"bytes=-" + b"9" * 5000, (0, 9)),
    (b"bytes=-0", False),
    (b"bytes=0-1,2-3", None),
])
def test_range_header_never_raises(value, expected):
    assert parse_range(value, 10) == expected


def test_range_numbers_with_leading_zeros_keep_their_value():
    assert parse_range(b"bytes=" + b"0" * 30 + b"2-" + b"0" * 30 + b"4", 10) == (2, 4)
    assert parse_range(b"bytes=-" + b"0" * 30, 10) is False


# ------------------------------------------------------------ notes

NOTES_SITE = """
[server]
workers = 1

[[listen]]
address = "127.0.0.1:0"

[[site]]
hosts = ["*"]

[site.notes]
dir = "{notes}"
token = "tok"
"""


def _call(port, method, path, body=None, token="tok"):
    import http.client
    import json
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if body is not None:
        body = json.dumps(body)
        headers["Content-Type"] = "application/json"
    conn.request(method, path, body=body, headers=headers)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, data


@pytest.fixture
def notes_server(start_server, tmp_path):
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "first.md").write_text("---\ntitle: First\n---\n\nHello\n")
    server = start_server(NOTES_SITE.format(notes=folder))
    return server, folder


def test_slug_with_a_trailing_newline_is_refused(notes_server):
    from nestgate.notes.store import SLUG
    assert not SLUG.match("abc\n")
    server, folder = notes_server
    port = server.port()
    assert _call(port, "PUT", "/api/v1/notes/abc%0A", {"title": "t", "body": "b"})[0] in (404, 422)
    assert _call(port, "POST", "/api/v1/notes",
                 {"slug": "xyz\n", "title": "t", "body": "b"})[0] == 422
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == ["first.md"]
    assert _call(port, "GET", "/notes/first%0A", token=None)[0] == 404
    assert all("Traceback" not in line for line in server.lines)


def test_non_ascii_digits_in_numbers_are_not_a_server_error(notes_server):
    server, _ = notes_server
    port = server.port()
    for query in ("page=%C2%B2", "per_page=%C2%B3", "page=" + "9" * 5000, "per_page=%D9%A1"):
        assert _call(port, "GET", "/api/v1/notes?" + query)[0] == 422, query
    assert _call(port, "GET", "/notes/page/%C2%B2", token=None)[0] == 404
    assert all("Traceback" not in line for line in server.lines)
