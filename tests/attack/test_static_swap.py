"""Static files while a deploy swaps symlinks under them: a name that changes kind or
vanishes between two checks is a 404 (or the new file), never a 500.

The swap is the usual deploy: a new release directory, `current` renamed over to
point at it (`ln -sfn` style), the old release removed; and a page that is a symlink
one moment and a regular file renamed over it the next."""

from __future__ import annotations

import http.client
import os
import shutil
import threading
import time
from collections import Counter

import pytest

from conftest import serve
from nestgate.handlers.static import NotFound, StaticFiles
from nestgate.sites.routetypes import StaticOptions

SWAP_SECONDS = 3.0


def _release(root, n: int) -> str:
    name = f"rel-{n}"
    folder = root / name
    folder.mkdir()
    (folder / "index.html").write_text(f"<h1>release {n}</h1>\n")
    (folder / "link.html").symlink_to("index.html")
    (folder / "sub").mkdir()
    (folder / "sub" / "a.txt").write_text("a\n")
    return name


def _swap(root, stop: threading.Event, counts: Counter) -> None:
    """Deploys and page swaps as fast as the disk allows, until `stop`."""
    n = 0
    old = _release(root, n)
    os.symlink(old, root / "current")
    while not stop.is_set():
        n += 1
        new = _release(root, n)
        os.symlink(new, root / "current.tmp")
        os.replace(root / "current.tmp", root / "current")
        shutil.rmtree(root / old)
        old = new
        (root / "page.tmp").write_text("regular\n")
        os.replace(root / "page.tmp", root / "page.html")
        os.symlink(f"{new}/index.html", root / "page.tmp")
        os.replace(root / "page.tmp", root / "page.html")
        counts["swaps"] += 1


def _hammer(port: int, stop: threading.Event, statuses: Counter) -> None:
    paths = ("/current/link.html", "/current/index.html", "/page.html", "/current/sub/",
             "/current/sub/a.txt", "/current/missing")
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    i = 0
    while not stop.is_set():
        conn.request("GET", paths[i % len(paths)])
        resp = conn.getresponse()
        resp.read()
        statuses[resp.status] += 1
        if resp.will_close:
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        i += 1
    conn.close()


def test_no_500_while_symlinks_are_swapped(start_server, tmp_path):
    root = tmp_path / "public"
    root.mkdir()
    # Nothing cached: every request walks the path on disk, where the race is.
    server = serve(start_server, root, "listing = true\ncache_bytes = 0")
    stop = threading.Event()
    swaps, statuses = Counter(), Counter()
    threads = [threading.Thread(target=_swap, args=(root, stop, swaps), daemon=True)]
    threads += [threading.Thread(target=_hammer, args=(server.port(), stop, statuses),
                                 daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(SWAP_SECONDS)                    # the length of the attack, not a wait
    stop.set()
    for t in threads:
        t.join(15)
    assert not any(t.is_alive() for t in threads)
    total = sum(statuses.values())
    print(f"{total} requests, {swaps['swaps']} swaps: {dict(statuses)}")
    assert swaps["swaps"] > 50 and total > 200
    assert statuses[500] == 0, f"{statuses[500]} of {total} requests answered 500"
    assert set(statuses) <= {200, 404}
    assert not [l for l in server.lines if "Traceback" in l]


# ------------------------------------------------------------ between the checks

def _files(root) -> StaticFiles:
    return StaticFiles(StaticOptions(str(root), listing=True, cache_bytes=0), "/")


@pytest.mark.parametrize("error", [FileNotFoundError(2, "gone"), OSError(22, "not a link"),
                                   NotADirectoryError(20, "not a directory")])
def test_a_name_that_changes_between_checks_is_not_found(tmp_path, monkeypatch, error):
    """Each disk step where the name can vanish or change kind after the step before
    it looked: resolving it, listing it. Every one ends in NotFound (a 404)."""
    root = tmp_path / "public"
    (root / "dir").mkdir(parents=True)
    (root / "dir" / "a.txt").write_text("a\n")
    files = _files(root)

    def gone(*_args, **_kw):
        raise error

    with monkeypatch.context() as m:
        m.setattr(os.path, "realpath", gone)
        with pytest.raises(NotFound):
            files._locate("dir/a.txt", False)
        with pytest.raises(NotFound):
            files._open(str(root / "dir" / "a.txt"))
    with monkeypatch.context() as m:
        m.setattr(os, "scandir", gone)
        with pytest.raises(NotFound):
            files._listing(str(root / "dir"), "/dir/")
