"""A nestgate behind a proxy that ends TLS and speaks plain HTTP to it: from a peer in
`[client_ip] trusted_proxies`, one valid X-Forwarded-Proto is the request's scheme (the
Secure-cookie page, passkey origins, the OpenID redirect_uri, the HTTPS redirect), over
HTTP/1.1, h2c and HTTP/3; from anyone else the header is ignored. A `redirect_https`
listener serves the sites to a trusted proxy's request that says https and redirects
every other one. Real servers: two
nestgates (one trusting 127.0.0.1, one trusting nobody), a small OpenID discovery
document for the sign-in start, and Debian's HAProxy ending TLS in front, each started
once for the module."""

from __future__ import annotations

import http.client
import json
import re
import shutil
import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

import h3client
import softauthn
from conftest import HTML, PASSWORD_HASH, Browser, Server, _env, free_port, tls_block
from h2client import H2Client
from nestgate.bench import peers
from softauthn import SoftAuthenticator

HOST = "private.test"
CALLBACK = "/__auth__/oidc/idp/callback"
BIG = 2 * 1024 * 1024                  # above sendfile_min: sent with sendfile on plain TCP


def config(folder, issuer: str, tls_port: int = 0, certs=None, trusted: str = "") -> str:
    """A protected site with password, passkey and OpenID sign-in, and a static site.
    With `tls_port`, an HTTPS (and HTTP/3) listener there too, which gives the
    protected site its redirect of plain-HTTP requests, and a plain listener that sends
    every visitor there (`redirect_https`)."""
    tls = (f'\n[[listen]]\naddress = "127.0.0.1:{tls_port}"\nhttp3 = true\n{tls_block(certs)}'
           f'\n[[listen]]\naddress = "127.0.0.1:0"\nredirect_https = true\n'
           f'https_port = {tls_port}\n'
           if tls_port else "")
    client_ip = f"\n[client_ip]\ntrusted_proxies = {trusted}\n" if trusted else ""
    (folder / "secret").write_text("the-client-secret\n")
    files = folder / "files"
    files.mkdir()
    (files / "big.bin").write_bytes(bytes(range(256)) * (BIG // 256))
    return f"""
[server]
workers = 1

[[listen]]
address = "127.0.0.1:0"
http2_cleartext = true
{tls}
{client_ip}
[auth]
store = "{folder / 'state.db'}"

[[auth.user]]
name = "demo"
password = "{PASSWORD_HASH}"

[[auth.user]]
name = "ann"                     # the HAProxy test's: her passkey is added there
password = "{PASSWORD_HASH}"

[[auth.oidc]]
name = "idp"
issuer = "{issuer}"
client_id = "nestgate"
client_secret_file = "{folder / 'secret'}"

[[site]]
hosts = ["{HOST}"]
protected = true

[[site.route]]
prefix = "/"
type = "return"
body = "private\\n"

[[site]]
hosts = ["files.test"]

[[site.route]]
prefix = "/"
type = "static"
root = "{files}"
"""


class Discovery(BaseHTTPRequestHandler):
    """An OpenID provider's discovery document: all a sign-in start reads of it."""

    def do_GET(self) -> None:
        issuer = f"http://127.0.0.1:{self.server.server_port}"
        body = json.dumps({"issuer": issuer, "authorization_endpoint": issuer + "/authorize",
                           "token_endpoint": issuer + "/token",
                           "jwks_uri": issuer + "/jwks"}).encode()
        self.send_response(200 if self.path == "/.well-known/openid-configuration" else 404)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def world(tmp_path_factory, certs):
    """(trusting, trusting nobody, the trusting one's HTTPS port): nestgates on 127.0.0.1."""
    idp = ThreadingHTTPServer(("127.0.0.1", 0), Discovery)
    threading.Thread(target=idp.serve_forever, daemon=True).start()
    issuer = f"http://127.0.0.1:{idp.server_port}"
    servers = []
    try:
        tls_port = free_port()
        for name, kw in (("trusting", {"tls_port": tls_port, "certs": certs,
                                       "trusted": '["127.0.0.1"]'}),
                         ("bare", {})):
            folder = tmp_path_factory.mktemp(name)
            (folder / "nestgate.toml").write_text(config(folder, issuer, **kw))
            servers.append(Server(folder / "nestgate.toml", env=_env()))
        yield servers[0], servers[1], tls_port
    finally:
        for server in servers:
            server.stop()
        idp.shutdown()
        idp.server_close()


HTTPS = {"X-Forwarded-Proto": "https"}


def raw(port: int, lines: list[str], path: str = "/__auth__/oidc/idp?next=/secret",
        source: str = "127.0.0.1") -> tuple[int, dict]:
    """(status, lower-case headers) of one HTTP/1.1 request with the header `lines`
    as given (repeated names included), from `source`."""
    with socket.create_connection(("127.0.0.1", port), timeout=10,
                                  source_address=(source, 0)) as sock:
        head = "".join(f"{line}\r\n" for line in lines)
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n"
                     f"{head}\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head = data.partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
    fields = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:])}
    return int(head[0].split()[1]), fields


def redirect_uri(location: str) -> str:
    """The redirect_uri nestgate gave the provider in a sign-in start's Location."""
    assert location.startswith("http://127.0.0.1:") and "/authorize?" in location, location
    return parse_qs(urlsplit(location).query)["redirect_uri"][0]


def session_cookie(resp) -> str:
    return next(c for c in resp.msg.get_all("set-cookie") if c.startswith("nestgate_session="))


# ---------------------------------------------------------------- the sign-in pages
def test_signing_in_behind_a_proxy_that_says_https(world):
    trusting, _bare, _tls = world
    visitor = Browser(trusting.port(), headers=HTTPS)
    resp, _ = visitor.sign_in(next_url="/secret")
    assert resp.status == 303 and resp.getheader("location") == "/secret"
    assert "; Secure" in session_cookie(resp)
    assert visitor.request("GET", "/secret")[0].status == 200
    # A form whose cookie did not come back: over HTTPS that is an expired form, not
    # "this page came over plain http://".
    stranger = Browser(trusting.port(), headers=HTTPS)
    token = stranger.login_form()
    stranger.jar.clear()
    resp, body = stranger.sign_in(csrf=token)
    assert resp.status == 403 and body == b"the form expired or came from another site; reload it\n"


def test_a_forged_proto_from_an_untrusted_client_changes_nothing_on_the_pages(world):
    _trusting, bare, _tls = world
    visitor = Browser(bare.port(), headers=HTTPS)       # no trusted_proxies: a client's word
    token = visitor.login_form()
    visitor.jar.clear()
    resp, body = visitor.sign_in(csrf=token)
    assert resp.status == 403 and b"Sign-in needs HTTPS here" in body


# ---------------------------------------------------------------- passkeys
def test_passkeys_behind_a_proxy_that_says_https_are_for_the_https_origin(world):
    trusting, _bare, _tls = world
    port = trusting.port()
    owner = Browser(port, headers=HTTPS)
    assert owner.sign_in()[0].status == 303
    key = SoftAuthenticator()
    assert softauthn.register(owner, key, origin=f"https://{HOST}") == 303
    resp, _ = softauthn.sign_in(Browser(port, headers=HTTPS), key, origin=f"https://{HOST}")
    assert resp.status == 303 and "; Secure" in session_cookie(resp)
    # The page the browser is on is https://: an answer made on http:// is not its own.
    resp, body = softauthn.sign_in(Browser(port, headers=HTTPS), key, origin=f"http://{HOST}")
    assert resp.status == 401 and b"does not verify" in body


def test_passkeys_for_an_untrusted_client_keep_the_listeners_origin(world):
    _trusting, bare, _tls = world
    port = bare.port()
    owner = Browser(port, headers=HTTPS)
    assert owner.sign_in()[0].status == 303
    key = SoftAuthenticator()
    assert softauthn.register(owner, key, origin=f"http://{HOST}") == 303
    resp, body = softauthn.sign_in(Browser(port, headers=HTTPS), key, origin=f"https://{HOST}")
    assert resp.status == 401 and b"does not verify" in body
    assert softauthn.sign_in(Browser(port, headers=HTTPS), key,
                             origin=f"http://{HOST}")[0].status == 303


# ---------------------------------------------------------------- OpenID redirect_uri
def test_the_openid_redirect_uri_follows_a_trusted_proxy_on_http1_and_h2c(world):
    trusting, _bare, _tls = world
    status, fields = raw(trusting.port(), ["X-Forwarded-Proto: https"])
    assert status == 303 and redirect_uri(fields["location"]) == f"https://{HOST}{CALLBACK}"
    assert "; Secure" in fields["set-cookie"]
    status, fields = raw(trusting.port(), ["X-Forwarded-Proto: HTTPS "])     # any case
    assert status == 303 and redirect_uri(fields["location"]) == f"https://{HOST}{CALLBACK}"
    h2 = H2Client(trusting.port(), None, server_hostname=HOST)
    try:
        status, headers, _ = h2.request("GET", "/__auth__/oidc/idp?next=/",
                                        headers=[(b"x-forwarded-proto", b"https")])
    finally:
        h2.close()
    assert status == 303 and redirect_uri(headers["location"]) == f"https://{HOST}{CALLBACK}"


@pytest.mark.parametrize("lines", [
    [],                                                          # nothing said
    ["X-Forwarded-Proto: https", "X-Forwarded-Proto: https"],    # said twice
    ["X-Forwarded-Proto: https, https"],                         # a list
    ["X-Forwarded-Proto: wss"],                                  # not http(s)
    ["X-Forwarded-Protocol: https"],                             # another header
    ["Forwarded: proto=https"],                                  # not read
], ids=["absent", "twice", "list", "other-scheme", "other-name", "forwarded"])
def test_a_trusted_proxys_missing_or_malformed_proto_leaves_the_listeners_scheme(world, lines):
    trusting, _bare, _tls = world
    status, fields = raw(trusting.port(), lines)
    assert status == 303 and redirect_uri(fields["location"]) == f"http://{HOST}{CALLBACK}"


def test_an_untrusted_clients_proto_is_ignored(world):
    trusting, bare, _tls = world
    status, fields = raw(bare.port(), ["X-Forwarded-Proto: https"])
    assert status == 303 and redirect_uri(fields["location"]) == f"http://{HOST}{CALLBACK}"
    h2 = H2Client(bare.port(), None, server_hostname=HOST)
    try:
        status, headers, _ = h2.request("GET", "/__auth__/oidc/idp?next=/",
                                        headers=[(b"x-forwarded-proto", b"https")])
    finally:
        h2.close()
    assert status == 303 and redirect_uri(headers["location"]) == f"http://{HOST}{CALLBACK}"
    # Beside a trusted proxy, on the same listener, another peer is still a client.
    status, fields = raw(trusting.port(), ["X-Forwarded-Proto: https"], source="127.0.0.2")
    assert status == 308         # plain HTTP to a site with an HTTPS listener: sent there


# ---------------------------------------------------------------- the HTTPS redirect
def test_the_https_redirect_follows_a_trusted_proxy(world, certs):
    trusting, _bare, tls_port = world
    port = trusting.port()
    to_https = f"https://{HOST}:{tls_port}/secret"
    status, fields = raw(port, ["X-Forwarded-Proto: http"], "/secret")
    assert status == 308 and fields["location"] == to_https
    for lines in ([], ["X-Forwarded-Proto: https"],
                  ["X-Forwarded-Proto: http", "X-Forwarded-Proto: http"]):
        assert raw(port, lines, "/secret")[0] == 401, lines      # the sign-in challenge
    # From a client that is not the proxy, plain HTTP is plain HTTP whatever it says.
    status, fields = raw(port, ["X-Forwarded-Proto: https"], "/secret", source="127.0.0.2")
    assert status == 308 and fields["location"] == to_https
    # The same over h2c and HTTP/3 (where the listener itself is https).
    h2 = H2Client(port, None, server_hostname=HOST)
    try:
        assert h2.request("GET", "/secret", headers=[(b"x-forwarded-proto", b"http")])[0] == 308
        assert h2.request("GET", "/secret", headers=[(b"x-forwarded-proto", b"https")])[0] == 401
    finally:
        h2.close()
    said_http = h3client.fetch(tls_port, certs["ca"], "/secret", authority=HOST,
                               headers=[("X-Forwarded-Proto", "http")])
    assert said_http.status == 308 and said_http.headers["location"] == to_https
    assert h3client.fetch(tls_port, certs["ca"], "/secret", authority=HOST).status == 401


def test_a_big_file_still_goes_through_tls_when_the_proxy_says_http(world, certs):
    """The scheme a proxy names is the client's: the bytes on this connection are TLS
    all the same, so a file is never handed to sendfile under it."""
    trusting, _bare, tls_port = world
    context = ssl.create_default_context(cafile=certs["ca"])
    conn = http.client.HTTPSConnection("127.0.0.1", tls_port, timeout=20, context=context)
    try:
        conn.request("GET", "/big.bin", headers={"Host": "files.test",
                                                 "X-Forwarded-Proto": "http"})
        resp = conn.getresponse()
        body = resp.read()
    finally:
        conn.close()
    assert resp.status == 200 and body == bytes(range(256)) * (BIG // 256)


# ---------------------------------------------------------------- HAProxy in front
HAPROXY = """
global
    maxconn 256
defaults
    mode http
    timeout connect 2s
    timeout client 10s
    timeout server 10s
frontend https_in
    bind 127.0.0.1:{tls} ssl crt {pem}
    option forwardfor
    http-request set-header X-Forwarded-Proto https
    default_backend gate
frontend http_in
    bind 127.0.0.1:{plain}
    option forwardfor
    http-request set-header X-Forwarded-Proto http
    default_backend gate
frontend https_to_redirecting
    bind 127.0.0.1:{tls_redirecting} ssl crt {pem}
    option forwardfor
    http-request set-header X-Forwarded-Proto https
    default_backend redirecting
frontend http_to_redirecting
    bind 127.0.0.1:{plain_redirecting}
    option forwardfor
    http-request set-header X-Forwarded-Proto http
    default_backend redirecting
backend gate
    server nestgate 127.0.0.1:{nestgate}
backend redirecting
    server nestgate 127.0.0.1:{redirecting}
"""


@pytest.fixture(scope="module")
def redirecting(world) -> int:
    """The port of the trusting nestgate's `redirect_https` listener."""
    trusting, _bare, _tls = world
    [port] = [p for scheme, _h, p in trusting.urls
              if scheme == "http" and p != trusting.port()]
    return port


@pytest.fixture(scope="module")
def haproxy(world, redirecting, ca, tmp_path_factory):
    """Debian's HAProxy ending TLS (trustme's certificate for 127.0.0.1) and plain HTTP
    in front of the trusting nestgate's plain listener, and again in front of its
    `redirect_https` one: (HTTPS port, HTTP port, HTTPS port and HTTP port to the
    redirecting listener)."""
    binary = shutil.which("haproxy")
    assert binary, "haproxy is installed by `make test` (debian-deps)"
    trusting, _bare, _tls = world
    folder = tmp_path_factory.mktemp("haproxy")
    ca.issue_cert("127.0.0.1", HOST).private_key_and_cert_chain_pem.write_to_path(
        str(folder / "site.pem"))
    ports = free_port(), free_port(), free_port(), free_port()
    (folder / "haproxy.cfg").write_text(HAPROXY.format(
        tls=ports[0], plain=ports[1], tls_redirecting=ports[2], plain_redirecting=ports[3],
        pem=folder / "site.pem", nestgate=trusting.port(), redirecting=redirecting))
    server = peers.ServerProcess("haproxy", [binary, "-db", "-f", str(folder / "haproxy.cfg")],
                                 folder)
    server.start(folder)
    try:
        peers.wait_ready(server, "http", ports[1], "/__auth__/login", HOST, timeout_s=20)
        yield ports
    finally:
        server.stop()


def test_signing_in_through_haproxy_ending_tls(haproxy, ca):
    tls_port, plain_port, _tls_redirecting, _plain_redirecting = haproxy
    context = ssl.create_default_context()
    ca.configure_trust(context)
    visitor = Browser(tls_port, tls=context)
    resp, page = visitor.request("GET", "/secret", headers=HTML)      # not sent to HTTPS
    assert resp.status == 401 and b'action="/__auth__/login"' in page
    resp, _ = visitor.sign_in(user="ann", next_url="/secret")
    assert resp.status == 303 and resp.getheader("location") == "/secret"
    assert "; Secure" in session_cookie(resp)
    resp, body = visitor.request("GET", "/secret")
    assert resp.status == 200 and body == b"private\n"
    # The sign-in start names the https:// callback; a passkey is for https://.
    resp, _ = visitor.request("GET", "/__auth__/oidc/idp?next=/secret")
    assert resp.status == 303
    assert redirect_uri(resp.getheader("location")) == f"https://{HOST}{CALLBACK}"
    key = SoftAuthenticator()
    assert softauthn.register(visitor, key, origin=f"https://{HOST}") == 303
    resp, _ = softauthn.sign_in(Browser(tls_port, tls=context), key, origin=f"https://{HOST}")
    assert resp.status == 303
    # Through HAProxy's plain port the client is on http://: sent to HTTPS.
    resp, _ = Browser(plain_port).request("GET", "/secret")
    assert resp.status == 308 and resp.getheader("location").startswith(f"https://{HOST}:")


# ---------------------------------------------------------------- a redirect_https listener
def test_a_redirecting_listener_serves_what_haproxy_says_came_over_https(haproxy, ca, world):
    """HAProxy ends TLS and speaks plain HTTP to a `redirect_https` listener: what came
    to it over HTTPS is served (a redirect to HTTPS would come back through it for
    ever), what came over plain HTTP is sent to HTTPS."""
    _trusting, _bare, tls_port = world
    _tls, _plain, tls_redirecting, plain_redirecting = haproxy
    context = ssl.create_default_context()
    ca.configure_trust(context)
    visitor = Browser(tls_redirecting, tls=context)
    resp, page = visitor.request("GET", "/secret", headers=HTML)
    assert resp.status == 401 and b'action="/__auth__/login"' in page
    resp, _ = visitor.sign_in(user="ann", next_url="/secret")
    assert resp.status == 303 and "; Secure" in session_cookie(resp)
    for _ in range(3):                   # one kept-alive connection: never sent round
        resp, body = visitor.request("GET", "/secret")
        assert resp.status == 200 and body == b"private\n"
    resp, _ = Browser(plain_redirecting).request("GET", "/secret")
    assert resp.status == 308
    assert resp.getheader("location") == f"https://{HOST}:{tls_port}/secret"


@pytest.mark.parametrize("lines,source,expected", [
    (["X-Forwarded-Proto: https"], "127.0.0.1", 401),            # the proxy: served
    (["X-Forwarded-Proto: HTTPS "], "127.0.0.1", 401),
    (["X-Forwarded-Proto: http"], "127.0.0.1", 308),
    ([], "127.0.0.1", 308),                                      # said nothing
    (["X-Forwarded-Proto: https", "X-Forwarded-Proto: https"], "127.0.0.1", 308),
    (["X-Forwarded-Proto: https, http"], "127.0.0.1", 308),
    (["Forwarded: proto=https"], "127.0.0.1", 308),
    (["X-Forwarded-Proto: https"], "127.0.0.2", 308),            # not the proxy
], ids=["https", "https-any-case", "http", "absent", "twice", "list", "forwarded",
        "untrusted-peer"])
def test_a_redirecting_listener_serves_only_a_trusted_proxys_https(world, redirecting, lines,
                                                                   source, expected):
    _trusting, _bare, tls_port = world
    status, fields = raw(redirecting, lines, "/secret", source=source)
    assert status == expected, (lines, source)
    if expected == 308:
        assert fields["location"] == f"https://{HOST}:{tls_port}/secret"


def test_a_trusted_proxys_connection_is_redirected_or_served_request_by_request(world,
                                                                                redirecting):
    """One kept-alive connection from the proxy carries clients on both schemes."""
    _trusting, _bare, tls_port = world
    said = ["https", "http", "https", None]
    with socket.create_connection(("127.0.0.1", redirecting), timeout=10) as sock:
        sock.sendall(b"".join(
            f"GET /secret HTTP/1.1\r\nHost: {HOST}\r\n".encode()
            + (f"X-Forwarded-Proto: {s}\r\n".encode() if s else b"")
            + (b"Connection: close\r\n" if i == len(said) - 1 else b"") + b"\r\n"
            for i, s in enumerate(said)))
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    statuses = [int(code) for code in re.findall(rb"HTTP/1\.1 (\d{3}) ", data)]
    assert statuses == [401, 308, 401, 308]
    assert data.count(f"location: https://{HOST}:{tls_port}/secret".encode()) == 2
