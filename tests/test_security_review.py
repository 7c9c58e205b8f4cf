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
    from nestgate.handlers.notes.store import SLUG
    assert not SLUG.match("abc\n")
    server, folder = notes_server
    port = server.port()
    assert _call(port, "PUT", "/api/v1/notes/abc%0A", {"title": "t", "body": "b"})[0] == 422
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


def test_deeply_nested_json_is_422_not_500(notes_server):
    import http.client
    server, _ = notes_server
    conn = http.client.HTTPConnection("127.0.0.1", server.port(), timeout=10)
    conn.request("POST", "/api/v1/notes", body=b"[" * 50_000,
                 headers={"Authorization": "Bearer tok", "Content-Type": "application/json"})
    resp = conn.getresponse()
    resp.read()
    assert resp.status == 422
    assert all("Traceback" not in line for line in server.lines)


# ------------------------------------------------------------ sign-in


def test_login_back_off_holds_under_concurrent_guesses(start_server, tmp_path):
    """Failures were counted after the (slow) password check: guesses sent together all
    passed the back-off check before any of them was recorded."""
    import socket
    import threading
    from urllib.parse import urlencode
    from conftest import HTML, PASSWORD_HASH, Browser
    server = start_server(f"""
[server]
workers = 1

[[listen]]
address = "127.0.0.1:0"

[auth]
store = "{tmp_path / 'state.db'}"
max_failures = 3
failure_window = "60s"

[[auth.user]]
name = "demo"
password = "{PASSWORD_HASH}"

[[site]]
hosts = ["private.test"]
protected = true

[[site.route]]
path = "/hello"
type = "return"
body = "hello"
""")
    port = server.port()
    b = Browser(port)
    csrf = b.login_form()
    body = urlencode({"user": "demo", "password": "nope", "csrf": csrf, "next": "/"}).encode()
    cookie = "; ".join(f"{k}={v}" for k, v in b.jar.items())
    request = (b"POST /__auth__/login HTTP/1.1\r\nHost: private.test\r\nConnection: close\r\n"
               b"Content-Type: application/x-www-form-urlencoded\r\nCookie: %s\r\n"
               b"Content-Length: %d\r\n\r\n%s" % (cookie.encode(), len(body), body))
    socks = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(20)]
    statuses = []

    def guess(sock):
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
        statuses.append(int(data[9:12]))
        sock.close()
    threads = [threading.Thread(target=guess, args=(s,)) for s in socks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert statuses.count(401) <= 3, statuses
    assert statuses.count(429) == 20 - statuses.count(401), statuses
    assert b.request("GET", "/__auth__/login", headers=HTML)[0].status == 200


def test_totp_code_with_unicode_digits_is_wrong_not_an_error():
    from nestgate.handlers.auth import totp
    secret = totp.new_secret()
    assert totp.verify(secret, "\u00b2" * 6) is False
    assert totp.verify(secret, "\u0661" * 6) is False        # Arabic-Indic one


def test_next_outside_latin_1_is_not_a_server_error():
    from nestgate.handlers.auth.portal import safe_next
    assert safe_next("/\u0101") == "/"
    assert safe_next("/caf%C3%A9?q=1") == "/caf%C3%A9?q=1"


# ------------------------------------------------------------ client addresses


def test_link_local_peer_with_a_zone_is_matched_by_deny_lists():
    """The kernel names a link-local IPv6 peer with its zone ("fe80::1%eth0"); such an
    address matched no list, so a deny entry for it was skipped."""
    from nestgate.pipeline.access import DENY, AccessConfig, NoDynamic, Policy
    from nestgate.base.clientip import Networks
    assert "fe80::1%eth0" in Networks(["fe80::/10"])
    policy = Policy(AccessConfig(deny=("fe80::/10",)))
    assert policy.verdict("fe80::1%eth0", NoDynamic()) == DENY


# ------------------------------------------------------------ the access log


def test_combined_log_lines_cannot_be_forged(tmp_path):
    """The decoded path keeps %0A as a newline: the combined format wrote it as is."""
    from wire import Wire, config_dict
    log = tmp_path / "access.log"
    wire = Wire(config_dict(log={"path": str(log), "format": "combined"}),
                peer=("203.0.113.8", 5000))
    wire.send(b'GET /x%0A6.6.6.6%20-%20-%20%22%1b[31m%7f HTTP/1.1\r\nHost: ab\r\n'
              b'User-Agent: ua\\"\r\nReferer: r\\\r\n\r\n')
    wire.worker.access_log.flush()
    text = log.read_text()
    assert wire.responses()[0].status == 404
    assert text.count("\n") == 1 and text.endswith("\n")
    assert "\x1b" not in text and "\x7f" not in text
    fields = text.split('"')
    assert fields[1].startswith("GET /x") and fields[1].endswith(" HTTP/1.1")
    assert len(fields) == 11, text        # request, referer, UA, host, route: 5 quoted
    wire.close()


def test_secrets_in_query_strings_are_not_logged(tmp_path):
    import json
    from wire import Wire, config_dict
    log = tmp_path / "access.log"
    wire = Wire(config_dict(log={"path": str(log)}), peer=("203.0.113.8", 5000))
    wire.send(b"GET /hello?token=s3cret HTTP/1.1\r\nHost: a\r\n"
              b"Proxy-Authorization: Basic c2VjcmV0\r\n\r\n")
    wire.worker.access_log.flush()
    text = log.read_text()
    assert json.loads(text)["path"] == "/hello"
    assert "s3cret" not in text and "c2VjcmV0" not in text
    wire.close()


def test_login_with_too_many_fields_is_not_a_server_error(start_server, tmp_path):
    """parse_qs(max_num_fields=...) raises ValueError past the limit: a 500 for anyone."""
    import http.client
    from conftest import HTML, PASSWORD_HASH
    server = start_server(f"""
[server]
workers = 1

[[listen]]
address = "127.0.0.1:0"

[auth]
store = "{tmp_path / 'state.db'}"

[[auth.user]]
name = "demo"
password = "{PASSWORD_HASH}"

[[site]]
hosts = ["*"]
protected = true
""")
    many = "&".join(f"f{i}=1" for i in range(40))
    conn = http.client.HTTPConnection("127.0.0.1", server.port(), timeout=10)
    conn.request("GET", "/__auth__/login?" + many, headers=HTML)
    resp = conn.getresponse()
    resp.read()
    assert resp.status == 200
    conn.request("POST", "/__auth__/login", body=many.encode(),
                 headers={"Content-Type": "application/x-www-form-urlencoded"})
    resp = conn.getresponse()
    resp.read()
    # Past 20 fields the form is not read at all, so it has no CSRF token: refused as such.
    assert resp.status == 403
    assert all("Traceback" not in line for line in server.lines)


def test_config_error_for_a_bad_totp_secret_does_not_print_it():
    """A mistyped secret (1 and 8 are not base32) is still nearly the whole secret."""
    from nestgate.config import ConfigError, parse_config
    from conftest import PASSWORD_HASH
    secret = "JBSWY3DPEHPK3PX1"
    with pytest.raises(ConfigError) as info:
        parse_config({"listen": [{"address": "127.0.0.1:0"}],
                      "auth": {"user": [{"name": "x", "password": PASSWORD_HASH,
                                         "totp": secret}]},
                      "site": [{"hosts": ["*"], "protected": True}]})
    problems = "\n".join(info.value.problems)
    assert "totp" in problems and secret not in problems
