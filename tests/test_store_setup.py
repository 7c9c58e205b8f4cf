"""The shared store is created and migrated once, by the supervisor, before workers
open it: workers switching a new file to WAL together failed with "database is
locked" (SQLite does not wait on that lock)."""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
import stat
import subprocess
import sys
import threading
import time

import pytest

from conftest import _env
from nestgate.handlers.auth.store import SCHEMA_NAMES, Store, prepare_store

OPENERS = 4


def _open_as_a_worker(path: str, barrier, errors) -> None:
    barrier.wait(10)
    try:
        store = Store(path)
        store.secret()
        store.add_allow("10.0.0.1", 60)
        store.allow_entries()
        store.close()
    except sqlite3.Error as exc:
        errors.put(repr(exc))


def test_workers_opening_a_prepared_store_together_never_fail(tmp_path):
    ctx = multiprocessing.get_context("fork")
    errors = ctx.Queue()
    for trial in range(15):             # without the set-up, about 1 in 6 failed
        path = str(tmp_path / f"state{trial}.db")
        prepare_store(path)                     # what the supervisor does before forking
        barrier = ctx.Barrier(OPENERS)
        procs = [ctx.Process(target=_open_as_a_worker, args=(path, barrier, errors))
                 for _ in range(OPENERS)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(30)
            assert proc.exitcode == 0
        assert errors.empty(), errors.get()
        assert len(Store(path).allow_entries()) == OPENERS


def test_a_prepared_store_waits_for_another_writer(tmp_path):
    path = str(tmp_path / "state.db")
    prepare_store(path)
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    threading.Timer(0.3, other.execute, ("COMMIT",)).start()
    started = time.monotonic()
    store = Store(path)                         # opening takes no lock that could fail
    store.add_allow("10.0.0.1", 60)             # and a write waits for the other one
    assert time.monotonic() - started >= 0.25
    assert [row[1] for row in store.allow_entries()] == ["10.0.0.1"]
    other.close()


def test_prepare_store_sets_wal_schema_and_secret(tmp_path):
    path = str(tmp_path / "state.db")
    prepare_store(path)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert {row[0] for row in db.execute("SELECT name FROM sqlite_master")} >= SCHEMA_NAMES
    assert db.execute("SELECT count(*) FROM meta WHERE key = 'secret'").fetchone()[0] == 1


ALLOW_LIST_SITE = """
[server]
workers = 3

[[listen]]
address = "127.0.0.1:0"

[auth]
store = "state.db"

[[site]]
hosts = ["*"]
allow = ["127.0.0.0/8"]
allow_dynamic = true

[[site.route]]
path = "/hello"
type = "return"
body = "hello\\n"
"""


def test_the_supervisor_prepares_the_store_before_workers_start(start_server, tmp_path):
    server = start_server(ALLOW_LIST_SITE)
    assert not any("locked" in line for line in server.lines), server.lines
    db = sqlite3.connect(tmp_path / "state.db")
    assert db.execute("SELECT count(*) FROM meta WHERE key = 'secret'").fetchone()[0] == 1


def test_a_store_that_cannot_be_made_stops_the_start(tmp_path):
    (tmp_path / "state.db").write_text("not a database, written by hand\n")
    config = tmp_path / "nestgate.toml"
    config.write_text(ALLOW_LIST_SITE)
    out = subprocess.run([sys.executable, "-m", "nestgate", "serve", "--config", str(config)],
                         capture_output=True, text=True, timeout=60, env=_env())
    assert out.returncode == 1
    assert f"cannot start: store {tmp_path / 'state.db'}: file is not a database" in out.stderr


def test_a_store_from_an_older_version_gains_the_new_columns(tmp_path):
    path = str(tmp_path / "old.db")
    old = sqlite3.connect(path, isolation_level=None)
    old.execute("PRAGMA journal_mode=WAL")
    old.execute("CREATE TABLE sessions (token_hash BLOB PRIMARY KEY, user TEXT NOT NULL, "
                "created REAL NOT NULL, expires REAL NOT NULL, ip TEXT NOT NULL DEFAULT '')")
    old.execute("INSERT INTO sessions VALUES (x'01', 'ops', 1.0, 4102444800.0, '10.0.0.1')")
    old.close()
    store = Store(path)
    try:
        assert store.ready()
        # A session of the older version counts as signed in with a password only, and
        # keeps no provider identity.
        assert store.live_sessions() == [(b"\x01", "ops", 1.0, 4102444800.0, "10.0.0.1", 0.0,
                                          "password")]
        assert store.session(b"\x01") == ("ops", 4102444800.0, "password", "")   # seen: now
        assert store.live_sessions()[0][5] > 1_000_000_000
    finally:
        store.close()


# ---------------------------------------------------------------- who may read the store

PRIVATE_STORE_SITE = ALLOW_LIST_SITE.replace('store = "state.db"', 'store = "state/state.db"')


@pytest.fixture
def usual_umask():
    """The umask most systems start services with: without care, files come out 0644."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_the_store_and_its_folder_are_private_from_the_start(start_server, tmp_path,
                                                              usual_umask):
    server = start_server(PRIVATE_STORE_SITE)
    folder = tmp_path / "state"
    db = folder / "state.db"
    # The workers hold the store open in WAL mode, so its -wal and -shm files exist.
    deadline = time.monotonic() + 10
    while not all((folder / f"state.db{end}").exists() for end in ("-wal", "-shm")):
        assert time.monotonic() < deadline, sorted(p.name for p in folder.iterdir())
        time.sleep(0.05)
    assert mode(folder) == 0o700
    assert {p.name: mode(p) for p in folder.iterdir()} == {
        "state.db": 0o600, "state.db-wal": 0o600, "state.db-shm": 0o600}
    assert not any("warning" in line and "auth.store" in line for line in server.lines)
    assert sqlite3.connect(db).execute("SELECT count(*) FROM meta").fetchone()[0] == 1


def test_sqlite_gives_the_wal_and_shm_files_the_stores_mode(tmp_path, usual_umask):
    folder = tmp_path / "state"
    folder.mkdir()
    store = Store(str(folder / "state.db"))
    try:
        store.add_allow("10.0.0.1", 60)
        assert {p.name: mode(p) for p in folder.iterdir()} == {
            "state.db": 0o600, "state.db-wal": 0o600, "state.db-shm": 0o600}
    finally:
        store.close()
    made = Store(str(tmp_path / "made" / "here" / "state.db"))
    made.close()
    assert (mode(tmp_path / "made"), mode(tmp_path / "made" / "here")) == (0o700, 0o700)


def test_check_warns_about_a_store_other_users_can_read(tmp_path, usual_umask):
    """A store made by an older version (0644) in a folder made by hand that its group
    may write to (0775): `check` says so, without refusing the config, and the start
    leaves both as they are (the folder may be shared on purpose; the owner decides).
    A folder others may only read (0755) is no warning: the store in it is 0600."""
    folder = tmp_path / "shared"
    folder.mkdir()
    os.chmod(folder, 0o775)
    db = folder / "state.db"
    old = sqlite3.connect(db)                    # as SQLite makes it: 0644 under umask 022
    old.execute("CREATE TABLE t (x)")
    old.close()
    config = tmp_path / "nestgate.toml"
    config.write_text(ALLOW_LIST_SITE.replace('store = "state.db"', 'store = "shared/state.db"'))
    out = subprocess.run([sys.executable, "-m", "nestgate", "check", "--config", str(config)],
                         capture_output=True, text=True, timeout=60, env=_env())
    assert out.returncode == 0 and "2 warnings above" in out.stdout, out.stderr
    assert out.stderr.splitlines() == [
        f"nestgate: warning: {config}: auth.store: {db} is open to other users (mode 0644) "
        f"and holds the CSRF key, the allow-list and who signed in from where: chmod 600 {db}",
        f"nestgate: warning: {config}: auth.store: its folder {folder} is writable by other "
        f"users (mode 0775), who could put their own store (or its -wal) there; nestgate "
        f"makes a missing folder 0700 but leaves one that exists as it is: chmod 700 "
        f"{folder}, or name a store in a folder of its own"]
    prepare_store(str(db))                       # what the supervisor does at start
    assert (mode(folder), mode(db)) == (0o775, 0o644)
    os.chmod(db, 0o600)
    os.chmod(folder, 0o755)
    out = subprocess.run([sys.executable, "-m", "nestgate", "check", "--config", str(config)],
                         capture_output=True, text=True, timeout=60, env=_env())
    assert out.returncode == 0 and out.stderr == "", out.stderr
