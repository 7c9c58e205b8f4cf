"""Servers the harness starts: nestgate (the subject), nginx and Caddy (peers), and an
nginx backend for the proxy scenarios.

Each server is given a `Site` (port, certificate, worker count, the scenario's route) and
renders it into its own config file, so the same routes and the same bytes are served by
all. Servers run in the foreground as our children, in their own process group, and are
stopped with SIGTERM then, after a deadline, SIGKILL to that group only.
"""

import http.client
import json
import os
import signal
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import BenchError, SkipScenario, callgrind, content, tools
from .scenarios import Route

READY_TIMEOUT_S = 15.0
PACKAGE_ROOT = Path(__file__).resolve().parents[2]     # the folder holding `nestgate/`
STOP_TIMEOUT_S = 10.0


@dataclass
class Site:
    """What every server of a scenario must serve."""
    content: Path                       # generated files (content.write_all)
    port: int
    workers: int
    route: Route
    certificate: content.Certificate | None = None
    site_host: str = ""                 # "" = any Host; else only this one (404 scenario)
    cidrs: tuple[str, ...] = ()         # access list checked for the other Hosts
    backend_port: int = 0               # proxy scenarios
    rate_limit: tuple[int, int] | None = None   # (per second, burst) per client address
    state: str = ""                     # behind sign-in: "sqlite" or "redis" sessions
    policy: bool = False                # behind sign-in: only the bench user's group
    bans: int = 0                       # bans put in the store before the start
    state_url: str = ""                 # the Redis server's, for "redis"
    wrapper: tuple[str, ...] = ()       # a command the server runs under (callgrind)
    http3: bool = False                 # nestgate's TLS listener also serves HTTP/3
    # Bytes nestgate answered for a path, which peers replay (health length, note pages).
    captured: dict[str, tuple[bytes, str]] = field(default_factory=dict)

    @property
    def scheme(self) -> str:
        return "https" if self.certificate else "http"


class ServerProcess:
    """A server we started: the process, its log files, start and stop."""

    def __init__(self, name: str, argv: list[str], logdir: Path, env: dict | None = None):
        self.name, self.argv, self.logdir = name, argv, logdir
        self.stdout_path = logdir / f"{name}.out.log"
        self.stderr_path = logdir / f"{name}.err.log"
        self._env = env
        self.proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, cwd: Path) -> None:
        env = {**os.environ, **(self._env or {})}
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(self.argv, cwd=cwd, stdout=out, stderr=err, env=env,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def stderr_tail(self, lines: int = 15) -> str:
        try:
            text = self.stderr_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            # Our own session: the group id is the pid we started, nothing else is in it.
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def fetch(scheme: str, port: int, path: str, host: str = "", timeout_s: float = 2.0,
          method: str = "GET", body: bytes | None = None,
          headers: dict | None = None) -> tuple[int, bytes, dict]:
    """One request to 127.0.0.1; certificates are not verified (ours, self-signed)."""
    if scheme == "https":
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout_s, context=ctx)
    else:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request(method, path, body=body, headers={"Host": host or f"127.0.0.1:{port}",
                                                       **(headers or {})})
        resp = conn.getresponse()
        data = resp.read()
        info = {k.lower(): v for k, v in resp.getheaders()}
        if scheme == "https":
            info[":tls"] = conn.sock.version() if conn.sock else ""
        return resp.status, data, info
    finally:
        conn.close()


def wait_ready(server: ServerProcess, scheme: str, port: int, path: str, host: str = "",
               timeout_s: float = READY_TIMEOUT_S) -> None:
    """Poll with a deadline until the server answers any HTTP response on `path`."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        if server.exited() is not None:
            raise BenchError(f"{server.name} exited with status {server.exited()} before it was "
                             f"ready:\n{server.stderr_tail()}")
        try:
            fetch(scheme, port, path, host)
            return
        except (OSError, http.client.HTTPException) as exc:
            last = str(exc)
            time.sleep(0.05)
    raise BenchError(f"{server.name} not ready on port {port} after {timeout_s:.0f}s "
                     f"({last}):\n{server.stderr_tail()}")


class Peer:
    """A server measured in the benchmark. Subclasses render configs and name the command."""
    name = ""
    tool = ""
    limits_rates = True                 # can limit requests per client (health-limited)

    def __init__(self, workdir: Path, outdir: Path):
        self.workdir, self.outdir = workdir, outdir
        self.server: ServerProcess | None = None

    def available(self) -> str:
        """'' when this peer can run here, else why not."""
        if self.tool and not tools.which(self.tool):
            return f"{self.tool} is not installed (Debian package: {tools.DEBIAN_PACKAGES[self.tool]})"
        return ""

    def version(self) -> str:
        return tools.version(self.tool)

    def configure(self, site: Site) -> list[Path]:
        raise NotImplementedError

    def argv(self, config: Path, site: Site) -> list[str]:
        raise NotImplementedError

    def env(self, site: Site) -> dict:
        return {}

    def start(self, site: Site, ready_path: str, ready_host: str = "") -> None:
        configs = self.configure(site)
        self.server = ServerProcess(self.name, self.argv(configs[0], site), self.outdir,
                                    self.env(site))
        self.server.start(self.workdir)
        try:
            wait_ready(self.server, site.scheme, site.port, ready_path, ready_host,
                       callgrind.READY_TIMEOUT_S if site.wrapper else READY_TIMEOUT_S)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.server:
            self.server.stop()

    @property
    def pid(self) -> int:
        assert self.server is not None
        return self.server.pid


# ---------------------------------------------------------------- nestgate

def _toml(value) -> str:
    # JSON strings, numbers, booleans and arrays of them are valid TOML values.
    return json.dumps(value)


class Nestgate(Peer):
    name = "nestgate"

    def available(self) -> str:
        return ""

    def version(self) -> str:
        out = subprocess.run([sys.executable, "-m", "nestgate", "--version"],
                             capture_output=True, text=True, timeout=30, cwd=PACKAGE_ROOT)
        return (out.stdout or out.stderr).strip().splitlines()[0] if out.returncode == 0 else "?"

    def argv(self, config: Path, site: Site) -> list[str]:
        return [*site.wrapper, sys.executable, "-m", "nestgate", "serve", "--config", str(config),
                "--workers", str(site.workers)]

    def env(self, site: Site) -> dict:
        # The server runs in a temporary directory: make `-m nestgate` find this very tree,
        # not another installed copy, so the code measured is the code of the harness.
        return {"PYTHONPATH": os.pathsep.join(filter(None, [str(PACKAGE_ROOT),
                                                            os.environ.get("PYTHONPATH")]))}

    def configure(self, site: Site) -> list[Path]:
        path = self.outdir / "nestgate.toml"
        path.write_text(render_nestgate(site, self.workdir))
        if site.state:
            _open_bench_session(site, self.workdir)
        if site.bans:
            _fill_bans(site, self.workdir)
        return [path]

    def check(self, config: Path) -> None:
        """`nestgate check` first: a config nestgate cannot read yet means a missing feature."""
        out = subprocess.run([sys.executable, "-m", "nestgate", "check", "--config", str(config)],
                             capture_output=True, text=True, timeout=60, cwd=PACKAGE_ROOT)
        if out.returncode != 0:
            problems = (out.stderr + out.stdout).strip().splitlines()[-6:]
            raise SkipScenario("nestgate rejects the config for this scenario:\n    "
                               + "\n    ".join(problems))

    def start(self, site: Site, ready_path: str, ready_host: str = "") -> None:
        self.check(self.configure(site)[0])
        super().start(site, ready_path, ready_host)


def _state_locator(site: Site, workdir: Path) -> str:
    if site.state == "redis":
        from nestgate.handlers.auth.redisstore import redis_locator
        return redis_locator(site.state_url, "nestgate-bench:")
    return str(workdir / "nestgate-bench-state.db")


def _open_bench_session(site: Site, workdir: Path) -> None:
    """The session the private scenarios' requests carry, put in the store the server
    will use, as a sign-in would."""
    from nestgate.handlers.auth.store import open_store, prepare_store, token_hash
    from .scenarios import BENCH_SESSION
    locator = _state_locator(site, workdir)
    prepare_store(locator)
    store = open_store(locator)
    try:
        store.delete_session(token_hash(BENCH_SESSION))      # configured more than once
        store.create_session(token_hash(BENCH_SESSION), "bench", time.time() + 86400,
                             "127.0.0.1")
    finally:
        store.close()


def _bans_store(workdir: Path) -> str:
    return str(workdir / "nestgate-bench-bans.db")


def _fill_bans(site: Site, workdir: Path) -> None:
    """`site.bans` bans in the store the server loads its table from at the start:
    addresses of 100.64.0.0/10, never the driver's loopback."""
    from nestgate.handlers.auth.store import prepare_store
    from nestgate.bans.store import open_bans
    locator = _bans_store(workdir)
    prepare_store(locator)
    bans = open_bans(locator)
    try:
        for i in range(site.bans):
            bans.ban(f"100.{64 + i // 65536}.{i // 256 % 256}.{i % 256}", (86400.0,), 0.0,
                     "operator", "", "bench", "close", replace=True)
    finally:
        bans.close()


def _signed_in_tables(site: Site, workdir: Path) -> list[str]:
    from nestgate.handlers.auth.passwords import hash_password
    lines = ["[auth]", f"store = {_toml(str(workdir / 'nestgate-bench-state.db'))}",
             "cookie_secure = false", "", "[[auth.user]]", 'name = "bench"',
             f"password = {_toml(hash_password('bench-password'))}",
             'groups = ["family"]', ""]
    if site.state == "redis":
        lines += ["[state]", 'backend = "redis"', f"url = {_toml(site.state_url)}",
                  'prefix = "nestgate-bench:"', ""]
    return lines


# Requests per connection for every server: the whole run on one connection.
KEEPALIVE_REQUESTS = 100_000_000


def render_nestgate(site: Site, workdir: Path | None = None) -> str:
    lines = ["# generated by nestgate bench", "[server]", f"workers = {site.workers}", "",
             "[log]", "log_loopback = false", "",
             # As nginx's config below: the drivers keep their connections for the whole
             # run, and neither server ends them (h2load does not reconnect; wrk's TLS
             # reconnections would add handshakes to the requests measured).
             "[limits]", f"keepalive_requests = {KEEPALIVE_REQUESTS}", "",
             # On as a user runs it, on a free port beside whatever else runs here.
             "[admin]", 'address = "127.0.0.1:0"', "", "[[listen]]",
             f"address = {_toml(f'127.0.0.1:{site.port}')}"]
    if site.http3:
        lines.append("http3 = true")
    if site.certificate:
        lines += ["[[listen.certificate]]", f"cert = {_toml(str(site.certificate.cert))}",
                  f"key = {_toml(str(site.certificate.key))}", 'names = ["localhost"]']
    if site.state:
        lines += [""] + _signed_in_tables(site, workdir)
    if site.bans:
        lines += ["", "[bans]", f"store = {_toml(_bans_store(workdir))}"]
    lines += ["", "[[site]]", f"hosts = {_toml([site.site_host or '*'])}"]
    if site.state:
        lines.append("protected = true")
    if site.policy:
        lines.append('allow_groups = ["family"]')
    if site.rate_limit:
        rate, burst = site.rate_limit
        lines.append(f'rate_limit = {{ rate = "{rate}/s", burst = {burst} }}')
    lines += _NESTGATE_ROUTES[site.route.kind](site)
    if site.site_host:
        # Any other Host lands on a catch-all site that checks the access list and has no
        # routes: the 404 comes after the CIDR check, as in nginx's default server.
        lines += ["", "[[site]]", 'name = "others"', 'hosts = ["*"]', "health = false",
                  f"allow = {_toml(list(site.cidrs))}"]
    return "\n".join(lines) + "\n"


def _nestgate_health(site: Site) -> list[str]:
    return []       # served on every site


def _nestgate_file(site: Site) -> list[str]:
    return ["[[site.route]]", f"path = {_toml(site.route.path)}", 'type = "return"', "status = 200",
            f"body_file = {_toml(str(site.content / site.route.source))}",
            'content_type = "text/html; charset=utf-8"']


def _nestgate_static(site: Site) -> list[str]:
    return ["[[site.route]]", f"prefix = {_toml(site.route.path)}", 'type = "static"',
            f"root = {_toml(str(site.content / 'static'))}"]


def _nestgate_proxy(site: Site) -> list[str]:
    return ["[[site.route]]", f"prefix = {_toml(site.route.path)}", 'type = "proxy"',
            "strip_prefix = true",
            f"upstream = {_toml(f'http://127.0.0.1:{site.backend_port}')}"]


def _nestgate_notes(site: Site) -> list[str]:
    return ["[site.notes]", f"dir = {_toml(str(site.content / 'notes'))}",
            f"token = {_toml(NOTES_TOKEN)}"]


NOTES_TOKEN = "bench-token-not-secret"
_NESTGATE_ROUTES = {"health": _nestgate_health, "file": _nestgate_file,
                    "static": _nestgate_static, "proxy": _nestgate_proxy, "notes": _nestgate_notes}


# ---------------------------------------------------------------- nginx

class Nginx(Peer):
    name = "nginx"
    tool = "nginx"

    def argv(self, config: Path, site: Site) -> list[str]:
        # -e: nginx would otherwise try its compiled-in error log before reading the config.
        return [tools.require("nginx"), "-c", str(config), "-p", str(self.workdir),
                "-e", str(self.outdir / f"{self.name}.error.log")]

    def configure(self, site: Site) -> list[Path]:
        path = self.outdir / f"{self.name}.conf"
        path.write_text(render_nginx(site, self.workdir, self.outdir / f"{self.name}.error.log",
                                     _NGINX_ROUTES[site.route.kind](site)))
        return [path]


class NginxBackend(Nginx):
    """The fast upstream of the proxy scenarios: not measured, the same for every peer."""
    name = "backend"

    def configure(self, site: Site) -> list[Path]:
        path = self.outdir / "backend.nginx.conf"
        root = site.content / "backend"
        locations = [f"location / {{ root {root}; default_type application/octet-stream; }}"]
        path.write_text(render_nginx(site, self.workdir, self.outdir / "backend.error.log",
                                     locations))
        return [path]


def render_nginx(site: Site, workdir: Path, error_log: Path, locations: list[str]) -> str:
    tmp = workdir / "nginx-tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    listen = f"listen 127.0.0.1:{site.port}"
    tls = []
    if site.certificate:
        listen += " ssl http2"
        tls = [f"ssl_certificate {site.certificate.cert};",
               f"ssl_certificate_key {site.certificate.key};",
               # nginx 1.22 still offers TLS 1.0-1.2 by default: pin what nestgate is held to.
               "ssl_protocols TLSv1.3;"]
    upstream, geo, default_server = [], [], []
    if site.rate_limit:
        geo = [f"limit_req_zone $binary_remote_addr zone=bench:10m rate={site.rate_limit[0]}r/s;"]
    if site.backend_port:
        upstream = [f"upstream backend {{ server 127.0.0.1:{site.backend_port}; keepalive 64; }}"]
    if site.site_host:
        # The 404 scenario: known Host on one server, everything else to a default server
        # that checks the client against the access list first.
        geo = ["geo $allowed {", "  default 0;", *(f"  {c} 1;" for c in site.cidrs), "}"]
        default_server = ["server {", f"  {listen} default_server;", *("  " + t for t in tls),
                          "  if ($allowed = 0) { return 403; }", "  return 404;", "}"]
        listen_main = f"listen 127.0.0.1:{site.port}" + (" ssl" if site.certificate else "")
    else:
        listen_main = listen
    return "\n".join([
        "# generated by nestgate bench",
        "daemon off;",
        "master_process on;",
        # Run as root, nginx would switch its workers to `nobody`, who cannot read the
        # content in our private (0700) temporary directories: keep the invoking user.
        *(["user root;"] if os.geteuid() == 0 else []),
        f"worker_processes {site.workers};",
        f"pid {workdir / (error_log.stem + '.pid')};",
        f"error_log {error_log} warn;",
        "events { worker_connections 8192; }",
        "http {",
        "  access_log off;",
        "  server_tokens off;",
        # The drivers keep connections for the whole run; nginx's default of 1000 requests
        # per connection would add reconnections nestgate does not make (and breaks h2load).
        f"  keepalive_requests {KEEPALIVE_REQUESTS};",
        "  keepalive_timeout 75s;",
        "  sendfile on;",
        "  tcp_nopush on;",
        # nestgate keeps small files in memory; nginx's nearest equivalent is cached fds.
        "  open_file_cache max=1000 inactive=60s;",
        "  open_file_cache_valid 60s;",
        "  types { }",
        "  default_type application/octet-stream;",
        *(f"  {k} {tmp};" for k in ("client_body_temp_path", "proxy_temp_path",
                                     "fastcgi_temp_path", "uwsgi_temp_path", "scgi_temp_path")),
        *("  " + line for line in upstream + geo + default_server),
        "  server {",
        f"    {listen_main};",
        f"    server_name {site.site_host or '_'};",
        *("    " + t for t in tls),
        *("    " + loc for loc in locations),
        "  }",
        "}",
        "",
    ])


def _nginx_health(site: Site) -> list[str]:
    body, _ = site.captured.get(site.route.path, (b'{"status":"ok"}', ""))
    fixed = content.health_json(len(body))
    if site.rate_limit:
        # `return` runs before limit_req's phase and would skip the limit: a file does not.
        path = site.content / "health-limited.json"
        path.write_text(fixed)
        return [f"location = {site.route.path} {{ limit_req zone=bench "
                f"burst={site.rate_limit[1]} nodelay; default_type application/json; "
                f"alias {path}; }}"]
    return [f"location = {site.route.path} {{ default_type application/json; "
            f"return 200 '{fixed}'; }}"]


def _nginx_file(site: Site) -> list[str]:
    # gzip_static: the file's .gz sibling for clients that take gzip (nginx has no brotli).
    return [f'location = {site.route.path} {{ alias {site.content / site.route.source}; '
            f'default_type "text/html; charset=utf-8"; gzip_static on; gzip_vary on; }}']


def _nginx_static(site: Site) -> list[str]:
    return [f"location {site.route.path} {{ alias {site.content / 'static'}/; "
            "types { text/plain txt; application/octet-stream bin; } }"]


def _nginx_proxy(site: Site) -> list[str]:
    return [f"location {site.route.path} {{ proxy_pass http://backend{site.route.source}; "
            'proxy_http_version 1.1; proxy_set_header Connection ""; }']


def _nginx_notes(site: Site) -> list[str]:
    # nginx cannot render Markdown: it serves the pages nestgate rendered, as files.
    return [f'location = {path} {{ alias {file}; default_type "{ctype}"; }}'
            for path, file, ctype in mirror_files(site)]


def mirror_files(site: Site) -> list[tuple[str, Path, str]]:
    mirror = site.content / "mirror"
    mirror.mkdir(exist_ok=True)
    found = []
    for i, (path, (body, ctype)) in enumerate(sorted(site.captured.items())):
        file = mirror / f"page{i}"
        file.write_bytes(body)
        found.append((path, file, ctype or "text/html; charset=utf-8"))
    return found


_NGINX_ROUTES = {"health": _nginx_health, "file": _nginx_file, "static": _nginx_static,
                 "proxy": _nginx_proxy, "notes": _nginx_notes}


# ---------------------------------------------------------------- caddy

class Caddy(Peer):
    """Caddy when installed. Its Go runtime is held to the same core count with GOMAXPROCS."""
    name = "caddy"
    tool = "caddy"
    limits_rates = False                # rate limiting is a plugin, not in Debian's build

    def argv(self, config: Path, site: Site) -> list[str]:
        return [tools.require("caddy"), "run", "--config", str(config), "--adapter", "caddyfile"]

    def validate_argv(self, config: Path) -> list[str]:
        """`caddy validate`: the config parses and its modules load, without serving."""
        return [tools.require("caddy"), "validate", "--config", str(config),
                "--adapter", "caddyfile"]

    def env(self, site: Site) -> dict:
        return {"GOMAXPROCS": str(site.workers), "XDG_DATA_HOME": str(self.workdir / "caddy"),
                "XDG_CONFIG_HOME": str(self.workdir / "caddy")}

    def configure(self, site: Site) -> list[Path]:
        path = self.outdir / "Caddyfile"
        path.write_text(render_caddy(site))
        return [path]


def render_caddy(site: Site) -> str:
    address = f"{site.scheme}://{site.site_host or '127.0.0.1'}:{site.port}"
    if site.site_host:
        address += f", {site.scheme}://:{site.port}"
    # Every block opens on one line and closes on its own: Caddy 2.6 (Debian 12) refuses
    # anything after "{" on the same line.
    lines = ["{", "  admin off", "  auto_https off", "  log {", "    output discard", "  }",
             "}", "", f"{address} {{"]
    if site.certificate:
        lines += [f"  tls {site.certificate.cert} {site.certificate.key} {{",
                  "    protocols tls1.3", "  }"]
    if site.site_host:
        lines += [f"  @other not host {site.site_host}",
                  "  @blocked not remote_ip " + " ".join(site.cidrs),
                  "  respond @blocked 403", "  respond @other 404"]
    lines += _CADDY_ROUTES[site.route.kind](site) + ["}", ""]
    return "\n".join(lines)


def _caddy_health(site: Site) -> list[str]:
    body, _ = site.captured.get(site.route.path, (b'{"status":"ok"}', ""))
    return [f"  handle {site.route.path} {{", "    header Content-Type application/json",
            f"    respond `{content.health_json(len(body))}` 200", "  }"]


def _caddy_file(site: Site) -> list[str]:
    return [f"  handle {site.route.path} {{", f"    root * {site.content}",
            f"    rewrite * /{site.route.source}", "    file_server {",
            "      precompressed br gzip", "    }", "  }"]


def _caddy_static(site: Site) -> list[str]:
    return [f"  handle_path {site.route.path}* {{", f"    root * {site.content / 'static'}",
            "    file_server", "  }"]


def _caddy_proxy(site: Site) -> list[str]:
    return [f"  handle_path {site.route.path}* {{",
            f"    reverse_proxy 127.0.0.1:{site.backend_port}", "  }"]


def _caddy_notes(site: Site) -> list[str]:
    lines = []
    for path, file, ctype in mirror_files(site):
        lines += [f"  handle {path} {{", f"    root * {file.parent}", f"    rewrite * /{file.name}",
                  f'    header Content-Type "{ctype}"', "    file_server", "  }"]
    return lines


_CADDY_ROUTES = {"health": _caddy_health, "file": _caddy_file, "static": _caddy_static,
                 "proxy": _caddy_proxy, "notes": _caddy_notes}

PEERS = {"nginx": Nginx, "caddy": Caddy}
