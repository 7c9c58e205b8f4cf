"""The admin API's answers: JSON bodies and the one error shape
`{"error": {"code", "message", "details"}}`, shared by every endpoint module."""

from __future__ import annotations

import json

from nestgate.base.jsonbody import read_json
from nestgate.base.responses import Prebuilt


def error(status: int, code: str, message: str, details=None, headers=()) -> Prebuilt:
    body = {"error": {"code": code, "message": message, "details": details or {}}}
    return Prebuilt(status, as_json(body), "application/json",
                    [("cache-control", "no-store"), *headers])


def method_not_allowed(allowed: str) -> Prebuilt:
    """405 naming the methods the path answers (RFC 9110 requires Allow)."""
    return error(405, "method_not_allowed", f"this endpoint answers {allowed}",
                 headers=[("allow", allowed)])


def parse_json(raw: bytes):
    """The JSON value of a request body. Anything that is not strictly one raises
    ValueError saying why (nestgate.base.jsonbody)."""
    return read_json(raw)


def as_json(value) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=False).encode() + b"\n"


async def reply(request, status: int, value) -> None:
    body = as_json(value)
    request.start(status, [("content-type", "application/json"),
                           ("cache-control", "no-store")], len(body))
    if request.method != b"HEAD":
        await request.write(body)
    request.end()
