"""The `[admin]` table.

    [admin]
    enabled = true                 # false: no admin listener
    address = "127.0.0.1:7998"     # fn-knock's port; NESTGATE_ADMIN overrides it (or "off")
    token = "..."                  # or token_file = "admin.token", or NESTGATE_ADMIN_TOKEN
    audit_log = "admin-audit.log"  # the changes made through the API; "-" (stderr) default
    certificate = { cert = "admin.pem", key = "admin.key" }   # optional: HTTPS
    allowed_hosts = ["admin.home.arpa"]   # Host names it answers besides its own address
    loopback_without_token = false # true: loopback clients need no token (the old default)

Every endpoint but liveness needs `Authorization: Bearer <token>`, from loopback clients
too. With no token configured, nestgate makes one at its first start and keeps it in the
state folder (nestgate.admin.token), where `nestgate ctl` reads it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from nestgate.base.configpath import resolved

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
    # Host names answered besides the listener's own address (nestgate.admin.origin).
    allowed_hosts: tuple[str, ...] = ()
    loopback_without_token: bool = False
    # The generated token's file, when no token is configured (nestgate.admin.token):
    # `token` holds its contents once it exists and this user may read it.
    token_file: str = ""

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
    token_file = s.readable_file("token_file", secret=True)
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
    audit_log = s.path("audit_log", d.audit_log)
    if audit_log not in ("-", ""):
        audit_log = str(resolved(s.base, audit_log))
        parent = Path(audit_log).parent
        if os.path.isdir(audit_log) or not os.path.isdir(parent) or \
                not os.access(parent, os.W_OK):
            s.fail("audit_log", "a file in a writable directory, or \"-\" for stderr",
                   audit_log)
    certificate = read_certificate(s.table("certificate")) if "certificate" in s.data else None
    allowed_hosts = tuple(_allowed_host(s, entry) for entry in s.strings("allowed_hosts", ()))
    loopback_without_token = s.bool("loopback_without_token", d.loopback_without_token)
    s.check_unknown()
    return AdminConfig(enabled, host, port, token, audit_log or "-", key, certificate,
                       allowed_hosts, loopback_without_token)


# [admin] keys read once, and so not changed by a reload: the listener's, by the
# supervisor when it binds it at start; the admin process's own, when that process
# starts (a reload that changes the token or the certificate starts it anew, with
# the reloaded config: then these apply too).
_LISTENER_KEYS = {"address": lambda a: (a.host, a.port), "enabled": lambda a: a.enabled}
_PROCESS_KEYS = ("allowed_hosts", "loopback_without_token", "audit_log")


def restarts_admin_process(running: AdminConfig, new: AdminConfig) -> bool:
    """Whether a reload to `new` starts the admin process anew (with the new token or
    certificate) rather than leaving the one `running` with its own config."""
    return (new.token, new.certificate) != (running.token, running.certificate)


def keys_not_applied(bound: AdminConfig, running: AdminConfig, new: AdminConfig) -> list[str]:
    """The [admin] keys (as written, `admin.address`) whose values in `new` are not in
    force after a reload to it: those of the listener bound with `bound`, and those
    the admin process started with (`running`) read once, unless it starts anew. They
    take effect when nestgate restarts."""
    if restarts_admin_process(running, new):
        running = new
    keys = [f"admin.{name}" for name, value in _LISTENER_KEYS.items()
            if value(new) != value(bound)]
    return keys + [f"admin.{name}" for name in _PROCESS_KEYS
                   if getattr(new, name) != getattr(running, name)]


def _allowed_host(s, entry: str) -> str:
    """An `allowed_hosts` entry as the Host check compares it: a name or an address in
    lower case, without a port (a Host's port is not compared)."""
    name = entry.strip().lower().rstrip(".")
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]                      # an IPv6 address as a Host spells it
    if not name or any(c.isspace() or c in "/@*?#[]" for c in name) or \
            (name.count(":") == 1):
        s.fail("allowed_hosts", "host names or addresses such as \"admin.home.arpa\" "
               "(no scheme, port, path or wildcard)", entry)
    return name


def with_generated_token(admin: AdminConfig, state_folder: str) -> AdminConfig:
    """With no token configured (and loopback clients not exempted), the token is the
    one nestgate made at its first start, in `state_folder` (nestgate.admin.token)."""
    if admin.token or admin.loopback_without_token or not admin.enabled:
        return admin
    from nestgate.admin.token import read_token, token_path
    path = token_path(state_folder)
    return replace(admin, token=read_token(path), token_file=str(path))
