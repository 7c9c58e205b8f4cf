"""Passkeys and recovery codes against a real server: a software authenticator
(tests/softauthn.py) registers on the account page and signs in; the factors a session
was signed in with decide `policy = "two_factor"`. (Chromium's own authenticator:
test_passkeys_browser.py; replays and forgeries: attack/test_passkey_forgery.py.)"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
import urllib.request

import softauthn
from conftest import HTML, REPO, Browser, _env, admin_token, otp_code, settled_step
from softauthn import SoftAuthenticator

# A route that needs two factors, before the site's proxy route.
STRICT = """
[[site.route]]
path = "/strict"
type = "return"
body = "strict"
policy = "two_factor"
"""


def start(gate_start, **kw):
    server, up = gate_start(site_extra=STRICT, **kw)
    return server, up


def strict(browser) -> int:
    return browser.request("GET", "/strict")[0].status


def test_a_password_alone_is_one_factor_and_a_verified_passkey_two(gate):
    server, _up = start(gate)
    port = server.port()
    owner = Browser(port)
    assert owner.sign_in()[0].status == 303                   # demo: password only
    assert owner.request("GET", "/echo")[0].status == 200    # one_factor: in
    resp, page = owner.request("GET", "/strict", headers=HTML)
    assert resp.status == 403 and b"needs a second factor" in page
    assert b'href="/__auth__/account"' in page
    # The first passkey may be added with the password: the account had no second factor.
    key = SoftAuthenticator()
    assert softauthn.register(owner, key) == 303
    page = account(owner)[1]
    assert 'value="laptop"' in page and "with: password)" in page

    # The passkey alone, user verified: two factors.
    visitor = Browser(port)
    resp, _ = softauthn.sign_in(visitor, key)
    assert resp.status == 303 and resp.getheader("location") == "/"
    assert strict(visitor) == 200
    # The password with the passkey standing in for the code: two factors.
    other = Browser(port)
    resp, _ = softauthn.sign_in(other, key, user="demo", password="demo-password")
    assert resp.status == 303 and strict(other) == 200
    # ... but not with a wrong password, nor as another user.
    for user, password in (("demo", "nope"), ("otp", "demo-password")):
        resp, page = softauthn.sign_in(Browser(port), key, user=user, password=password)
        assert resp.status == 401 and b"Passkey refused" in page
    # A passkey that did not verify the user is one factor.
    careless = SoftAuthenticator(verifies_user=False)
    assert softauthn.register(visitor, careless) == 303       # (a two-factor session)
    third = Browser(port)
    assert softauthn.sign_in(third, careless)[0].status == 303
    assert strict(third) == 403 and third.request("GET", "/echo")[0].status == 200


def test_sessions_record_their_factors(gate, tmp_path):
    server, _up = start(gate)
    port = server.port()
    key = SoftAuthenticator()
    owner = Browser(port)
    owner.sign_in()
    softauthn.register(owner, key)
    softauthn.sign_in(Browser(port), key)
    step = settled_step()
    Browser(port).sign_in(user="otp", code=otp_code(step))
    with sqlite3.connect(tmp_path / "state.db") as db:
        factors = sorted(row[0] for row in db.execute("SELECT factors FROM sessions"))
    assert factors == ["passkey uv", "password", "password totp"]


def account(browser) -> tuple[str, str]:
    """(CSRF token, page) of the account page."""
    resp, page = browser.request("GET", "/__auth__/account")
    assert resp.status == 200
    return re.search(r'name="csrf" value="([0-9a-f]+)"', page.decode()).group(1), page.decode()


def test_account_page_renames_and_revokes(gate):
    server, _up = start(gate)
    port = server.port()
    owner = Browser(port)
    owner.sign_in()
    first, second = SoftAuthenticator(), SoftAuthenticator()
    assert softauthn.register(owner, first, "phone") == 303
    # Now the account has a second factor: a password-only session may not add another.
    assert softauthn.options(owner, "register", owner.form_token("/__auth__/account"))[0] == 403
    owner = Browser(port)
    softauthn.sign_in(owner, first)
    assert softauthn.register(owner, second, "key") == 303
    csrf, page = account(owner)
    ids = re.findall(r'name="revoke" value="([^"]+)"', page)
    assert len(ids) == 2
    resp, _ = owner.post_form("/__auth__/account", {"csrf": csrf, "action": "rename",
                                                    f"name:{ids[0]}": "old phone"})
    assert resp.status == 303
    csrf, page = account(owner)
    assert 'value="old phone"' in page
    resp, _ = owner.post_form("/__auth__/account", {"csrf": csrf, "revoke": ids[1]})
    assert resp.status == 303
    _csrf, page = account(owner)
    assert re.findall(r'name="revoke" value="([^"]+)"', page) == [ids[0]]
    resp, body = softauthn.sign_in(Browser(port), second)
    assert resp.status == 401 and b"not (or no longer) registered" in body
    # Signed out, the account page sends to the sign-in page and back.
    resp, _ = Browser(port).request("GET", "/__auth__/account")
    assert resp.status == 303 and resp.getheader("location") == \
        "/__auth__/login?next=/__auth__/account"


def recovery_codes(browser) -> list[str]:
    csrf = browser.form_token("/__auth__/account")
    resp, page = browser.post_form("/__auth__/account", {"csrf": csrf, "action": "recovery"})
    assert resp.status == 200 and resp.getheader("cache-control") == "no-store"
    return re.findall(r"<code>([a-z2-7-]+)</code>", page.decode())


def test_recovery_codes_stand_in_for_the_second_factor_once(gate, tmp_path):
    server, _up = start(gate)
    port = server.port()
    step = settled_step()
    owner = Browser(port)
    assert owner.sign_in(user="otp", code=otp_code(step))[0].status == 303
    codes = recovery_codes(owner)
    assert len(codes) == 10 and len(set(codes)) == 10
    assert all(re.fullmatch(r"[a-z2-7]{4}(-[a-z2-7]{4}){3}", c) for c in codes)
    with sqlite3.connect(tmp_path / "state.db") as db:     # hashed: no code in the store
        stored = [row[0] for row in db.execute("SELECT code_hash FROM recovery_codes")]
    assert len(stored) == 10 and not any(c.encode() in h for c in codes for h in stored)
    # A code in place of the TOTP code (typed loosely): two factors.
    typed = codes[0].upper().replace("-", " ")
    visitor = Browser(port)
    assert visitor.sign_in(user="otp", code=typed)[0].status == 303
    assert strict(visitor) == 200
    assert "Recovery codes left: <b>9</b>" in account(visitor)[1]
    # Good once.
    assert Browser(port).sign_in(user="otp", code=codes[0])[0].status == 401
    # New codes replace the old ones.
    fresh = recovery_codes(visitor)
    assert Browser(port).sign_in(user="otp", code=codes[1])[0].status == 401
    assert Browser(port).sign_in(user="otp", code=fresh[1])[0].status == 303


def test_options_need_the_forms_csrf_token_and_register_a_session(gate):
    server, _up = start(gate)
    port = server.port()
    stranger = Browser(port)
    stranger.login_form()
    assert softauthn.options(stranger, "signin", "0" * 64)[0] == 403
    # No session: no registration options.
    status, body = softauthn.options(stranger, "register", stranger.login_form())
    assert status == 403 and "sign in" in body["error"]
    # A sign-in's options: the challenge, this site as the relying party, UV preferred.
    status, opts = softauthn.options(stranger, "signin", stranger.login_form())
    assert status == 200 and opts["rpId"] == "private.test"
    assert opts["userVerification"] == "preferred" and len(opts["challenge"]) >= 43
    cookie = stranger.jar["nestgate_webauthn"]
    assert re.fullmatch(r"[0-9a-f]{32}", cookie)


def test_the_login_page_offers_a_passkey_and_serves_its_script(gate):
    server, _up = start(gate)
    b = Browser(server.port())
    resp, page = b.request("GET", "/__auth__/login", headers=HTML)
    assert b'id="passkey-signin"' in page and b'src="/__auth__/passkey.js"' in page
    assert "script-src 'self'" in resp.getheader("content-security-policy")
    resp, script = b.request("GET", "/__auth__/passkey.js")
    assert resp.status == 200 and b"navigator.credentials.get" in script
    assert resp.getheader("content-type").startswith("text/javascript")


def ctl(port: int, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nestgate", "ctl", "--address",
                           f"127.0.0.1:{port}", f"--token={admin_token(port)}", *args],
                          capture_output=True, text=True, env=_env(), cwd=REPO, timeout=30)


def test_admin_api_and_ctl_list_and_revoke_passkeys(gate):
    server, _up = start(gate)
    port, admin = server.port(), server.admin_port()
    owner = Browser(port)
    owner.sign_in()
    key = SoftAuthenticator()
    assert softauthn.register(owner, key, "phone") == 303
    request = urllib.request.Request(f"http://127.0.0.1:{admin}/v1/passkeys?user=demo",
                                     headers={"Authorization":
                                              f"Bearer {admin_token(admin)}"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        listed = json.loads(resp.read())["passkeys"]
    assert [(p["user"], p["name"], p["sign_count"]) for p in listed] == [("demo", "phone", 0)]
    assert set(listed[0]) == {"id", "user", "name", "sign_count", "created", "last_used"}
    assert softauthn.sign_in(Browser(port), key)[0].status == 303
    shown = ctl(admin, "passkeys")
    assert shown.returncode == 0 and listed[0]["id"] in shown.stdout and "phone" in shown.stdout
    assert json.loads(ctl(admin, "passkeys", "--user", "otp", "--json").stdout) == \
        {"passkeys": []}
    revoked = ctl(admin, "passkeys", "revoke", listed[0]["id"])
    assert revoked.returncode == 0, revoked.stderr
    assert ctl(admin, "passkeys", "revoke", listed[0]["id"]).returncode == 1    # 404
    resp, body = softauthn.sign_in(Browser(port), key)
    assert resp.status == 401 and b"no longer) registered" in body
