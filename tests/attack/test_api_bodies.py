"""JSON and TOML bodies that Python's readers take but that are not what they look
like, sent to the admin API and the notes API of a running server.

A lone surrogate (`"\\ud800"`) in an allow-list comment or a ban reason was a 500 (the
store could not encode it); a key given twice was taken with its last value; UTF-16,
`NaN`, `1e400` (infinity) and `true` as a duration passed; an IPv6 zone
(`fe80::1%eth0`) was kept under one text and enforced under another; a TOML body with
an integer of 100,000 digits was a 500 from validate. Each is now a 422 that says what
is wrong, and nothing is stored (nestgate/base/jsonbody.py, nestgate/base/tomltext.py).
"""

from __future__ import annotations

import http.client
import json

from conftest import rss_kib

TOKEN = "7c2e9a0b4d6f8e1a3c5b7d9f0e2a4c6b"
NOTES_TOKEN = "notes-token-0123456789abcdef"

CONFIG = f"""
[server]
workers = 2

[[listen]]
address = "127.0.0.1:0"

[admin]
address = "127.0.0.1:0"
token = "{TOKEN}"

[auth]
store = "state.db"

[bans]

[[site]]
hosts = ["*"]

[site.notes]
dir = "notes"
token = "{NOTES_TOKEN}"
"""

# (body, what the 422's message must say)
REFUSED = [
    (b'{"cidr": "203.0.113.7", "comment": "\\ud800"}', "lone surrogate"),
    (b'{"cidr": "203.0.113.7", "comment": "\\udfff x"}', "lone surrogate"),
    (b'{"cidr": "203.0.113.7", "cidr": "0.0.0.0/0"}', "'cidr' is given twice"),
    ('{"cidr": "203.0.113.7"}'.encode("utf-16"), "not UTF-8"),
    (b'{"cidr": "203.0.113.7", "ttl": NaN}', "NaN is not a JSON value"),
    (b'{"cidr": "203.0.113.7", "ttl": 1e400}', "too large a number"),
    (b'{"cidr": "203.0.113.7", "ttl": ' + b"9" * 5000 + b"}", "a number of 5000 digits"),
    (b'{"cidr": "203.0.113.7", "ttl": true}', "ttl: expected"),
    (b'{"cidr": "fe80::1%eth0"}', "a zone such as %eth0"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
]


def call(port: int, method: str, path: str, body: bytes = b"", token: str = TOKEN,
         content_type: str = "application/json"):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request(method, path, body=body or None, headers={
        "Authorization": f"Bearer {token}", "Content-Type": content_type})
    resp = conn.getresponse()
    raw = resp.read()
    conn.close()
    return resp.status, json.loads(raw) if raw else None


def as_ban(body: bytes) -> bytes:
    return body.replace(b'"cidr"', b'"network"').replace(b'"ttl"', b'"for"') \
        .replace(b'"comment"', b'"reason"')


def test_admin_bodies_that_are_not_plain_json_are_refused_and_store_nothing(start_server,
                                                                           tmp_path):
    (tmp_path / "notes").mkdir()
    server = start_server(CONFIG)
    admin = server.admin_port()
    before = rss_kib(server.admin_pid())
    for body, said in REFUSED:
        status, answer = call(admin, "POST", "/v1/allow", body)
        assert status == 422 and said in answer["error"]["message"], (body[:60], answer)
        status, answer = call(admin, "POST", "/v1/bans", as_ban(body))
        assert status == 422, (body[:60], answer)
        assert said.replace("cidr", "network").replace("ttl", "for") in \
            answer["error"]["message"], (body[:60], answer)
    assert call(admin, "GET", "/v1/allow") == (200, {"entries": []})
    assert call(admin, "GET", "/v1/bans") == (200, {"bans": []})
    # A byte-order mark is skipped (RFC 8259 lets a reader ignore it).
    status, answer = call(admin, "POST", "/v1/allow", b'\xef\xbb\xbf{"cidr": "203.0.113.7"}')
    assert status == 201 and answer["cidr"] == "203.0.113.7"
    # The same reader behind every endpoint that takes JSON.
    status, answer = call(admin, "POST", "/v1/upstreams/drain",
                          b'{"route": "/", "route": "/x", "upstream": "u"}')
    assert status == 422
    status, answer = call(admin, "PUT", "/v1/certificates/example.test",
                          b'{"cert": "\\ud800", "key": "k"}')
    assert status == 422
    # The validate endpoint's TOML: a number past what Python converts.
    status, answer = call(admin, "POST", "/v1/config/validate", b"a = " + b"9" * 100_000,
                          content_type="application/toml")
    assert status == 422
    assert answer["error"]["details"]["problems"] == [{
        "file": "<body>", "key": "",
        "message": "not valid TOML: an integer of more than 4300 digits"}]
    assert not any("Traceback" in line for line in server.lines), "\n".join(server.lines)
    assert rss_kib(server.admin_pid()) - before < 20_000


def test_a_note_with_a_lone_surrogate_or_a_key_twice_is_refused_and_not_written(
        start_server, tmp_path):
    (tmp_path / "notes").mkdir()
    server = start_server(CONFIG)
    port = server.port()
    for body in (b'{"title": "T", "body": "\\ud800"}',
                 b'{"title": "T", "title": "U", "body": "b"}'):
        status, answer = call(port, "PUT", "/api/v1/notes/probe", body, token=NOTES_TOKEN)
        assert status == 422 and answer["field"] == "body", answer
        assert "not valid JSON" in answer["error"]
    assert list((tmp_path / "notes").glob("*.md")) == []
    status, _answer = call(port, "PUT", "/api/v1/notes/probe",
                           b'{"title": "T", "body": "\\ud83d\\ude00"}', token=NOTES_TOKEN)
    assert status == 201                      # a surrogate pair is a character
    assert "\U0001F600" in (tmp_path / "notes" / "probe.md").read_text()
    assert not any("Traceback" in line for line in server.lines)
