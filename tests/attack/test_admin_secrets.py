"""Every secret a config can hold, looked for in what the admin API answers.

`GET /v1/config` redacted fields by exact name, and the list missed two:
`[[auth.oidc]] client_secret` (the client secret nestgate signs in to an OpenID
provider with) was shown in clear, and `[[auth.client]] client_secret_hash` (what a
client of nestgate's own provider is checked against) was shown whole. Fields are now
redacted by name and by the suffixes that mean a secret (nestgate/admin/configapi.py).
"""

from __future__ import annotations

import http.client
import json

from nestgate.handlers.auth.passwords import hash_password

TOKEN = "5b8e1d0c2a4f6e8d0b2c4e6f8a0b1c3d"
OIDC_SECRET = "oidc-client-secret-3f9a7c1e5b"
CLIENT_SECRET = "own-client-secret-8d2b6f0a4c"
NOTES_TOKEN = "notes-token-6e0c4a8b2d1f"
TOTP = "JBSWY3DPEHPK3PXPJBSWY3DPEHPK3PXP"
TSIG = "c2VjcmV0LXRzaWcta2V5LTAxMjM0NTY3ODk="
EAB = "zWNDZM6eQGHWpSRTPal5eIUYFTu7EajVIoguysqZ9wG44nMEtx3MUAsUDkMTQ12W"


def config(password_hash: str, client_hash: str) -> str:
    return f"""
[server]
workers = 2

[[listen]]
address = "127.0.0.1:0"

[admin]
address = "127.0.0.1:0"
token = "{TOKEN}"

[auth]
store = "state.db"
issuer = "https://auth.localhost"

[[auth.user]]
name = "alice"
password = "{password_hash}"
totp = "{TOTP}"

[[auth.client]]
client_id = "grafana"
client_secret_hash = "{client_hash}"
redirect_uris = ["https://grafana.example.com/cb"]

[[auth.oidc]]
name = "idp"
issuer = "https://idp.example.com"
client_id = "nestgate"
client_secret = "{OIDC_SECRET}"

[acme]
email = "ops@example.com"
eab_kid = "kid-1"
eab_hmac_key = "{EAB}"

[acme.dns]
server = "127.0.0.1"
zone = "example.com"
tsig_name = "nestgate"
tsig_secret = "{TSIG}"

[[site]]
hosts = ["auth.localhost"]
protected = true

[site.notes]
dir = "notes"
token = "{NOTES_TOKEN}"
"""


def get(port: int, path: str, token: str = TOKEN) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
    resp = conn.getresponse()
    text = resp.read().decode()
    conn.close()
    return resp.status, text


def test_no_secret_is_in_any_admin_answer(start_server, tmp_path):
    (tmp_path / "notes").mkdir()
    password_hash, client_hash = hash_password("pw-9f1e"), hash_password(CLIENT_SECRET)
    server = start_server(config(password_hash, client_hash))
    admin = server.admin_port()
    status, shown = get(admin, "/v1/config")
    assert status == 200
    data = json.loads(shown)
    assert data["auth"]["providers"][0]["client_secret"] == "<redacted>"
    assert data["auth"]["provider"]["clients"][0]["secret_hash"] == "<redacted>"
    assert data["auth"]["users"][0]["password"] == "<redacted>"
    assert data["acme"]["dns"]["tsig_secret"] == "<redacted>"
    answers = [shown]
    for path in ("/v1/status", "/v1/ready", "/v1/users", "/v1/providers", "/v1/oidc/clients",
                 "/metrics", "/docs/json", "/"):
        status, text = get(admin, path)
        assert status == 200, (path, text)
        answers.append(text)
    secrets = (TOKEN, OIDC_SECRET, NOTES_TOKEN, TOTP, TSIG, EAB, password_hash, client_hash,
               "$argon2")
    for secret in secrets:
        assert not any(secret in text for text in answers), secret
        assert not any(secret in line for line in server.lines), secret
