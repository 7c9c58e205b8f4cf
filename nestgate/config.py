"""Config: one TOML file -> one frozen, validated `Config`.

Every problem is collected (not just the first) and reported with the file, the
key and what was expected, so `nestgate check` can list them all at once.
Relative paths are resolved against the config file's directory.
Nothing here touches sockets or the event loop.
"""

from __future__ import annotations

import ipaddress
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from nestgate.units import parse_duration, parse_size

DEFAULT_CONFIG_NAME = "nestgate.toml"
EMBEDDED_DEFAULT = Path(__file__).parent / "default" / "nestgate.toml"


class ConfigError(Exception):
    """Raised with every problem found; `problems` holds one line each."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


# ---------------------------------------------------------------- the object


@dataclass(frozen=True)
class Limits:
    max_url: int = 8 * 1024                 # nginx: large_client_header_buffers 8k -> 414
    max_header_bytes: int = 32 * 1024       # nginx: 4 x 8k -> 431
    max_headers: int = 100
    max_body: int = 1024 * 1024             # nginx: client_max_body_size 1m -> 413
    header_timeout: float = 60.0            # nginx: client_header_timeout 60s -> 408
    body_timeout: float = 60.0              # nginx: client_body_timeout 60s -> 408
    keepalive_timeout: float = 75.0         # nginx: keepalive_timeout 75s
    keepalive_requests: int = 1000          # nginx: keepalive_requests 1000
    max_connections: int = 1024             # per worker; nginx: worker_connections
    send_timeout: float = 60.0              # nginx: send_timeout 60s


@dataclass(frozen=True)
class LogConfig:
    format: str = "json"                    # "json" lines or "combined"
    path: str = "-"                         # "-" is stdout
    flush_interval: float = 1.0
    log_loopback: bool = False              # fn-knock's default: loopback is not logged


@dataclass(frozen=True)
class Certificate:
    cert: str
    key: str
    names: tuple[str, ...]


@dataclass(frozen=True)
class Listener:
    host: str
    port: int
    certificates: tuple[Certificate, ...] = ()
    redirect_https: bool = False
    https_port: int = 443

    @property
    def tls(self) -> bool:
        return bool(self.certificates)

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"


@dataclass(frozen=True)
class Route:
    type: str
    path: str = ""                          # exact path, may hold {name} segments
    prefix: str = ""                        # prefix match, longest wins
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.path or (self.prefix + "*")


@dataclass(frozen=True)
class Site:
    name: str
    hosts: tuple[str, ...]
    routes: tuple[Route, ...] = ()
    health: bool = True


@dataclass(frozen=True)
class ServerConfig:
    workers: int = 0                        # 0: one per CPU
    shutdown_timeout: float = 10.0
    restart_backoff_max: float = 10.0
    not_found_page: str = ""                # HTML file replacing the built-in 404 page
    health_path: str = "/api/v1/health"


@dataclass(frozen=True)
class Config:
    source: str
    server: ServerConfig
    limits: Limits
    log: LogConfig
    listeners: tuple[Listener, ...]
    sites: tuple[Site, ...]

    @property
    def worker_count(self) -> int:
        return self.server.workers or os.cpu_count() or 1


# ---------------------------------------------------------------- reading


class _Section:
    """A table being read: typed getters that record problems, then unknown keys."""

    def __init__(self, data: Any, where: str, problems: list[str], file: str, base: Path):
        self.where, self.problems, self.file, self.base = where, problems, file, base
        if not isinstance(data, dict):
            self.fail("", "a table", data)
            data = {}
        self.data = data
        self.seen: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.where}.{name}" if self.where else name

    def fail(self, name: str, expected: str, got: Any = None) -> None:
        shown = "" if got is None else f", got {got!r}"
        self.problems.append(f"{self.file}: {self.key(name) or '<top>'}: expected {expected}{shown}")

    def get(self, name: str, default: Any, convert: Callable[[Any], Any], expected: str) -> Any:
        self.seen.add(name)
        if name not in self.data:
            return default
        raw = self.data[name]
        try:
            return convert(raw)
        except (ValueError, TypeError) as exc:
            self.fail(name, str(exc) or expected, raw)
            return default

    def str(self, name: str, default: str = "") -> str:
        return self.get(name, default, _typed(str, "a string"), "a string")

    def bool(self, name: str, default: bool) -> bool:
        return self.get(name, default, _typed(bool, "true or false"), "true or false")

    def int(self, name: str, default: int, low: int = 0, high: int = 2**31) -> int:
        return self.get(name, default, _int_in(low, high), f"an integer {low}..{high}")

    def size(self, name: str, default: int) -> int:
        return self.get(name, default, parse_size, "a size")

    def duration(self, name: str, default: float) -> float:
        return self.get(name, default, parse_duration, "a duration")

    def choice(self, name: str, default: str, choices: tuple[str, ...]) -> str:
        def convert(v):
            if v not in choices:
                raise ValueError("one of " + ", ".join(repr(c) for c in choices))
            return v
        return self.get(name, default, convert, "")

    def strings(self, name: str, default: tuple[str, ...] = ()) -> tuple[str, ...]:
        def convert(v):
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                raise ValueError("a list of strings")
            return tuple(v)
        return self.get(name, default, convert, "")

    def readable_file(self, name: str, required: bool = False) -> str:
        value = self.str(name)
        if not value:
            if required:
                self.fail(name, "a path to a readable file")
            return ""
        path = (self.base / value).resolve()
        if not path.is_file() or not os.access(path, os.R_OK):
            self.fail(name, "a path to a readable file", value)
        return str(path)

    def tables(self, name: str) -> list[_Section]:
        self.seen.add(name)
        raw = self.data.get(name, [])
        if isinstance(raw, dict):
            raw = [raw]
        if not isinstance(raw, list):
            self.fail(name, "an array of tables", raw)
            return []
        return [self.child(item, f"{self.key(name)}[{i}]") for i, item in enumerate(raw)]

    def table(self, name: str) -> _Section:
        self.seen.add(name)
        return self.child(self.data.get(name, {}), self.key(name))

    def child(self, data: Any, where: str) -> _Section:
        return _Section(data, where, self.problems, self.file, self.base)

    def check_unknown(self) -> None:
        for name in self.data:
            if name not in self.seen:
                self.problems.append(f"{self.file}: {self.key(name)}: unknown key")


def _typed(kind: type, expected: str) -> Callable[[Any], Any]:
    def convert(v):
        if type(v) is not kind:
            raise ValueError(expected)
        return v
    return convert


def _int_in(low: int, high: int) -> Callable[[Any], int]:
    def convert(v):
        if type(v) is not int or not low <= v <= high:
            raise ValueError(f"an integer {low}..{high}")
        return v
    return convert


def parse_address(value: str) -> tuple[str, int]:
    """"127.0.0.1:8080", "[::1]:8443", "localhost:80", ":8080" (all interfaces)."""
    if not isinstance(value, str) or ":" not in value:
        raise ValueError("HOST:PORT such as \"127.0.0.1:8080\" or \"[::1]:8443\"")
    host, _, port_text = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        ipaddress.IPv6Address(host)
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError("HOST:PORT with a port 0..65535")
    return host or "0.0.0.0", int(port_text)


# ------------------------------------------------------------- the sections


def _read_server(s: _Section) -> ServerConfig:
    d = ServerConfig()
    cfg = ServerConfig(
        workers=s.int("workers", d.workers, 0, 512),
        shutdown_timeout=s.duration("shutdown_timeout", d.shutdown_timeout),
        restart_backoff_max=s.duration("restart_backoff_max", d.restart_backoff_max),
        not_found_page=s.readable_file("not_found_page"),
        health_path=s.str("health_path", d.health_path),
    )
    if not cfg.health_path.startswith("/"):
        s.fail("health_path", "a path starting with /", cfg.health_path)
    s.check_unknown()
    return cfg


def _read_limits(s: _Section) -> Limits:
    d = Limits()
    cfg = Limits(
        max_url=s.size("max_url", d.max_url),
        max_header_bytes=s.size("max_header_bytes", d.max_header_bytes),
        max_headers=s.int("max_headers", d.max_headers, 1, 10_000),
        max_body=s.size("max_body", d.max_body),
        header_timeout=s.duration("header_timeout", d.header_timeout),
        body_timeout=s.duration("body_timeout", d.body_timeout),
        keepalive_timeout=s.duration("keepalive_timeout", d.keepalive_timeout),
        keepalive_requests=s.int("keepalive_requests", d.keepalive_requests, 1, 10**9),
        max_connections=s.int("max_connections", d.max_connections, 1, 10**6),
        send_timeout=s.duration("send_timeout", d.send_timeout),
    )
    s.check_unknown()
    return cfg


def _read_log(s: _Section) -> LogConfig:
    d = LogConfig()
    cfg = LogConfig(
        format=s.choice("format", d.format, ("json", "combined")),
        path=s.str("path", d.path),
        flush_interval=s.duration("flush_interval", d.flush_interval),
        log_loopback=s.bool("log_loopback", d.log_loopback),
    )
    if cfg.path not in ("-", ""):
        cfg = LogConfig(cfg.format, str((s.base / cfg.path).resolve()), cfg.flush_interval,
                        cfg.log_loopback)
        parent = Path(cfg.path).parent
        if not parent.is_dir() or not os.access(parent, os.W_OK):
            s.fail("path", "a file in a writable directory", cfg.path)
    s.check_unknown()
    return cfg


def _read_listener(s: _Section) -> Listener:
    host, port = s.get("address", ("127.0.0.1", 8080), parse_address, "")
    certs = []
    for c in s.tables("certificate"):
        names = c.strings("names")
        certs.append(Certificate(c.readable_file("cert", True), c.readable_file("key", True), names))
        c.check_unknown()
    listener = Listener(host, port, tuple(certs),
                        redirect_https=s.bool("redirect_https", False),
                        https_port=s.int("https_port", 443, 1, 65535))
    if listener.tls and listener.redirect_https:
        s.fail("redirect_https", "false on a TLS listener (it would redirect to itself)")
    s.check_unknown()
    return listener


def _read_route(s: _Section) -> Route | None:
    path, prefix = s.str("path"), s.str("prefix")
    kind = s.choice("type", "", tuple(ROUTE_OPTIONS))
    if bool(path) == bool(prefix):
        s.fail("path", "exactly one of path or prefix")
    for name, value in (("path", path), ("prefix", prefix)):
        if value and not value.startswith("/"):
            s.fail(name, "a path starting with /", value)
    if not kind:
        if "type" not in s.data:
            s.fail("type", "one of " + ", ".join(repr(k) for k in ROUTE_OPTIONS))
        s.check_unknown()
        return None
    options = ROUTE_OPTIONS[kind](s)
    s.check_unknown()
    return Route(kind, path, prefix, options)


def _read_site(s: _Section, index: int) -> Site:
    hosts = s.strings("hosts", ("*",))
    for h in hosts:
        if h != "*" and (not h or " " in h or "/" in h or h.count("*") > 1
                         or ("*" in h and not h.startswith("*."))):
            s.fail("hosts", "host names, \"*.example.com\" wildcards or \"*\"", h)
    routes = tuple(r for r in (_read_route(t) for t in s.tables("route")) if r)
    site = Site(name=s.str("name", f"site{index}"), hosts=tuple(h.lower() for h in hosts),
                routes=routes, health=s.bool("health", True))
    s.check_unknown()
    return site


# Route types and the options each takes. Each reader returns the options dict.

def _return_options(s: _Section) -> dict[str, Any]:
    body = s.str("body")
    body_file = s.readable_file("body_file")
    if body and body_file:
        s.fail("body", "only one of body or body_file")
    return {
        "status": s.int("status", 200, 100, 599),
        "body": Path(body_file).read_bytes() if body_file else body.encode(),
        "content_type": s.str("content_type", "text/plain; charset=utf-8"),
    }


def _redirect_options(s: _Section) -> dict[str, Any]:
    to = s.str("to")
    if not to:
        s.fail("to", "the address to redirect to")
    return {"to": to, "status": s.choice("status", 308, (301, 302, 303, 307, 308))}


ROUTE_OPTIONS: dict[str, Callable[[_Section], dict[str, Any]]] = {
    "return": _return_options,
    "redirect": _redirect_options,
}


# ------------------------------------------------------------------ entry


def read_config(path: str | os.PathLike | None = None) -> Config:
    """Read `path`, or ./nestgate.toml when present, or the embedded default."""
    if path is None:
        path = DEFAULT_CONFIG_NAME if os.path.exists(DEFAULT_CONFIG_NAME) else EMBEDDED_DEFAULT
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror}"]) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{path}: not valid TOML: {exc}"]) from None
    return parse_config(data, str(path), path.resolve().parent)


def parse_config(data: dict, file: str = "<config>", base: Path | None = None) -> Config:
    problems: list[str] = []
    top = _Section(data, "", problems, file, base or Path.cwd())
    server = _read_server(top.table("server"))
    limits = _read_limits(top.table("limits"))
    log = _read_log(top.table("log"))
    listeners = tuple(_read_listener(t) for t in top.tables("listen"))
    sites = tuple(_read_site(t, i) for i, t in enumerate(top.tables("site")))
    top.check_unknown()
    if not listeners:
        problems.append(f"{file}: listen: expected at least one [[listen]] table")
    if problems:
        raise ConfigError(problems)
    return Config(file, server, limits, log, listeners, sites)


def with_overrides(config: Config, listen: list[str] | None = None,
                   workers: int | None = None) -> Config:
    """Apply command-line flags: --listen replaces the plain listeners, --workers N."""
    from dataclasses import replace
    if listen:
        problems, addresses = [], []
        for value in listen:
            try:
                addresses.append(parse_address(value))
            except ValueError as exc:
                problems.append(f"--listen {value!r}: expected {exc}")
        if problems:
            raise ConfigError(problems)
        kept = tuple(l for l in config.listeners if l.tls)
        config = replace(config, listeners=tuple(Listener(h, p) for h, p in addresses) + kept)
    if workers is not None:
        if workers < 1:
            raise ConfigError([f"--workers {workers}: expected a number of workers >= 1"])
        config = replace(config, server=replace(config.server, workers=workers))
    return config
