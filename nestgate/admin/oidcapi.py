"""The OpenID provider through the admin API: its clients (from the config, never a
secret's hash) and the grants it holds in the shared store.

    GET    /v1/oidc/clients        the configured [[auth.client]] entries
    GET    /v1/oidc/grants         the live grants: client, user, scope, times
    DELETE /v1/oidc/grants/{id}    end one: its access and refresh tokens stop working
"""

from __future__ import annotations

from nestgate.admin.stateapi import StoreEndpoint
from nestgate.handlers.auth.oidc.state import is_grant_id


class Grants(StoreEndpoint):
    """A grant is shown by its id (random, not derived from any token)."""

    __slots__ = ()

    async def answer(self, request) -> str:
        from nestgate.handlers.auth.oidc.state import provider_state
        grant_id = request.params.get("id")
        method = request.method
        if grant_id is None and method not in (b"GET", b"HEAD"):
            return "GET, HEAD"
        if grant_id is not None and method != b"DELETE":
            return "DELETE"
        if grant_id is not None and not is_grant_id(grant_id):
            await self.not_found(request, "grant")    # not even the store is asked
            return ""
        store = self.store()
        try:
            state = provider_state(store)
            if grant_id is None:
                grants = state.live_grants()
            else:
                found = state.delete_grant(grant_id)
        finally:
            store.close()
        if grant_id is None:
            await self.reply(request, 200, {"grants": [_shown(g) for g in grants]})
        elif not found:
            await self.not_found(request, "grant")
        else:
            self.audit(request, "oidc.revoke_grant", {"id": grant_id})
            await self.deleted(request)
        return ""


def _shown(grant: dict) -> dict:
    return {"id": grant["id"], "client_id": grant["client_id"], "user": grant["user"],
            "scope": grant["scope"], "created": round(grant["created"], 3),
            "auth_time": round(grant["auth_time"], 3),
            "access_expires": round(grant["access_expires"], 3),
            "refresh_expires": round(grant["refresh_expires"], 3)}
