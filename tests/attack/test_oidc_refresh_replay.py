"""A refresh token copied off a relying party (its database, a log, a backup) and used
by someone else, against nestgate as an OpenID provider.

Refresh tokens rotate: each use spends the token and hands out the next. A spent one
was only refused, and the grant went on: whoever refreshed first (the thief, with a
token taken while the app slept) kept the grant for `refresh_token_ttl` (30 days),
refreshing as they liked, while the app's next refresh just failed. RFC 9700 4.14.2
asks the provider to notice: a spent token presented again means two parties hold
the grant, and as nobody can tell which is the thief, the grant ends, its newest
tokens with it. Only the token's own client can end it so; another client's word
about a token it was never given ends nothing.
"""

from __future__ import annotations

import pytest

from oidcprovider import RelyingParty, start_provider

SCOPE = "openid profile offline_access"


@pytest.fixture
def rp(tmp_path, certs):
    server = start_provider(tmp_path, certs, f'store = "{tmp_path}/state.db"', workers=1)
    party = RelyingParty(f"https://localhost:{server.port('https')}", certs["ca"])
    yield party
    party.close()
    server.stop()


def _grant(rp: RelyingParty) -> dict:
    rp.sign_in("ann")
    code, verifier = rp.code(scope=SCOPE)
    resp = rp.redeem(code, verifier)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _refresh(rp: RelyingParty, token: str, client_id: str = "app"):
    return rp.token({"grant_type": "refresh_token", "refresh_token": token},
                    client_id=client_id)


def _userinfo(rp: RelyingParty, access_token: str) -> int:
    return rp.backend.get(rp.metadata["userinfo_endpoint"],
                          headers={"Authorization": f"Bearer {access_token}"}).status_code


def test_the_app_coming_back_with_its_spent_token_ends_the_thiefs_grant(rp):
    app = _grant(rp)
    # The thief refreshes first, with the token copied from the app.
    thief = _refresh(rp, app["refresh_token"])
    assert thief.status_code == 200, thief.text
    thief = thief.json()
    assert _userinfo(rp, thief["access_token"]) == 200
    # The app's own refresh: its token was spent. Refused, and the grant ends.
    refused = _refresh(rp, app["refresh_token"])
    assert refused.status_code == 400 and refused.json()["error"] == "invalid_grant"
    assert _userinfo(rp, thief["access_token"]) == 401
    again = _refresh(rp, thief["refresh_token"])
    assert again.status_code == 400 and again.json()["error"] == "invalid_grant"


def test_a_replayed_old_token_ends_the_grant_the_app_went_on_with(rp):
    first = _grant(rp)
    tokens = first
    for _ in range(3):                       # the app refreshes as usual
        resp = _refresh(rp, tokens["refresh_token"])
        assert resp.status_code == 200, resp.text
        tokens = resp.json()
    assert _userinfo(rp, tokens["access_token"]) == 200
    # An old token (from a backup, a log) turns up again: the grant ends.
    assert _refresh(rp, first["refresh_token"]).status_code == 400
    assert _userinfo(rp, tokens["access_token"]) == 401
    assert _refresh(rp, tokens["refresh_token"]).status_code == 400


def test_another_client_naming_a_spent_token_ends_nothing(rp):
    first = _grant(rp)
    second = _refresh(rp, first["refresh_token"]).json()
    for _ in range(20):
        resp = _refresh(rp, first["refresh_token"], client_id="other")
        assert resp.status_code == 400 and resp.json()["error"] == "invalid_grant"
    assert _userinfo(rp, second["access_token"]) == 200
    assert _refresh(rp, second["refresh_token"]).status_code == 200
