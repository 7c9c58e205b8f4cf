"""The options of a `type = "proxy"` route, read and checked at config load."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from nestgate.base.grammar import TCHAR

# Upgrades a route may never pass: each would make the tunnel an HTTP connection of
# its own, whose requests reach the upstream past the route's access rules, limits
# and request log (an h2c-capable upstream answers `Upgrade: h2c` with 101).
NEVER_UPGRADE = frozenset(("h2c", "h2", "http"))


@dataclass(frozen=True)
class TargetConfig:
    url: str
    scheme: str           # "http" or "https"
    host: str
    port: int
    weight: int = 1

    @property
    def authority(self) -> bytes:
        default = 443 if self.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return (host if self.port == default else f"{host}:{self.port}").encode()


@dataclass(frozen=True)
class ProxyOptions:
    targets: tuple[TargetConfig, ...]
    balance: str = "round_robin"          # or "least_conn"
    strip_prefix: bool = False
    host_header: str = "client"           # "client" keeps the Host; "target" sends the target's
    forwarded: bool = True                # X-Forwarded-For/-Proto/-Host
    upgrade: tuple[str, ...] = ("websocket",)   # Upgrade protocols passed, lower case
    compress: bool = False                # br/zstd/gzip text answers as they stream
    connect_timeout: float = 5.0
    read_timeout: float = 60.0            # between bytes from the upstream
    request_timeout: float = 0.0          # whole exchange; 0: none
    retries: int = 1                      # other targets tried when a connect fails
    max_idle: int = 64                    # kept-alive connections per target
    idle_timeout: float = 60.0
    tunnel_idle_timeout: float = 60.0     # after 101: no byte either way for this long
    max_connections: int = 0              # per target, 0: no limit (503 when reached)
    max_fails: int = 3                    # passive health: failures that eject a target ...
    fail_timeout: float = 10.0            # ... for this long
    health_path: str = ""                 # active health: GET this path ...
    health_interval: float = 5.0          # ... this often
    health_timeout: float = 2.0
    verify_tls: bool = True
    ca_file: str = ""
    server_name: str = ""                 # SNI and the name checked, default the target host


def parse_target(value, weight: int = 1) -> TargetConfig:
    if not isinstance(value, str):
        raise ValueError("an upstream URL such as \"http://127.0.0.1:9001\"")
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("an upstream URL such as \"http://127.0.0.1:9001\" (http or https)")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise ValueError("an upstream URL with no path, query or user (scheme://host:port)")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ValueError("an upstream URL with a port 1..65535") from None
    return TargetConfig(value, parts.scheme, parts.hostname, port, weight)


def _targets(value) -> tuple[TargetConfig, ...]:
    items = value if isinstance(value, list) else [value]
    if not items:
        raise ValueError("at least one upstream")
    out = []
    for item in items:
        if isinstance(item, dict):
            unknown = set(item) - {"url", "weight"}
            if unknown:
                raise ValueError(f"upstream tables with url and weight only, not {sorted(unknown)}")
            weight = item.get("weight", 1)
            if type(weight) is not int or not 1 <= weight <= 1000:
                raise ValueError("an upstream weight 1..1000")
            out.append(parse_target(item.get("url"), weight))
        else:
            out.append(parse_target(item))
    return tuple(out)


def proxy_options(s) -> ProxyOptions:
    """Reader of the proxy route type (nestgate.sites.routetypes); `s` is the route's config section."""
    d = ProxyOptions(())
    targets = s.get("upstream", (), _targets, "")
    if "upstream" not in s.data:
        s.fail("upstream", "an upstream URL or a list of them")
    opts = ProxyOptions(
        targets=targets,
        balance=s.choice("balance", d.balance, ("round_robin", "least_conn")),
        strip_prefix=s.bool("strip_prefix", d.strip_prefix),
        host_header=s.choice("host_header", d.host_header, ("client", "target")),
        forwarded=s.bool("forwarded", d.forwarded),
        upgrade=_upgrades(s, d.upgrade),
        compress=s.bool("compress", d.compress),
        connect_timeout=s.duration("connect_timeout", d.connect_timeout),
        read_timeout=s.duration("read_timeout", d.read_timeout),
        request_timeout=s.duration("request_timeout", d.request_timeout),
        retries=s.int("retries", d.retries, 0, 10),
        max_idle=s.int("max_idle", d.max_idle, 0, 100_000),
        idle_timeout=s.duration("idle_timeout", d.idle_timeout),
        tunnel_idle_timeout=s.duration("tunnel_idle_timeout", d.tunnel_idle_timeout),
        max_connections=s.int("max_connections", d.max_connections, 0, 1_000_000),
        max_fails=s.int("max_fails", d.max_fails, 0, 1000),
        fail_timeout=s.duration("fail_timeout", d.fail_timeout),
        health_path=s.str("health_path", d.health_path),
        health_interval=s.duration("health_interval", d.health_interval),
        health_timeout=s.duration("health_timeout", d.health_timeout),
        verify_tls=s.bool("verify_tls", d.verify_tls),
        ca_file=s.readable_file("ca_file"),
        server_name=s.str("server_name", d.server_name),
    )
    if opts.health_path and not opts.health_path.startswith("/"):
        s.fail("health_path", "a path starting with /", opts.health_path)
    if opts.strip_prefix and "prefix" not in s.data:
        s.fail("strip_prefix", "a route with a prefix")
    for name in ("connect_timeout", "read_timeout", "tunnel_idle_timeout", "health_interval",
                 "health_timeout"):
        if getattr(opts, name) <= 0:
            s.fail(name, "a duration above zero")
    return opts


def _upgrade_names(value) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise ValueError('a list of Upgrade protocol names, such as ["websocket"]')
    names = []
    for name in value:
        lower = name.lower()
        if not name or not name.isascii() or name.encode().translate(None, TCHAR):
            raise ValueError(f"protocol names that are tokens, not {name!r}")
        if lower in NEVER_UPGRADE:
            raise ValueError(f"no {name!r}: an HTTP upgrade would carry requests past "
                             "the route's rules; list protocols such as \"websocket\"")
        if lower not in names:
            names.append(lower)
    return tuple(names)


def _upgrades(s, default: tuple[str, ...]) -> tuple[str, ...]:
    """`upgrade`, the protocols a client may switch to through the route, or the older
    `websocket` (true: the default list, false: none)."""
    websocket = s.bool("websocket", True)
    if "upgrade" not in s.data:
        return default if websocket else ()
    if "websocket" in s.data:
        s.fail("websocket", "either upgrade or websocket, not both "
                            "(websocket = false is upgrade = [])")
    return s.get("upgrade", default, _upgrade_names, "")
