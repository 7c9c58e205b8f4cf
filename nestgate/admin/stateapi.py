"""The shared state in the config's `[auth] store` through the admin API: the same
store every worker polls, so a change is in force everywhere within a second, without
a reload.

    GET    /v1/allow                  the dynamic allow-list entries in force
    POST   /v1/allow                  {"cidr": "203.0.113.7", "ttl": "2h", "comment": ""}
                                      (0.0.0.0/0, ::/0: 400 without "allow_everyone": true)
    DELETE /v1/allow/{id}             204, or 404 when there is no such entry
    GET    /v1/sessions               the live sign-in sessions (never their secret)
    DELETE /v1/sessions/{id}          revoke one
    DELETE /v1/users/{name}/sessions  revoke all of a user's
    DELETE /v1/users/{name}/providers unbind the provider accounts the user signed in
                                      through first (the next sign-in binds anew)
    GET    /v1/passkeys               the registered passkeys (?user=NAME: one user's)
    DELETE /v1/passkeys/{id}          revoke one (its id: the credential id, base64url)
"""

from __future__ import annotations

from nestgate.admin.replies import method_not_allowed, parse_json
from nestgate.base.clientip import Networks, covers_every_address
from nestgate.base.units import parse_duration

MAX_COMMENT = 200
# What a POST to /v1/allow (and `nestgate allow add`) sends to mean an entry that holds
# every address: without it such an entry is refused, as it opens every site with
# allow_dynamic (the default), protected ones past sign-in, to everyone.
ALLOW_EVERYONE = "allow_everyone"


def every_address_refused(cidr: str, to_mean_it: str = f'send "{ALLOW_EVERYONE}": true') -> str:
    """Why `cidr`, an entry that holds every address, is refused unless asked for:
    `to_mean_it` says how to ask."""
    return (f"cidr: {cidr} holds every address: as a dynamic allow entry it would let "
            "anyone through every access list with allow_dynamic, and past sign-in on "
            f"protected sites; {to_mean_it} if that is meant")


class StoreEndpoint:
    """What the store's endpoints share: no store -> 409, a store that cannot be used
    now -> 503, a method the path does not answer -> 405. `answer` does the rest."""

    is_async = True
    __slots__ = ("store_path", "audit", "error", "reply")
    missing = "the config has no [auth] store to keep this in"   # the 409's detail

    def __init__(self, store_path: str, audit, error, reply) -> None:
        self.store_path = store_path      # "" when the config has no [auth] store
        self.audit = audit                # audit(request, action, details)
        self.error = error                # nestgate.admin.api.error
        self.reply = reply                # reply(request, status, value)

    async def handle(self, request) -> None:
        if not self.store_path:
            await request.send_prebuilt(self.error(409, "no_store", self.missing))
            return
        from nestgate.handlers.auth.store import store_errors
        try:
            allowed = await self.answer(request)
        except store_errors() as exc:
            await request.send_prebuilt(self.error(503, "store_unavailable",
                                                   f"the store cannot be used now: {exc}"))
            return
        if allowed:
            await request.send_prebuilt(method_not_allowed(allowed))

    async def answer(self, request) -> str:
        """Answer the request; or return the methods the path allows (405)."""
        raise NotImplementedError

    def store(self):
        from nestgate.handlers.auth.store import open_store
        return open_store(self.store_path)

    def ask(self, method: str, *args):
        """`Store.<method>(*args)` on a store opened for this one question."""
        store = self.store()
        try:
            return getattr(store, method)(*args)
        finally:
            store.close()

    async def removed(self, request, found: bool, what: str, action: str, shown) -> None:
        """204 when something was `found` (and removed), audited as `action` with id
        `shown`; else 404 naming `what`."""
        if not found:
            await self.not_found(request, what)
            return
        self.audit(request, action, {"id": shown})
        await self.deleted(request)

    async def not_found(self, request, what: str) -> None:
        await request.send_prebuilt(self.error(404, "not_found", f"no such {what}"))

    async def deleted(self, request) -> None:
        request.start(204, [("cache-control", "no-store")], 0)
        request.end()


class AllowList(StoreEndpoint):
    __slots__ = ()

    async def answer(self, request) -> str:
        entry_id = request.params.get("id")
        method = request.method
        if entry_id is None and method in (b"GET", b"HEAD"):
            await self.reply(request, 200, {"entries": self._entries()})
        elif entry_id is None and method == b"POST":
            await self._add(request)
        elif entry_id is not None and method == b"DELETE":
            await self._remove(request, entry_id)
        else:
            return "GET, HEAD, POST" if entry_id is None else "DELETE"
        return ""

    def _entries(self) -> list[dict]:
        store = self.store()
        try:
            return [{"id": i, "cidr": cidr, "expires": round(expires, 3), "comment": comment}
                    for i, cidr, expires, comment in store.allow_entries()]
        finally:
            store.close()

    async def _add(self, request) -> None:
        raw = await request.body.read_all() if request.body is not None else b""
        problem, entry = _entry(raw)
        if problem:
            await request.send_prebuilt(self.error(422, "invalid_entry", problem))
            return
        everyone = entry.pop(ALLOW_EVERYONE)
        if covers_every_address(entry["cidr"]) and not everyone:
            await request.send_prebuilt(self.error(400, "every_address",
                                                   every_address_refused(entry["cidr"])))
            return
        store = self.store()
        try:
            entry_id = store.add_allow(entry["cidr"], entry["ttl"], entry["comment"])
        finally:
            store.close()
        self.audit(request, "allow.add", {"id": entry_id, **entry})
        await self.reply(request, 201, {"id": entry_id, **entry})

    async def _remove(self, request, entry_id: str) -> None:
        if not entry_id.isdigit():
            await self.not_found(request, "entry")
            return
        await self.removed(request, self.ask("remove_allow", int(entry_id)), "entry",
                           "allow.remove", int(entry_id))


class Sessions(StoreEndpoint):
    """A session is shown by an id made from its token's hash (never the token, which
    is all a cookie thief would need). A revoked session is refused on every worker
    within a second (workers trust a checked session for `portal.RECHECK`)."""

    __slots__ = ()

    async def answer(self, request) -> str:
        method, params = request.method, request.params
        if "user" in params:
            if method != b"DELETE":
                return "DELETE"
            store = self.store()
            try:
                count = store.delete_user_sessions(params["user"])
            finally:
                store.close()
            self.audit(request, "sessions.revoke_user", {"user": params["user"],
                                                         "revoked": count})
            await self.reply(request, 200, {"revoked": count})
        elif "id" in params:
            if method != b"DELETE":
                return "DELETE"
            session_id = params["id"]
            found = len(session_id) == SESSION_ID_HEX and \
                self.ask("delete_session_by_id", session_id)
            await self.removed(request, found, "session", "sessions.revoke", session_id)
        elif method in (b"GET", b"HEAD"):
            store = self.store()
            try:
                rows = store.live_sessions()
            finally:
                store.close()
            await self.reply(request, 200, {"sessions": [
                {"id": hashed.hex()[:SESSION_ID_HEX], "user": user, "client": ip,
                 "created": round(created, 3), "last_seen": round(seen, 3),
                 "expires": round(expires, 3), "factors": factors.split()}
                for hashed, user, created, expires, ip, seen, factors in rows]})
        else:
            return "GET, HEAD"
        return ""


SESSION_ID_HEX = 16


class ProviderBindings(StoreEndpoint):
    """A configured user's bindings to provider accounts (nestgate.handlers.auth.oidc.
    client.bound_subject), undone when the person's account at a provider was made
    anew: the next sign-in through each provider binds the account it comes from."""

    __slots__ = ()

    async def answer(self, request) -> str:
        if request.method != b"DELETE":
            return "DELETE"
        user = request.params["user"]
        count = self.ask("unbind_subjects", user)
        self.audit(request, "users.unbind_providers", {"user": user, "unbound": count})
        await self.reply(request, 200, {"unbound": count})
        return ""


class Passkeys(StoreEndpoint):
    """The users' passkeys: who, what they named it, its counter, when it was added and
    last used (never its public key). A revoked passkey signs in nowhere from the next
    attempt: each sign-in asks the store for it."""

    __slots__ = ()

    async def answer(self, request) -> str:
        method, params = request.method, request.params
        if "id" in params:
            if method != b"DELETE":
                return "DELETE"
            from nestgate.handlers.auth.passkeys import PasskeyError, from_b64url
            try:
                found = self.ask("remove_passkey", from_b64url(params["id"]))
            except PasskeyError:                   # not base64url: no such passkey
                found = False
            await self.removed(request, found, "passkey", "passkeys.revoke", params["id"])
        elif method in (b"GET", b"HEAD"):
            from urllib.parse import parse_qs
            from nestgate.handlers.auth.passkeys import b64url
            user = parse_qs(request.query.decode("latin-1")).get("user", [""])[0]
            rows = self.ask("passkeys", user)
            await self.reply(request, 200, {"passkeys": [
                {"id": b64url(cred_id), "user": owner, "name": name, "sign_count": count,
                 "created": round(created, 3), "last_used": round(used, 3)}
                for cred_id, owner, name, count, created, used in rows]})
        else:
            return "GET, HEAD"
        return ""


def _entry(raw: bytes) -> tuple[str, dict]:
    """The entry a POST body asks for, or what is wrong with it."""
    try:
        data = parse_json(raw)
    except ValueError as exc:
        return f'expected a JSON object {{"cidr": ..., "ttl": ..., "comment": ...}}: {exc}', {}
    if not isinstance(data, dict):
        return "expected a JSON object", {}
    unknown = set(data) - {"cidr", "ttl", "comment", ALLOW_EVERYONE}
    if unknown:
        return f"unknown field: {sorted(unknown)[0]}", {}
    cidr = data.get("cidr")
    if not isinstance(cidr, str):
        return "cidr: expected an address or CIDR as a string", {}
    try:
        Networks([cidr])
    except ValueError as exc:
        return f"cidr: {exc}", {}
    from nestgate.handlers.auth.store import DEFAULT_TTL
    ttl_text = data.get("ttl", DEFAULT_TTL)
    try:
        ttl = parse_duration(ttl_text)          # a string, or a number of seconds
    except ValueError as exc:
        return f"ttl: expected a duration such as \"2h\" ({exc})", {}
    if not 0 < ttl <= 366 * 86400:
        return "ttl: expected a duration above zero and at most a year", {}
    comment = data.get("comment", "")
    if not isinstance(comment, str) or len(comment) > MAX_COMMENT:
        return f"comment: expected a string of at most {MAX_COMMENT} characters", {}
    everyone = data.get(ALLOW_EVERYONE, False)
    if not isinstance(everyone, bool):
        return f"{ALLOW_EVERYONE}: expected true or false", {}
    return "", {"cidr": cidr.strip(), "ttl": ttl, "comment": comment, ALLOW_EVERYONE: everyone}
