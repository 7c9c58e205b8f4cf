"""`/v1/allow`: the dynamic allow-list, the same entries as `nestgate allow` in the
config's `[auth] store`, which every worker polls (a change is in force everywhere
within a second, without a reload).

    GET    /v1/allow        the entries in force
    POST   /v1/allow        {"cidr": "203.0.113.7", "ttl": "2h", "comment": "..."} -> 201
    DELETE /v1/allow/{id}   204, or 404 when there is no such entry
"""

from __future__ import annotations

import json
import sqlite3

from nestgate.allowcli import DEFAULT_TTL
from nestgate.clientip import Networks
from nestgate.units import parse_duration

MAX_COMMENT = 200


class AllowList:
    is_async = True
    __slots__ = ("store_path", "audit", "error", "reply")

    def __init__(self, store_path: str, audit, error, reply) -> None:
        self.store_path = store_path      # "" when the config has no [auth] store
        self.audit = audit                # audit(request, action, details)
        self.error = error                # nestgate.admin.api.error
        self.reply = reply                # reply(request, status, value)

    async def handle(self, request) -> None:
        if not self.store_path:
            await request.send_prebuilt(self.error(
                409, "no_store", "the config has no [auth] store to keep allow entries in"))
            return
        entry_id = request.params.get("id")
        method = request.method
        try:
            if entry_id is None and method in (b"GET", b"HEAD"):
                await self.reply(request, 200, {"entries": self._entries()})
            elif entry_id is None and method == b"POST":
                await self._add(request)
            elif entry_id is not None and method == b"DELETE":
                await self._remove(request, entry_id)
            else:
                allowed = "GET, HEAD, POST" if entry_id is None else "DELETE"
                await request.send_prebuilt(self.error(
                    405, "method_not_allowed", f"this endpoint answers {allowed}",
                    headers=[("allow", allowed)]))
        except sqlite3.Error as exc:
            await request.send_prebuilt(self.error(503, "store_unavailable",
                                                   f"the store cannot be used now: {exc}"))

    def _open(self):
        from nestgate.auth.store import Store
        return Store(self.store_path)

    def _entries(self) -> list[dict]:
        store = self._open()
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
        store = self._open()
        try:
            entry_id = store.add_allow(entry["cidr"], entry["ttl"], entry["comment"])
        finally:
            store.close()
        self.audit(request, "allow.add", {"id": entry_id, **entry})
        await self.reply(request, 201, {"id": entry_id, **entry})

    async def _remove(self, request, entry_id: str) -> None:
        if not entry_id.isdigit():
            await request.send_prebuilt(self.error(404, "not_found", "no such entry"))
            return
        store = self._open()
        try:
            removed = store.remove_allow(int(entry_id))
        finally:
            store.close()
        if not removed:
            await request.send_prebuilt(self.error(404, "not_found", "no such entry"))
            return
        self.audit(request, "allow.remove", {"id": int(entry_id)})
        request.start(204, [("cache-control", "no-store")], 0)
        request.end()


def _entry(raw: bytes) -> tuple[str, dict]:
    """The entry a POST body asks for, or what is wrong with it."""
    try:
        data = json.loads(raw)
    except ValueError:
        return 'expected a JSON object {"cidr": ..., "ttl": ..., "comment": ...}', {}
    if not isinstance(data, dict):
        return "expected a JSON object", {}
    unknown = set(data) - {"cidr", "ttl", "comment"}
    if unknown:
        return f"unknown field: {sorted(unknown)[0]}", {}
    cidr = data.get("cidr")
    if not isinstance(cidr, str):
        return "cidr: expected an address or CIDR as a string", {}
    try:
        Networks([cidr])
    except ValueError as exc:
        return f"cidr: {exc}", {}
    ttl_text = data.get("ttl", DEFAULT_TTL)
    try:
        ttl = parse_duration(ttl_text) if isinstance(ttl_text, str) else float(ttl_text)
    except (ValueError, TypeError) as exc:
        return f"ttl: expected a duration such as \"2h\" ({exc})", {}
    if not 0 < ttl <= 366 * 86400:
        return "ttl: expected a duration above zero and at most a year", {}
    comment = data.get("comment", "")
    if not isinstance(comment, str) or len(comment) > MAX_COMMENT:
        return f"comment: expected a string of at most {MAX_COMMENT} characters", {}
    return "", {"cidr": cidr.strip(), "ttl": ttl, "comment": comment}
