"""What keeps web pages from driving the admin listener, checked before the token.

A page the operator's browser has open can send requests to http://127.0.0.1:7998
(a form, `fetch` with `mode: "no-cors"` and a text/plain body: no preflight), and a
name the attacker controls can be made to resolve to 127.0.0.1 (DNS rebinding), after
which the page's requests are same-origin to the browser but carry the attacker's
name in Host. So, as Caddy's admin endpoint does and more:

- Host must name this listener: `localhost`, a loopback address, the address it is
  bound to (any address when bound to 0.0.0.0 or ::: an IP literal is never a name
  that can be rebound), or a name in `[admin] allowed_hosts`. Anything else is 421.
- `Sec-Fetch-Site`, when sent, must be `same-origin` or `none` (typed, a bookmark);
  `Origin`, when sent, must be this listener's scheme, host and port as Host names
  them. Anything else (`same-site`, `cross-site`, `null`, another origin) is 403.
- A body must be of the type the endpoint reads (JSON; TOML for validate; the status
  page's form): 415 otherwise, so that no body a page can send without a preflight
  (text/plain, a form, multipart) is ever read by a JSON endpoint.

Liveness (`/v1/health`) is outside these checks: probes send all kinds of Host, and it
tells nothing but "ok".
"""

from __future__ import annotations

import ipaddress

from nestgate.admin.replies import error
from nestgate.base.handler import GATED

WRONG_HOST = error(421, "misdirected_request", "the Host does not name this admin "
                   "listener: use its address, localhost, or a name in [admin] "
                   "allowed_hosts")
CROSS_SITE = error(403, "cross_site", "a request from another site (Origin or "
                   "Sec-Fetch-Site) is not answered; open the admin listener's own "
                   "address directly")
JSON = b"application/json"


def wrong_type(expected: bytes) -> object:
    return error(415, "unsupported_media_type",
                 f"send the body with Content-Type: {expected.decode()}")


def ip_loopback(text: str) -> bool:
    """Whether an address (as a client or a Host spells it) is loopback: 127.0.0.0/8,
    ::1, and IPv4-mapped ::ffff:127.x. Parsed, never compared as text ("::1:2" is not
    loopback)."""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def split_host(value: str) -> tuple[str, int | None]:
    """("name", port or None) of a Host value or an origin's authority: "[::1]:7998",
    "localhost", "127.0.0.1:7998". A port that is not a number is -1; an IPv6 address
    without brackets is no name ("")."""
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return "", None
        name, rest = value[1:end], value[end + 1:]
        if not rest:
            return name, None
        if not rest.startswith(":"):
            return "", None
        port = rest[1:]
    elif value.count(":") == 1:
        name, _, port = value.partition(":")
    else:
        return ("" if ":" in value else value), None
    return name, int(port) if port.isdigit() and len(port) <= 5 else -1


class OwnAddress:
    """Which Host values and origins name this listener. A Host's port is not compared:
    what DNS rebinding changes is the name (a page on another port of this machine is
    another origin, which the Origin check refuses)."""

    __slots__ = ("scheme", "bound", "names")

    def __init__(self, scheme: str, bound_host: str, allowed_hosts=()) -> None:
        self.scheme = scheme
        try:
            bound = ipaddress.ip_address(bound_host)
            self.bound = None if bound.is_unspecified else bound
        except ValueError:
            self.bound = bound_host.lower()    # bound by name ("admin.lan")
        self.names = frozenset(("localhost", *allowed_hosts))

    def default_port(self) -> int:
        return 443 if self.scheme == "https" else 80

    def host_ok(self, value: bytes | None) -> bool:
        if not value:
            return False
        name, port = split_host(value.decode("latin-1").lower())
        if not name or port == -1:
            return False
        if name in self.names or name == self.bound:
            return True
        try:
            address = ipaddress.ip_address(name)
        except ValueError:
            return False
        return ip_loopback(name) or self.bound is None or address == self.bound

    def origin_ok(self, origin: bytes, host: bytes) -> bool:
        """An Origin is this listener's when its scheme is the listener's and its host
        and port are the ones Host names."""
        scheme, sep, rest = origin.decode("latin-1").lower().partition("://")
        if not sep or scheme != self.scheme or "/" in rest:
            return False
        default = self.default_port()
        origin_name, origin_port = split_host(rest)
        host_name, host_port = split_host(host.decode("latin-1").lower())
        return bool(origin_name) and origin_name == host_name and \
            (origin_port or default) == (host_port or default)


class SameOrigin:
    """In front of a route of the admin listener (and of its token gate): Host,
    Origin, Sec-Fetch-Site and the body's Content-Type, as the module says."""

    is_async = GATED
    __slots__ = ("inner", "own", "body_type", "wrong_type")

    def __init__(self, inner, own: OwnAddress, body_type: bytes = JSON) -> None:
        self.inner = inner
        self.own = own
        self.body_type = body_type
        self.wrong_type = wrong_type(body_type)

    def admit(self, conn, headers):
        host = origin = site = media = None
        body = False
        for name, value in headers:
            if name == b"host":
                host = value
            elif name == b"origin":
                origin = value
            elif name == b"sec-fetch-site":
                site = value.lower()
            elif name == b"content-type":
                media = value
            elif name == b"content-length":
                body = body or value.strip() != b"0"
            elif name == b"transfer-encoding":
                body = True
        own = self.own
        if not own.host_ok(host):
            return WRONG_HOST
        if site is not None and site not in (b"same-origin", b"none"):
            return CROSS_SITE
        if origin is not None and not own.origin_ok(origin, host):
            return CROSS_SITE
        if body and (media is None or
                     media.partition(b";")[0].strip().lower() != self.body_type):
            return self.wrong_type
        return self.inner
