"""The `[admin]` table.

    [admin]
    enabled = true                 # false: no admin listener
    address = "127.0.0.1:7998"     # fn-knock's port; NESTGATE_ADMIN overrides it (or "off")
    token = "..."                  # or token_file = "admin.token", or NESTGATE_ADMIN_TOKEN
    audit_log = "admin-audit.log"  # the changes made through the API; "-" (stderr) default
    certificate = { cert = "admin.pem", key = "admin.key" }   # optional: HTTPS

Without a token the listener answers loopback clients only; with one, every endpoint
but liveness needs `Authorization: Bearer <token>`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ADDRESS_ENV = "NESTGATE_ADMIN"        # like Caddy's CADDY_ADMIN: an address, or "off"
TOKEN_ENV = "NESTGATE_ADMIN_TOKEN"
DEFAULT_ADDRESS = ("127.0.0.1", 7998)
MIN_TOKEN_LENGTH = 16


@dataclass(frozen=True)
class AdminConfig:
    enabled: bool = True
    host: str = DEFAULT_ADDRESS[0]
    port: int = DEFAULT_ADDRESS[1]
    token: str = ""
    audit_log: str = "-"              # a file for the API's changes; "-" is stderr
    key: str = "admin.address"        # where the address was set, for bind errors
    certificate: Any = None           # nestgate.config.Certificate: the listener is HTTPS

    @property
    def scheme(self) -> str:
        return "https" if self.certificate is not None else "http"


def read_admin(s, parse_address, read_certificate) -> AdminConfig:
    """The table as written, then the environment's overrides (which a deployment sets
    without editing the file: a container's port, a secret from the service manager)."""
    d = AdminConfig()
    enabled = s.bool("enabled", d.enabled)
    host, port = s.get("address", DEFAULT_ADDRESS, parse_address, "")
    key = f"{s.file}: {s.key('address')}"
    token = s.str("token")
    token_file = s.readable_file("token_file")
    if token and token_file:
        s.fail("token_file", "either token or token_file, not both")
    if token_file and os.path.isfile(token_file):
        token = Path(token_file).read_text(encoding="utf-8", errors="replace").strip()
        if not token:
            s.fail("token_file", "a file holding the token", "an empty file")
    override = os.environ.get(ADDRESS_ENV, "").strip()
    if override:
        if override.lower() == "off":
            enabled = False
        else:
            try:
                host, port = parse_address(override)
            except ValueError as exc:
                s.problems.append(f"{ADDRESS_ENV}: expected an address host:port or "
                                  f"\"off\", got {override!r} ({exc})")
            key = ADDRESS_ENV
    token = os.environ.get(TOKEN_ENV, "").strip() or token
    if token and len(token) < MIN_TOKEN_LENGTH:
        s.fail("token", f"a token of at least {MIN_TOKEN_LENGTH} characters "
               "(`openssl rand -hex 32` makes one)", "a shorter one")
    if token and any(c.isspace() for c in token):
        s.fail("token", "a token without spaces", "one with spaces")
    audit_log = s.str("audit_log", d.audit_log)
    if audit_log not in ("-", ""):
        audit_log = str((s.base / audit_log).resolve())
        parent = Path(audit_log).parent
        if Path(audit_log).is_dir() or not parent.is_dir() or not os.access(parent, os.W_OK):
            s.fail("audit_log", "a file in a writable directory, or \"-\" for stderr",
                   audit_log)
    certificate = read_certificate(s.table("certificate")) if "certificate" in s.data else None
    s.check_unknown()
    return AdminConfig(enabled, host, port, token, audit_log or "-", key, certificate)
