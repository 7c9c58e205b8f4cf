"""Who signed in, told to the apps behind a protected site: the identity headers.

A proxy route on a protected site sends `Remote-User`, `Remote-Groups` (comma-separated),
`Remote-Name` and `Remote-Email` (Authelia's names, which Grafana, Paperless-ngx,
Navidrome, Gitea and Nextcloud can be told to trust), renamed or turned off by
`[auth] identity_headers`. Each user's lines are made once per load (`identity_lines`),
so a request adds one bytes object to the upstream head.

Whatever a client sends under any of these names (the default ones and the configured
ones) is dropped by every proxy route, protected or not (`claimed_names`): an upstream
that trusts the header must only ever see nestgate's value.
"""

from __future__ import annotations

from dataclasses import dataclass

from nestgate.base.grammar import TCHAR

FIELDS = ("user", "groups", "name", "email")
DEFAULT_NAMES = {"user": "Remote-User", "groups": "Remote-Groups", "name": "Remote-Name",
                 "email": "Remote-Email"}


@dataclass(frozen=True)
class IdentityHeaders:
    """The header name for each field; "" leaves that field out."""
    user: str = DEFAULT_NAMES["user"]
    groups: str = DEFAULT_NAMES["groups"]
    name: str = DEFAULT_NAMES["name"]
    email: str = DEFAULT_NAMES["email"]

    def names(self) -> tuple[str, ...]:
        return tuple(n for n in (self.user, self.groups, self.name, self.email) if n)


OFF = IdentityHeaders("", "", "", "")


def read_identity_headers(s) -> IdentityHeaders:
    """`identity_headers` of [auth]: true (the default names), false (none), or a table
    `{ user = "X-User", groups = "X-Groups", name = "", email = "X-Email" }` where a
    field left out keeps its default name and "" leaves the field out."""
    s.seen.add("identity_headers")
    raw = s.data.get("identity_headers", True)
    if raw is True:
        return IdentityHeaders()
    if raw is False:
        return OFF
    if not isinstance(raw, dict):
        s.fail("identity_headers", "true, false or a table such as "
               "{ user = \"X-User\", email = \"\" }", raw)
        return IdentityHeaders()
    table = s.child(raw, s.key("identity_headers"))
    chosen = {}
    for field in FIELDS:
        name = table.str(field, DEFAULT_NAMES[field])
        if name and name.encode("latin-1", "replace").translate(None, TCHAR):
            table.fail(field, "a header name (letters, digits and -), or \"\" for none", name)
            name = ""
        chosen[field] = name
    table.check_unknown()
    headers = IdentityHeaders(**chosen)
    lowered = [n.lower() for n in headers.names()]
    if len(set(lowered)) != len(lowered):
        s.fail("identity_headers", "a different name for each field", raw)
    return headers


def claimed_names(config) -> frozenset[bytes]:
    """The lower-case names no client may send through a proxy route: the default
    identity headers and the configured ones."""
    names = set(DEFAULT_NAMES.values())
    if config.auth is not None:
        names.update(config.auth.identity_headers.names())
    return frozenset(n.lower().encode() for n in names)


def identity_pairs(headers: IdentityHeaders, user) -> list[tuple[bytes, bytes]]:
    """The identity headers of `user` as (lower-case name, value) pairs: what a
    forward-auth answer tells the proxy that asked (nestgate.handlers.auth.provider). Empty
    fields are left out rather than sent empty."""
    values = ((headers.user, user.name), (headers.groups, ",".join(user.groups)),
              (headers.name, user.display_name), (headers.email, user.email))
    return [(name.lower().encode(), value.encode()) for name, value in values
            if name and value]


def identity_lines(headers: IdentityHeaders, user) -> bytes:
    """The identity header lines of `user` for an upstream request head (b"" when
    they are off)."""
    return b"".join(b"%s: %s\r\n" % pair for pair in identity_pairs(headers, user))
