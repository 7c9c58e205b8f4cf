"""The site as a whole: the embedded demo, the home page, security headers, config checks."""

from __future__ import annotations

import http.client
import json
import ssl

import pytest

from conftest import BASIC_SITE, Server
from nestgate.config import EMBEDDED_DEFAULT, ConfigError, parse_config


def get(port, path, method="GET", headers=None, body=None, context=None):
    if context is not None:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)
    else:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request(method, path, body=body, headers=headers or {})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data


@pytest.fixture
def demo():
    server = Server(EMBEDDED_DEFAULT, ["--listen", "127.0.0.1:0", "--workers", "1"])
    yield server
    server.stop()


def test_embedded_demo(demo):
    port = demo.port()
    status, headers, body = get(port, "/")
    assert status == 200 and headers["content-type"] == "text/html; charset=utf-8"
    assert b"A table and some code" in body and b"Hello from nestgate" in body
    assert body.index(b"A table and some code") < body.index(b"Hello from nestgate")
    assert headers["x-frame-options"] == "DENY" and "content-security-policy" in headers
    status, headers, body = get(port, "/style.css")
    assert status == 200 and headers["content-type"] == "text/css; charset=utf-8"
    assert headers["cache-control"] == "public, max-age=3600"
    status, headers, body = get(port, "/favicon.ico")
    assert status == 200 and headers["content-type"] == "image/x-icon"
    assert body[:4] == b"\x00\x00\x01\x00"
    assert get(port, "/favicon.svg")[1]["content-type"] == "image/svg+xml"
    status, _, body = get(port, "/notes/20260621093000")
    assert status == 200 and b"<table>" in body and b'class="language-sh"' in body
    status, _, body = get(port, "/notes/20260620160514")
    assert b"&lt;script&gt;" in body and b"<script>" not in body
    assert get(port, "/notes/feed.xml")[0] == 200
    assert get(port, "/notes/tag/nestgate")[0] == 200
    status, _, body = get(port, "/api/v1/notes")
    assert status == 401 and b"NESTGATE_NOTES_TOKEN" in body
    assert get(port, "/api/v1/health")[0] == 200
    assert get(port, "/nothing-here")[0] == 404


HOME_SITE = """
[server]
workers = 1

[[listen]]
address = "127.0.0.1:0"
{tls}

[[site]]
hosts = ["*"]

[site.home]
title = "Lily's nest"
owner = "Lily"
profile = "I grow **lilies** <b>and</b> write."
latest = 2

[[site.home.links]]
name = "GitHub"
url = "https://github.com/lily"

[site.notes]
dir = "{notes}"
token = "tok"

{security}
"""


@pytest.fixture
def notes(tmp_path):
    folder = tmp_path / "notes"
    folder.mkdir()
    for i in range(3):
        (folder / f"n{i}.md").write_text(f"---\ntitle: Note {i}\ndate: 2026-01-0{i + 1}\n---\nx\n")
    return folder


def test_home_page_from_config_with_latest_notes(start_server, notes):
    server = start_server(HOME_SITE.format(notes=notes, tls="", security=""))
    port = server.port()
    status, headers, body = get(port, "/")
    page = body.decode()
    assert status == 200 and "<title>Lily&#39;s nest</title>" in page
    assert "<strong>lilies</strong>" in page and "<b>and</b>" not in page
    assert 'href="https://github.com/lily"' in page and "&copy; Lily" in page
    assert "Note 2" in page and "Note 1" in page and "Note 0" not in page    # latest = 2
    assert "strict-transport-security" not in headers
    # A write shows on the home page at the next request.
    status = get(port, "/api/v1/notes/n9", "PUT", {"Authorization": "Bearer tok"},
                 json.dumps({"title": "Fresh", "body": "y", "date": "2027-01-01"}))[0]
    assert status == 201
    body = get(port, "/")[2]
    assert b"Fresh" in body and b"Note 1" not in body


def test_security_headers_configured_and_hsts_on_tls(start_server, notes, certs):
    tls = f"""
[[listen]]
address = "127.0.0.1:0"
[[listen.certificate]]
cert = "{certs['local'][0]}"
key = "{certs['local'][1]}"
"""
    security = """
[site.security]
csp = "default-src 'none'"
frame_options = "SAMEORIGIN"
hsts = "max-age=63072000; includeSubDomains"
"""
    server = start_server(HOME_SITE.format(notes=notes, tls=tls, security=security))
    context = ssl.create_default_context(cafile=certs["ca"])
    for path in ("/", "/notes", "/notes/n1", "/notes/feed.xml"):
        status, headers, _ = get(server.port("https"), path, context=context)
        assert status == 200, path
        assert headers["content-security-policy"] == "default-src 'none'"
        assert headers["x-frame-options"] == "SAMEORIGIN"
        assert headers["strict-transport-security"] == "max-age=63072000; includeSubDomains"
        assert headers["referrer-policy"] == "strict-origin-when-cross-origin"
        assert headers["permissions-policy"].startswith("camera=()")
    _, headers, _ = get(server.port("https"), "/api/v1/notes",
                        headers={"Authorization": "Bearer tok"}, context=context)
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["cache-control"] == "no-store"


def test_site_config_problems_are_reported(tmp_path):
    data = {"listen": [{"address": "127.0.0.1:0"}], "site": [{
        "notes": {"dir": str(tmp_path / "missing"), "cors_origins": ["example.com"],
                  "colour": 1},
        "home": {"path": "home", "links": [{"name": "x"}]},
        "security": {"csp": "a\nb"},
        "base_url": "lily.example",
    }]}
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    text = str(err.value)
    for expected in ("site[*].notes.dir: expected a path to a readable directory",
                     "site[*].notes.cors_origins: expected origins",
                     "site[*].notes.colour: unknown key",
                     "site[*].home.path: expected a path starting with /",
                     "site[*].home.links[0].name: expected a link with both name and url",
                     "site[*].security.csp: expected a header value on one line",
                     "site[*].base_url: expected an absolute http(s) address"):
        assert expected in text, expected


def test_built_in_error_pages_and_the_server_header_name_no_version(start_server):
    """Which version runs tells an outsider which known faults to try (nginx's
    server_tokens off): neither the Server header nor the built-in pages say it."""
    from nestgate import __version__
    server = start_server(BASIC_SITE)
    conn = http.client.HTTPConnection("127.0.0.1", server.port(), timeout=5)
    conn.request("GET", "/no/such/page")
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    assert resp.status == 404 and resp.getheader("server") == "nestgate"
    assert __version__.encode() not in body and b"nestgate" in body
