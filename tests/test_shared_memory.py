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
PROBE = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from nestgate.config import parse_config
    folder = Path(sys.argv[1])
    (folder / "notes").mkdir()
    (folder / "notes" / "hello.md").write_text("---\\ntitle: Hello\\n---\\n\\nHi.\\n")
    config = parse_config({
        "listen": [{"address": "127.0.0.1:0"}],
        "site": [{"hosts": ["*"], "home": {"title": "Home"},
                  "notes": {"dir": str(folder / "notes")},
                  "route": [
                      {"path": "/r", "type": "return", "body": "hi"},
                      {"path": "/go", "type": "redirect", "to": "https://example.test/"},
                      {"prefix": "/files/", "type": "static", "root": str(folder)},
                      {"prefix": "/app/", "type": "proxy",
                       "upstream": "http://127.0.0.1:9"}]}]}, "t.toml", folder)
    import importlib
    import nestgate.server.supervisor, nestgate.server.worker      # what the supervisor has loaded itself
    from nestgate.sites.build import build_router, handler_modules
    for name in handler_modules(config):
        importlib.import_module(name)
    before = set(sys.modules)
    build_router(config)
    print(json.dumps(sorted(set(sys.modules) - before)))
""")


def test_the_supervisor_imports_every_module_a_workers_router_is_built_with(tmp_path):
    out = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path)], capture_output=True,
                         text=True, env=_env(), timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []


def test_idle_memory_is_read_from_the_whole_tree():
    out = subprocess.run([sys.executable, "-m", "nestgate", "bench", "--idle-memory",
                          "--runs", "1"], capture_output=True, text=True, env=_env(),
                         timeout=120)
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip()
    assert "2 workers + supervisor + admin, 4 processes" in line, line
    median = float(line.split("PSS median ")[1].split(" MiB")[0])
    assert 10 < median < 500, line
