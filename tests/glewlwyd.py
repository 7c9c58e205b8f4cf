"""Debian's glewlwyd on loopback as a real OpenID provider for the sign-in tests.

Set up as its documentation says: a SQLite database made from the schema the package
ships, a config file of our own (its port, its web login pages served from a copy of
/usr/share/glewlwyd/webapp with their config.json), then its admin API (signed in as
the schema's `admin`/`password`) adds the OpenID Connect plugin, the users and the
clients.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path

import httpx

from conftest import free_port

SCHEMA = "/usr/share/dbconfig-common/data/glewlwyd/install/sqlite3"
WEBAPP = "/usr/share/glewlwyd/webapp"
WEBAPP_CONFIG = "/etc/glewlwyd/config-2.7.json/config.json"
PLUGIN = "oidc"
ADMIN = ("admin", "password")


class Glewlwyd:
    """glewlwyd on a free port with an OpenID Connect plugin whose issuer is
    `http://127.0.0.1:PORT/api/oidc`."""

    def __init__(self, folder: Path, token_duration: int = 300) -> None:
        binary = shutil.which("glewlwyd")
        assert binary, "glewlwyd is installed by `make test` (debian-deps)"
        assert os.path.exists(SCHEMA), "glewlwyd's SQLite schema is missing"
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        db = folder / "glewlwyd.db"
        with sqlite3.connect(db) as conn:
            conn.executescript(Path(SCHEMA).read_text())
        # A copy (its static file server serves no symbolic links), with the
        # config.json the package links to.
        webapp = folder / "webapp"
        shutil.copytree(WEBAPP, webapp, ignore=shutil.ignore_patterns("config.json"))
        shutil.copy(WEBAPP_CONFIG, webapp / "config.json")
        # A port free when asked may be taken before glewlwyd binds it: then another.
        for _attempt in range(3):
            if self._start(binary, db, webapp):
                break
        else:
            raise AssertionError("glewlwyd did not start: " + self.log()[-2000:])
        # The database backend keeps a user's extra properties; "groups" as a list.
        users = self._call("GET", "/mod/user/database").json()
        users["parameters"]["data-format"]["groups"] = {
            "multiple": True, "read": True, "write": True, "profile-read": True,
            "profile-write": False}
        self._call("PUT", "/mod/user/database", users)
        self._call("PUT", "/mod/user/database/reset")     # the instance takes it
        clients = self._call("GET", "/mod/client/database").json()
        clients["parameters"]["data-format"]["post_logout_redirect_uris"] = {
            "multiple": True, "read": True, "write": True}
        self._call("PUT", "/mod/client/database", clients)
        self._call("PUT", "/mod/client/database/reset")
        self.plugin(PLUGIN, token_duration)

    def plugin(self, name: str, token_duration: int, method: str = "POST") -> str:
        """An OpenID Connect plugin `name` with a new RSA key, its tokens (the ID
        token too) valid `token_duration` seconds; its issuer. With method "PUT", the
        plugin of that name is given a new key (the provider rotates its keys)."""
        key, cert = _key_pair_pem()
        issuer = f"{self.url}/api/{name}"
        self._call(method, "/mod/plugin/" + ("" if method == "POST" else name), {
            "module": "oidc", "name": name, "display_name": "OpenID Connect",
            "enabled": True,
            "parameters": {
                "iss": issuer, "jwt-type": "rsa", "jwt-key-size": "256",
                "key": key, "cert": cert,
                "session-cookie-name": "GLEWLWYD2_OIDC_SID",
                "session-cookie-expiration": 2592000,
                "access-token-duration": token_duration, "refresh-token-duration": 1209600,
                "code-duration": 600, "refresh-token-rolling": False,
                "allow-non-oidc": False, "auth-type-code-enabled": True,
                "auth-type-code-revoke-replayed": False,
                "auth-type-token-enabled": False, "auth-type-id-token-enabled": False,
                "auth-type-none-enabled": False, "auth-type-password-enabled": False,
                "auth-type-client-enabled": False, "auth-type-refresh-enabled": True,
                "scope": [], "claims": [
                    {"name": claim, "user-property": prop, "type": "string",
                     "mandatory": True, "on-demand": False, "scope": []}
                    for claim, prop in (("preferred_username", "username"),
                                        ("groups", "groups"))],
                "name-claim": "mandatory", "email-claim": "mandatory",
                "allowed-scope": ["openid"], "pkce-allowed": True,
                "pkce-method-plain-allowed": False, "jwks-show": True,
                "session-management-allowed": True, "subject-type": "public",
                "secret-type": "public", "request-parameter-allow": False,
            }})
        if method == "PUT":
            self._call("PUT", f"/mod/plugin/{name}/reset")
        return issuer


    def _start(self, binary: str, db: Path, webapp: Path) -> bool:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.issuer = f"{self.url}/api/{PLUGIN}"
        conf = Path("/etc/glewlwyd/glewlwyd.conf").read_text()
        conf = re.sub(r"(?m)^port=.*$", f"port={self.port}", conf)
        conf = re.sub(r"(?m)^external_url=.*$", f'external_url="{self.url}"', conf)
        conf = re.sub(r"(?m)^log_mode=.*$", 'log_mode="file"', conf)
        conf = re.sub(r"(?m)^log_file=.*$", f'log_file="{self.folder}/glewlwyd.log"', conf)
        conf = re.sub(r"(?m)^log_level=.*$", 'log_level="DEBUG"', conf)
        conf = re.sub(r"(?m)^#bind_address=.*$", 'bind_address="127.0.0.1"', conf)
        conf = re.sub(r"(?m)^#? *static_files_path=.*$", f'static_files_path="{webapp}/"', conf)
        conf = conf.replace('@include "/etc/glewlwyd/glewlwyd-db.conf"',
                            f'database = {{ type = "sqlite3"\n path = "{db}" }};')
        (self.folder / "glewlwyd.conf").write_text(conf)
        self.proc = subprocess.Popen([binary, "-c", str(self.folder / "glewlwyd.conf"), "-l", "DEBUG"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.admin = httpx.Client(base_url=f"{self.url}/api", timeout=10)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                if self.admin.post("/auth/", json={"username": ADMIN[0],
                                                   "password": ADMIN[1]}).status_code == 200:
                    return True
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        self.stop()
        return False

    def _call(self, method: str, path: str, body=None) -> httpx.Response:
        answer = self.admin.request(method, path, json=body)
        assert answer.status_code == 200, (method, path, answer.status_code, answer.text)
        return answer

    def add_user(self, name: str, password: str, groups=()) -> None:
        self._call("POST", "/user/", {
            "username": name, "name": name.title(), "email": f"{name}@example.test",
            "enabled": True, "scope": ["openid"], "password": password,
            "groups": list(groups)})

    def add_client(self, client_id: str, secret: str, redirect_uris, logout_uris=()) -> None:
        self._call("POST", "/client/", {
            "client_id": client_id, "name": client_id, "enabled": True,
            "confidential": True, "client_secret": secret, "redirect_uri": list(redirect_uris),
            "authorization_type": ["code", "refresh_token"], "scope": ["openid"],
            "token_endpoint_auth_method": ["client_secret_basic", "client_secret_post"],
            "post_logout_redirect_uris": list(logout_uris)})

    def log(self) -> str:
        path = self.folder / "glewlwyd.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        self.admin.close()
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def _key_pair_pem() -> tuple[str, str]:
    """A new RSA key: (private PEM, public PEM), as the plugin takes them."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    return private, public.decode()


if __name__ == "__main__":                      # by hand: python tests/glewlwyd.py FOLDER
    import sys
    g = Glewlwyd(Path(sys.argv[1]))
    print(json.dumps(httpx.get(g.issuer + "/.well-known/openid-configuration").json(),
                     indent=1)[:3000])
    g.stop()
