"""The operator's actions on the workers, through the control frame of the shared table
(nestgate/base/control.py):

    POST /v1/notes/purge        forget every rendered page; each renders on its next request
    POST /v1/notes/reread       read the notes folders again (edits made on disk), and purge
    GET  /v1/upstreams          the proxy routes' upstreams: health, drained, counters
    POST /v1/upstreams/drain    {"route": "/app/*", "upstream": "http://10.0.0.5:3000"}:
                                no new requests to it; those under way finish
    POST /v1/upstreams/undrain  the same body: back into picking

A change is answered once every worker of the serving generation has applied it (200,
with how many), or with 504 after APPLY_WAIT seconds. Drained upstreams are a state:
workers started later (a restart, a reload) apply it too, and it lasts until undrained
or until nestgate stops. Every change goes to the audit log.
"""

from __future__ import annotations

import asyncio
import json
import time

from nestgate.admin.replies import method_not_allowed, parse_json

APPLY_WAIT = 5.0             # seconds to wait for every worker to apply a change


class Operations:
    is_async = True
    __slots__ = ("state", "error", "reply", "wanted")

    def __init__(self, state, error, reply) -> None:
        self.state = state                # nestgate.admin.api.AdminState
        self.error = error
        self.reply = reply
        # What was asked before this admin process started (it may have been restarted).
        _seq, data = state.table.read_control()
        self.wanted = json.loads(data) if data else {"purge": 0, "reread": 0, "drained": []}

    async def handle(self, request) -> None:
        path, method = request.path, request.method
        if path == "/v1/upstreams":
            if method not in (b"GET", b"HEAD"):
                await self._refuse(request, "GET, HEAD")
                return
            self.state.answers.refresh(self.state.table)
            await self.reply(request, 200, {"upstreams": self.state.answers.upstreams()})
            return
        if method != b"POST":
            await self._refuse(request, "POST")
            return
        if path in ("/v1/notes/purge", "/v1/notes/reread"):
            kind = path.rsplit("/", 1)[1]
            self.wanted[kind] += 1
            action, details = f"notes.{kind}", {}
        else:
            pair = await self._upstream(request)
            if pair is None:
                return
            drained = {tuple(p) for p in self.wanted["drained"]}
            if path.endswith("/drain"):
                drained.add(pair)
            else:
                drained.discard(pair)
            self.wanted["drained"] = sorted(drained)
            action = "upstreams." + path.rsplit("/", 1)[1]
            details = {"route": pair[0], "upstream": pair[1]}
        table = self.state.table
        table.write_control(json.dumps(self.wanted, separators=(",", ":")).encode())
        seq = table.read_control()[0]
        self.state.audit(request, action, details)
        applied = await self._applied(seq)
        if applied is None:
            await request.send_prebuilt(self.error(
                504, "not_applied", f"not every worker applied it within {APPLY_WAIT:g} s; "
                "it stays asked for, and workers apply it on their next tick"))
            return
        await self.reply(request, 200, {"applied_by_workers": applied, **details})

    async def _upstream(self, request) -> tuple[str, str] | None:
        raw = await request.body.read_all() if request.body is not None else b""
        try:
            body = parse_json(raw)
            pair = (body["route"], body["upstream"])
            if not all(isinstance(v, str) for v in pair):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            await request.send_prebuilt(self.error(
                422, "invalid_body", 'expected {"route": "...", "upstream": "..."} as '
                "GET /v1/upstreams names them"))
            return None
        self.state.answers.refresh(self.state.table)
        known = {(u["route"], u["upstream"]) for u in self.state.answers.upstreams()}
        if pair not in known:
            await request.send_prebuilt(self.error(404, "not_found", "no such upstream",
                                                   {"route": pair[0], "upstream": pair[1]}))
            return None
        return pair

    async def _applied(self, seq: int) -> int | None:
        """How many workers of the serving generation have applied control `seq`, once
        all have; None if some have not within APPLY_WAIT."""
        state = self.state
        deadline = time.monotonic() + APPLY_WAIT
        while True:
            state.answers.refresh(state.table)
            pids = state.serving_pids()
            if pids and all(state.answers.latest.get(pid, {}).get("control", 0) >= seq
                            for pid in pids):
                return len(pids)
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(0.1)

    async def _refuse(self, request, allowed: str) -> None:
        await request.send_prebuilt(method_not_allowed(allowed))
