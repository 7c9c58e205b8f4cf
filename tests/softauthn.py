"""A WebAuthn authenticator in software, for tests that speak to the server without a
browser: a P-256 key per credential, the authenticator data and client data a browser
and a CTAP2 authenticator would make, and real ECDSA signatures over them. What it
sends can be bent the ways an attacker would (another origin, another relying party,
an old counter), so the server's checks are shown to refuse each.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import struct

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from webauthn.helpers import encode_cbor

UP, UV, AT = 0x01, 0x04, 0x40


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class SoftAuthenticator:
    """One resident credential for one relying party, made by `register`."""

    def __init__(self, verifies_user: bool = True) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.cred_id = os.urandom(16)
        self.count = 0
        self.user_handle = b""
        self.verifies_user = verifies_user

    def _cose_key(self) -> bytes:
        numbers = self.key.public_key().public_numbers()
        return encode_cbor({1: 2, 3: -7, -1: 1, -2: numbers.x.to_bytes(32, "big"),
                            -3: numbers.y.to_bytes(32, "big")})

    def _flags(self) -> int:
        return UP | (UV if self.verifies_user else 0)

    @staticmethod
    def _client_data(kind: str, challenge: str, origin: str) -> bytes:
        return json.dumps({"type": kind, "challenge": challenge, "origin": origin,
                           "crossOrigin": False}).encode()

    def register(self, options: dict, origin: str, rp_id: str | None = None) -> str:
        """The JSON a browser posts for navigator.credentials.create(`options`)."""
        rp_id = rp_id or options["rp"]["id"]
        self.user_handle = unb64url(options["user"]["id"])
        attested = (b"\0" * 16 + struct.pack(">H", len(self.cred_id)) + self.cred_id
                    + self._cose_key())
        auth_data = (hashlib.sha256(rp_id.encode()).digest()
                     + bytes([self._flags() | AT]) + struct.pack(">I", self.count) + attested)
        client_data = self._client_data("webauthn.create", options["challenge"], origin)
        attestation = encode_cbor({"fmt": "none", "attStmt": {}, "authData": auth_data})
        return json.dumps({"id": b64url(self.cred_id), "rawId": b64url(self.cred_id),
                           "type": "public-key", "clientExtensionResults": {},
                           "response": {"clientDataJSON": b64url(client_data),
                                        "attestationObject": b64url(attestation),
                                        "transports": ["internal"]}})

    def assert_(self, options: dict, origin: str, rp_id: str | None = None,
                count: int | None = None) -> str:
        """The JSON a browser posts for navigator.credentials.get(`options`); the
        counter goes up by one unless `count` says what to send (a clone's)."""
        rp_id = rp_id or options["rpId"]
        if count is None:
            count = self.count + 1
        self.count = max(self.count, count)
        auth_data = (hashlib.sha256(rp_id.encode()).digest() + bytes([self._flags()])
                     + struct.pack(">I", count))
        client_data = self._client_data("webauthn.get", options["challenge"], origin)
        signature = self.key.sign(auth_data + hashlib.sha256(client_data).digest(),
                                  ec.ECDSA(hashes.SHA256()))
        return json.dumps({"id": b64url(self.cred_id), "rawId": b64url(self.cred_id),
                           "type": "public-key", "clientExtensionResults": {},
                           "response": {"clientDataJSON": b64url(client_data),
                                        "authenticatorData": b64url(auth_data),
                                        "signature": b64url(signature),
                                        "userHandle": b64url(self.user_handle)}})


# ---- the server's pages, driven like the pages' script does (`browser`: conftest.Browser)
def options(browser, purpose: str, csrf: str):
    """(status, JSON) of POST /__auth__/passkey/options; the ceremony's cookie lands in
    the browser's jar."""
    resp, body = browser.post_form("/__auth__/passkey/options",
                                   {"csrf": csrf, "purpose": purpose})
    json_ = resp.getheader("content-type") == "application/json"
    return resp.status, json.loads(body) if json_ else body.decode()


def origin_of(browser) -> str:
    return f"http://{browser.host}"


def register(browser, authenticator: SoftAuthenticator, name: str = "laptop",
             origin: str | None = None) -> int:
    """Add `authenticator`'s passkey on the account page, the browser on `origin`
    (its Host over http:// unless said); the answer's status (303: added)."""
    csrf = browser.form_token("/__auth__/account")
    status, opts = options(browser, "register", csrf)
    assert status == 200, opts
    answer = authenticator.register(opts, origin or origin_of(browser))
    return browser.post_form("/__auth__/account", {"csrf": csrf, "action": "add",
                                                   "credential": answer, "name": name})[0].status


def begin_sign_in(browser) -> tuple[str, dict]:
    """(CSRF token, options) of a passkey sign-in begun on the sign-in page."""
    csrf = browser.login_form()
    status, opts = options(browser, "signin", csrf)
    assert status == 200, opts
    return csrf, opts


def finish_sign_in(browser, csrf: str, answer: str, **fields):
    """POST the authenticator's `answer` (with the form's other `fields`)."""
    return browser.post_form("/__auth__/passkey", {"csrf": csrf, "credential": answer,
                                                   "next": "/", **fields})


def sign_in(browser, authenticator: SoftAuthenticator, origin: str | None = None, **fields):
    csrf, opts = begin_sign_in(browser)
    return finish_sign_in(browser, csrf,
                          authenticator.assert_(opts, origin or origin_of(browser)), **fields)
