"""Passkeys in a real browser: headless Chromium with a virtual authenticator (DevTools
WebAuthn domain: CTAP2, resident keys, user verification) registers a passkey on the
account page, signs out, signs in with the passkey alone into a `two_factor` route,
revokes it, and is refused with it. http://localhost is a secure context, where
WebAuthn runs (Chromium refuses it on a page with a certificate error)."""

from __future__ import annotations

import json
import textwrap

import pytest

from conftest import PASSWORD_HASH

SITE = """
[server]
workers = 1

[[listen]]
address = "127.0.0.1:0"

[auth]
store = "{store}"
title = "Home"

[[auth.user]]
name = "demo"
password = "{hash}"

[[site]]
hosts = ["localhost"]
protected = true

[[site.route]]
path = "/strict"
type = "return"
body = "strict room"
policy = "two_factor"

[[site.route]]
path = "/"
type = "return"
body = "front room"
"""


@pytest.fixture(scope="module")
def chromium(tmp_path_factory):
    """One server and one browser with a virtual authenticator for the module."""
    from browser import Browser
    from conftest import Server, _env
    folder = tmp_path_factory.mktemp("passkeys")
    config = folder / "nestgate.toml"
    config.write_text(textwrap.dedent(SITE.format(store=folder / "state.db",
                                                  hash=PASSWORD_HASH)))
    server = Server(config, (), env=_env())
    base = f"http://localhost:{server.port()}"
    browser = Browser(base + "/__auth__/login")
    try:
        browser.command("WebAuthn.enable")
        found = browser.command("WebAuthn.addVirtualAuthenticator", options={
            "protocol": "ctap2", "transport": "internal", "hasResidentKey": True,
            "hasUserVerification": True, "isUserVerified": True,
            "automaticPresenceSimulation": True})
        yield browser, base, found["authenticatorId"]
    finally:
        browser.close()
        server.stop()


def go(browser, url: str) -> None:
    browser.command("Page.navigate", url=url)
    browser.wait_for(f"location.href === {json.dumps(url)} && document.readyState === "
                     "'complete'")


def text(browser) -> str:
    return browser.wait_for("document.body && document.body.innerText")


def click(browser, selector: str) -> None:
    browser.wait_for(f"(() => {{ const b = document.querySelector({json.dumps(selector)});"
                     " return b && !b.hidden && !b.disabled; })()")
    browser.evaluate(f"document.querySelector({json.dumps(selector)}).click()")


def listed(name: str) -> str:
    """An expression true once the account page the server sent lists a passkey named
    `name` (an input named "name:<its id>"). Not `input[value=...]`: the script posts the
    new passkey with hidden inputs added to the page it leaves, one of them value=`name`,
    so that page would pass before the server has the passkey, and the test's next
    navigation could cancel the registration."""
    return ("[...document.querySelectorAll('input[name^=\"name:\"]')]"
            f".some(input => input.value === {json.dumps(name)})")


def sign_out(browser, base: str) -> None:
    go(browser, base + "/__auth__/logout")
    click(browser, "button[type=submit]")
    browser.wait_for("location.pathname === '/__auth__/login'")


def test_register_sign_out_sign_in_with_the_passkey_revoke_refused(chromium):
    browser, base, authenticator = chromium
    # Signed in with the password: one factor, so the two_factor route refuses.
    go(browser, base + "/__auth__/login?next=/")
    browser.type_into("input[name=user]", "demo")
    browser.type_into("input[name=password]", "demo-password")
    click(browser, "button[type=submit]")
    browser.wait_for("document.body && document.body.innerText.includes('front room')")
    go(browser, base + "/strict")
    assert "needs a second factor" in text(browser)

    # Register on the account page.
    go(browser, base + "/__auth__/account")
    browser.type_into("#passkey-name", "laptop")
    click(browser, "#passkey-add")
    assert browser.wait_for(listed("laptop"))
    credentials = browser.command("WebAuthn.getCredentials",
                                  authenticatorId=authenticator)["credentials"]
    assert len(credentials) == 1 and credentials[0]["isResidentCredential"]
    assert credentials[0]["rpId"] == "localhost"

    # Sign out, then in with the passkey alone: two factors (the user was verified).
    sign_out(browser, base)
    go(browser, base + "/__auth__/login?next=/strict")
    click(browser, "#passkey-signin")
    assert browser.wait_for("document.body && document.body.innerText.includes('strict room')",
                            timeout=40), \
        text(browser)
    count = browser.command("WebAuthn.getCredentials",
                            authenticatorId=authenticator)["credentials"][0]["signCount"]
    assert count >= 1

    # Revoke it; the next passkey sign-in is refused.
    go(browser, base + "/__auth__/account")
    click(browser, "button[name=revoke]")
    browser.wait_for("document.body && document.body.innerText.includes('none yet')")
    sign_out(browser, base)
    go(browser, base + "/__auth__/login?next=/strict")
    click(browser, "#passkey-signin")
    assert browser.wait_for("document.body && document.body.innerText.includes('Passkey refused')")
    assert "no longer) registered" in text(browser)
    go(browser, base + "/strict")
    assert "strict room" not in text(browser)
