"""Passkeys (WebAuthn, through py_webauthn) and the account page where a signed-in user
manages them and their recovery codes.

    POST /__auth__/passkey/options  the options of a ceremony: purpose=signin (anyone)
                                    or purpose=register (a signed-in user); JSON
    POST /__auth__/passkey          sign in with the browser's answer (a form post, so
                                    it ends like the password form: 303 with a session)
    GET  /__auth__/account          the user's passkeys (name, added, last used) and
                                    how many recovery codes are left
    POST /__auth__/account          action=add (a passkey), rename, revoke, recovery
                                    (ten new codes, shown once)
    GET  /__auth__/passkey.js       the pages' script (the CSP allows 'self' only)

Every POST carries the portal's CSRF token. A ceremony's challenge is 32 random bytes
kept in the shared store under a random id that travels in a cookie only this site can
set (HttpOnly, SameSite=Strict, /__auth__/ only): it is good for one answer, for
CEREMONY_TTL seconds, for the purpose it was made for and, when registering, for the
session that asked (its token's hash is stored with it). An answer to a challenge used
or never made is refused, so the same assertion sent twice signs in once, on any worker.

What py_webauthn checks (and we give it): the challenge, the origin (the scheme and Host
the browser asked for), the relying party id's hash (the site's host name, or
`[auth] cookie_domain` when the host is under it, so one passkey serves every
subdomain that shares the session cookie), the signature with the stored public key,
user presence, and the sign counter against the stored one. The counter is then moved
in one statement that only lets it go up (`Store.use_passkey`), so two workers given
the same assertion at once cannot both accept it, and a cloned authenticator whose
count falls behind is refused.

Factors: a passkey alone that verified the user (UV: PIN or biometric) is two factors;
one that did not is one. After the password (the form's user and password fields
filled in), a passkey of that user stands in for the TOTP code: two factors. The
password is then checked, and counted against guessing, exactly as by the form.

Who may change factors: a session of two factors, or of one when the user has no
second factor yet (no TOTP, passkey or recovery code: the first enrolment). Otherwise a
stolen password could add an attacker's passkey, or revoke the owner's.
"""

from __future__ import annotations

import asyncio
import hashlib
import html
import json
import math
import secrets
import time
from importlib import resources

from nestgate.handlers.auth import recovery
from nestgate.handlers.auth.config import (ACCOUNT_PATH, LOGIN_PATH, PASSKEY_OPTIONS,
                                           PASSKEY_PATH, PASSKEY_SCRIPT)
from nestgate.handlers.auth.passwords import verify_password
from nestgate.handlers.auth.policy import PASSKEY, PASSWORD, VERIFIED, two_factors
from nestgate.handlers.auth.portal import (_PAGE_HEADERS, _FormPath, _entering, _page_html,
                                           cookies, login_url, safe_next)
from nestgate.base.hosts import host_name
from nestgate.base.tally import TALLY

CEREMONY_COOKIE = "nestgate_webauthn"
CEREMONY_TTL = 120.0          # seconds a challenge may be answered in
MAX_PASSKEYS = 10             # per user: the store does not grow, the form stays small
MAX_NAME = 60                 # characters of a passkey's name
TIMEOUT_MS = 60_000           # what the browser is told to give the person

SIGNIN, REGISTER = "signin", "register"


class PasskeyError(Exception):
    """A ceremony's answer that does not sign in or register; the text is shown."""


def relying_party(cfg, request) -> tuple[str, str]:
    """(rp id, origin) of a request: the Host's name (or the cookie domain above it)
    and the origin the browser is on."""
    host = host_name(request.host).decode("latin-1")
    domain = cfg.cookie_domain
    rp_id = domain if domain and (host == domain or host.endswith("." + domain)) else host
    return rp_id, f"{request.scheme}://{request.host.decode('latin-1').lower()}"


def user_handle(secret: bytes, user: str) -> bytes:
    """The WebAuthn user id of `user`: the same for each of their passkeys (so an
    authenticator keeps one per account), and not their name."""
    return hashlib.sha256(secret + b"webauthn-user\0" + user.encode()).digest()[:16]


def b64url(data: bytes) -> str:
    from webauthn.helpers import bytes_to_base64url
    return bytes_to_base64url(data)


def from_b64url(text: str) -> bytes:
    from webauthn.helpers import base64url_to_bytes
    try:
        return base64url_to_bytes(text)
    except (ValueError, TypeError) as exc:
        raise PasskeyError("the passkey's answer is malformed") from exc


class Passkeys:
    """The ceremonies and the account page of one config's sign-in (`SignIn`)."""

    def __init__(self, signin) -> None:
        self.signin = signin
        self.options = Options(self)
        self.sign_in = PasskeySignIn(signin)
        self.sign_in.passkeys = self
        self.account = Account(signin)
        self.account.passkeys = self
        self.script = Script()

    def routes(self) -> list[tuple[str, object, str]]:
        """(path, handler, log label) of each page, for a protected site."""
        return [(PASSKEY_OPTIONS, self.options, "auth-passkey-options"),
                (PASSKEY_PATH, self.sign_in, "auth-passkey"),
                (ACCOUNT_PATH, self.account, "auth-account"),
                (PASSKEY_SCRIPT, self.script, "auth-passkey-script")]

    # ------------------------------------------------------ ceremonies
    async def start(self, request, purpose: str, user: str = "", bound: bytes = b"",
                    exclude=()) -> tuple[dict, tuple[bytes, bytes]] | None:
        """The options of a new ceremony (JSON-ready) and the cookie that names it; None
        when the store holds as many ceremonies as it may."""
        from webauthn import (generate_authentication_options,
                              generate_registration_options, options_to_json)
        from webauthn.helpers.structs import (AuthenticatorSelectionCriteria,
                                              PublicKeyCredentialDescriptor,
                                              ResidentKeyRequirement,
                                              UserVerificationRequirement)
        signin = self.signin
        rp_id, _origin = relying_party(signin.cfg, request)
        challenge = secrets.token_bytes(32)
        if purpose == REGISTER:
            options = generate_registration_options(
                rp_id=rp_id, rp_name=signin.cfg.title, user_name=user,
                user_id=user_handle(await signin.state.secret(), user),
                challenge=challenge, timeout=TIMEOUT_MS,
                authenticator_selection=AuthenticatorSelectionCriteria(
                    resident_key=ResidentKeyRequirement.REQUIRED,
                    user_verification=UserVerificationRequirement.PREFERRED),
                exclude_credentials=[PublicKeyCredentialDescriptor(id=c) for c in exclude])
        else:
            options = generate_authentication_options(
                rp_id=rp_id, challenge=challenge, timeout=TIMEOUT_MS,
                user_verification=UserVerificationRequirement.PREFERRED)
        ceremony = secrets.token_bytes(16)
        if not await signin.state.run("start_ceremony", ceremony, challenge, purpose, user,
                                      bound, CEREMONY_TTL):
            return None
        cookie = signin.cookie(request, CEREMONY_COOKIE, ceremony.hex(),
                               math.ceil(CEREMONY_TTL), path="/__auth__/", samesite="Strict")
        return json.loads(options_to_json(options)), cookie

    async def take(self, request, purpose: str) -> tuple[bytes, str, bytes]:
        """(challenge, user, bound) of the ceremony the request's cookie names, used up
        now; PasskeyError when there is none live for `purpose`."""
        named = cookies(request.headers).get(CEREMONY_COOKIE, "")
        try:
            ceremony = bytes.fromhex(named)
        except ValueError:
            ceremony = b""
        found = await self.signin.state.run("take_ceremony", ceremony) if ceremony else None
        if found is None or found[1] != purpose:
            raise PasskeyError("the passkey request expired or was already answered; "
                               "try again")
        return found[0], found[2], found[3]

    async def verify_assertion(self, request, challenge: bytes, answer: str):
        """(user, verified user) of a passkey's answer to `challenge`, its counter moved
        on; PasskeyError when it does not prove the passkey."""
        from webauthn import verify_authentication_response
        from webauthn.helpers.exceptions import WebAuthnException
        state = self.signin.state
        try:
            credential = json.loads(answer)
            cred_id = from_b64url(credential["rawId"])
        except (ValueError, KeyError, TypeError) as exc:
            raise PasskeyError("the passkey's answer is malformed") from exc
        stored = await state.run("passkey", cred_id)
        if stored is None:
            raise PasskeyError("this passkey is not (or no longer) registered here")
        user, public_key, count = stored
        rp_id, origin = relying_party(self.signin.cfg, request)
        try:
            verified = verify_authentication_response(
                credential=credential, expected_challenge=challenge, expected_rp_id=rp_id,
                expected_origin=origin, credential_public_key=public_key,
                credential_current_sign_count=count)
        except (WebAuthnException, ValueError, KeyError, TypeError) as exc:
            raise PasskeyError(f"the passkey's answer does not verify ({exc})") from exc
        handle = (credential.get("response") or {}).get("userHandle")
        if handle and from_b64url(handle) != user_handle(await state.secret(), user):
            raise PasskeyError("the passkey's answer names another user")
        if not await state.run("use_passkey", cred_id, verified.new_sign_count):
            raise PasskeyError("the passkey's counter did not go up: a replayed answer "
                               "or a cloned authenticator")
        return user, verified.user_verified

    async def register(self, request, user: str, hashed: bytes, answer: str,
                       name: str) -> None:
        """Add the passkey of a registration answer to `user`'s; PasskeyError when it
        does not verify or was not asked for by this session."""
        from webauthn import verify_registration_response
        from webauthn.helpers.exceptions import WebAuthnException
        challenge, for_user, bound = await self.take(request, REGISTER)
        if for_user != user or bound != hashed:
            raise PasskeyError("the passkey request was made for another session")
        rp_id, origin = relying_party(self.signin.cfg, request)
        try:
            verified = verify_registration_response(
                credential=json.loads(answer), expected_challenge=challenge,
                expected_rp_id=rp_id, expected_origin=origin)
        except (WebAuthnException, ValueError, KeyError, TypeError) as exc:
            raise PasskeyError(f"the new passkey does not verify ({exc})") from exc
        state = self.signin.state
        if await state.run("passkey", verified.credential_id) is not None:
            raise PasskeyError("this passkey is registered already")
        await state.run("add_passkey", user, verified.credential_id,
                        name or f"passkey {time.strftime('%Y-%m-%d')}",
                        verified.credential_public_key, verified.sign_count)

    async def may_change(self, user, factors: str) -> bool:
        """A session of `factors` may add or remove `user`'s factors (see the module)."""
        if two_factors(factors):
            return True
        state = self.signin.state
        return not (user.totp or await state.run("passkeys", user.name)
                    or await state.run("recovery_left", user.name))


class Options(_FormPath):
    """POST purpose=signin|register: a ceremony's options, JSON."""

    def __init__(self, passkeys: Passkeys) -> None:
        super().__init__(passkeys.signin)
        self.passkeys = passkeys

    async def show(self, request) -> None:
        await request.send(405, [(b"allow", b"POST")], b"")

    async def submit(self, request, form: dict[str, str]) -> None:
        passkeys, signin = self.passkeys, self.signin
        if form.get("purpose") == REGISTER:
            found = await signin.cookie_session(request)
            user = signin.cfg.user(found[1]) if found else None
            if user is None or not await passkeys.may_change(user, found[2]):
                await _json(request, 403, {"error": "sign in (with a second factor, when "
                                           "the account has one) to add a passkey"})
                return
            mine = await signin.state.run("passkeys", user.name)
            if len(mine) >= MAX_PASSKEYS:
                await _json(request, 409, {"error": f"at most {MAX_PASSKEYS} passkeys"})
                return
            started = await passkeys.start(request, REGISTER, user.name, found[0],
                                           [row[0] for row in mine])
        else:
            started = await passkeys.start(request, SIGNIN)
        if started is None:
            TALLY.event("signin_refused")
            await _json(request, 503, {"error": "too many passkey sign-ins under way; try "
                                       "again in a minute"}, [(b"retry-after", b"60")])
            return
        options, cookie = started
        await _json(request, 200, options, [cookie])


class PasskeySignIn(_FormPath):
    """POST credential=<the browser's answer, JSON>, next, and optionally user and
    password: sign in with the passkey (alone, or after the password)."""

    passkeys: Passkeys

    async def show(self, request) -> None:
        await request.send(303, [(b"location", LOGIN_PATH.encode())], b"")

    async def submit(self, request, form: dict[str, str]) -> None:
        signin, passkeys = self.signin, self.passkeys
        next_url = safe_next(form.get("next"))
        named, password = form.get("user", ""), form.get("password", "")
        try:
            challenge, _user, _bound = await passkeys.take(request, SIGNIN)
            if named or password:
                factors = await self._after_password(request, form, challenge)
                if factors is None:
                    return                     # answered (429)
                user = named
            else:
                user, uv = await passkeys.verify_assertion(request, challenge,
                                                           form.get("credential", ""))
                factors = f"{PASSKEY} {VERIFIED}" if uv else PASSKEY
            if signin.cfg.user(user) is None:
                raise PasskeyError("this passkey's user is no longer configured")
        except PasskeyError as exc:
            signin.failed(request)                                   # as a wrong password
            await signin.page(request, 401, next_url, f"Passkey refused: {exc}.")
            return
        TALLY.event("signin_success")
        await signin.start_session(request, user, next_url, factors)

    async def _after_password(self, request, form, challenge: bytes) -> str | None:
        """PASSWORD PASSKEY when the password is the named user's and the passkey
        theirs; None when the sign-in must wait (answered 429 here)."""
        signin = self.signin
        user = signin.cfg.user(form.get("user", ""))
        account = user.name if user else ""
        trusted = bool(account) and await signin.cookie_user(request) == account
        if not await signin.attempt(request, account, trusted):
            return None
        owner, _uv = await self.passkeys.verify_assertion(request, challenge,
                                                          form.get("credential", ""))
        loop = asyncio.get_running_loop()
        ok = await loop.run_in_executor(None, verify_password,
                                        user.password if user else None,
                                        form.get("password", ""))
        if not ok or owner != account:
            raise PasskeyError("wrong user or password, or not this user's passkey")
        return f"{PASSWORD} {PASSKEY}"


class Account(_FormPath):
    """The signed-in user's page: passkeys (add, rename, revoke) and recovery codes."""

    passkeys: Passkeys

    async def show(self, request, message: str = "") -> None:
        found = await self.signin.cookie_session(request)
        if found is None:
            await request.send(303, [(b"location", login_url(ACCOUNT_PATH).encode()),
                                     (b"cache-control", b"no-store")], b"")
            return
        _hashed, name, factors = found
        state = self.signin.state
        rows = await state.run("passkeys", name)
        left = await state.run("recovery_left", name)
        user = self.signin.cfg.user(name)
        may = await self.passkeys.may_change(user, factors)
        await self.signin._form_page(
            request, 200, ACCOUNT_PATH, "Your account",
            _account_fields(request, name, factors, rows, left, may, message), "Save names",
            _ACCOUNT_AFTER if may else "")

    async def submit(self, request, form: dict[str, str]) -> None:
        signin = self.signin
        found = await signin.cookie_session(request)
        if found is None:
            await request.send(303, [(b"location", login_url(ACCOUNT_PATH).encode())], b"")
            return
        hashed, name, factors = found
        user = signin.cfg.user(name)
        if not await self.passkeys.may_change(user, factors):
            await self.show(request, "Sign in with a second factor to change these.")
            return
        action, state = form.get("action", "rename"), signin.state
        try:
            if "revoke" in form:
                await state.run("remove_passkey", from_b64url(form["revoke"]), name)
            elif action == "add":
                await self.passkeys.register(request, name, hashed,
                                             form.get("credential", ""), _name(form))
            elif action == "recovery":
                await self._new_codes(request, name)
                return
            else:                                 # rename: one field per passkey
                for key, value in form.items():
                    if key.startswith("name:"):
                        await state.run("rename_passkey", from_b64url(key[5:]), name,
                                        value.strip()[:MAX_NAME])
        except PasskeyError as exc:
            await self.show(request, f"Not done: {exc}.")
            return
        await request.send(303, [(b"location", ACCOUNT_PATH.encode()),
                                 (b"cache-control", b"no-store")], b"")

    async def _new_codes(self, request, name: str) -> None:
        """Ten new codes replace the old ones; shown on this page only, once."""
        codes = recovery.new_codes()
        await self.signin.state.run("set_recovery_codes", name,
                                    [recovery.code_hash(name, c) for c in codes])
        items = "".join(f"<li><code>{c}</code></li>" for c in codes)
        body = _page_html(self.signin.cfg.title, f"""<main><h1>Recovery codes</h1>
<p>Each signs in once in place of the second factor. Keep them somewhere safe: they are
not shown again, and the old ones no longer work.</p><ol>{items}</ol>
<p><a href="{ACCOUNT_PATH}">Back to your account</a></p></main>""")
        await request.send(200, _PAGE_HEADERS, body)


class Script:
    """The pages' script, one file served from memory."""

    is_async = True

    def __init__(self) -> None:
        self.body = resources.files("nestgate.handlers.auth").joinpath("passkey.js").read_bytes()

    async def handle(self, request) -> None:
        await request.send(200, [(b"content-type", b"text/javascript; charset=utf-8"),
                                 (b"cache-control", b"no-cache"),
                                 (b"x-content-type-options", b"nosniff")], self.body)


async def _json(request, status: int, value, headers=()) -> None:
    await request.send(status, [(b"content-type", b"application/json"),
                                (b"cache-control", b"no-store"), *headers],
                       json.dumps(value).encode())


def _name(form: dict[str, str]) -> str:
    name = form.get("name", "").strip()[:MAX_NAME]
    return "".join(c for c in name if c.isprintable())


def _when(stamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(stamp)) if stamp else "never"


def _account_fields(request, name: str, factors: str, rows, left: int, may: bool,
                    message: str) -> str:
    esc = html.escape
    note = f'<p class="err" role="alert">{esc(message)}</p>' if message else ""
    keys = "".join(
        f'<li><input name="name:{b64url(cid)}" value="{esc(label)}" maxlength="{MAX_NAME}" '
        f'aria-label="name"> <small>added {_when(created)}, last used {_when(used)}</small> '
        f'<button name="revoke" value="{b64url(cid)}">Revoke</button></li>'
        for cid, _user, label, _count, created, used in rows) or "<li>none yet</li>"
    locked = "" if may else ("<p>Sign in with a second factor to add or remove passkeys "
                             "and recovery codes.</p>")
    # Enter in a name field presses the form's first button: saving, not a revoke.
    default = '<button name="action" value="rename" hidden tabindex="-1"></button>'
    return (f"{default}{_entering(request)}{note}<p>Signed in as <b>{esc(name)}</b> "
            f"(with: {esc(factors)}).</p>{locked}<h2>Passkeys</h2><ul>{keys}</ul>"
            f"<p>Recovery codes left: <b>{left}</b></p>")


# After the account form's button: add a passkey (the script runs the ceremony and posts
# action=add) and make new recovery codes.
_ACCOUNT_AFTER = (
    '<p><label>New passkey\'s name <input id="passkey-name" maxlength="60"></label>'
    '<button type="button" id="passkey-add" hidden>Add a passkey</button>'
    '<small id="passkey-note" class="err" role="alert"></small></p>'
    '<p><button name="action" value="recovery">Make new recovery codes</button></p>'
    f'<script src="{PASSKEY_SCRIPT}" defer></script>')
