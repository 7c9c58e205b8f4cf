"""A site's access list and sign-in cover everything the site answers, over HTTP/1.1
and HTTP/2 alike: configured routes, health, the home page, and the notes pages and
API, including pages registered while serving (rendered by a visit or by an API write).

Visitors are told apart by X-Forwarded-For from a trusted proxy (loopback), so an
"allowed visitor" (10.1.2.3), an "outsider" (203.0.113.9) and a local visitor (no
header) all come from this machine.
"""

from __future__ import annotations

import http.client
import json
import ssl

import pytest

from h2client import H2Client
from nestgate.handlers.auth.passwords import hash_password

ALLOWED, OUTSIDER = "10.1.2.3", "203.0.113.9"
NOTE = "---\ntitle: Private plans\n---\n\nthe secret text\n"


def site_config(notes: str, certs, access: str, auth: str = "") -> str:
    chain, key = certs["local"]
    return f"""
[server]
workers = 1

[client_ip]
trusted_proxies = ["127.0.0.1"]

[[listen]]
address = "127.0.0.1:0"

[[listen]]
address = "127.0.0.1:0"
[[listen.certificate]]
cert = "{chain}"
key = "{key}"
names = ["localhost", "127.0.0.1"]
{auth}
[[site]]
hosts = ["*"]
{access}

[site.home]
title = "home"

[site.notes]
dir = "{notes}"
token = "tok"
"""


class Visitor:
    """Requests as one client address, over HTTP/1.1 (plain) or HTTP/2 (TLS)."""

    def __init__(self, server, certs, protocol: str, address: str | None) -> None:
        self.server, self.certs, self.protocol = server, certs, protocol
        self.headers = [("x-forwarded-for", address)] if address else []

    def get(self, path: str, method: str = "GET", body: bytes = b"",
            extra=()) -> tuple[int, bytes]:
        headers = [*self.headers, *extra]
        if self.protocol == "h2":
            client = H2Client(self.server.port("https"), self.certs["ca"])
            try:
                status, _h, data = client.request(
                    method, path, body,
                    [(n.encode(), v.encode()) for n, v in headers])
            finally:
                client.close()
            return status, data
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port("http"), timeout=10)
        try:
            conn.request(method, path, body=body or None, headers=dict(headers))
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()


def write_note(visitor: Visitor, slug: str) -> int:
    body = json.dumps({"title": "Fresh plans", "body": "the secret text"}).encode()
    status, _ = visitor.get(f"/api/v1/notes/{slug}", "PUT", body,
                            [("authorization", "Bearer tok"),
                             ("content-type", "application/json")])
    return status


@pytest.fixture(params=["h1", "h2"])
def protocol(request):
    return request.param


@pytest.fixture
def notes(tmp_path):
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "plans.md").write_text(NOTE)
    return folder


def test_allow_list_holds_for_a_note_rendered_by_an_allowed_visit(
        start_server, certs, notes, protocol):
    server = start_server(site_config(notes, certs, 'allow = ["10.0.0.0/8"]'))
    outsider = Visitor(server, certs, protocol, OUTSIDER)
    allowed = Visitor(server, certs, protocol, ALLOWED)
    assert outsider.get("/notes/plans")[0] == 403
    status, body = allowed.get("/notes/plans")
    assert status == 200 and b"the secret text" in body
    for path in ("/notes/plans", "/notes", "/", "/notes/feed.xml", "/api/v1/notes/plans"):
        status, body = outsider.get(path)
        assert status == 403 and b"secret" not in body, path


def test_allow_list_holds_for_a_note_rendered_by_an_api_write(
        start_server, certs, notes, protocol):
    server = start_server(site_config(notes, certs, 'allow = ["10.0.0.0/8"]'))
    allowed = Visitor(server, certs, protocol, ALLOWED)
    outsider = Visitor(server, certs, protocol, OUTSIDER)
    assert write_note(allowed, "fresh") == 201
    status, body = outsider.get("/notes/fresh")
    assert status == 403 and b"secret" not in body
    assert write_note(outsider, "intruder") == 403
    assert allowed.get("/notes/fresh")[0] == 200


def test_local_exemption_does_not_open_pages_to_others(start_server, certs, notes, protocol):
    server = start_server(site_config(
        notes, certs, 'allow = ["10.0.0.0/8"]\nexempt_local = true'))
    local = Visitor(server, certs, protocol, None)
    outsider = Visitor(server, certs, protocol, OUTSIDER)
    assert local.get("/notes/plans")[0] == 200
    assert local.get("/notes/tag/none")[0] == 404
    assert outsider.get("/notes/plans")[0] == 403


def test_sign_in_holds_for_pages_rendered_by_a_local_visit(
        start_server, certs, notes, protocol, tmp_path):
    auth = f"""
[auth]
store = "{tmp_path / 'state.db'}"
[[auth.user]]
name = "demo"
password = "{hash_password('demo-password')}"
"""
    server = start_server(site_config(notes, certs, "protected = true\nexempt_local = true",
                                      auth))
    local = Visitor(server, certs, protocol, None)
    outsider = Visitor(server, certs, protocol, OUTSIDER)
    assert outsider.get("/notes/plans")[0] == 401
    status, body = local.get("/notes/plans")
    assert status == 200 and b"the secret text" in body
    assert write_note(local, "fresh") == 201
    for path in ("/notes/plans", "/notes/fresh", "/notes", "/"):
        status, body = outsider.get(path)
        assert status == 401 and b"secret" not in body, path
