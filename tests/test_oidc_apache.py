"""End to end: Apache with mod_auth_openidc (Debian's) protects a page as a relying
party of nestgate's OpenID provider, and headless Chromium signs in through it: from
the protected page to nestgate's authorization endpoint, its sign-in page, back with
a code that Apache redeems at the token endpoint (client_secret_basic, PKCE), checking
the ID token against nestgate's JWKS, to the page showing the claims it received."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from urllib.error import URLError

import pytest

from conftest import free_port
from oidcprovider import CLIENT_SECRET_HASH, CLIENT_SECRET, start_provider

MODULES = "/usr/lib/apache2/modules"


def _apache_conf(folder, port: int, issuer: str, ca_file: str) -> str:
    # Started as root, Apache hands its workers to an unprivileged user.
    user = "User www-data\nGroup www-data" if os.geteuid() == 0 else ""
    return f"""
{user}
ServerRoot "{folder}"
ServerName 127.0.0.1
Listen 127.0.0.1:{port}
PidFile "{folder}/apache.pid"
ErrorLog "{folder}/error.log"
LogLevel warn auth_openidc:info
DefaultRuntimeDir "{folder}"
LoadModule mpm_event_module {MODULES}/mod_mpm_event.so
LoadModule authn_core_module {MODULES}/mod_authn_core.so
LoadModule authz_core_module {MODULES}/mod_authz_core.so
LoadModule authz_user_module {MODULES}/mod_authz_user.so
LoadModule auth_openidc_module {MODULES}/mod_auth_openidc.so
LoadModule include_module {MODULES}/mod_include.so
LoadModule mime_module {MODULES}/mod_mime.so
TypesConfig /etc/mime.types
DocumentRoot "{folder}/htdocs"

OIDCProviderMetadataURL {issuer}/.well-known/openid-configuration
OIDCCABundlePath "{ca_file}"
OIDCClientID apache
OIDCClientSecret {CLIENT_SECRET}
OIDCRedirectURI http://127.0.0.1:{port}/private/redirect_uri
OIDCCryptoPassphrase the-passphrase-of-the-tests
OIDCScope "openid profile email groups"
OIDCPKCEMethod S256
OIDCRemoteUserClaim preferred_username

<Directory "{folder}/htdocs">
    Require all granted
</Directory>
<Directory "{folder}/htdocs/private">
    AuthType openid-connect
    Require valid-user
    Options +Includes
    AddOutputFilter INCLUDES .shtml
</Directory>
"""


PAGE = """<!doctype html><title>private</title>
<p id="who">user=<!--#echo var="REMOTE_USER" -->;\
name=<!--#echo var="OIDC_CLAIM_name" -->;\
email=<!--#echo var="OIDC_CLAIM_email" -->;\
groups=<!--#echo var="OIDC_CLAIM_groups" --></p>
"""


@pytest.fixture(scope="module")
def apache_and_provider(tmp_path_factory, certs):
    binary = shutil.which("apache2") or "/usr/sbin/apache2"
    assert os.path.exists(binary), "apache2 is installed by `make test` (debian-deps)"
    assert os.path.exists(f"{MODULES}/mod_auth_openidc.so"), \
        "libapache2-mod-auth-openidc is installed by `make test` (debian-deps)"
    # Apache started as root hands its workers to www-data, who must reach the pages:
    # a folder of its own in /tmp (pytest's are 0700).
    folder = Path(tempfile.mkdtemp(prefix="nestgate-apache-"))
    folder.chmod(0o755)
    apache_port = free_port()
    clients = f"""
[[auth.client]]
client_id = "apache"
name = "Apache"
client_secret_hash = "{CLIENT_SECRET_HASH}"
redirect_uris = ["http://127.0.0.1:{apache_port}/private/redirect_uri"]
allowed_groups = ["family"]
consent = "implicit"
"""
    provider = start_provider(folder, certs, f'store = "{folder}/state.db"', clients)
    issuer = f"https://localhost:{provider.port('https')}"
    (folder / "htdocs" / "private").mkdir(parents=True)
    (folder / "htdocs" / "private" / "index.shtml").write_text(PAGE)
    for path in (folder / "htdocs", folder / "htdocs" / "private"):
        path.chmod(0o755)
    (folder / "htdocs" / "private" / "index.shtml").chmod(0o644)
    shutil.copy(certs["ca"], folder / "ca.pem")
    (folder / "ca.pem").chmod(0o644)
    conf = folder / "apache.conf"
    conf.write_text(_apache_conf(folder, apache_port, issuer, folder / "ca.pem"))
    proc = subprocess.Popen([binary, "-f", str(conf), "-DFOREGROUND"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "APACHE_RUN_DIR": str(folder)})
    deadline = time.monotonic() + 20
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{apache_port}/", timeout=2)
        except URLError as exc:
            if getattr(exc, "code", None):        # an HTTP answer (404): it is up
                break
            assert proc.poll() is None, proc.stderr.read().decode() + _log(folder)
            assert time.monotonic() < deadline, "apache2 did not start"
            time.sleep(0.1)
        else:
            break
    yield provider, issuer, apache_port, folder
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    proc.stderr.close()
    provider.stop()
    shutil.rmtree(folder, ignore_errors=True)


def test_apache_signs_its_users_in_through_nestgate_in_chromium(apache_and_provider):
    from browser import Browser
    provider, issuer, apache_port, folder = apache_and_provider
    args = ["--ignore-certificate-errors", "--disable-quic", "--disable-background-networking",
            "--disable-component-update"]
    browser = Browser(f"http://127.0.0.1:{apache_port}/private/index.shtml", args)
    try:
        # Apache sent the browser to nestgate, which asks it to sign in first.
        assert browser.wait_for("document.querySelector('input[name=password]') !== null",
                                timeout=30), _log(folder)
        assert browser.evaluate("location.origin") == issuer
        assert browser.evaluate("location.pathname") == "/__auth__/login"
        browser.type_into("input[name=user]", "ann")
        browser.type_into("input[name=password]", "demo-password")
        browser.evaluate("document.querySelector('form').submit()")
        shown = browser.wait_for(
            "location.port === '%d' && document.getElementById('who') && "
            "document.getElementById('who').innerText" % apache_port, timeout=30)
        assert shown, _log(folder) + str(browser.evaluate("location.href")) + \
            str(browser.evaluate("document.body.innerText"))
        assert shown == ("user=ann;name=Ann Example;email=ann@example.com;groups=family"), shown
        assert browser.evaluate("location.pathname") == "/private/index.shtml"
    finally:
        browser.close()
    # The admin API lists the client (never its secret's hash) and the grant Apache
    # holds, and ends it.
    clients = _admin(provider, "GET", "/v1/oidc/clients")[1]["clients"]
    assert [c["client_id"] for c in clients] == ["apache"]
    assert "argon2" not in json.dumps(clients) and clients[0]["allowed_groups"] == ["family"]
    grants = _admin(provider, "GET", "/v1/oidc/grants")[1]["grants"]
    grant, = [g for g in grants if g["client_id"] == "apache" and g["user"] == "ann"]
    assert grant["scope"] == "openid profile email groups"
    assert _admin(provider, "DELETE", f"/v1/oidc/grants/{grant['id']}")[0] == 204
    assert _admin(provider, "DELETE", f"/v1/oidc/grants/{grant['id']}")[0] == 404
    for not_an_id in ("zz", "%C3%BE" * 8, grant["id"].upper()):
        assert _admin(provider, "DELETE", f"/v1/oidc/grants/{not_an_id}")[0] == 404
    assert _admin(provider, "GET", "/v1/oidc/grants")[1]["grants"] == []


def _admin(server, method: str, path: str):
    import http.client
    from conftest import admin_headers
    port = server.admin_port()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request(method, path, headers=admin_headers(port))
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp.status, json.loads(body) if body else None


def _log(folder) -> str:
    path = folder / "error.log"
    return path.read_text(errors="replace")[-3000:] if path.exists() else ""
