"""The config through the admin API.

    GET  /v1/config            the effective config of the serving generation, secrets
                               redacted (tokens, password hashes, TOTP secrets, client
                               secrets and their hashes, keys)
    POST /v1/config/validate   a TOML body: the problems `nestgate check` would list, as
                               {"file", "key", "message"} objects (422), or 200 with
                               the warnings it would print
    POST /v1/config/reload     reload from the file as SIGHUP does, and wait for the
                               result: 200 with what changed (sites, routes, listeners
                               added and removed) once the new workers serve, 422 with
                               the reasons when it is refused (the running config stays)
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import time
from pathlib import Path

from nestgate.admin.replies import method_not_allowed
from nestgate.base.tomltext import read_toml
from nestgate.config import (ConfigError, config_warnings, parse_config, read_config,
                             with_overrides)

RELOAD_WAIT = 60.0           # seconds a reload may take before the answer says so
MAX_VALIDATE_BYTES = 1 << 20
REDACTED = "<redacted>"
SECRET_KEYS = {"token", "password", "totp", "api_key", "eab_hmac_key", "machine_password"}
# Any field whose name ends so holds a secret or a hash of one: `[[auth.oidc]]
# client_secret`, `[[auth.client]] client_secret_hash`, `tsig_secret`. By suffix, so
# that a secret a later table adds under such a name is not shown by default.
SECRET_SUFFIXES = ("secret", "secret_hash", "password")


def is_secret(name: str) -> bool:
    return name in SECRET_KEYS or name.endswith(SECRET_SUFFIXES)


def redacted(value):
    """The config as plain JSON values, every secret replaced (never the empty ones:
    that a token is unset is worth seeing)."""
    if dataclasses.is_dataclass(value):
        return {f.name: (REDACTED if is_secret(f.name) and getattr(value, f.name)
                         else redacted(getattr(value, f.name)))
                for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): REDACTED if is_secret(str(k)) and v else redacted(v)
                for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [redacted(v) for v in value]
    if isinstance(value, str) and "://" in value:
        from nestgate.handlers.auth.redisstore import shown
        return shown(value) if value.startswith(("redis", "unix")) else value
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def problems_as_json(problems: list[str]) -> list[dict]:
    """`check`'s "file: key: message" lines as objects (a line without a key keeps
    its message whole)."""
    out = []
    for line in problems:
        file, _, rest = line.partition(": ")
        key, sep, message = rest.partition(": ")
        if not sep or " " in key:
            key, message = "", rest
        out.append({"file": file, "key": key, "message": message})
    return out


def changes(old, new) -> dict:
    """What a reload changed: sites (by name), routes (site name and route label) and
    listeners (by address), added and removed."""
    def sites(c):
        return {s.name for s in c.sites}

    def routes(c):
        return {f"{s.name} {r.label}" for s in c.sites for r in s.routes}

    def listeners(c):
        return {f"{l.scheme}://{l.host}:{l.port}" for l in c.listeners}

    out = {}
    for name, of in (("sites", sites), ("routes", routes), ("listeners", listeners)):
        before, after = of(old), of(new)
        out[name] = {"added": sorted(after - before), "removed": sorted(before - after)}
    return out


class ConfigAPI:
    """One handler for the three paths (told apart by `request.path`)."""

    is_async = True
    __slots__ = ("state", "error", "reply", "config", "config_hash", "listen", "workers")

    def __init__(self, state, config, error, reply) -> None:
        self.state = state
        self.error = error
        self.reply = reply
        self.config = config            # the serving generation's, refreshed by `current`
        self.config_hash = ""
        self.listen = None
        self.workers = None

    def current(self):
        """The serving config: re-read when the supervisor reports a new file hash."""
        report = self.state.report.get("config", {})
        digest = report.get("sha256", "")
        if not self.config_hash:
            # The process was started with the config of the supervisor's first report.
            self.config_hash = digest
        elif digest and digest != self.config_hash:
            try:
                self.config = with_overrides(read_config(report["file"]),
                                             report.get("listen"), report.get("workers"))
                self.config_hash = digest
            except ConfigError:
                pass                    # the file changed again since: keep what serves
        return self.config

    async def handle(self, request) -> None:
        path, method = request.path, request.method
        if path == "/v1/config" and method in (b"GET", b"HEAD"):
            await self.reply(request, 200, redacted(self.current()))
        elif path == "/v1/config/validate" and method == b"POST":
            await self._validate(request)
        elif path == "/v1/config/reload" and method == b"POST":
            await self._reload(request)
        else:
            allowed = "GET, HEAD" if path == "/v1/config" else "POST"
            await request.send_prebuilt(method_not_allowed(allowed))

    async def _validate(self, request) -> None:
        raw = await request.body.read_all() if request.body is not None else b""
        try:
            data = read_toml(raw)
        except ValueError as exc:
            await self._invalid(request, [f"<body>: {exc}"])
            return
        base = Path(self.current().source).resolve().parent
        try:
            # Files the body names are looked up beside the running config, as a
            # reload of it would.
            config = parse_config(data, "<body>", base)
        except ConfigError as exc:
            await self._invalid(request, exc.problems)
            return
        await self.reply(request, 200, {"ok": True, "problems": [],
                                        "warnings": problems_as_json(config_warnings(config))})

    def _old_accepting(self) -> bool:
        report = self.state.report
        current = report.get("generation")
        return any(g["accepting"] for g in report.get("generations", ())
                   if g["number"] != current)

    async def _invalid(self, request, problems: list[str]) -> None:
        await request.send_prebuilt(self.error(
            422, "invalid_config", f"{len(problems)} problem(s) in the config",
            {"problems": problems_as_json(problems)}))

    async def _reload(self, request) -> None:
        before = self.current()
        counts = dict(self.state.report.get("reload_counts", {}))
        seen = sum(counts.values())
        supervisor = self.state.report.get("pid") or os.getppid()
        self.state.audit(request, "config.reload", {})
        os.kill(supervisor, signal.SIGHUP)
        deadline = time.monotonic() + RELOAD_WAIT
        result = None
        while time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            report = self.state.report
            if sum(report.get("reload_counts", {}).values()) > seen and report.get("reloads"):
                result = report["reloads"][-1]
                break
        if result is None:
            await request.send_prebuilt(self.error(
                504, "reload_pending", f"no result within {RELOAD_WAIT:.0f} s: the new "
                "workers have not all started; the running config serves meanwhile"))
            return
        while result["ok"] and time.monotonic() < deadline and self._old_accepting():
            # The new workers serve; the old ones are told to stop. Answer once none of
            # them can take a new connection, so a request made after this answer
            # reaches the new config.
            await asyncio.sleep(0.02)
        if not result["ok"]:
            reasons = [r.strip() for r in result["message"].split("\n")[1:] if r.strip()]
            if not reasons:
                # One line after "refused, the running config stays: ": a listener
                # that cannot be bound names the file and key; "cannot start: ..."
                # names neither, and is not to be split as "file: key: message".
                reason = result["message"].partition(": ")[2] or result["message"]
                named = reason.startswith(self.state.report.get("config", {}).get("file", "")
                                          + ": ")
                reasons = [reason if named else f": {reason}"]
            problems = problems_as_json(reasons)
            await request.send_prebuilt(self.error(
                422, "reload_refused", "reload refused, the running config stays",
                {"problems": problems}))
            return
        after = self.current()
        await self.reply(request, 200, {"ok": True, "generation": self.state.report.get(
            "generation"), "changed": changes(before, after),
            "not_applied": result.get("not_applied", [])})
