"""Sign in with an OpenID provider, end to end: Debian's glewlwyd as the provider,
headless Chromium through the redirects (its own login page included), and a small
test-side client for the refusals a browser cannot be made to produce (a wrong state,
a replayed code); the ID token checks run against tokens glewlwyd really issued."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import subprocess
import sys
import time
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

import httpx
import pytest

from browser import Browser as Chromium
from conftest import HASH, HTML, Browser, Server, Upstream, _env, admin_headers, admin_token
from glewlwyd import Glewlwyd
from nestgate.handlers.auth.oidc.client import Http, Provider, Refused, identity
from nestgate.handlers.auth.config import AuthConfig, User
from nestgate.handlers.auth.portal import SignIn
from nestgate.handlers.auth.providers import OidcProvider

SECRET = "nestgate-client-secret"
OTHER_CALLBACK = "http://other.localhost/cb"
PASSWORDS = {"ann": "ann-password-1", "eve": "eve-password-1", "carol": "carol-password-1"}

CONFIG = """
[server]
workers = 1

[[listen]]
address = "127.0.0.1:0"

[auth]
store = "{store}"
cookie_secure = false

[[auth.user]]
name = "carol"
password = "{hash}"
groups = ["family", "admins"]
display_name = "Carol at home"

[[auth.oidc]]
name = "glew"
display_name = "Glewlwyd"
issuer = "{issuer}"
client_id = "nestgate"
client_secret_file = "{secret_file}"
scopes = ["openid"]
allowed_groups = ["family", "friends"]
allowed_users = ["carol"]

[[site]]
hosts = ["app.localhost"]
protected = true
allow_groups = ["family"]

[[site.route]]
prefix = "/admin/"
type = "proxy"
upstream = "{up}"
policy = "two_factor"

[[site.route]]
prefix = "/"
type = "proxy"
upstream = "{up}"
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """glewlwyd with ann (family), eve (strangers) and carol (a configured nestgate
    user); nestgate in front of an echoing upstream, signing in through glewlwyd."""
    folder = tmp_path_factory.mktemp("oidc")
    provider = Glewlwyd(folder / "glewlwyd")
    upstream = Upstream("up", None)
    server = None
    try:
        provider.add_user("ann", PASSWORDS["ann"], ["family"])
        provider.add_user("eve", PASSWORDS["eve"], ["strangers"])
        provider.add_user("carol", PASSWORDS["carol"])
        (folder / "secret").write_text(SECRET + "\n")
        (folder / "nestgate.toml").write_text(CONFIG.format(
            store=folder / "state.db", hash=HASH, issuer=provider.issuer,
            secret_file=folder / "secret", up=upstream.url))
        server = Server(folder / "nestgate.toml", env=_env())
        site = f"http://app.localhost:{server.port()}"
        provider.add_client("nestgate", SECRET, [f"{site}/__auth__/oidc/glew/callback"],
                            [f"{site}/__auth__/login"])
        provider.add_client("other", "other-secret", [OTHER_CALLBACK])
        provider.plugin("short", 4)             # ID tokens good for four seconds
        yield provider, server, site
    finally:
        if server is not None:
            server.stop()
        upstream.stop()
        provider.stop()


def provider_session(provider: Glewlwyd, user: str, client: str = "nestgate") -> httpx.Client:
    """A client signed in to glewlwyd as `user`, who has granted `client` its scopes
    (as the consent page would)."""
    session = httpx.Client(base_url=provider.url, timeout=10)
    assert session.post("/api/auth/", json={"username": user,
                                            "password": PASSWORDS[user]}).status_code == 200
    assert session.put(f"/api/auth/grant/{client}", json={"scope": "openid"}).status_code == 200
    return session


def to_provider(visitor: Browser, next_url: str = "/echo") -> str:
    """The visitor presses "Sign in with Glewlwyd": where nestgate sends it."""
    resp, _ = visitor.request("GET", "/__auth__/oidc/glew?" + urlencode({"next": next_url}))
    assert resp.status == 303
    assert "nestgate_oidc" in visitor.jar
    return resp.getheader("location")


def provider_answer(session: httpx.Client, authorize: str) -> str:
    """glewlwyd's redirect back for a signed-in user (`g_continue`: past its own login
    page, which the browser test goes through): the callback path and query."""
    answer = session.get(authorize + "&g_continue")
    assert answer.status_code == 302, answer.text
    back = urlsplit(answer.headers["location"])
    return f"{back.path}?{back.query}"


def visitor(server: Server) -> Browser:
    return Browser(server.port(), f"app.localhost:{server.port()}")


def fill(chromium: Chromium, selector: str, text: str) -> None:
    """Type into the input once the page shows it (glewlwyd's pages render late)."""
    assert chromium.wait_for(
        f"(() => {{ const input = document.querySelector({json.dumps(selector)});"
        " if (!(input instanceof HTMLInputElement)) return false;"
        " Object.getOwnPropertyDescriptor(HTMLInputElement.prototype, 'value')"
        f".set.call(input, {json.dumps(text)});"
        " input.dispatchEvent(new Event('input', {bubbles: true})); return true; })()")


def seen(body: bytes) -> dict[str, str]:
    return {k.lower(): v for k, v in json.loads(body)["headers"]}


# ---------------------------------------------------------------- the config


def test_a_bad_provider_entry_is_named_with_its_file_and_key(tmp_path):
    from nestgate.config import ConfigError, read_config
    (tmp_path / "empty.secret").write_text("\n")
    path = tmp_path / "nestgate.toml"
    path.write_text(f"""
[[listen]]
address = "127.0.0.1:0"

[auth]
store = "{tmp_path / 'state.db'}"

[[auth.oidc]]
name = "Pocket ID"
issuer = "http://id.example.com"
scopes = ["profile"]
client_secret = "s"
client_secret_file = "{tmp_path / 'empty.secret'}"
clinet_id = "typo"

[[auth.oidc]]
name = "ok"
issuer = "https://id.example.com/"
client_id = "nestgate"
client_secret_file = "{tmp_path / 'empty.secret'}"

[[auth.oidc]]
name = "ok"
issuer = "https://other.example.com"
client_id = "nestgate"
""")
    with pytest.raises(ConfigError) as info:
        read_config(path)
    problems = "\n".join(info.value.problems)
    for expected in ("auth.oidc[0].name: expected a short name", "auth.oidc[0].issuer: "
                     "expected an https:// URL (http:// only to localhost",
                     "auth.oidc[0].client_id: expected the client id",
                     "auth.oidc[0].client_secret_file: expected either client_secret or",
                     "auth.oidc[0].scopes: expected a list holding \"openid\"",
                     "auth.oidc[0].clinet_id: unknown key",
                     "auth.oidc[1].client_secret_file: expected a file holding the client "
                     "secret (it is empty)", "auth.oidc: expected each provider name once"):
        assert f"{path}: {expected}" in problems, problems
    assert problems.count("\n") == 7, problems


# ---------------------------------------------------------------- a real browser


def test_a_browser_signs_in_through_the_provider_and_out_of_both(world):
    provider, server, site = world
    chromium = Chromium(f"{site}/echo?from=browser")
    try:
        # The sign-in page offers the provider; the visitor takes it.
        assert chromium.wait_for("document.querySelector('a.sso') !== null")
        assert chromium.evaluate("document.querySelector('a.sso').textContent") \
            == "Sign in with Glewlwyd"
        chromium.evaluate("document.querySelector('a.sso').click()")
        # glewlwyd's own login page.
        assert chromium.wait_for("location.href.includes('/login.html') && "
                          "document.querySelector('input[name=username]') !== null")
        fill(chromium, "input[name=username]", "ann")
        fill(chromium, "input[name=password]", PASSWORDS["ann"])
        assert chromium.wait_for("(() => { const b = document.querySelector('button[type=submit]');"
                          " return b ? (b.click(), true) : false; })()")
        # Its consent: grant nestgate the openid scope, then back through nestgate.
        landed = chromium.wait_for(
            "location.href.startsWith(" + json.dumps(site) + ") ? location.href : "
            "(document.querySelector('#grantButton, button.btn-success') && "
            "(document.querySelector('#grantButton, button.btn-success').click(), false))",
            timeout=30)
        assert landed == f"{site}/echo?from=browser", landed
        headers = json.loads(chromium.evaluate("document.body.innerText"))["headers"]
        told = {k.lower(): v for k, v in headers}
        assert told["remote-user"] == "ann" and told["remote-groups"] == "family"
        assert told["remote-email"] == "ann@example.test"
        # Signing out here ends the provider's session too.
        chromium.evaluate("location.href = '/__auth__/logout'")
        assert chromium.wait_for("document.querySelector('form button') !== null")
        chromium.evaluate("document.querySelector('form button').click()")
        # Sign-out went on to glewlwyd's end-session page (RP-initiated logout), which
        # asks whether to end its session too and names where it goes back to after.
        assert chromium.wait_for(
            "location.href.startsWith(" + json.dumps(provider.url) + ") && "
            "location.href.includes('prompt=end_session') && "
            "(document.body?.innerText || '').includes('Logout')", timeout=30)
        assert f"callback_url={quote(site + '/__auth__/login', safe='')}" \
            in chromium.evaluate("location.href")
        # nestgate's session is over: the page asks to sign in again.
        chromium.evaluate(f"location.href = {json.dumps(site + '/echo')}")
        assert chromium.wait_for("document.querySelector('a.sso') !== null")
    finally:
        chromium.close()


def test_the_admin_api_lists_the_providers_without_their_secrets(world):
    provider, server, _site = world
    port = server.admin_port()
    answer = httpx.get(f"http://127.0.0.1:{port}/v1/providers",
                       headers=admin_headers(port), timeout=10)
    assert answer.status_code == 200
    [listed] = answer.json()["providers"]
    assert listed["name"] == "glew" and listed["issuer"] == provider.issuer
    assert listed["client_id"] == "nestgate" and listed["confidential"] is True
    assert listed["allowed_groups"] == ["family", "friends"]
    assert SECRET not in answer.text


# ---------------------------------------------------------------- the refusals


def test_a_wrong_state_is_refused_and_spends_no_code(world):
    provider, server, _site = world
    guest = visitor(server)
    back = provider_answer(provider_session(provider, "ann"), to_provider(guest))
    path, query = back.split("?", 1)
    fields = dict(parse_qsl(query))
    forged = path + "?" + urlencode({**fields, "state": fields["state"][:-2] + "xx"})
    resp, page = guest.request("GET", forged, headers=HTML)
    assert resp.status == 400 and b"not started in this browser" in page
    assert "nestgate_session" not in guest.jar
    # A state from another browser (the attacker's own sign-in) is as wrong.
    stranger = visitor(server)
    assert stranger.request("GET", back, headers=HTML)[0].status == 400
    assert "nestgate_session" not in stranger.jar
    # The provider was never asked: the code still works, once, for its own flow.
    resp, _ = guest.request("GET", back)
    assert resp.status == 303 and resp.getheader("location") == "/echo"
    resp, body = guest.request("GET", "/echo")
    assert resp.status == 200 and seen(body)["remote-user"] == "ann"


def test_a_replayed_code_is_refused_by_the_provider(world):
    provider, server, _site = world
    guest = visitor(server)
    back = provider_answer(provider_session(provider, "ann"), to_provider(guest))
    flow = guest.jar["nestgate_oidc"]
    assert guest.request("GET", back)[0].status == 303
    # The same callback again, flow cookie and all (what someone who copied both
    # would send): glewlwyd has spent the code, so nothing signs in.
    thief = visitor(server)
    thief.jar["nestgate_oidc"] = flow
    resp, page = thief.request("GET", back, headers=HTML)
    assert resp.status == 403 and b"did not confirm" in page
    assert "nestgate_session" not in thief.jar


def test_a_user_outside_the_allowed_groups_gets_no_session(world):
    provider, server, _site = world
    guest = visitor(server)
    back = provider_answer(provider_session(provider, "eve"), to_provider(guest))
    resp, page = guest.request("GET", back, headers=HTML)
    assert resp.status == 403 and b"eve may not sign in here" in page
    assert "nestgate_session" not in guest.jar
    assert guest.request("GET", "/echo")[0].status == 401


def test_a_configured_user_signs_in_as_configured_with_one_factor(world):
    provider, server, _site = world
    guest = visitor(server)
    back = provider_answer(provider_session(provider, "carol"), to_provider(guest))
    assert guest.request("GET", back)[0].status == 303
    told = seen(guest.request("GET", "/echo")[1])
    # carol's groups and name are nestgate's (the provider gave her none).
    assert told["remote-user"] == "carol" and told["remote-groups"] == "family,admins"
    assert told["remote-name"] == "Carol at home"


def test_a_sign_in_through_the_provider_is_one_factor_and_two_factor_refuses_it(world):
    provider, server, _site = world
    for name in ("carol", "ann"):              # configured, and known by her group only
        guest = visitor(server)
        back = provider_answer(provider_session(provider, name), to_provider(guest))
        assert guest.request("GET", back)[0].status == 303
        assert guest.request("GET", "/echo")[0].status == 200
        resp, page = guest.request("GET", "/admin/", headers=HTML)
        assert resp.status == 403 and b"needs a second factor" in page, (name, page)
        resp, body = guest.request("GET", "/admin/")
        assert resp.status == 403
        assert json.loads(body)["reason"] == "no_second_factor"
    # The store lists each session with the provider it came through as its one factor.
    port = server.admin_port()
    listed = httpx.get(f"http://127.0.0.1:{port}/v1/sessions",
                       headers=admin_headers(port), timeout=10).json()["sessions"]
    factors = {tuple(s["factors"]) for s in listed if s["user"] in ("carol", "ann")}
    assert factors == {("oidc:glew",)}


def test_a_provider_account_made_anew_under_a_user_s_name_is_not_that_user(world):
    """carol's first sign-in binds nestgate's carol to her glewlwyd account (its `sub`).
    An account made anew at glewlwyd with her name (hers deleted, the name taken
    again) is refused, with a log line naming her and the provider, until the owner
    unbinds her (`nestgate ctl unbind`); then the new account binds."""
    provider, server, _site = world
    first = visitor(server)
    back = provider_answer(provider_session(provider, "carol"), to_provider(first))
    assert first.request("GET", back)[0].status == 303
    provider._call("DELETE", "/user/carol")
    provider.add_user("carol", PASSWORDS["carol"])
    taken = visitor(server)
    start = len(server.lines)
    back = provider_answer(provider_session(provider, "carol"), to_provider(taken))
    resp, page = taken.request("GET", back, headers=HTML)
    assert resp.status == 403 and b"is not the one that signs in as carol" in page, page
    assert "nestgate_session" not in taken.jar
    line = server.wait_for("carol is bound to another subject", start=start)
    assert "glew" in line and provider.issuer in line
    # The owner says the account is hers now: the next sign-in binds it.
    port = server.admin_port()
    unbind = subprocess.run(
        [sys.executable, "-m", "nestgate", "ctl", "--address", f"127.0.0.1:{port}",
         "--token", admin_token(port), "unbind", "--user", "carol"],
        capture_output=True, text=True, env=_env(), timeout=30)
    assert unbind.returncode == 0 and unbind.stdout == "unbound 1\n", unbind
    again = visitor(server)
    back = provider_answer(provider_session(provider, "carol"), to_provider(again))
    assert again.request("GET", back)[0].status == 303
    assert seen(again.request("GET", "/echo")[1])["remote-user"] == "carol"
    answer = httpx.delete(f"http://127.0.0.1:{port}/v1/users/nobody/providers",
                          headers=admin_headers(port), timeout=10)
    assert answer.status_code == 200 and answer.json() == {"unbound": 0}


def test_an_email_the_provider_has_not_verified_names_nobody(world):
    """With `user_claim = "email"`, glewlwyd's real claims (an address, and no
    email_verified) sign in as nobody, not even a configured user of that name."""
    provider, server, _site = world
    claims = check(provider.issuer, nestgate_token(provider, server, "n-7"), "n-7")
    assert claims["email"] == "ann@example.test" and "email_verified" not in claims
    by_email = OidcProvider("glew", provider.issuer, "nestgate", SECRET, user_claim="email")
    ann = User("ann@example.test", "", groups=("family",))
    for unverified in (claims, {**claims, "email_verified": False},
                       {**claims, "email_verified": "true"}):
        with pytest.raises(Refused, match="email_verified is not true") as info:
            identity(by_email, unverified, [ann], frozenset())
        assert info.value.status == 403 and "has not verified" in info.value.message
    assert identity(by_email, {**claims, "email_verified": True}, [ann], frozenset()) is ann
    # A claim other than the address is not held to it.
    assert identity(OidcProvider("glew", provider.issuer, "nestgate", SECRET), claims,
                    [User("ann", "")], frozenset()).name == "ann"


def test_forward_auth_answers_a_provider_s_user_as_the_gate_does(world):
    """Another proxy asking /api/authz/forward-auth about a session from the provider
    (of a user the config does not name) gets the gate's answers: yes with her
    identity where one factor will do, the two_factor refusal where it will not."""
    provider, server, _site = world
    guest = visitor(server)
    back = provider_answer(provider_session(provider, "ann"), to_provider(guest))
    assert guest.request("GET", back)[0].status == 303
    host = f"app.localhost:{server.port()}"
    resp, _ = guest.request("GET", "/api/authz/forward-auth",
                            headers={"X-Forwarded-Host": host, "X-Forwarded-Uri": "/echo"})
    assert resp.status == 200
    assert resp.getheader("remote-user") == "ann"
    assert resp.getheader("remote-groups") == "family"
    resp, body = guest.request("GET", "/api/authz/forward-auth",
                               headers={"X-Forwarded-Host": host, "X-Forwarded-Uri": "/admin/"})
    assert resp.status == 403 and json.loads(body)["reason"] == "no_second_factor"


def test_the_sign_in_pages_may_redirect_to_providers_and_to_clients():
    """The form-action names the providers' origins (sign-out goes on to theirs) and
    the OpenID clients' (nestgate's own provider sends the browser back to them), both
    at once whichever is added last."""
    provider = OidcProvider(name="p", issuer="https://id.example.test:8443/realm",
                            client_id="c")
    signin = SignIn(AuthConfig(providers=(provider,)), None)
    signin.allow_form_redirects(["https://grafana.example.test"])
    [csp] = [v for n, v in signin.page_headers if n == b"content-security-policy"]
    assert b"form-action 'self' https://grafana.example.test https://id.example.test:8443;" \
        in csp


def test_a_new_signing_key_at_the_provider_is_fetched_on_its_first_token(world):
    provider, server, _site = world
    first = visitor(server)
    back = provider_answer(provider_session(provider, "ann"), to_provider(first))
    assert first.request("GET", back)[0].status == 303       # the keys are cached now
    provider.plugin("oidc", 300, method="PUT")              # glewlwyd signs with a new key
    again = visitor(server)
    back = provider_answer(provider_session(provider, "ann"), to_provider(again))
    assert again.request("GET", back)[0].status == 303, server.lines[-3:]
    assert seen(again.request("GET", "/echo")[1])["remote-user"] == "ann"


# ---------------------------------------------------------------- the ID token


def issued_id_token(provider: Glewlwyd, client: str, secret: str, redirect_uri: str,
                    nonce: str, plugin: str = "oidc") -> str:
    """An ID token glewlwyd issues `client` after ann signs in (a code flow)."""
    from authlib.oauth2.rfc6749.parameters import prepare_grant_uri
    from authlib.oauth2.rfc7636 import create_s256_code_challenge
    verifier = "v" * 64
    authorize = prepare_grant_uri(
        f"{provider.url}/api/{plugin}/auth", client, "code", redirect_uri=redirect_uri,
        scope="openid", state="s", nonce=nonce,
        code_challenge=create_s256_code_challenge(verifier), code_challenge_method="S256")
    back = provider_answer(provider_session(provider, "ann", client), authorize)
    code = dict(parse_qsl(back.split("?", 1)[1]))["code"]
    answer = httpx.post(f"{provider.url}/api/{plugin}/token", auth=(client, secret), data={
        "grant_type": "authorization_code", "client_id": client, "code": code,
        "redirect_uri": redirect_uri, "code_verifier": verifier})
    assert answer.status_code == 200, answer.text
    return answer.json()["id_token"]


def token_part(token: str, index: int) -> dict:
    """The header (0) or claims (1) of a compact JWT."""
    part = token.split(".")[index]
    return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))


def check(issuer: str, id_token: str, nonce: str, leeway: float = 60.0) -> dict:
    """nestgate's check of an ID token, as the callback makes it for client nestgate."""
    async def run():
        http = Http()
        try:
            cfg = OidcProvider("glew", issuer, "nestgate", SECRET, clock_leeway=leeway)
            return await Provider(cfg, http).id_claims(id_token, nonce)
        finally:
            await http.close()
    return asyncio.run(run())


def nestgate_token(provider: Glewlwyd, server: Server, nonce: str, plugin: str = "oidc"):
    redirect = f"http://app.localhost:{server.port()}/__auth__/oidc/glew/callback"
    return issued_id_token(provider, "nestgate", SECRET, redirect, nonce, plugin)


def test_an_id_token_for_another_audience_is_refused(world):
    provider, server, _site = world
    assert check(provider.issuer, nestgate_token(provider, server, "n-1"), "n-1")["sub"]
    other = issued_id_token(provider, "other", "other-secret", OTHER_CALLBACK, "n-2")
    with pytest.raises(Refused, match="aud"):
        check(provider.issuer, other, "n-2")


def test_an_id_token_for_another_flow_is_refused(world):
    provider, server, _site = world
    with pytest.raises(Refused, match="nonce"):
        check(provider.issuer, nestgate_token(provider, server, "n-3"), "n-4")


def test_an_expired_id_token_is_refused(world):
    provider, server, _site = world
    short = f"{provider.url}/api/short"
    token = nestgate_token(provider, server, "n-5", plugin="short")
    assert check(short, token, "n-5", leeway=0)["sub"]
    time.sleep(max(0.0, token_part(token, 1)["exp"] - time.time()) + 1.1)
    with pytest.raises(Refused, match="exp"):
        check(short, token, "n-5", leeway=0)
    assert check(short, token, "n-5", leeway=60)["sub"]      # within the clock leeway


def test_forged_id_tokens_are_refused(world):
    """Unsigned (alg none), HMAC-keyed with the provider's public key (algorithm
    confusion), or signed with another key under the provider's key id."""
    from joserfc import jwk, jwt
    provider, server, _site = world
    real = nestgate_token(provider, server, "n-6")
    claims = real.split(".")[1]
    kid = token_part(real, 0)["kid"]
    payload = token_part(real, 1)

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).decode().rstrip("=")
    unsigned = f"{b64(json.dumps({'alg': 'none', 'kid': kid}).encode())}.{claims}."
    keys = httpx.get(f"{provider.issuer}/jwks").json()
    public_pem = jwk.import_key(keys["keys"][0]).as_pem(private=False)
    # joserfc itself will not make this one: HMAC by hand, keyed with the public key.
    signed = f"{b64(json.dumps({'alg': 'HS256', 'kid': kid}).encode())}.{claims}"
    confused = signed + "." + b64(hmac.new(public_pem, signed.encode(), hashlib.sha256).digest())
    stranger = jwk.RSAKey.generate_key(2048, parameters={"kid": kid})
    foreign = jwt.encode({"alg": "RS256", "kid": kid}, payload, stranger)
    for forged in (unsigned, confused, foreign):
        with pytest.raises(Refused):
            check(provider.issuer, forged, "n-6")
    assert check(provider.issuer, real, "n-6")["nonce"] == "n-6"


# Last: it leaves the tests' address held back for a minute.
def test_made_up_callbacks_are_counted_as_failed_sign_ins(world):
    _provider, server, _site = world
    prober = Browser(server.port(), f"app.localhost:{server.port()}")
    statuses = [prober.request("GET", "/__auth__/oidc/glew/callback?code=x&state=y",
                               headers={**HTML, "X-Probe": str(i)})[0].status
                for i in range(8)]
    # One address: refused (400) until max_failures (5 a minute), then held back.
    assert statuses[:5] == [400] * 5 and set(statuses[5:]) == {429}, statuses
