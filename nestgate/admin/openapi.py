"""The OpenAPI 3.1 document of the admin API, served at `/docs/json`.

Written here as data beside the routes it describes; `tests/test_admin.py` checks that
every route of the admin router is in it and nothing else is.
"""

from __future__ import annotations

import json

from nestgate import __version__

_ERROR = {"$ref": "#/components/responses/Error"}
_JSON = "application/json"


def _json(schema: dict, description: str) -> dict:
    return {"description": description, "content": {_JSON: {"schema": schema}}}


def _obj(properties: dict, required=()) -> dict:
    return {"type": "object", "properties": properties, "required": list(required)}


_NUM = {"type": "number"}
_INT = {"type": "integer"}
_STR = {"type": "string"}
_BOOL = {"type": "boolean"}
_STRS = {"type": "array", "items": _STR}
_UPSTREAMS = {"type": "array", "items": _obj(
    {"route": _STR, "upstream": _STR, "healthy": _BOOL, "failing_in_workers": _INT,
     "last_check": {"type": ["number", "null"]}},
    ("route", "upstream", "healthy", "failing_in_workers", "last_check"))}
_UPSTREAM_NAME = _obj({"route": _STR, "upstream": _STR}, ("route", "upstream"))
_UPSTREAM_FULL = _obj(
    {"route": _STR, "upstream": _STR, "healthy": _BOOL, "failing_in_workers": _INT,
     "drained": _BOOL, "last_check": {"type": ["number", "null"]}, "requests": _INT,
     "errors": _INT, "retries": _INT},
    ("route", "upstream", "healthy", "failing_in_workers", "drained", "last_check",
     "requests", "errors", "retries"))
_UPSTREAM_CHANGE = {
    "200": _json(_obj({"applied_by_workers": _INT, "route": _STR, "upstream": _STR},
                      ("applied_by_workers", "route", "upstream")), "done"),
    "404": _ERROR, "422": _ERROR, "504": _ERROR}
_CERTIFICATES = {"type": "array", "items": _obj(
    {"listener": _STR, "file": _STR, "names": {"type": "array", "items": _STR},
     "not_after": _NUM, "expires_in_days": _NUM, "error": _STR,
     "source": {"type": "string", "enum": ["acme", "internal", "installed"]},
     "issuer": _STR, "failures": _INT},
    ("listener", "file", "names"))}
_PROBLEMS = {"type": "array", "items": _obj({"file": _STR, "key": _STR, "message": _STR},
                                             ("file", "key", "message"))}
_WORKER = _obj({"pid": _INT, "ready": _BOOL, "restarts": _INT, "uptime_s": _NUM,
                "requests": _INT, "figures_age_s": _NUM,
                "connections": _obj({"http1": _INT, "http2": _INT, "tls": _INT,
                                     "tls_handshakes": _INT})}, ("pid", "ready", "restarts"))
_STATUS = _obj({
    "version": _STR, "pid": _INT, "uptime_s": _NUM, "generation": {"type": ["integer", "null"]},
    "config": _obj({"file": _STR, "sha256": _STR}),
    "generations": {"type": "array", "items": _obj({
        "number": _INT, "ready": _BOOL, "stopping": _BOOL,
        "workers": {"type": "array", "items": _WORKER}})},
    "listeners": {"type": "array", "items": _obj({"address": _STR, "bound": _BOOL})},
    "worker_restarts": _INT,
    "reloads": {"type": "array", "items": _obj({"at": _NUM, "ok": _BOOL, "message": _STR,
                                                "not_applied": _STRS})},
}, ("version", "generations", "listeners", "reloads"))
_ALLOW_ENTRY = _obj({"id": _INT, "cidr": _STR, "expires": _NUM, "comment": _STR},
                    ("id", "cidr", "expires", "comment"))
_BAN = _obj({"network": _STR, "until": _NUM, "origin": _STR, "rule": _STR, "reason": _STR,
             "answer": _STR, "strikes": {"type": ["integer", "null"]}},
            ("network", "until", "origin", "answer"))
_SESSION = _obj({"id": _STR, "user": _STR, "client": _STR, "created": _NUM,
                 "last_seen": _NUM, "expires": _NUM,
                 "factors": {"type": "array", "items": _STR}},
                ("id", "user", "client", "created", "last_seen", "expires", "factors"))
_CLIENT = _obj({"client_id": _STR, "name": _STR, "public": {"type": "boolean"},
                "redirect_uris": {"type": "array", "items": _STR},
                "scopes": {"type": "array", "items": _STR},
                "allowed_groups": {"type": "array", "items": _STR}, "consent": _STR},
               ("client_id", "public", "redirect_uris", "scopes", "consent"))
_GRANT = _obj({"id": _STR, "client_id": _STR, "user": _STR, "scope": _STR, "created": _NUM,
               "auth_time": _NUM, "access_expires": _NUM, "refresh_expires": _NUM},
              ("id", "client_id", "user", "scope"))
_CREDENTIAL_ID = {"type": "string", "pattern": "^[A-Za-z0-9_-]+$",
                  "description": "the credential id, base64url"}
_PASSKEY = _obj({"id": _STR, "user": _STR, "name": _STR, "sign_count": _INT,
                 "created": _NUM, "last_used": _NUM},
                ("id", "user", "name", "sign_count", "created", "last_used"))
_USER = _obj({"name": _STR, "groups": {"type": "array", "items": _STR},
              "display_name": _STR, "email": _STR, "second_factor": _BOOL},
             ("name", "groups", "display_name", "email", "second_factor"))
_PROVIDER = _obj({"name": _STR, "display_name": _STR, "issuer": _STR, "client_id": _STR,
                  "confidential": _BOOL, "scopes": {"type": "array", "items": _STR},
                  "user_claim": _STR, "groups_claim": _STR,
                  "allowed_users": {"type": "array", "items": _STR},
                  "allowed_groups": {"type": "array", "items": _STR},
                  "allow_unknown": _BOOL, "end_session": _BOOL,
                  "clock_leeway": {"type": "number"}},
                 ("name", "issuer", "client_id", "confidential"))
_CHANGE = _obj({"added": {"type": "array", "items": _STR},
                "removed": {"type": "array", "items": _STR}}, ("added", "removed"))


def _op(summary: str, responses: dict, *, open_: bool = False, body: dict | None = None,
        parameters=(), checked: bool = True) -> dict:
    """An operation. Every one but liveness (`checked=False`) is behind the Host (421),
    Origin and Sec-Fetch-Site (403) and body type (415) checks; all but the `open_`
    ones behind the token (401, 429)."""
    op = {"summary": summary, "responses": {"401": _ERROR, "403": _ERROR, "429": _ERROR,
                                            **responses}}
    if open_:
        op["security"] = []
        for code in ("401", "403", "429"):
            if code not in responses:          # the endpoint's own answers stay
                del op["responses"][code]
    if checked:
        op["responses"] = {"403": _ERROR, "421": _ERROR, **op["responses"]}
    if body is not None:
        op["requestBody"] = {"required": True, "content": body}
        op["responses"]["415"] = _ERROR
    if parameters:                    # names, or (name, schema) pairs
        op["parameters"] = [{"name": p, "in": "path", "required": True, "schema": _STR}
                            if isinstance(p, str) else
                            {"name": p[0], "in": "path", "required": True, "schema": p[1]}
                            for p in parameters]
    return op


def _with_pattern(op: dict, name: str, pattern: str) -> dict:
    """`op` whose path parameter `name` has the given form (any other is a 404)."""
    for parameter in op["parameters"]:
        if parameter["name"] == name:
            parameter["schema"] = {"type": "string", "pattern": pattern}
    return op


def _lift(summary: str, parameters: tuple[str, ...]) -> dict:
    """DELETE of a ban: its path parameters are an address's and a prefix's characters."""
    op = _op(summary, {"204": {"description": "lifted"}, "404": _ERROR, "409": _ERROR,
                       "503": _ERROR}, parameters=parameters)
    _with_pattern(op, "address", "^[0-9A-Fa-f:.]{2,45}$")
    return _with_pattern(op, "prefix", "^[0-9]{1,3}$")


PATHS = {
    "/v1/health": {"get": _op("Liveness: the admin process answers", {
        "200": _json(_obj({"status": {"const": "ok"}}, ("status",)), "alive")}, open_=True,
        checked=False)},
    "/v1/ready": {"get": _op("Readiness of the serving generation and its listeners, with "
                             "the state of the upstreams (which does not decide it)", {
        "200": _json(_obj({"ready": {"const": True}, "generation": _INT,
                           "upstreams": _UPSTREAMS, "certificates": _CERTIFICATES}), "ready"),
        "503": _json(_obj({"ready": {"const": False},
                           "reasons": {"type": "array", "items": _STR},
                           "upstreams": _UPSTREAMS, "certificates": _CERTIFICATES}),
                     "not ready")})},
    "/v1/status": {"get": _op("Version, uptime, config, generations and workers, reloads", {
        "200": _json(_STATUS, "the status")})},
    "/metrics": {"get": _op("Prometheus text exposition 0.0.4", {
        "200": {"description": "the metrics",
                "content": {"text/plain; version=0.0.4": {"schema": _STR}}}})},
    "/v1/config": {"get": _op("The effective config, secrets redacted", {
        "200": _json({"type": "object"}, "the config")})},
    "/v1/config/validate": {"post": _op("The problems `nestgate check` would list", {
        "200": _json(_obj({"ok": {"const": True}, "problems": {"type": "array"},
                           "warnings": {"type": "array"}}), "valid (with `check`'s warnings)"),
        "422": _ERROR}, body={"application/toml": {"schema": _STR}})},
    "/v1/config/reload": {"post": _op("Reload from the file and wait for the result", {
        "200": _json(_obj({"ok": {"const": True}, "generation": _INT, "changed": _obj(
            {"sites": _CHANGE, "routes": _CHANGE, "listeners": _CHANGE}),
            "not_applied": _STRS}), "reloaded (`not_applied`: the [admin] keys whose "
            "change takes effect at restart)"),
        "422": _ERROR, "504": _ERROR})},
    "/v1/allow": {
        "get": _op("The dynamic allow-list entries in force", {
            "200": _json(_obj({"entries": {"type": "array", "items": _ALLOW_ENTRY}},
                              ("entries",)), "the entries"), "409": _ERROR, "503": _ERROR}),
        "post": _op("Add an entry (one that holds every address needs allow_everyone)", {
            "201": _json(_obj({"id": _INT, "cidr": _STR, "ttl": _NUM, "comment": _STR}),
                         "added"), "400": _ERROR, "409": _ERROR, "422": _ERROR, "503": _ERROR},
            body={_JSON: {"schema": _obj({"cidr": _STR, "ttl": {"type": ["string", "number"]},
                                          "comment": _STR, "allow_everyone": _BOOL},
                                         ("cidr",))}})},
    "/v1/allow/{id}": {"delete": _op("Remove an entry", {
        "204": {"description": "removed"}, "404": _ERROR, "409": _ERROR, "503": _ERROR},
        parameters=("id",))},
    "/v1/bans": {
        "get": _op("Every ban in force (rules', the operator's, CrowdSec's decisions)", {
            "200": _json(_obj({"bans": {"type": "array", "items": _BAN}}, ("bans",)),
                         "the bans"), "409": _ERROR, "503": _ERROR}),
        "post": _op("Ban an address or range (in force at every worker's next accept)", {
            "201": _json(_BAN, "banned"), "409": _ERROR, "422": _ERROR, "503": _ERROR},
            body={_JSON: {"schema": _obj({"network": _STR,
                                          "for": {"type": ["string", "number"]},
                                          "reason": _STR, "answer": _STR}, ("network",))}})},
    "/v1/bans/{address}": {"delete": _lift("Lift the ban on an address, or the one covering "
                                           "it", ("address",))},
    "/v1/bans/{address}/{prefix}": {"delete": _lift("Lift the ban on a range",
                                                    ("address", "prefix"))},
    "/v1/certificates/{name}": {"put": _op(
        "Install a certificate another tool renews (as `nestgate cert install`)", {
            "200": _json(_obj({"name": _STR, "sources": {"type": "array", "items": _STR},
                               "not_after": _NUM}, ("name", "sources", "not_after")),
                         "installed; every worker serves it within a second"),
            "404": _ERROR, "409": _ERROR, "422": _ERROR, "503": _ERROR},
        body={_JSON: {"schema": _obj({"cert": _STR, "key": _STR}, ("cert", "key"))}},
        parameters=("name",))},
    "/v1/notes/purge": {"post": _op("Forget every rendered page in every worker", {
        "200": _json(_obj({"applied_by_workers": _INT}, ("applied_by_workers",)), "done"),
        "504": _ERROR})},
    "/v1/notes/reread": {"post": _op("Read the notes folders again, and purge the pages", {
        "200": _json(_obj({"applied_by_workers": _INT}, ("applied_by_workers",)), "done"),
        "504": _ERROR})},
    "/v1/upstreams": {"get": _op("The proxy routes' upstreams: health, drained, counters", {
        "200": _json(_obj({"upstreams": {"type": "array", "items": _UPSTREAM_FULL}},
                          ("upstreams",)), "the upstreams")})},
    "/v1/upstreams/drain": {"post": _op(
        "Send no new request to an upstream (those under way finish)", _UPSTREAM_CHANGE,
        body={_JSON: {"schema": _UPSTREAM_NAME}})},
    "/v1/upstreams/undrain": {"post": _op(
        "Put a drained upstream back into picking", _UPSTREAM_CHANGE,
        body={_JSON: {"schema": _UPSTREAM_NAME}})},
    "/v1/users": {"get": _op("The configured users and their groups (never a password "
                             "hash or TOTP secret), as the serving config has them", {
        "200": _json(_obj({"users": {"type": "array", "items": _USER}}, ("users",)),
                     "the users")})},
    "/v1/providers": {"get": _op("The OpenID providers visitors may sign in with "
                                 "([[auth.oidc]]; never a client secret)", {
        "200": _json(_obj({"providers": {"type": "array", "items": _PROVIDER}},
                          ("providers",)), "the providers")})},
    "/v1/sessions": {"get": _op("The live sign-in sessions", {
        "200": _json(_obj({"sessions": {"type": "array", "items": _SESSION}}, ("sessions",)),
                     "the sessions"), "409": _ERROR, "503": _ERROR})},
    "/v1/sessions/{id}": {"delete": _op("Revoke one session", {
        "204": {"description": "revoked"}, "404": _ERROR, "409": _ERROR, "503": _ERROR},
        parameters=("id",))},
    "/v1/users/{user}/sessions": {"delete": _op("Revoke all of a user's sessions", {
        "200": _json(_obj({"revoked": _INT}, ("revoked",)), "revoked"), "409": _ERROR,
        "503": _ERROR}, parameters=("user",))},
    "/v1/users/{user}/providers": {"delete": _op(
        "Unbind the provider accounts a user signed in through first (made anew there)", {
            "200": _json(_obj({"unbound": _INT}, ("unbound",)), "unbound"), "409": _ERROR,
            "503": _ERROR}, parameters=("user",))},
    "/v1/oidc/clients": {"get": _op("The OpenID provider's clients (never a secret's hash)", {
        "200": _json(_obj({"clients": {"type": "array", "items": _CLIENT}}, ("clients",)),
                     "the clients")})},
    "/v1/oidc/grants": {"get": _op("The OpenID provider's live grants", {
        "200": _json(_obj({"grants": {"type": "array", "items": _GRANT}}, ("grants",)),
                     "the grants"), "409": _ERROR, "503": _ERROR})},
    "/v1/oidc/grants/{id}": {"delete": _with_pattern(_op(
        "End one grant (its access and refresh tokens)", {
            "204": {"description": "revoked"}, "404": _ERROR, "409": _ERROR, "503": _ERROR},
        parameters=("id",)), "id", "^[0-9a-f]{16}$")},
    "/v1/passkeys": {"get": _op("The registered passkeys (?user=NAME: one user's), never "
                                "their public keys", {
        "200": _json(_obj({"passkeys": {"type": "array", "items": _PASSKEY}}, ("passkeys",)),
                     "the passkeys"), "409": _ERROR, "503": _ERROR})},
    "/v1/passkeys/{id}": {"delete": _op("Revoke one passkey", {
        "204": {"description": "revoked"}, "404": _ERROR, "409": _ERROR, "503": _ERROR},
        parameters=(("id", _CREDENTIAL_ID),))},
    "/": {"get": _op("The status page (HTML) for a browser; with a token, it sends a "
                     "browser without the page's cookie to /login", {
        "200": {"description": "the page", "content": {"text/html": {"schema": _STR}}},
        "303": {"description": "to /login"}}, open_=True)},
    "/login": {
        "get": _op("The status page's sign-in form", {
            "200": {"description": "the form", "content": {"text/html": {"schema": _STR}}}},
            open_=True),
        "post": _op("Sign in to the status page with the token (form fields token, csrf)", {
            "303": {"description": "signed in: to /, with the page's cookie"},
            "401": {"description": "wrong token"}, "403": {"description": "no CSRF match"},
            "429": {"description": "too many failures"}}, open_=True,
            body={"application/x-www-form-urlencoded": {"schema": _obj(
                {"token": _STR, "csrf": _STR}, ("token", "csrf"))}})},
    "/docs/json": {"get": _op("This document", {"200": _json({"type": "object"}, "OpenAPI")},
                              open_=True)},
    "/docs": {"get": _op("Swagger UI on this document (its scripts and styles under /docs/, "
                         "bundled)", {"200": {"description": "the page",
                                              "content": {"text/html": {"schema": _STR}}}},
                         open_=True)},
}

DOCUMENT = {
    "openapi": "3.1.0",
    "info": {"title": "nestgate management API", "version": __version__,
             "description": "The operator side of nestgate: see docs/admin.md."},
    "servers": [{"url": "/"}],
    "security": [{"bearer": []}],
    "paths": PATHS,
    "components": {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                       "description": "[admin] token, or the one nestgate "
                                                      "made in its state folder"}},
        "schemas": {"Error": _obj({"error": _obj(
            {"code": _STR, "message": _STR, "details": {"type": "object"}},
            ("code", "message", "details"))}, ("error",))},
        "responses": {"Error": _json({"$ref": "#/components/schemas/Error"},
                                     "an error (the one shape every error has)")},
    },
}

DOCUMENT_BYTES = json.dumps(DOCUMENT, separators=(",", ":")).encode()
