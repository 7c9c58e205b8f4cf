"""Error pages: styled and explained, JSON for clients that ask for it, the refused
address on a 403, a site's own pages by status, over HTTP/1.1 and HTTP/2."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys

from conftest import listeners, refused_port
from h2client import H2Client

SITES = """
[[site]]
name = "private"
hosts = ["private.test"]
allow = ["10.0.0.0/8"]

[[site.route]]
prefix = "/"
type = "return"
body = "secret"

[[site]]
name = "app"
hosts = ["app.test"]
error_pages = {{ 502 = "{down}", 404 = "{missing}", 403 = "{refused}" }}

[[site.route]]
prefix = "/api/"
type = "proxy"
upstream = "http://127.0.0.1:{dead}"

[[site.route]]
path = "/closed"
type = "return"
body = "closed"
allow = ["10.0.0.0/8"]

[[site]]
name = "plain"
hosts = ["*"]

[[site.route]]
prefix = "/api/"
type = "proxy"
upstream = "http://127.0.0.1:{dead}"
"""


def serve(start_server, tmp_path, certs):
    pages = {}
    for name, text in (("down", "<h1>our app is restarting</h1>"), ("missing", "<h1>lost?</h1>"),
                       ("refused", "<h1>members only</h1>")):
        pages[name] = tmp_path / f"{name}.html"
        pages[name].write_text(text)
    return start_server(listeners(certs) + SITES.format(dead=refused_port(), **pages))


def get(port, path, host, accept=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {"Host": host}
    if accept:
        headers["Accept"] = accept
    conn.request("GET", path, headers=headers)
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, body


BROWSER = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"


def test_built_in_pages_are_styled_explained_and_json_on_request(start_server, tmp_path,
                                                                  certs):
    port = serve(start_server, tmp_path, certs).port()
    for path, status, words in (("/nowhere", 404, b"There is nothing at this address."),
                                ("/api/x", 502, b"The service behind this site is not answering.")):
        got, headers, body = get(port, path, "plain.test", BROWSER)
        assert got == status and headers["content-type"] == "text/html; charset=utf-8"
        assert words in body and b"<style>" in body and b"#2f6f4f" in body
        assert b"0.1" not in body and headers["server"] == "nestgate"   # no version
        got, headers, body = get(port, path, "plain.test", "application/json")
        assert got == status and headers["content-type"] == "application/json"
        assert json.loads(body) == {"status": status, "error": http.client.responses[status],
                                    "detail": words.decode()}


def test_a_refused_visitor_is_shown_its_address(start_server, tmp_path, certs):
    server = serve(start_server, tmp_path, certs)
    status, _, body = get(server.port(), "/", "private.test", BROWSER)
    assert status == 403 and b"This address is not allowed here." in body
    assert b"<code>127.0.0.1</code>" in body and b"secret" not in body
    status, headers, body = get(server.port(), "/", "private.test", "application/json")
    assert (status, json.loads(body)["client"]) == (403, "127.0.0.1")
    client = H2Client(server.port("https"), certs["ca"], server_hostname="localhost")
    try:
        status, headers, body = client.request("GET", "/", authority=b"private.test",
                                               headers=[(b"accept", b"application/json")])
        assert (status, json.loads(body)["status"]) == (403, 403)
        status, headers, body = client.request("GET", "/", authority=b"private.test")
        assert status == 403 and b"<code>127.0.0.1</code>" in body
    finally:
        client.close()


def test_a_site_replaces_pages_by_status(start_server, tmp_path, certs):
    server = serve(start_server, tmp_path, certs)
    port = server.port()
    for path, status, text in (("/api/x", 502, b"our app is restarting"),
                               ("/nowhere", 404, b"lost?"), ("/closed", 403, b"members only")):
        got, headers, body = get(port, path, "app.test", BROWSER)
        assert (got, body) == (status, b"<h1>" + text + b"</h1>"), path
        got, headers, body = get(port, path, "app.test", "application/json")
        assert got == status and json.loads(body)["status"] == status   # JSON stays ours
    client = H2Client(server.port("https"), certs["ca"])
    try:
        status, _, body = client.request("GET", "/api/x", authority=b"app.test")
        assert (status, body) == (502, b"<h1>our app is restarting</h1>")
    finally:
        client.close()
    got, _, body = get(port, "/api/x", "plain.test", BROWSER)            # other sites keep theirs
    assert got == 502 and b"not answering" in body


def test_check_names_a_bad_error_page(tmp_path):
    config = tmp_path / "nestgate.toml"
    config.write_text('[[listen]]\naddress = "127.0.0.1:0"\n[[site]]\nhosts = ["*"]\n'
                      'error_pages = { 200 = "ok.html", 502 = "gone.html" }\n')
    result = subprocess.run([sys.executable, "-m", "nestgate", "check", "--config", str(config)],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert "site[*].error_pages.200: expected an error status, 400 to 599" in result.stderr
    assert "site[*].error_pages.502: expected a path to a readable file, got 'gone.html'" \
        in result.stderr


def test_server_tokens_shows_the_version_only_when_asked(start_server):
    from nestgate import __version__
    body = '[[site]]\nhosts = ["*"]\n[[site.route]]\npath = "/"\ntype = "return"\nbody = "x"\n'
    head = '[server]\nworkers = 1\n{tokens}\n[[listen]]\naddress = "127.0.0.1:0"\n'
    hidden = start_server(head.format(tokens="") + body)
    status, headers, page = get(hidden.port(), "/nowhere", "a.test", BROWSER)
    assert headers["server"] == "nestgate" and __version__.encode() not in page
    shown = start_server(head.format(tokens="server_tokens = true") + body)
    for path, status in (("/", 200), ("/nowhere", 404)):
        got, headers, page = get(shown.port(), path, "a.test", BROWSER)
        assert (got, headers["server"]) == (status, f"nestgate/{__version__}")
    assert f"nestgate/{__version__}".encode() in page
    conn = http.client.HTTPConnection("127.0.0.1", shown.port(), timeout=10)
    conn.request("GET", "/", headers={"Host": "bad host"})              # before routing
    resp = conn.getresponse()
    assert (resp.status, resp.getheader("server")) == (400, f"nestgate/{__version__}")
