"""Sign-in over plain HTTP with Secure cookies: the browser drops the form's cookie, and
the page must say so instead of "the form expired"."""

from __future__ import annotations

from conftest import HASH, Browser

SITE = """
[server]
workers = 1

[[listen]]
address = "127.0.0.1:0"

[auth]
store = "state.db"
cookie_secure = {secure}

[[auth.user]]
name = "demo"
password = "{hash}"

[[site]]
hosts = ["private.test"]
protected = true

[[site.route]]
prefix = "/"
type = "return"
body = "private\\n"
"""


def secure_cookie_dropped(port: int):
    """What a browser does on http://private.test/: the page's Secure cookie is not
    kept, so the form comes back without it."""
    browser = Browser(port, "private.test")
    token = browser.login_form()
    browser.jar.clear()
    return browser.sign_in(csrf=token)


def test_the_login_page_says_why_the_cookie_did_not_come_back(start_server):
    port = start_server(SITE.format(secure="true", hash=HASH)).port()
    resp, body = secure_cookie_dropped(port)
    assert resp.status == 403 and resp.getheader("content-type").startswith("text/html")
    assert b"Sign-in needs HTTPS here" in body and b"cookie_secure" in body
    assert b'<a href="https://private.test/__auth__/login">' in body   # the styled page


def test_without_secure_cookies_the_usual_refusal_stays(start_server):
    port = start_server(SITE.format(secure="false", hash=HASH)).port()
    resp, body = secure_cookie_dropped(port)
    assert resp.status == 403 and body == b"the form expired or came from another site; reload it\n"
