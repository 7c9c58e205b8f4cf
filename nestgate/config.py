"""Config: one TOML file -> one frozen, validated `Config`.

Every problem is collected (not just the first) and reported with the file, the
key and what was expected, so `nestgate check` can list them all at once.
Relative paths are resolved against the config file's directory.
Nothing here touches sockets or the event loop.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from nestgate import PACKAGE_DIR
from nestgate.base import shorthands
from nestgate.base.clientip import covers_every_address
from nestgate.base.configpath import path_text, resolved
from nestgate.base.hosts import configured_host_problem
from nestgate.base.private import make_private_folders
from nestgate.base.tomltext import read_toml
from nestgate.certs.config import AcmeConfig, read_acme
from nestgate.wire.tls import certificate_problem
from nestgate.pipeline.access import _cidr_list, read_access
from nestgate.bans.crowdsec import read_crowdsec
from nestgate.pipeline.geoip import read_geoip
from nestgate.pipeline.ratelimit import read_rate_limit
from nestgate.admin.config import AdminConfig, read_admin, with_generated_token
from nestgate.handlers.auth.config import AUTHZ_PATHS, PORTAL_PATHS, read_auth
from nestgate.handlers.auth.forwardconfig import read_forward_auth
from nestgate.handlers.auth.policy import read_policy
from nestgate.sites.routetypes import ROUTE_TYPES
from nestgate.base.private import open_to_others

WRITABLE_BY_OTHERS = 0o022
READABLE_BY_OTHERS = 0o044
from nestgate.pipeline.routing import path_shape
from nestgate.bans.config import BansConfig
from nestgate.base.units import parse_duration, parse_size

DEFAULT_CONFIG_NAME = "nestgate.toml"
MAX_HEADER_BYTES = 2**31 - 1                # SETTINGS_MAX_HEADER_LIST_SIZE, kept in 31 bits
EMBEDDED_DEFAULT = PACKAGE_DIR / "default" / "nestgate.toml"


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
    # Request bodies in very many tiny pieces (HTTP/1.1 chunks, HTTP/2 DATA frames):
    # past `body_chunk_allowance` pieces on a connection, their average size must be
    # at least `min_body_chunk_average` bytes (0: no check), else 400 / GOAWAY.
    body_chunk_allowance: int = 4096
    min_body_chunk_average: int = 64


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
    # "" for PEM files; "acme" or "internal" for certificates nestgate obtains and
    # renews itself (nestgate.certs), "installed" for ones another tool renews and
    # `nestgate cert install` stores; all kept in [acme] storage, one per name.
    managed: str = ""


MANAGED_KINDS = ("acme", "internal", "installed")


@dataclass(frozen=True)
class Listener:
    host: str
    port: int
    certificates: tuple[Certificate, ...] = ()
    redirect_https: bool = False
    https_port: int = 443
    http2: bool = True                      # TLS listeners offer h2 by ALPN
    http2_cleartext: bool = False           # plain listeners take h2c by prior knowledge
    http3: bool = False                     # TLS listeners also serve HTTP/3 on UDP, same port
    proxy_protocol_from: tuple[str, ...] = ()   # peers that may send a PROXY header
    max_connections_per_client: int = 0     # open HTTP connections per address; 0: no limit
    key: str = ""                           # where it was set: "listen[0].address", "--listen"

    @property
    def tls(self) -> bool:
        return bool(self.certificates)

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def speaks_http2(self) -> bool:
        """Its connections may speak HTTP/2: h2 by ALPN on TLS, or a preface in clear."""
        return self.tls and self.http2 or self.http2_cleartext


@dataclass(frozen=True)
class Route:
    type: str
    path: str = ""                          # exact path, may hold {name} segments
    prefix: str = ""                        # prefix match, longest wins
    options: Any = None                     # the type's options (nestgate.sites.routetypes)
    access: Any = None                      # nestgate.pipeline.access.AccessConfig, replaces the site's
    rate_limit: Any = None                  # nestgate.pipeline.ratelimit.RateLimit, replaces the site's
    policy: Any = None                      # nestgate.handlers.auth.policy.UserPolicy, replaces the site's
    forward_auth: Any = None                # nestgate.handlers.auth.forwardconfig.ForwardAuthOptions

    @property
    def label(self) -> str:
        return self.path or (self.prefix + "*")


DEFAULT_CSP = ("default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
               "object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors 'none'")


@dataclass(frozen=True)
class Security:
    """Headers added to every response of the site's own handlers (static, notes, home,
    API), compiled into their cached responses at load time."""
    enabled: bool = True
    csp: str = DEFAULT_CSP                  # Content-Security-Policy; "" leaves it out
    hsts: str = "max-age=31536000"          # sent only when the config has a TLS listener
    frame_options: str = "DENY"             # X-Frame-Options
    referrer_policy: str = "strict-origin-when-cross-origin"
    permissions_policy: str = "camera=(), microphone=(), geolocation=()"
    nosniff: bool = True                    # X-Content-Type-Options: nosniff

    def headers(self, tls: bool) -> list[tuple[str, str]]:
        if not self.enabled:
            return []
        pairs = [("content-security-policy", self.csp),
                 ("strict-transport-security", self.hsts if tls else ""),
                 ("x-content-type-options", "nosniff" if self.nosniff else ""),
                 ("x-frame-options", self.frame_options),
                 ("referrer-policy", self.referrer_policy),
                 ("permissions-policy", self.permissions_policy)]
        return [(name, value) for name, value in pairs if value]


@dataclass(frozen=True)
class Home:
    """The home page: who the site belongs to, and the latest notes."""
    path: str = "/"
    title: str = "nestgate"
    owner: str = ""
    profile: str = ""                       # a few lines of Markdown
    links: tuple[tuple[str, str], ...] = ()  # (name, url)
    latest: int = 5                         # how many notes it lists


@dataclass(frozen=True)
class Notes:
    """Markdown notes in `dir` (<slug>.md with YAML front matter), their pages and API."""
    dir: str
    path: str = "/notes"
    api_path: str = "/api/v1/notes"
    title: str = "Notes"
    token: str = ""                         # else the NESTGATE_NOTES_TOKEN environment variable
    page_size: int = 10
    cache_pages: int = 256                  # rendered pages kept, per worker
    feed_entries: int = 20
    raw_html: bool = False                  # raw HTML inside Markdown stays escaped
    max_note_bytes: int = 1024 * 1024       # an API body above this -> 413
    max_page_bytes: int = 2 * 1024 * 1024   # a note written through the API whose page
                                            # would be larger -> 422
    cors_origins: tuple[str, ...] = ()      # origins allowed to call the API ("*": any)


@dataclass(frozen=True)
class Site:
    name: str
    hosts: tuple[str, ...]
    routes: tuple[Route, ...] = ()
    health: bool = True
    access: Any = None                      # nestgate.pipeline.access.AccessConfig
    protected: bool = False                 # sign-in before forwarding ([auth])
    policy: Any = None                      # nestgate.handlers.auth.policy.UserPolicy: who may enter
    rate_limit: Any = None                  # nestgate.pipeline.ratelimit.RateLimit
    security: Security = Security()
    home: Home | None = None
    notes: Notes | None = None
    templates: str = ""                     # a directory whose templates replace the built-in ones
    base_url: str = ""                      # absolute address of the site, for the Atom feed
    error_pages: tuple[tuple[int, bytes], ...] = ()   # (status, HTML) replacing built-in pages
    key: str = "site"                       # how `check` names it: site[first host]
    forward_auth: Any = None                # ask another server first (auth.delegate)


@dataclass(frozen=True)
class ServerConfig:
    workers: int = 0                        # 0: one per CPU
    shutdown_timeout: float = 10.0
    restart_backoff_max: float = 10.0
    not_found_page: str = ""                # HTML file replacing the built-in 404 page
    health_path: str = "/api/v1/health"
    health_details: str = "local"           # version and pid to: "local" clients, "all", "none"
    server_tokens: bool = False             # the version in the Server header and on pages
    user: str = ""                          # started as root: run as this user once bound
    group: str = ""                         # ... and group (default: the user's own)
    # Where relative state paths ([auth] store, [acme] storage) resolve: this, else
    # systemd's $STATE_DIRECTORY, else the config file's folder (see `state_folder`).
    state_dir: str = ""


@dataclass(frozen=True)
class StateConfig:
    """`[state]`: where the state instances share lives. SQLite (the `[auth] store`
    file) for one machine; Redis for several instances that must be one gateway."""
    backend: str = "sqlite"                 # "sqlite" | "redis"
    url: str = ""                           # redis://[:password@]host:port/db, rediss://, unix://
    prefix: str = "nestgate:"               # before every key, for instances of one gateway


def _read_state(s: _Section) -> StateConfig:
    d = StateConfig()
    backend = s.choice("backend", d.backend, ("sqlite", "redis"))
    url = s.str("url")
    prefix = s.str("prefix", d.prefix)
    if backend == "redis" and not url.startswith(("redis://", "rediss://", "unix://")):
        s.fail("url", "a redis://, rediss:// or unix:// address of the Redis server", url)
    elif backend == "sqlite" and url:
        s.fail("url", "no url with backend = \"sqlite\" (the [auth] store file is used)", url)
    if not prefix or any(c.isspace() for c in prefix):
        s.fail("prefix", "a key prefix without spaces", prefix)
    s.check_unknown()
    return StateConfig(backend, url, prefix)


@dataclass(frozen=True)
class Config:
    source: str
    server: ServerConfig
    limits: Limits
    log: LogConfig
    listeners: tuple[Listener, ...]
    sites: tuple[Site, ...]
    trusted_proxies: tuple[str, ...] = ()   # X-Forwarded-For is walked through these
    auth: Any = None                        # nestgate.handlers.auth.config.AuthConfig
    admin: AdminConfig = AdminConfig()      # the operator's listener (nestgate.admin)
    state: StateConfig = StateConfig()      # where shared state lives ([state])
    acme: AcmeConfig = AcmeConfig()         # the CA and storage of managed certificates
    geoip: Any = None                       # nestgate.pipeline.geoip.GeoConfig: countries, AS numbers
    crowdsec: Any = None                    # nestgate.bans.crowdsec.CrowdSecConfig: its bouncer
    bans: BansConfig = BansConfig()         # [[ban]] rules and where bans are kept
    # (key, path) of the files read that hold secrets: keys, tokens, passwords.
    secret_files: tuple[tuple[str, str], ...] = ()

    @property
    def worker_count(self) -> int:
        return self.server.workers or os.cpu_count() or 1

    @property
    def guarded_sites(self) -> tuple[Site, ...]:
        """Every site a worker builds a route table for: the [[site]] tables, then one
        per [[auth.forward]] entry (`forward_sites`)."""
        return self.sites + forward_sites(self.auth)


# ---------------------------------------------------------------- reading


class _Section:
    """A table being read: typed getters that record problems, then unknown keys."""

    def __init__(self, data: Any, where: str, problems: list[str], file: str, base: Path,
                 state_base: Path | None = None, secrets: list | None = None):
        self.where, self.problems, self.file, self.base = where, problems, file, base
        self.state_base = state_base or base     # where relative state paths resolve
        # (key, path) of each file read that holds a secret, shared by the whole config:
        # `config_warnings` tells which of them other users can read.
        self.secrets: list[tuple[str, str]] = [] if secrets is None else secrets
        if not isinstance(data, dict):
            self.fail("", "a table", data)
            data = {}
        self.data = data
        self.seen: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.where}.{name}" if self.where else name

    def fail(self, name: str, expected: str, got: Any = None) -> None:
        shown = "" if got is None else f", got {got!r}"
        key = self.key(name) if name else self.where
        self.problems.append(f"{self.file}: {key or '<top>'}: expected {expected}{shown}")

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

    def path(self, name: str, default: str = "") -> str:
        """A file or folder name as written (resolve it with `resolved`): a string
        without NUL, which no file name holds (the OS refuses it with a ValueError)."""
        return self.get(name, default, path_text, "a path")

    def int(self, name: str, default: int, low: int = 0, high: int = 2**31) -> int:
        return self.get(name, default, _int_in(low, high), f"an integer {low}..{high}")

    def size(self, name: str, default: int, low: int = 0, high: int | None = None,
             expected: str = "") -> int:
        """A size; outside low..high it is a problem saying `expected`."""
        return self.get(name, default, _within(parse_size, low, high, expected), "a size")

    def duration(self, name: str, default: float) -> float:
        return self.get(name, default, parse_duration, "a duration")

    def positive_duration(self, name: str, default: float) -> float:
        """A duration where 0 would stop the thing it times from ever working."""
        return self.get(name, default, _within(parse_duration, 1e-9, None,
                                               "a duration above 0"), "a duration")

    def choice(self, name: str, default: str, choices: tuple[str, ...]) -> str:
        def convert(v):
            if v not in choices:
                import difflib      # only a config with a mistake needs it
                near = difflib.get_close_matches(str(v), choices, n=1, cutoff=0.6)
                hint = f" (did you mean {near[0]!r}?)" if near else ""
                raise ValueError("one of " + ", ".join(repr(c) for c in choices) + hint)
            return v
        return self.get(name, default, convert, "")

    def strings(self, name: str, default: tuple[str, ...] = ()) -> tuple[str, ...]:
        def convert(v):
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                raise ValueError("a list of strings")
            return tuple(v)
        return self.get(name, default, convert, "")

    def readable_file(self, name: str, required: bool = False, secret: bool = False) -> str:
        """The resolved path `name` names, a readable file; "" (and a problem) when it
        is not. `secret`: the file holds a key, token or password (`secret_file`)."""
        value = self.path(name)
        if not value:
            if required:
                self.fail(name, "a path to a readable file")
            return ""
        path = resolved(self.base, value)
        # os.path's tests, not Path's: a path under a folder this user may not search
        # is one it cannot read (Path.is_file raises there: a traceback from `check`,
        # a 500 from the admin API's validate that told such paths apart).
        if not os.path.isfile(path) or not os.access(path, os.R_OK):
            # "" rather than the path: nothing after validation may try to read it.
            self.fail(name, "a path to a readable file", value)
            return ""
        if secret:
            self.secret_file(name, str(path))
        return str(path)

    def secret_file(self, name: str, path: str) -> None:
        """Note that the file `path`, named by key `name`, holds a secret."""
        self.secrets.append((self.key(name), path))

    def file_bytes(self, name: str, secret: bool = False) -> bytes | None:
        """The contents of the file `name` names: None if none is named, b"" (and a
        problem) if it cannot be read."""
        if not self.data.get(name):
            self.str(name)                  # still type-checked and marked as seen
            return None
        path = self.readable_file(name, secret=secret)
        if not path:
            return b""
        try:
            return Path(path).read_bytes()
        except OSError as exc:
            self.fail(name, f"a path to a readable file ({exc.strerror})", self.data[name])
            return b""

    def directory(self, name: str, required: bool = False) -> str:
        value = self.path(name)
        if not value:
            if required:
                self.fail(name, "a path to a directory")
            return ""
        path = resolved(self.base, value)
        if not os.path.isdir(path) or not os.access(path, os.R_OK | os.X_OK):
            self.fail(name, "a path to a readable directory", value)
        return str(path)

    def tables(self, name: str, labels=None) -> list[_Section]:
        """The [[name]] tables, each keyed `name[i]`, or `name[label]` with `labels`
        (a function from the raw tables to one label each)."""
        self.seen.add(name)
        raw = self.data.get(name, [])
        if isinstance(raw, dict):
            raw = [raw]
        if not isinstance(raw, list):
            self.fail(name, "an array of tables", raw)
            return []
        names = labels(raw) if labels else range(len(raw))
        return [self.child(item, f"{self.key(name)}[{label}]")
                for label, item in zip(names, raw)]

    def table(self, name: str) -> _Section:
        self.seen.add(name)
        return self.child(self.data.get(name, {}), self.key(name))

    def child(self, data: Any, where: str) -> _Section:
        return _Section(data, where, self.problems, self.file, self.base, self.state_base,
                        self.secrets)

    def check_unknown(self) -> None:
        for name in self.data:
            if name not in self.seen:
                # The keys this table was read for are the ones it knows.
                self.problems.append(f"{self.file}: {self.key(name)}: unknown key"
                                     f"{self.near(name, self.seen)}")

    @staticmethod
    def near(name: str, known, cutoff: float = 0.75) -> str:
        """" (did you mean 'x'?)" for the known name closest to a mistyped one."""
        import difflib      # only a config with a mistake needs it
        close = difflib.get_close_matches(name, known, n=1, cutoff=cutoff)
        return f" (did you mean {close[0]!r}?)" if close else ""


def _typed(kind: type, expected: str) -> Callable[[Any], Any]:
    def convert(v):
        if type(v) is not kind:
            raise ValueError(expected)
        return v
    return convert


def _within(parse: Callable[[Any], Any], low, high, expected: str) -> Callable[[Any], Any]:
    def convert(v):
        value = parse(v)
        if value < low or (high is not None and value > high):
            raise ValueError(expected)
        return value
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
        restart_backoff_max=s.positive_duration("restart_backoff_max", d.restart_backoff_max),
        not_found_page=s.readable_file("not_found_page"),
        health_path=s.str("health_path", d.health_path),
        health_details=s.choice("health_details", d.health_details, ("local", "all", "none")),
        server_tokens=s.bool("server_tokens", d.server_tokens),
        user=s.str("user"),
        group=s.str("group"),
        state_dir=s.path("state_dir"),
    )
    if cfg.state_dir:
        folder = resolved(s.base, os.path.expanduser(cfg.state_dir))
        if not folder.is_dir() and not folder.parent.is_dir():
            s.fail("state_dir", "a folder (or one whose parent exists)", cfg.state_dir)
        cfg = replace(cfg, state_dir=str(folder))
    if cfg.user and _user_id(cfg.user) is None:
        s.fail("user", "a user of this system", cfg.user)
    if cfg.group and _group_id(cfg.group) is None:
        s.fail("group", "a group of this system", cfg.group)
    if cfg.group and not cfg.user:
        s.fail("group", "a user as well (group is the group that user runs with)")
    if not cfg.health_path.startswith("/"):
        s.fail("health_path", "a path starting with /", cfg.health_path)
    s.check_unknown()
    return cfg


def _user_id(name: str) -> int | None:
    import pwd
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        return None


def _group_id(name: str) -> int | None:
    import grp
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        return None


def _read_limits(s: _Section) -> Limits:
    d = Limits()
    cfg = Limits(
        max_url=s.size("max_url", d.max_url),
        max_header_bytes=s.size("max_header_bytes", d.max_header_bytes, 1, MAX_HEADER_BYTES,
                                f"a size from 1 byte to {MAX_HEADER_BYTES} bytes (HTTP/2 "
                                "SETTINGS carry it in 31 bits)"),
        max_headers=s.int("max_headers", d.max_headers, 1, 10_000),
        # 0 is refused rather than read as nginx's "no limit": nestgate has no unlimited
        # body, and "no body at all" is better said by the route.
        max_body=s.size("max_body", d.max_body, 1, None,
                        "a size above 0 (there is no unlimited; nginx's 0 means no limit)"),
        header_timeout=s.positive_duration("header_timeout", d.header_timeout),
        body_timeout=s.positive_duration("body_timeout", d.body_timeout),
        keepalive_timeout=s.positive_duration("keepalive_timeout", d.keepalive_timeout),
        keepalive_requests=s.int("keepalive_requests", d.keepalive_requests, 1, 10**9),
        max_connections=s.int("max_connections", d.max_connections, 1, 10**6),
        send_timeout=s.positive_duration("send_timeout", d.send_timeout),
        body_chunk_allowance=s.int("body_chunk_allowance", d.body_chunk_allowance,
                                   1, 10**9),
        min_body_chunk_average=s.size("min_body_chunk_average", d.min_body_chunk_average,
                                      0, 16 * 1024, "a size from 0 (no check) to 16KiB"),
    )
    s.check_unknown()
    return cfg


def _read_log(s: _Section) -> LogConfig:
    d = LogConfig()
    cfg = LogConfig(
        format=s.choice("format", d.format, ("json", "combined")),
        path=s.path("path", d.path),
        flush_interval=s.duration("flush_interval", d.flush_interval),
        log_loopback=s.bool("log_loopback", d.log_loopback),
    )
    if cfg.path not in ("-", ""):
        cfg = LogConfig(cfg.format, str(resolved(s.base, cfg.path)), cfg.flush_interval,
                        cfg.log_loopback)
        target = Path(cfg.path)
        if os.path.isdir(target):
            s.fail("path", "a file, not a directory", cfg.path)
        elif os.path.exists(target) and not os.access(target, os.W_OK):
            s.fail("path", "a file this user can append to", cfg.path)
        elif not os.path.isdir(target.parent) or not os.access(target.parent, os.W_OK):
            s.fail("path", "a file in a writable directory", cfg.path)
    s.check_unknown()
    return cfg


def read_certificate(c: _Section, managed_ok: bool = False) -> Certificate:
    """A `certificate` table: `cert` and `key` (PEM files that match), `names`; on a
    site listener `acme = true` or `internal = true` instead of the files."""
    names = tuple(n.lower().rstrip(".") for n in c.strings("names"))
    for name in names:
        if not _certificate_name(name):
            c.fail("names", "host names or \"*.example.com\" wildcards", name)
    if managed_ok:
        kinds = [kind for kind in MANAGED_KINDS if c.bool(kind, False)]
        if kinds:
            if len(kinds) > 1:
                c.fail(kinds[1], "one of acme = true, internal = true, installed = true")
            for key in ("cert", "key"):
                if key in c.data:
                    c.fail(key, "no PEM files here (acme, internal and installed "
                                "certificates are kept in [acme] storage)")
            c.check_unknown()
            return Certificate("", "", names, kinds[0])
    cert = Certificate(c.readable_file("cert", True), c.readable_file("key", True, secret=True),
                       names)
    if cert.cert and cert.key and os.path.isfile(cert.cert) and os.path.isfile(cert.key):
        problem = certificate_problem(cert)
        if problem:
            c.fail("", f"a matching PEM certificate and key ({problem})")
    c.check_unknown()
    return cert


def http3_problem(listener: Listener) -> str:
    """Why `http3 = true` cannot be served on `listener`, or ""."""
    if not listener.tls:
        return "false on a plain listener (QUIC is always TLS: add a certificate)"
    if listener.proxy_protocol_from:
        return "false on a listener that takes PROXY headers (QUIC datagrams carry none)"
    try:
        import aioquic  # noqa: F401  (an optional dependency: nestgate[http3])
    except ImportError:
        return "false, or aioquic installed (pip install 'nestgate[http3]')"
    return ""


def _read_listener(s: _Section) -> Listener:
    host, port = s.get("address", ("127.0.0.1", 8080), parse_address, "")
    if bind_address(host) is None:
        s.fail("address", f"a host name that resolves to an IPv4 address, got {host!r}")
    certs = [read_certificate(c, managed_ok=True) for c in s.tables("certificate")]
    if s.choice("tls", "", ("", "internal")) == "internal" and \
            not any(c.managed == "internal" for c in certs):
        certs.append(Certificate("", "", (), "internal"))   # names: the sites' hosts
    listener = Listener(host, port, tuple(certs),
                        redirect_https=s.bool("redirect_https", False),
                        https_port=s.int("https_port", 443, 1, 65535),
                        http2=s.bool("http2", True),
                        http2_cleartext=s.bool("http2_cleartext", False),
                        http3=s.bool("http3", False),
                        proxy_protocol_from=s.get("proxy_protocol_from", (), _cidr_list, ""),
                        max_connections_per_client=s.int("max_connections_per_client", 0,
                                                         0, 1_000_000),
                        key=f"{s.file}: {s.key('address')}")
    if listener.tls and listener.redirect_https:
        s.fail("redirect_https", "false on a TLS listener (it would redirect to itself)")
    if listener.http2_cleartext and (listener.tls or listener.proxy_protocol_from):
        s.fail("http2_cleartext", "false on a TLS listener (ALPN offers h2 there) or one "
               "that takes PROXY headers")
    if listener.http2_cleartext and listener.redirect_https:
        s.fail("http2_cleartext", "false on a listener that redirects to HTTPS")
    if listener.http3:
        problem = http3_problem(listener)
        if problem:
            s.fail("http3", problem)
    s.check_unknown()
    return listener


def _read_route(s: _Section) -> Route | None:
    path, prefix = s.str("path"), s.str("prefix")
    kind = s.choice("type", "", tuple(ROUTE_TYPES))
    if bool(path) == bool(prefix):
        s.fail("path", "exactly one of path or prefix")
    for name, value in (("path", path), ("prefix", prefix)):
        if value and not value.startswith("/"):
            s.fail(name, "a path starting with /", value)
    if not kind:
        if "type" not in s.data:
            s.fail("type", "one of " + ", ".join(repr(k) for k in ROUTE_TYPES))
        # A type that is not known says nothing of which keys belong: the one problem
        # is the type, not a line for each of its keys.
        return None
    options = ROUTE_TYPES[kind].read(s)
    access = read_access(s)
    rate_limit = read_rate_limit(s)
    policy = read_policy(s)
    forward_auth = read_forward_auth(s)
    s.check_unknown()
    return Route(kind, path, prefix, options, access, rate_limit, policy, forward_auth)


def _proxies_root(routes) -> bool:
    """A site whose "/" goes to an upstream: its health path belongs to the app
    behind it, so nestgate's own is off unless the site asks for it."""
    return any(r.type == "proxy" and r.prefix == "/" for r in routes)


def _host_pattern(h: str) -> bool:
    """A host name, a "*.example.com" wildcard or "*"."""
    return not configured_host_problem(h)


def site_labels(raw: list) -> list[str]:
    """A site is named by its first host (`site[photos.example.com]`, `site[*]` for the
    catch-all), which a reader finds in the file faster than a count of [[site]] tables;
    by its position (`site[2]`) when it has no readable host or shares its first host
    with another site."""
    firsts = []
    for item in raw:
        hosts = item.get("hosts", ["*"]) if isinstance(item, dict) else None
        first = hosts[0] if isinstance(hosts, list) and hosts else None
        firsts.append(first.lower() if isinstance(first, str) and _host_pattern(first)
                      else None)
    return [first if first is not None and firsts.count(first) == 1 else str(index)
            for index, first in enumerate(firsts)]


def _read_site(s: _Section, index: int) -> Site:
    # Shorthands (nestgate.base.shorthands) were expanded already: here only checked.
    s.str("proxy"), s.str("static")
    s.choice("https", "", ("", *shorthands.HTTPS_KINDS))
    hosts = s.strings("hosts", ("*",))
    if not hosts:
        # An empty list would make a site no request can reach, silently.
        s.fail("hosts", "at least one host name (\"*\" for every Host)", [])
    for h in hosts:
        problem = configured_host_problem(h)
        if problem:
            s.fail("hosts", f"host names, \"*.example.com\" wildcards or \"*\": {problem}", h)
    routes = tuple(r for r in (_read_route(t) for t in s.tables("route")) if r)
    site = Site(name=s.str("name", f"site{index}"), hosts=tuple(h.lower() for h in hosts),
                routes=routes, health=s.bool("health", not _proxies_root(routes)),
                security=_read_security(s.table("security")),
                home=_read_home(s.table("home")) if "home" in s.data else None,
                notes=_read_notes(s.table("notes")) if "notes" in s.data else None,
                templates=s.directory("templates"),
                base_url=s.str("base_url").rstrip("/"),
                access=read_access(s), protected=s.bool("protected", False),
                rate_limit=read_rate_limit(s), policy=read_policy(s),
                error_pages=_read_error_pages(s.table("error_pages")),
                key=s.where,
                forward_auth=read_forward_auth(s))
    if not site.protected:
        where = [("", site.policy)] + [(f"route[{i}].", r.policy)
                                       for i, r in enumerate(site.routes)]
        for prefix, policy in where:
            if policy is not None:
                s.fail(prefix + "policy", "protected = true on the site (a policy says who "
                       "of the signed-in users may enter)")
    if site.base_url and not site.base_url.startswith(("http://", "https://")):
        s.fail("base_url", "an absolute http(s) address", site.base_url)
    s.check_unknown()
    return site


def _read_error_pages(s) -> tuple[tuple[int, bytes], ...]:
    """`error_pages = { 403 = "403.html" }`: HTML files by status, read at load."""
    pages = []
    for key in s.data:
        s.seen.add(key)
        if not (key.isascii() and key.isdigit() and 400 <= int(key) <= 599):
            s.fail(key, "an error status, 400 to 599, naming an HTML file")
            continue
        body = s.file_bytes(key)
        if body:
            pages.append((int(key), body))
    return tuple(pages)


# Route types: each type's options are read by its entry in nestgate.sites.routetypes.


# Site sections: security headers, home page, notes.

def _read_security(s: _Section) -> Security:
    d = Security()
    cfg = Security(
        enabled=s.bool("enabled", d.enabled),
        csp=s.str("csp", d.csp),
        hsts=s.str("hsts", d.hsts),
        frame_options=s.str("frame_options", d.frame_options),
        referrer_policy=s.str("referrer_policy", d.referrer_policy),
        permissions_policy=s.str("permissions_policy", d.permissions_policy),
        nosniff=s.bool("nosniff", d.nosniff),
    )
    for name in ("csp", "hsts", "frame_options", "referrer_policy", "permissions_policy"):
        value = getattr(cfg, name)
        if "\r" in value or "\n" in value or not value.isascii():
            s.fail(name, "a header value on one line, in ASCII", value)
    s.check_unknown()
    return cfg


def _read_home(s: _Section) -> Home:
    d = Home()
    links = []
    for t in s.tables("links"):
        name, url = t.str("name"), t.str("url")
        if not name or not url:
            t.fail("name", "a link with both name and url")
        links.append((name, url))
        t.check_unknown()
    cfg = Home(path=s.str("path", d.path), title=s.str("title", d.title),
               owner=s.str("owner", d.owner), profile=s.str("profile", d.profile),
               links=tuple(links), latest=s.int("latest", d.latest, 0, 100))
    if not cfg.path.startswith("/"):
        s.fail("path", "a path starting with /", cfg.path)
    s.check_unknown()
    return cfg


def _read_notes(s: _Section) -> Notes:
    d = Notes(dir="")
    cfg = Notes(
        dir=s.directory("dir", required=True),
        path=s.str("path", d.path).rstrip("/") or "/notes",
        api_path=s.str("api_path", d.api_path).rstrip("/"),
        title=s.str("title", d.title),
        token=s.str("token", d.token),
        page_size=s.int("page_size", d.page_size, 1, 1000),
        cache_pages=s.int("cache_pages", d.cache_pages, 1, 1_000_000),
        feed_entries=s.int("feed_entries", d.feed_entries, 1, 1000),
        raw_html=s.bool("raw_html", d.raw_html),
        max_note_bytes=s.size("max_note_bytes", d.max_note_bytes),
        max_page_bytes=s.size("max_page_bytes", d.max_page_bytes, 16 * 1024, None,
                              "a size of at least 16KiB (the page around a note alone "
                              "takes a few KiB)"),
        cors_origins=s.strings("cors_origins", d.cors_origins),
    )
    for name in ("path", "api_path"):
        if not getattr(cfg, name).startswith("/"):
            s.fail(name, "a path starting with /", getattr(cfg, name))
    for origin in cfg.cors_origins:
        if origin != "*" and (not origin.startswith(("http://", "https://"))
                              or origin.count("/") != 2):
            s.fail("cors_origins", "origins such as \"https://example.com\" or \"*\"", origin)
    s.check_unknown()
    return cfg


# ------------------------------------------------------------------ entry


def read_config(path: str | os.PathLike | None = None) -> Config:
    """Read `path`, or ./nestgate.toml when present, or the embedded default."""
    if path is None:
        path = DEFAULT_CONFIG_NAME if os.path.exists(DEFAULT_CONFIG_NAME) else EMBEDDED_DEFAULT
    path = Path(path)
    try:
        data = read_toml(path.read_bytes())
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror}"]) from None
    except ValueError as exc:
        raise ConfigError([f"{path}: {exc}"]) from None
    return parse_config(data, str(path), path.resolve().parent)


def state_folder(server: ServerConfig, base: Path, file: str = "") -> Path:
    """The folder relative state paths resolve against: `[server] state_dir`; else,
    run by systemd with `StateDirectory=`, its $STATE_DIRECTORY (the first, if it
    names several), the one place the unit lets nestgate write; else the config's
    own folder, except for the embedded default, which lives inside the installed
    package: its state goes to the user's state folder ($XDG_STATE_HOME/nestgate,
    ~/.local/state/nestgate), made 0700 when missing."""
    if server.state_dir:
        return Path(server.state_dir)
    systemd = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
    if systemd and os.path.isabs(systemd):
        return Path(systemd)
    if file and Path(file).resolve() == EMBEDDED_DEFAULT.resolve():
        xdg = os.environ.get("XDG_STATE_HOME", "")
        folder = Path(xdg if os.path.isabs(xdg) else Path.home() / ".local" / "state")
        try:
            make_private_folders(folder / "nestgate")
        except OSError:
            return base            # the storage's own check then says what is wrong
        return folder / "nestgate"
    return base


def parse_config(data: dict, file: str = "<config>", base: Path | None = None) -> Config:
    problems: list[str] = []
    top = _Section(shorthands.expand(data), "", problems, file, base or Path.cwd())
    server = _read_server(top.table("server"))
    top.state_base = state_folder(server, top.base, file)
    limits = _read_limits(top.table("limits"))
    log = _read_log(top.table("log"))
    listeners = tuple(_read_listener(t) for t in top.tables("listen"))
    sites = tuple(_read_site(t, i) for i, t in enumerate(top.tables("site", site_labels)))
    client_ip = top.table("client_ip")
    trusted = client_ip.get("trusted_proxies", (), _cidr_list, "")
    client_ip.check_unknown()
    auth = read_auth(top.table("auth"))
    state = _read_state(top.table("state"))
    if auth is not None and state.backend == "redis":
        from nestgate.handlers.auth.redisstore import redis_locator
        auth = replace(auth, store=redis_locator(state.url, state.prefix))
    from nestgate.bans.config import check_sites, read_bans
    bans = read_bans(top, auth, state)
    admin = read_admin(top.table("admin"), parse_address, read_certificate)
    acme = read_acme(top.table("acme"))
    geoip = read_geoip(top.table("geoip"))
    crowdsec = read_crowdsec(top.table("crowdsec"), bans)
    admin = with_generated_token(admin, acme.storage)
    top.check_unknown()
    listeners = _managed_names(listeners, sites, acme, file, problems)
    if not listeners:
        problems.append(f"{file}: listen: expected at least one [[listen]] table")
    for first, second in _clashing_listeners(listeners):
        shown = listeners[second]
        host = f"[{shown.host}]" if ":" in shown.host else shown.host
        problems.append(f"{file}: listen[{second}].address: expected an address that "
                        f"listen[{first}].address does not already take, "
                        f"got '{host}:{shown.port}'")
    # [[auth.forward]] hosts are a site's too: one of the two could never be asked about.
    problems += _clashing_hosts(sites + forward_sites(auth), file) \
        + _clashing_routes(sites, server, file)
    if (any(site.protected for site in sites) or auth is not None and auth.forward) \
            and (auth is None or not auth.users):
        problems.append(f"{file}: auth: expected an [auth] table with at least one "
                        "[[auth.user]] when a site is protected (or [[auth.forward]] "
                        "guards hosts)")
    if auth is not None and auth.provider is not None:
        from nestgate.handlers.auth.oidc.config import provider_problems
        problems += provider_problems(auth.provider, sites, file)
    if admin.enabled:
        problems += _admin_clashes(admin, listeners, file)
    problems += _user_keyed_limits(sites, file) + _places_without_database(sites, geoip, file)
    problems += check_sites(bans, sites, file)
    if problems:
        raise ConfigError(problems)
    return Config(file, server, limits, log, listeners, sites, trusted, auth, admin, state,
                  acme, geoip, crowdsec, bans, tuple(top.secrets))


def _places_without_database(sites, geoip, file: str) -> list[str]:
    """Countries or AS numbers on a site or route, and no [geoip] file to look them up in."""
    problems = []
    for site in sites:
        where = [(site.key, site.access)] + [
            (f"{site.key}.route[{j}]", r.access) for j, r in enumerate(site.routes)]
        for at, access in where:
            for key in access.by_place if access is not None else ():
                needed = geoip is not None and (
                    geoip.database if key.endswith("countries")
                    else geoip.database or geoip.asn_database)
                if not needed:
                    what = "database" if key.endswith("countries") else \
                        "asn_database (or a database that holds AS numbers)"
                    problems.append(f"{file}: {at}.{key}: expected a [geoip] {what} to "
                                    f"look addresses up in")
    return problems


def _certificate_name(name: str) -> bool:
    return name != "*" and not configured_host_problem(name)


def _address(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
        return True
    except ValueError:
        return False


def _managed_names(listeners, sites, acme, file: str, problems: list[str]):
    """Give each managed certificate without `names` the exact names of the sites'
    hosts, and refuse what the CA could not sign: a wildcard needs DNS-01."""
    hosts = tuple(dict.fromkeys(h for site in sites for h in site.hosts if h != "*"))
    out = []
    for i, listener in enumerate(listeners):
        certs = []
        for j, cert in enumerate(listener.certificates):
            where = f"{file}: listen[{i}].certificate[{j}].names"
            if cert.managed and not cert.names:
                # A wildcard host is certified as one only where it can be proven.
                names = tuple(h for h in hosts if cert.managed != "acme"
                              or acme.dns is not None or not h.startswith("*."))
                if cert.managed == "acme":
                    # No CA certifies these; an address is never sent as SNI either.
                    names = tuple(h for h in names if h != "localhost"
                                  and not h.endswith(".localhost") and not _address(h))
                unprovable = [h for h in hosts if h.startswith("*.")] \
                    if cert.managed == "acme" and acme.dns is None else []
                if not names and not unprovable:
                    problems.append(f"{where}: expected names to certify (no site has a "
                                    "host name other than \"*\")")
                cert = replace(cert, names=names + tuple(unprovable))
                where = f"{where} (from the sites' hosts)"
            if cert.managed == "acme" and acme.dns is None:
                for name in cert.names:
                    if name.startswith("*."):
                        problems.append(
                            f"{where}: expected names without wildcards unless [acme.dns] "
                            f"is set (a CA proves a wildcard only by DNS-01), got {name!r}")
            certs.append(cert)
        out.append(replace(listener, certificates=tuple(certs)))
    return tuple(out)


def _user_keyed_limits(sites, file: str) -> list[str]:
    """`key = "user"` counts signed-in users: only a protected site has them."""
    problems = []
    for site in sites:
        if site.protected:
            continue
        where = [("", site.rate_limit)] + [(f".route[{i}]", r.rate_limit)
                                           for i, r in enumerate(site.routes)]
        for suffix, limit in where:
            if limit is not None and limit.key == "user":
                problems.append(f"{file}: {site.key}{suffix}.rate_limit.key: expected "
                                f"\"ip\" on a site without protected = true (only signed-"
                                f"in visitors have a user), got 'user'")
    return problems


def _admin_clashes(admin, listeners, file: str) -> list[str]:
    """The admin listener never shares a port with the sites'."""
    if admin.port == 0:
        return []
    problems = []
    for index, listener in enumerate(listeners):
        if listener.port == admin.port and (
                listener.host == admin.host or "0.0.0.0" in (listener.host, admin.host)
                or "::" in (listener.host, admin.host)):
            problems.append(f"{file}: {admin.key.rpartition(': ')[2]}: expected an address "
                            f"that listen[{index}].address does not take (the admin "
                            f"listener never shares a port with the sites), got "
                            f"'{admin.host}:{admin.port}'")
    return problems


def bind_address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address a listener on `host` binds, as the supervisor binds it: an IP as
    written, or a host name resolved to IPv4 (None when it does not resolve)."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return None
    return ipaddress.ip_address(infos[0][4][0]) if infos else None


def _clashing_listeners(listeners) -> list[tuple[int, int]]:
    """(i, j) for each listener j that could not bind beside listener i: the same port
    on the same address however it is spelt ("localhost", "127.0.0.1"; "::1",
    "0:0::1"), or beside the wildcard of its family (0.0.0.0, or :: since IPv6
    listeners are IPv6-only). Port 0 never clashes."""
    bound = [bind_address(listener.host) for listener in listeners]

    def clash(i, j):
        a, b = bound[i], bound[j]
        if listeners[i].port != listeners[j].port or listeners[i].port == 0 \
                or a is None or b is None or a.version != b.version:
            return False
        return a == b or a.is_unspecified or b.is_unspecified
    return [(i, j) for j in range(len(listeners)) for i in range(j) if clash(i, j)]


def _clashing_hosts(sites, file: str) -> list[str]:
    """A Host claimed twice: only one of the sites could ever answer it."""
    problems, claimed = [], {}
    for i, site in enumerate(sites):
        for host in sorted({h for h in site.hosts if site.hosts.count(h) > 1}):
            problems.append(f"{file}: {site.key}.hosts: expected each host once, "
                            f"got {host!r} twice")
        for host in dict.fromkeys(site.hosts):
            first = claimed.setdefault(host, i)
            if first != i:
                problems.append(f"{file}: {site.key}.hosts: expected hosts no other site "
                                f"claims, got {host!r} ({sites[first].key}.hosts claims it too)")
    return problems


def report_config_problems(exc) -> int:
    """Print every problem of a `ConfigError`; the exit status that says so (every
    command that reads the config reports it this way)."""
    print("nestgate: the config has problems:", file=sys.stderr)
    for problem in exc.problems:
        print(f"  {problem}", file=sys.stderr)
    return 2


def forward_sites(auth) -> tuple[Site, ...]:
    """Each [[auth.forward]] entry as the site nestgate keeps for it: protected, with
    the entry's policy and network keys, no routes (nestgate.handlers.auth.forwardconfig)."""
    if auth is None:
        return ()
    return tuple(Site(name=entry.name, hosts=entry.hosts, health=False, access=entry.access,
                      protected=True, policy=entry.policy, key=f"auth.forward[{i}]")
                 for i, entry in enumerate(auth.forward))


def site_claims(site: Site, server: ServerConfig) -> list[tuple[str, str, str, str]]:
    """Every route the site's table gets at load, in the order nestgate.sites.build adds
    them: (kind "path" or "prefix", its path or prefix, the config key that puts it
    there, what it is when the site adds it by itself)."""
    key = site.key
    claims = []
    if site.health:
        claims.append(("path", server.health_path, "server.health_path", "the health check"))
    claims += [("path", route.path, f"{key}.route[{j}].path", "") if route.path else
               ("prefix", route.prefix, f"{key}.route[{j}].prefix", "")
               for j, route in enumerate(site.routes)]
    if site.home:
        claims.append(("path", site.home.path, f"{key}.home.path", "the home page"))
    if site.notes:
        base, api = site.notes.path, site.notes.api_path
        pages, api_key = f"{key}.notes.path", f"{key}.notes.api_path"
        claims += [("path", base, pages, "the notes list"),
                   ("path", base + "/feed.xml", pages, "the notes feed"),
                   ("path", base + "/{slug}", pages, "the notes pages"),
                   ("path", base + "/page/{n}", pages, "the notes list pages"),
                   ("path", base + "/tag/{tag}", pages, "the notes tag pages"),
                   ("path", base + "/tag/{tag}/page/{n}", pages, "the notes tag pages"),
                   ("path", api, api_key, "the notes API"),
                   ("path", api + "/{slug}", api_key, "the notes API")]
    if site.protected:
        claims += [("path", path, f"{key}.protected", what)
                   for path, what in {**PORTAL_PATHS, **AUTHZ_PATHS}.items()]
    return claims


def _clashing_routes(sites, server: ServerConfig, file: str) -> list[str]:
    """Two routes of a site on the same exact path (a route table refuses the second:
    nestgate.pipeline.routing.SiteRoutes) or the same prefix (the first would win): one of them
    could never answer. The routes a site adds by itself count: the health check, the
    home and notes pages, the notes API, the sign-in pages. Paths differing only in
    the names of their {segments} are the same path."""
    problems = []
    for site in sites:
        held: dict[tuple[str, str], tuple[str, str]] = {}
        for kind, value, key, what in site_claims(site, server):
            first = held.setdefault((kind, path_shape(value)), (key, what))
            if first != (key, what):
                other = first[0] + (f" ({first[1]})" if first[1] else "")
                problems.append(f"{file}: {key}: expected a {kind} no other route of the "
                                f"site has, got {value!r} ({other} has it too)")
    return problems


# Names a browser treats as secure even over plain HTTP, so a Secure cookie comes back.
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]", "::1")


def config_warnings(config: Config) -> list[str]:
    """What the config allows but will not work as its owner expects; `check` and
    `serve` print these without refusing the config."""
    out = _secrets_open_to_others(config)
    out += _store_open_to_others(config)
    out += _forward_without_trusted_proxies(config)
    # [[auth.forward]] entries are protected sites too: the same warnings, by their key.
    for site in config.guarded_sites:
        out += _plain_sign_in(config, site)
        out += _policy_names(config, site)
        out += _entered_without_sign_in(config, site)
        out += _open_to_all(config.source, site.key, site.access)
        for j, route in enumerate(site.routes):
            out += _open_to_all(config.source, f"{site.key}.route[{j}]", route.access)
            out += _system_root(config.source, f"{site.key}.route[{j}]", route)
        if site.notes and not site.base_url:
            out.append(f"{config.source}: {site.key}.base_url: the Atom feed at "
                       f"{site.notes.path}/feed.xml needs it for absolute links (feed "
                       "readers cannot follow relative ones); set it, e.g. "
                       "\"https://example.com\"")
    return out


def _forward_without_trusted_proxies(config: Config) -> list[str]:
    """[[auth.forward]] hosts are asked about by a proxy in front: unless it is a
    trusted proxy, its X-Forwarded-For is not believed, and the network keys judge
    the proxy's own address (exempt_local lets everyone in through a local proxy)."""
    if config.auth is None or not config.auth.forward or config.trusted_proxies:
        return []
    return [f"{config.source}: auth.forward: no [client_ip] trusted_proxies, so the proxy "
            "that asks is taken for the client (its X-Forwarded-For is not believed) and "
            "allow, deny and exempt_local judge the proxy's address; list the proxy's "
            "address in trusted_proxies"]


def _secrets_open_to_others(config: Config) -> list[str]:
    """Each file holding a secret (a TLS key, a token, a client secret, a DNS provider's
    credentials, users' password hashes and TOTP secrets) that the file's group or other
    users may read, as ssh warns of a private key others can read: once, naming the
    file and its mode. Not refused: a group such as Debian's ssl-cert may be meant."""
    out = []
    for key, path in dict.fromkeys(config.secret_files):
        mode = open_to_others(path, READABLE_BY_OTHERS)
        if mode is not None:
            out.append(f"{config.source}: {key}: {path} can be read by other users of "
                       f"this machine (mode {mode:04o}); `chmod 600` it")
    return out


def _store_open_to_others(config: Config) -> list[str]:
    """An existing store file (or its -wal, -shm) that other local users may read (it
    holds the CSRF key, the allow-list and who signed in from where), or a folder of it
    they may write to. nestgate creates them private; one made before, or by hand, is
    left as it is, and told."""
    auth = config.auth
    if auth is None or auth.store == ":memory:" or config.state.backend == "redis":
        return []
    out = []
    for path in (auth.store, auth.store + "-wal", auth.store + "-shm"):
        mode = open_to_others(path)
        if mode is not None:
            out.append(f"{config.source}: auth.store: {path} is open to other users "
                       f"(mode {mode:04o}) and holds the CSRF key, the allow-list and who "
                       f"signed in from where: chmod 600 {path}")
    folder = os.path.dirname(auth.store)
    mode = open_to_others(folder, WRITABLE_BY_OTHERS)
    if mode is not None:
        out.append(f"{config.source}: auth.store: its folder {folder} is writable by other "
                   f"users (mode {mode:04o}), who could put their own store (or its -wal) "
                   "there; nestgate makes a missing folder 0700 but leaves one that exists "
                   f"as it is: chmod 700 {folder}, or name a store in a folder of its own")
    return out


def _open_to_all(file: str, where: str, access) -> list[str]:
    """An allow entry that holds every address (0.0.0.0/0, ::/0): the list lets anyone
    in, which is seldom what it was written for."""
    if access is None:
        return []
    everything = [e for e in access.allow if covers_every_address(e)]
    if not everything:
        return []
    return [f"{file}: {where}.allow: {everything[0]!r} holds every address, so the list "
            "lets anyone in; remove the allow list to mean that, or name the networks "
            "meant"]


def _system_root(file: str, where: str, route) -> list[str]:
    """A static root that is "/" or a folder right under it (/etc, /home, /var...):
    every file the server may read there is served to whoever reaches the route."""
    root = getattr(route.options, "root", "") if route.type == "static" else ""
    if not root or len(Path(root).parts) > 2:
        return []
    return [f"{file}: {where}.root: {root!r} serves the whole of a system folder (every "
            "file the server's user may read in it); point it at a folder that holds "
            "only what the site publishes"]


def _plain_sign_in(config: Config, site: Site) -> list[str]:
    """A protected site that browsers reach only over plain HTTP, with a Secure session
    cookie: the browser drops the cookie and sign-in fails on every try."""
    auth = config.auth
    if not site.protected or auth is None or not auth.cookie_secure:
        return []
    if any(l.tls or l.redirect_https or l.proxy_protocol_from for l in config.listeners) \
            or config.trusted_proxies:
        return []                           # HTTPS here, or a proxy in front that has it
    plain = [h for h in site.hosts
             if h not in _LOOPBACK_NAMES and not h.endswith(".localhost")]
    if not plain:
        return []
    return [f"{config.source}: {site.key}: protected, but reachable only "
            f"over plain HTTP as {', '.join(repr(h) for h in plain)}: browsers drop the "
            "session cookie there (auth.cookie_secure = true) and sign-in fails; add an "
            "HTTPS listener (with a redirect_https one on port 80), or sign in through a "
            "*.localhost name on this machine only"]


def _policy_names(config: Config, site: Site) -> list[str]:
    if config.auth is None:
        return []
    from nestgate.handlers.auth.policy import policy_warnings
    where = [(f"{config.source}: {site.key}", site.policy)] + [
        (f"{config.source}: {site.key}.route[{j}]", r.policy)
        for j, r in enumerate(site.routes)]
    return [w for key, policy in where if policy is not None
            for w in policy_warnings(key, policy, config.auth.users)]


def _entered_without_sign_in(config: Config, site: Site) -> list[str]:
    """Where a protected site lets someone in without signing in: clients on local
    networks (exempt_local), and the dynamic allow-list (`nestgate allow` entries, and
    every address a user signed in from when ip_grant is on), which also skip the
    users and groups a policy names."""
    if not site.protected or config.auth is None:
        return []
    out = []
    where = [("", site.access, site.policy)] + [
        (f".route[{j}]", r.access, r.policy or site.policy)
        for j, r in enumerate(site.routes) if r.access is not None]
    for suffix, access, policy in where:
        key = f"{config.source}: {site.key}{suffix}"
        if access is not None and access.exempt_local:
            out.append(f"{key}: protected, but exempt_local = true lets every client on a "
                       "local network (loopback, private, link-local, CGNAT addresses) in "
                       "without signing in")
        if access is not None and not access.allow_dynamic:
            continue
        if config.auth.ip_grant > 0:
            out.append(f"{key}: protected, but [auth] ip_grant lets the address of anyone "
                       f"who signs in (to any site) in without signing in for "
                       f"{config.auth.ip_grant:g} s, whoever else uses it; set "
                       "allow_dynamic = false here to refuse it")
        if policy is not None and (policy.allow_users or policy.allow_groups
                                   or policy.policy == "two_factor"):
            out.append(f"{key}: protected with a user policy, but entries of the dynamic "
                       "allow-list (`nestgate allow`, ip_grant) enter without signing in, "
                       "so the policy is not asked; set allow_dynamic = false here to "
                       "refuse them")
    return out


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
        listeners = tuple(Listener(h, p, key=f"--listen {v!r}")
                          for (h, p), v in zip(addresses, listen)) + kept
        names = [f"--listen {v!r}" for v in listen] + [f"TLS listener {l.host}:{l.port}"
                                                        for l in kept]
        clashes = [f"{names[j]}: expected an address {names[i]} does not already take"
                   for i, j in _clashing_listeners(listeners)]
        if clashes:
            raise ConfigError(clashes)
        config = replace(config, listeners=listeners)
    if workers is not None:
        if workers < 1:
            raise ConfigError([f"--workers {workers}: expected a number of workers >= 1"])
        config = replace(config, server=replace(config.server, workers=workers))
    return config
