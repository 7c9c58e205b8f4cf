"""The workers share what the supervisor loaded before forking them (see
nestgate.server.supervisor.share_before_fork): every module a worker's router imports as it is
built is already imported, and the bench's idle-memory figure reads the process tree."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from conftest import _env

# One site with every route type and the pages (home, notes), so every builder runs.
EVERY_ROUTE_TYPE = {
    "listen": [{"address": "127.0.0.1:0"}],
    "site": [{"hosts": ["*"], "home": {"title": "Home"},
              "notes": {"dir": "{folder}/notes"},
              "route": [
                  {"path": "/r", "type": "return", "body": "hi"},
                  {"path": "/go", "type": "redirect", "to": "https://example.test/"},
                  {"prefix": "/files/", "type": "static", "root": "{folder}"},
                  {"prefix": "/app/", "type": "proxy",
                   "upstream": "http://127.0.0.1:9"}]}]}

# Prints the modules building a worker's router and its listeners' protocols imports
# beyond those the supervisor has loaded, then the names among `LIBRARIES` loaded at all.
PROBE = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from nestgate.config import parse_config
    folder = Path(sys.argv[1])
    (folder / "notes").mkdir()
    (folder / "notes" / "hello.md").write_text("---\\ntitle: Hello\\n---\\n\\nHi.\\n")
    data = json.loads(sys.argv[2].replace("{folder}", str(folder)))
    config = parse_config(data, "t.toml", folder)
    import importlib
    import nestgate.server.supervisor, nestgate.server.worker      # what the supervisor has loaded itself
    from nestgate.admin.process import build_admin               # and the admin process,
    from nestgate.admin.stats import WorkerTable                 # built before the fork
    build_admin(config, WorkerTable())
    from nestgate.sites.build import build_router, handler_modules
    for name in handler_modules(config):
        importlib.import_module(name)
    before = set(sys.modules)
    build_router(config)
    from nestgate.server.worker import protocol_factory
    for listener in config.listeners:           # what each connection starts as
        protocol_factory(None, listener, None)
    print(json.dumps(sorted(set(sys.modules) - before)))
    print(json.dumps(sorted(name for name in json.loads(sys.argv[3]) if name in sys.modules)))
""")

# Libraries for features the embedded default does not use: cryptography (certificate
# files), maxminddb ([geoip]), urllib.request (the CrowdSec bouncer), the HTTP/2 engine
# and hpack (listeners with TLS or h2c). Loaded by every config, they were 15 MiB of
# the default's idle PSS. And what no config needs until something asks: the `email`
# package and `calendar` (HTTP dates are nestgate.base.httpdate's), `difflib` (a config
# with a mistake), the admin's OpenAPI document (its first GET /docs/json), and
# `multiprocessing` for one lock (nestgate.bans.table). And `sqlite3` with the store's
# module (nestgate.handlers.auth.store) for a config with no store: the admin's pages
# and metrics ask it only when there is one.
LIBRARIES = ["cryptography", "maxminddb", "urllib.request", "nestgate.wire.http2", "hpack",
             "email", "calendar", "difflib", "nestgate.admin.openapi", "multiprocessing",
             "sqlite3", "nestgate.handlers.auth.store"]


def probe(folder, config: dict) -> tuple[list[str], list[str]]:
    """(modules building the router imported, LIBRARIES loaded) for `config`."""
    out = subprocess.run([sys.executable, "-c", PROBE, str(folder), json.dumps(config),
                          json.dumps(LIBRARIES)], capture_output=True, text=True,
                         env=_env(), timeout=60)
    assert out.returncode == 0, out.stderr
    built, loaded = out.stdout.splitlines()
    return json.loads(built), json.loads(loaded)


def test_the_supervisor_imports_every_module_a_workers_router_is_built_with(tmp_path):
    assert probe(tmp_path, EVERY_ROUTE_TYPE)[0] == []


def test_a_config_with_geoip_has_its_library_imported_before_the_workers(tmp_path):
    from test_geoip import PLACES, write_countries
    write_countries(tmp_path / "country.mmdb", PLACES)
    config = {**EVERY_ROUTE_TYPE, "geoip": {"database": "{folder}/country.mmdb"}}
    built, loaded = probe(tmp_path, config)
    assert built == []
    assert "maxminddb" in loaded


def test_a_listener_speaking_http2_has_its_engine_imported_before_the_workers(tmp_path):
    config = {**EVERY_ROUTE_TYPE,
              "listen": [{"address": "127.0.0.1:0", "http2_cleartext": True}]}
    built, loaded = probe(tmp_path, config)
    assert built == []
    assert "nestgate.wire.http2" in loaded and "hpack" in loaded


def test_a_config_without_certificates_geoip_crowdsec_or_http2_loads_none_of_their_libraries(
        tmp_path):
    assert probe(tmp_path, EVERY_ROUTE_TYPE)[1] == []


# The config of argv[2] (its "{folder}" made argv[1]) parsed, with the supervisor's
# build_shared done: where the probes below start.
SHARED_BUILT = textwrap.dedent("""
    import gc, json, sys
    from pathlib import Path
    from nestgate.config import parse_config
    from nestgate.sites.build import build_router, build_shared
    folder = Path(sys.argv[1])
    (folder / "notes").mkdir()
    (folder / "style.css").write_text("body { color: black; }\\n" * 100)
    config = parse_config(json.loads(sys.argv[2].replace("{folder}", str(folder))),
                          "t.toml", folder)
    build_shared(config)
""")

# Prints how many page renderers, warmed static files and sets of error pages building
# a worker's router made, after the supervisor's build_shared.
BUILT_AGAIN_PROBE = SHARED_BUILT + textwrap.dedent("""
    from nestgate.base.errorpages import ErrorPages
    from nestgate.handlers.static import Entry
    from nestgate.handlers.notes.render import Renderer
    def count():
        found = {"Renderer": 0, "Entry": 0, "ErrorPages": 0}
        for o in gc.get_objects():
            if isinstance(o, (Renderer, Entry, ErrorPages)):
                found[type(o).__name__] += 1
        return found
    before = count()
    build_router(config)
    after = count()
    print(json.dumps({name: after[name] - before[name] for name in after}))
""")


def _probe_warm(tmp_path, probe: str):
    """`probe` run on every route type with the static route's files warmed."""
    config = json.loads(json.dumps(EVERY_ROUTE_TYPE))
    static = next(r for r in config["site"][0]["route"] if r["type"] == "static")
    static["warm"] = True
    out = subprocess.run([sys.executable, "-c", probe, str(tmp_path), json.dumps(config)],
                         capture_output=True, text=True, env=_env(), timeout=60)
    assert out.returncode == 0, out.stderr
    return out


def test_the_workers_take_the_renderers_warm_files_and_error_pages_built_before(tmp_path):
    """A worker building its own page renderer (Markdown parser, Jinja environment),
    reading and compressing its own warm files and building the built-in error pages
    again wrote about 4.5 MB of the supervisor's pages; it takes those built before the
    fork."""
    out = _probe_warm(tmp_path, BUILT_AGAIN_PROBE)
    assert json.loads(out.stdout) == {"Renderer": 0, "Entry": 0, "ErrorPages": 0}


# Prints how many KiB of anonymous memory share_before_fork gave back, after 40 MB of
# the C heap (blocks above pymalloc's 512 bytes) were freed under a few kept blocks.
TRIM_PROBE = textwrap.dedent("""
    from nestgate.server.supervisor import share_before_fork
    def anonymous_kib():
        with open("/proc/self/smaps_rollup") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Anonymous:"))
    blocks = [bytes(2000) for _ in range(20000)]
    kept = blocks[::50]               # the heap cannot shrink from its top past these
    del blocks
    before = anonymous_kib()
    share_before_fork()
    print(before - anonymous_kib())
""")


def test_the_heaps_free_pages_are_given_back_before_a_fork():
    """Free pages left on the supervisor's heap would be shared and then copied by each
    child that allocates there; they go back to the system before each fork."""
    out = subprocess.run([sys.executable, "-c", TRIM_PROBE], capture_output=True, text=True,
                         env=_env(), timeout=60)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) > 20 * 1024, out.stdout


def test_idle_memory_is_read_from_the_whole_tree():
    out = subprocess.run([sys.executable, "-m", "nestgate", "bench", "--idle-memory",
                          "--runs", "1"], capture_output=True, text=True, env=_env(),
                         timeout=120)
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip()
    assert "2 workers + supervisor + admin, 4 processes" in line, line
    median = float(line.split("PSS median ")[1].split(" MiB")[0])
    assert 10 < median < 500, line


# Starts the admin process as the supervisor does, its router built before the fork
# (`prepared`) or by the process itself (`own`); prints its private dirty KiB once it
# serves.
ADMIN_MEMORY_PROBE = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from nestgate.config import parse_config
    from nestgate.admin.keeper import AdminKeeper
    from nestgate.server.supervisor import _bound, share_before_fork
    import nestgate.server.worker
    folder = Path(sys.argv[1])
    os.environ["STATE_DIRECTORY"] = str(folder)
    config = parse_config({"listen": [{"address": "127.0.0.1:0"}],
                           "site": [{"hosts": ["*"], "route": [
                               {"path": "/r", "type": "return", "body": "hi"}]}],
                           "admin": {"address": "127.0.0.1:0"}}, "t.toml", folder)
    keeper = AdminKeeper()
    config = keeper.with_token(config)
    keeper.bind(config, _bound, lambda message: None)
    if sys.argv[2] == "prepared":
        keeper.prepare()
    share_before_fork()
    ready_r, ready_w = os.pipe()
    keeper.fork(ready_w, lambda: None)
    os.read(ready_r, 64)                      # the admin process serves
    with open(f"/proc/{keeper.pid}/smaps_rollup") as f:
        print(next(int(line.split()[1]) for line in f if line.startswith("Private_Dirty:")))
    os.kill(keeper.pid, signal.SIGTERM)
    os.waitpid(keeper.pid, 0)
""")


def admin_private_kib(folder, how: str) -> int:
    folder.mkdir()
    out = subprocess.run([sys.executable, "-c", ADMIN_MEMORY_PROBE, str(folder), how],
                         capture_output=True, text=True, env=_env(), timeout=60)
    assert out.returncode == 0, out.stderr
    return int(out.stdout)


def test_the_admin_process_takes_the_router_built_before_the_fork(tmp_path):
    """Building its state and router after the fork, the admin process wrote about 4 MB
    of the pages it shared with the supervisor (7.3 MB private against 3.3 taking
    what the supervisor built, on this machine)."""
    own = admin_private_kib(tmp_path / "own", "own")
    prepared = admin_private_kib(tmp_path / "prepared", "prepared")
    assert prepared < own - 1024, (prepared, own)


def test_the_admin_router_built_in_the_supervisor_is_in_no_workers_figures(tmp_path):
    """The workers forked after it inherit the supervisor's tally: the admin's routes
    and its Swagger UI cache must not show in their figures (/metrics)."""
    from nestgate.admin.process import build_admin
    from nestgate.admin.stats import WorkerTable
    from nestgate.base.tally import TALLY
    from nestgate.config import parse_config
    config = parse_config({"listen": [{"address": "127.0.0.1:0"}],
                           "admin": {"address": "127.0.0.1:0", "token": "t" * 32}},
                          "t.toml", tmp_path)
    before = (list(TALLY.caches), dict(TALLY.routes), dict(TALLY.sites))
    _state, router = build_admin(config, WorkerTable())
    assert "/v1/status" in router.catch_all.exact, "the admin's routes were built"
    assert (TALLY.caches, TALLY.routes, TALLY.sites) == before


# Prints whether a second build_shared for the same config made the warm files'
# handlers again (what it keeps for the workers is then new).
BUILT_TWICE_PROBE = SHARED_BUILT + textwrap.dedent("""
    from nestgate.handlers import static
    first = dict(static._WARMED)
    build_shared(config)
    print(json.dumps({"warmed": len(first),
                      "made_again": any(static._WARMED[k] is not v for k, v in first.items())}))
""")


def test_the_second_workers_fork_builds_nothing_shared_again(tmp_path):
    """Built again before the second worker's fork, the warm files' handlers were made
    anew and the first ones freed: writes to pages the first worker shared."""
    out = _probe_warm(tmp_path, BUILT_TWICE_PROBE)
    assert json.loads(out.stdout) == {"warmed": 1, "made_again": False}
