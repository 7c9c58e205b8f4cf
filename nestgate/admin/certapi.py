"""Certificates through the admin API:

    PUT /v1/certificates/{name}   {"cert": "<PEM chain>", "key": "<PEM key>"}

the same as `nestgate cert install` (nestgate.certs.install): checked (key, chain,
dates, name, not earlier than the one it replaces), stored under the name's lock, and
served by every worker within a second. The audit log records the name and the new
expiry, never the key.
"""

from __future__ import annotations

import asyncio

from nestgate.admin.replies import method_not_allowed, parse_json

MAX_PEM = 64 * 1024


class CertificateInstall:
    is_async = True
    __slots__ = ("settings", "audit", "error", "reply")

    def __init__(self, settings, audit, error, reply) -> None:
        self.settings = settings          # ConfigAPI: `current()` is the serving config
        self.audit = audit
        self.error = error
        self.reply = reply

    async def handle(self, request) -> None:
        if request.method != b"PUT":
            await request.send_prebuilt(method_not_allowed("PUT"))
            return
        raw = await request.body.read_all() if request.body is not None else b""
        try:
            body = parse_json(raw)
            cert, key = body["cert"], body["key"]
            if not isinstance(cert, str) or not isinstance(key, str) or \
                    len(cert) > MAX_PEM or len(key) > MAX_PEM:
                raise TypeError
        except (ValueError, KeyError, TypeError):
            await request.send_prebuilt(self.error(
                422, "invalid_certificate", "expected a JSON object with \"cert\" (the PEM "
                "chain, leaf first) and \"key\" (its PEM private key), strings of at most "
                f"{MAX_PEM} characters"))
            return
        from nestgate.certs.install import install_certificate
        config = self.settings.current()
        outcome = await asyncio.to_thread(install_certificate, config,
                                          request.params["name"], cert.encode(),
                                          key.encode(), "admin API")
        if not outcome.ok:
            code = {404: "not_found", 409: "locked", 422: "invalid_certificate",
                    503: "state_unavailable"}[outcome.status]
            await request.send_prebuilt(self.error(outcome.status, code, outcome.problem))
            return
        self.audit(request, "certificate.install", {"name": outcome.name,
                                                    "not_after": outcome.not_after})
        await self.reply(request, 200, {"name": outcome.name, "sources": list(outcome.kinds),
                                        "not_after": outcome.not_after})
