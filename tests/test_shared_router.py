"""The workers' router built once by the supervisor before it forks them
(nestgate.sites.shared): which configs it is built for, that it is shared rather than
written by each worker, and that what must stay a worker's own (its answer counts,
the health answer's pid and uptime, the notes generation file's lock) is."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from conftest import _env

SITE = {"hosts": ["*"], "home": {"title": "Home"}, "notes": {"dir": "{folder}/notes"},
        "route": [{"prefix": "/", "type": "static", "root": "{folder}", "warm": True}]}

# Builds the router for the config in argv[2] ({folder} is argv[1]) as the supervisor
# does, forks, and runs `CHILD` in the child, which prints its findings as JSON.
SETUP = textwrap.dedent("""
    import gc, json, os, sys
    from pathlib import Path
    from nestgate.config import parse_config
    from nestgate.base.clock import CLOCK
    from nestgate.base.control import CONTROLS
    from nestgate.base.tally import TALLY
    from nestgate.sites.build import build_router, build_shared, handler_modules
    from nestgate.sites.shared import SharedRouter
    from nestgate.server.supervisor import share_before_fork
    import nestgate.server.worker
    folder = Path(sys.argv[1])
    (folder / "notes").mkdir()
    (folder / "notes" / "hello.md").write_text("---\\ntitle: Hello\\n---\\n\\nHi.\\n")
    (folder / "style.css").write_text("body { color: black; }\\n" * 100)
    config = parse_config(json.loads(sys.argv[2].replace("{folder}", str(folder))),
                          "t.toml", folder)
    build_shared(config)
    shared = SharedRouter(config)
    share_before_fork(handler_modules(config))
    def private_dirty_kib():
        with open("/proc/self/smaps_rollup") as f:
            return next(int(l.split()[1]) for l in f if l.startswith("Private_Dirty:"))
    parent = os.getpid()
    r, w = os.pipe()
    if os.fork() == 0:
        found = {}
        try:
            exec(sys.argv[3])
        except BaseException as exc:
            found["error"] = repr(exc)
        finally:
            os.write(w, json.dumps(found).encode())
            os._exit(0)
    os.close(w)
    print(os.read(r, 65536).decode())
""")


def in_forked_worker(folder, child: str, config: dict | None = None) -> dict:
    config = config or {"listen": [{"address": "127.0.0.1:0"}], "site": [SITE]}
    out = subprocess.run([sys.executable, "-c", SETUP, str(folder), json.dumps(config),
                          textwrap.dedent(child)],
                         capture_output=True, text=True, env=_env(), timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_the_embedded_default_has_its_router_built_before_the_fork():
    from nestgate import PACKAGE_DIR
    from nestgate.config import read_config
    from nestgate.sites.shared import shareable
    assert shareable(read_config(str(PACKAGE_DIR / "default" / "nestgate.toml")))


@pytest.mark.parametrize("change", [
    {"route": [{"prefix": "/app/", "type": "proxy", "upstream": "http://127.0.0.1:9"}]},
    {"allow": ["127.0.0.1/32"]},
    {"rate_limit": {"rate": "10/s", "burst": 20}},
], ids=["proxy", "access", "rate_limit"])
def test_a_router_holding_a_workers_own_state_is_built_by_each_worker(tmp_path, change):
    """Connections to upstreams, access decisions kept per connection, rate limits: a
    router with any of them is not built in the supervisor."""
    from nestgate.config import parse_config
    from nestgate.sites.shared import shareable
    site = {"hosts": ["*"], "route": [{"path": "/r", "type": "return", "body": "hi"}]}
    config = {"listen": [{"address": "127.0.0.1:0"}], "site": [{**site, **change}]}
    assert shareable(parse_config(config, "t.toml", tmp_path)) is False
    plain = {"listen": [{"address": "127.0.0.1:0"}], "site": [site]}
    assert shareable(parse_config(plain, "t.toml", tmp_path)) is True


def test_a_worker_taking_the_router_writes_less_than_one_building_its_own(tmp_path):
    """Built in the worker, the router (and the first run of the code building it)
    wrote about 1 MB of the pages the worker shared with the supervisor."""
    found = in_forked_worker(tmp_path, """
        before = private_dirty_kib()
        shared.take()
        found["taken"] = private_dirty_kib() - before
        before = private_dirty_kib()
        build_router(config)
        found["built"] = private_dirty_kib() - before
    """)
    assert found["taken"] + 512 < found["built"], found


def test_the_supervisor_keeps_none_of_the_routers_counts_and_the_worker_takes_them(
        tmp_path):
    """The supervisor's tally and page list are inherited by every process it forks:
    the shared router's caches, route counts and notes pages are the worker's only
    once it takes the router (else /metrics would show them twice after a reload)."""
    found = in_forked_worker(tmp_path, """
        def held():
            return {"caches": len(TALLY.caches), "pages": len(CONTROLS.pages),
                    "routes": sorted(f"{s} {l}" for s, l in TALLY.routes)}
        found["before"] = held()
        router = shared.take()
        found["after"] = held()
        found["cache_routes"] = sorted(c.cache_figures()[2] for c in TALLY.caches)
    """)
    assert found["before"] == {"caches": 0, "pages": 0, "routes": ["- -"]}, found
    assert found["after"]["caches"] == 3 and found["after"]["pages"] == 1, found
    assert {"site0 /", "site0 /*", "site0 /notes", "site0 health"} <= set(
        found["after"]["routes"]), found
    assert found["cache_routes"] == ["/*", "/__nestgate__/*", "/notes"], found


def test_the_health_answer_built_before_the_fork_tells_the_workers_pid_and_uptime(
        tmp_path):
    found = in_forked_worker(tmp_path, """
        import time
        time.sleep(1.1)                   # the supervisor built it a second ago
        CLOCK.begin()                     # what run_worker does first
        route = shared.take().catch_all.exact["/api/v1/health"]
        answer = route.handler.detailed   # the answer to a local client
        found.update(json.loads(answer.body), parent=parent, me=os.getpid())
    """)
    assert found["pid"] == found["me"] != found["parent"], found
    assert found["uptime_s"] == 0, found


def test_a_notes_store_built_before_the_fork_locks_on_the_workers_own_descriptor(
        tmp_path):
    """A descriptor inherited through fork shares its flock with the parent and every
    other child: a worker's bump of the notes generation must wait while another
    process holds the lock, not take it alongside."""
    found = in_forked_worker(tmp_path, """
        import fcntl, threading
        from nestgate.handlers.notes.store import GENERATION_FILE
        pages = shared.pages[0]
        generation = pages.store._generation
        # The descriptor every worker inherited: locked through it, as another worker
        # would lock the file were the lock taken on it.
        holder = os.open(str(folder / "notes" / GENERATION_FILE), os.O_RDONLY)
        inherited = next(fd for fd in map(int, os.listdir("/proc/self/fd"))
                         if fd != holder and os.path.sameopenfile(fd, holder))
        os.close(holder)
        fcntl.flock(inherited, fcntl.LOCK_EX)
        before = generation.read()
        bumping = threading.Thread(target=generation.bump, daemon=True)
        bumping.start()
        bumping.join(0.5)
        found["waited"] = bumping.is_alive()
        fcntl.flock(inherited, fcntl.LOCK_UN)
        bumping.join(5)
        found["bumped"] = generation.read() - before
    """)
    assert found == {"waited": True, "bumped": 1}, found
