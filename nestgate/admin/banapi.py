"""Bans through the admin API: the store every worker polls and the table they all
look clients up in (this process shares it), so a ban added here is in force at the
next accept and one lifted is lifted there too.

    GET    /v1/bans                      every ban in force: network, until, origin,
                                         rule, reason, answer, strikes (CrowdSec's
                                         decisions too, origin "crowdsec", also when
                                         the config keeps no bans of its own)
    POST   /v1/bans                      {"network": "203.0.113.7", "for": "1d",
                                          "reason": "...", "answer": "close" | "403"}
    DELETE /v1/bans/{address}            the ban on that address, or covering it (204, 404)
    DELETE /v1/bans/{address}/{prefix}   the ban on that range
"""

from __future__ import annotations

from nestgate.admin.replies import method_not_allowed, parse_json
from nestgate.admin.stateapi import MAX_COMMENT, StoreEndpoint
from nestgate.bans.table import ANSWERS, FED, ban_table
from nestgate.base.units import parse_duration

DEFAULT_FOR = 86400.0
MOST_FOR = 366 * 86400.0


class Bans(StoreEndpoint):
    __slots__ = ("crowdsec",)
    missing = "the config has no [[ban]] rules and no [bans] table: bans are not kept"

    def __init__(self, store_path: str, audit, error, reply, crowdsec: bool) -> None:
        super().__init__(store_path, audit, error, reply)
        self.crowdsec = crowdsec         # CrowdSec's decisions are in the table to list

    def store(self):
        from nestgate.bans.store import open_bans
        return open_bans(self.store_path)

    async def handle(self, request) -> None:
        # A method the path does not answer is 405 whether or not bans are kept.
        allowed = "DELETE" if "address" in request.params else "GET, HEAD, POST"
        if request.method.decode("latin-1") not in allowed.split(", "):
            await request.send_prebuilt(method_not_allowed(allowed))
            return
        if not self.store_path and self.crowdsec and request.method in (b"GET", b"HEAD") \
                and "address" not in request.params:
            await self.reply(request, 200, {"bans": self._listed()})   # CrowdSec's alone
            return
        await super().handle(request)

    async def answer(self, request) -> str:
        params, method = request.params, request.method
        if "address" in params:
            if method != b"DELETE":
                return "DELETE"
            await self._remove(request, params["address"], params.get("prefix"))
        elif method in (b"GET", b"HEAD"):
            await self.reply(request, 200, {"bans": self._listed()})
        elif method == b"POST":
            await self._add(request)
        else:
            return "GET, HEAD, POST"
        return ""

    def _listed(self) -> list[dict]:
        """The table's bans (every origin), with what the store knows of each."""
        rows = {}
        if self.store_path:
            store = self.store()
            try:
                rows = {row.network: row for row in store.live()}
            finally:
                store.close()
        listed = []
        for ban in ban_table().entries():
            row = rows.pop(ban.network, None) if ban.origin != FED else None
            listed.append(_shown(ban.network, ban.until, ban.origin, row.rule if row else "",
                                 row.reason if row else ban.reason, ban.answer,
                                 row.strikes if row else None))
        # Kept in the store but not yet loaded by a worker (another instance's, just now).
        listed += [_shown(*row) for row in rows.values()]
        return listed

    async def _add(self, request) -> None:
        raw = await request.body.read_all() if request.body is not None else b""
        problem, entry = _ban_entry(raw)
        if problem:
            await request.send_prebuilt(self.error(422, "invalid_ban", problem))
            return
        store = self.store()
        try:
            until, strikes = store.ban(entry["network"], (entry["for"],), 0.0, "operator", "",
                                       entry["reason"], entry["answer"], replace=True)
        finally:
            store.close()
        ban_table().add(entry["network"], until, "operator", entry["reason"], entry["answer"])
        self.audit(request, "ban.add", entry)
        await self.reply(request, 201, _shown(entry["network"], until, "operator", "",
                                              entry["reason"], entry["answer"], strikes))

    async def _remove(self, request, address: str, prefix: str | None) -> None:
        from nestgate.bans.store import lift
        text = address if prefix is None else f"{address}/{prefix}"
        store = self.store()
        try:
            lifted = lift(store, text)
        except ValueError:
            lifted = None
        finally:
            store.close()
        if lifted is None:
            lifted = text if _lift_table(text) else None
        else:
            _lift_table(lifted)
        if lifted is None:
            await self.not_found(request, "ban")
            return
        self.audit(request, "ban.remove", {"network": lifted})
        await self.deleted(request)


def _lift_table(network: str) -> bool:
    try:
        return ban_table().remove(network)
    except ValueError:
        return False


def _shown(network, until, origin, rule, reason, answer, strikes) -> dict:
    return {"network": network, "until": round(until, 3), "origin": origin, "rule": rule,
            "reason": reason, "answer": answer, "strikes": strikes}


def _ban_entry(raw: bytes) -> tuple[str, dict]:
    """The ban a POST body asks for, or what is wrong with it."""
    from nestgate.bans.store import canonical
    try:
        data = parse_json(raw)
    except ValueError as exc:
        return f'expected a JSON object {{"network": ..., "for": ..., "reason": ...}}: {exc}', {}
    if not isinstance(data, dict):
        return 'expected a JSON object {"network": ..., "for": ..., "reason": ...}', {}
    unknown = set(data) - {"network", "for", "reason", "answer"}
    if unknown:
        return f"unknown field: {sorted(unknown)[0]}", {}
    network = data.get("network")
    if not isinstance(network, str):
        return "network: expected an address or CIDR as a string", {}
    try:
        network = canonical(network)
    except ValueError as exc:
        return f"network: {exc}", {}
    length = data.get("for", DEFAULT_FOR)
    try:
        seconds = parse_duration(length)
    except ValueError as exc:
        return f"for: expected {exc}", {}
    if not 0 < seconds <= MOST_FOR:
        return "for: expected a duration above zero and at most a year", {}
    reason = data.get("reason", "operator")
    if not isinstance(reason, str) or len(reason) > MAX_COMMENT:
        return f"reason: expected a string of at most {MAX_COMMENT} characters", {}
    answer = data.get("answer", "close")
    if answer not in ANSWERS:
        return "answer: expected \"close\" or \"403\"", {}
    return "", {"network": network, "for": seconds, "reason": reason, "answer": answer}
