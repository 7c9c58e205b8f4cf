"""Forward auth in the config, both ways.

`[[auth.forward]]`: hosts nestgate guards but does not serve (an nginx or Caddy in
front serves them and asks nestgate, nestgate.handlers.auth.provider), each with the policy
keys of a protected site (`policy`, `allow_users`, `allow_groups`) and its network
keys (`allow`, `deny`, `exempt_local`, `allow_dynamic`). Such an entry becomes a
protected site with no routes of its own (`entry_site`): its sign-in pages and the
forward-auth endpoints, answered under its hosts.

`forward_auth = { url = "...", copy_headers = [...], timeout = "5s" }` on a [[site]]
or [[site.route]]: nestgate asks another server (Authelia, Authentik, another
nestgate) before the route answers (nestgate.handlers.auth.delegate).

Only readers and frozen options here: reading a config loads no engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from nestgate.base.grammar import TCHAR

ENTRY_KEYS = ("name", "hosts")


@dataclass(frozen=True)
class ForwardEntry:
    """One [[auth.forward]] entry."""
    name: str
    hosts: tuple[str, ...]
    access: Any = None              # nestgate.pipeline.access.AccessConfig
    policy: Any = None              # nestgate.handlers.auth.policy.UserPolicy


def read_forward_entry(s, index: int) -> ForwardEntry:
    from nestgate.pipeline.access import read_access
    from nestgate.handlers.auth.policy import read_policy
    hosts = s.strings("hosts")
    if not hosts:
        s.fail("hosts", "at least one host name the other proxy serves")
    for host in hosts:
        # "*" would let the forwarded Host name any site at all, and the sign-in
        # redirect go there: a forward entry names its hosts.
        if not host or host == "*" or " " in host or "/" in host or host.count("*") > 1 \
                or ("*" in host and not host.startswith("*.")):
            s.fail("hosts", "host names or \"*.example.com\" wildcards (not \"*\")", host)
    entry = ForwardEntry(s.str("name", f"forward{index}"), tuple(h.lower() for h in hosts),
                         read_access(s), read_policy(s))
    s.check_unknown()
    return entry


@dataclass(frozen=True)
class ForwardAuthOptions:
    """`forward_auth` of a site or route: where to ask, and what to take from a yes."""
    url: str
    scheme: str                     # "http" or "https"
    authority: str                  # scheme://host:port, as a proxy target's url
    target: bytes                   # the path (and query) asked, as sent
    copy_headers: tuple[str, ...] = ()   # lower case
    timeout: float = 5.0            # connect and answer, in all


def read_forward_auth(s) -> ForwardAuthOptions | None:
    """`forward_auth` of a [[site]] or [[site.route]] table; None when absent."""
    s.seen.add("forward_auth")
    raw = s.data.get("forward_auth")
    if raw is None:
        return None
    expected = "a table such as { url = \"http://127.0.0.1:9091/api/authz/forward-auth\", " \
               "copy_headers = [\"Remote-User\"] }"
    if not isinstance(raw, dict):
        s.fail("forward_auth", expected, raw)
        return None
    table = s.child(raw, s.key("forward_auth"))
    url = table.str("url")
    parts = urlsplit(url)
    ok = parts.scheme in ("http", "https") and bool(parts.hostname) and not parts.username \
        and not parts.fragment and url.isascii() and not any(c in url for c in " \t\r\n")
    try:
        ok = ok and parts.port != 0
    except ValueError:
        ok = False
    if not ok:
        table.fail("url", "the auth server's address, such as "
                   "\"http://127.0.0.1:9091/api/authz/forward-auth\"", url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    names = table.strings("copy_headers")
    for name in names:
        if not name or name.encode("latin-1", "replace").translate(None, TCHAR):
            table.fail("copy_headers", "header names (letters, digits and -)", name)
    timeout = table.duration("timeout", 5.0)
    if timeout <= 0:
        table.fail("timeout", "a duration above zero")
    table.check_unknown()
    return ForwardAuthOptions(url, parts.scheme, f"{parts.scheme}://{parts.netloc}",
                              target.encode(), tuple(dict.fromkeys(n.lower() for n in names)),
                              timeout)
