"""`nestgate allow add | list | remove`: the dynamic allow-list edited from the command
line, in the store file a real config names, and seen by a running server."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import datetime, timezone

import pytest

from conftest import HELLO, REPO, _env, ask, config
from nestgate.handlers.auth.store import Store
from nestgate.cli import main

STORE_CONFIG = """
[[listen]]
address = "127.0.0.1:0"

[auth]
store = "state.db"
"""


@pytest.fixture
def nestgate(tmp_path, capsys):
    """nestgate(*argv) -> (exit status, stdout, stderr), run against tmp_path/nestgate.toml."""
    config = tmp_path / "nestgate.toml"
    config.write_text(STORE_CONFIG)

    def run(*argv: str, config_path=config):
        try:
            status = main(["allow", *argv, "--config", str(config_path)])
        except SystemExit as exc:                       # argparse's usage errors
            status = exc.code
        out, err = capsys.readouterr()
        return status, out, err
    return run


def listed(out: str) -> list[list[str]]:
    """The rows of `allow list` below its heading, split on runs of spaces."""
    lines = out.splitlines()
    assert lines[0].split() == ["ID", "CIDR", "EXPIRES", "(UTC)", "COMMENT"]
    return [line.split(None, 3) for line in lines[1:]]


def test_add_list_remove(nestgate, tmp_path):
    status, out, _ = nestgate("add", "203.0.113.7", "--for", "2h", "--comment",
                              "phone on holiday")
    assert status == 0
    first = int(out)
    added = time.time()
    status, out, _ = nestgate("add", "2001:db8::/48")
    second = int(out)
    assert second > first

    status, out, _ = nestgate("list")
    assert status == 0
    rows = listed(out)
    assert [(int(r[0]), r[1]) for r in rows] == [(first, "203.0.113.7"),
                                                (second, "2001:db8::/48")]
    assert rows[0][3] == "phone on holiday" and len(rows[1]) == 3
    expires = datetime.strptime(rows[0][2], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    assert abs(expires.timestamp() - (added + 2 * 3600)) < 5
    default = datetime.strptime(rows[1][2], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    assert abs(default.timestamp() - (added + 3600)) < 5        # 1h unless --for says

    # The store is the config's, resolved against the config file's folder.
    assert [e[0] for e in Store(str(tmp_path / "state.db")).allow_entries()] == [first, second]

    assert nestgate("remove", str(first))[0] == 0
    assert [int(r[0]) for r in listed(nestgate("list")[1])] == [second]
    status, _, err = nestgate("remove", str(first))
    assert status == 1 and f"no entry with id {first}" in err


def test_expired_entries_are_not_listed(nestgate):
    nestgate("add", "198.51.100.0/24", "--for", "300ms")
    nestgate("add", "198.51.100.9", "--for", "1h")
    deadline = time.monotonic() + 5
    while len(listed(nestgate("list")[1])) != 1:
        assert time.monotonic() < deadline, "the 300 ms entry was still listed after 5 s"
        time.sleep(0.05)
    assert listed(nestgate("list")[1])[0][1] == "198.51.100.9"


@pytest.mark.parametrize("argv, message", [
    (("add", "10.0.0.300"), "not an IP address or CIDR: '10.0.0.300'"),
    (("add", "fe80::/200"), "not an IP address or CIDR: 'fe80::/200'"),
    (("add", "example.com"), "not an IP address or CIDR: 'example.com'"),
    (("add", "10.0.0.1", "--for", "2hours"), "expected a duration such as"),
    (("add", "10.0.0.1", "--for=-5m"), "expected a duration such as"),
    (("add", "10.0.0.1", "--for", "0s"), "expected a duration above zero"),
    (("remove", "one"), "invalid int value: 'one'"),
])
def test_bad_input_is_refused_before_the_store_is_touched(nestgate, tmp_path, argv, message):
    status, out, err = nestgate(*argv)
    assert status == 2 and out == "" and message in err
    assert not (tmp_path / "state.db").exists()


@pytest.mark.parametrize("toml, message", [
    ('[[listen]]\naddress = "127.0.0.1:0"\n', "auth: expected an [auth] table"),
    ('[[listen]]\naddress = "127.0.0.1:0"\n[auth]\nstore = ":memory:"\n',
     "auth.store: expected a file the workers share"),
    # A missing folder is made (0700); one that cannot be, under a file, is refused.
    ('[[listen]]\naddress = "127.0.0.1:0"\n[auth]\nstore = "other.toml/dir/state.db"\n',
     "auth.store: expected a file in a writable directory"),
    ('[[listen]]\naddress = "nowhere"\n[auth]\nstore = "state.db"\n', "listen[0].address"),
])
def test_a_config_without_a_usable_store_is_refused(nestgate, tmp_path, toml, message):
    config = tmp_path / "other.toml"
    config.write_text(toml)
    status, out, err = nestgate("list", config_path=config)
    assert status == 2 and out == ""
    assert "the config has problems" in err and message in err


@pytest.mark.parametrize("cidr", ["0.0.0.0/0", "::/0", "::ffff:0:0/96"])
def test_an_entry_for_every_address_needs_saying_so(nestgate, tmp_path, cidr):
    # Before: added silently, letting anyone past every access list with allow_dynamic
    # and past sign-in.
    status, out, err = nestgate("add", cidr)
    assert status == 2 and out == ""
    assert f"{cidr} holds every address" in err and "--allow-everyone" in err
    assert not (tmp_path / "state.db").exists()
    status, out, _ = nestgate("add", cidr, "--allow-everyone", "--for", "5m")
    assert status == 0 and out.strip().isdigit()
    assert listed(nestgate("list")[1])[0][1] == cidr


def test_a_missing_config_file_is_refused(nestgate, tmp_path):
    status, _, err = nestgate("add", "10.0.0.1", config_path=tmp_path / "missing.toml")
    assert status == 2 and "missing.toml: cannot read" in err


# ------------------------------------------------------------- with a server


def allow_command(config, *argv: str) -> str:
    """`python -m nestgate allow ...` as a user runs it; its stdout."""
    out = subprocess.run([sys.executable, "-m", "nestgate", "allow", *argv,
                          "--config", str(config)], capture_output=True, text=True,
                         env=_env(), cwd=REPO, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout


def wait_status(port: int, status: int, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while ask(port, "lan.test")[0] != status:
        assert time.monotonic() < deadline, f"no {status} within {within} s"
        time.sleep(0.05)


def test_a_running_server_follows_the_command(start_server, tmp_path):
    server = start_server(config('[[site]]\nhosts = ["lan.test"]\nallow = ["10.0.0.0/8"]\n'
                                 + HELLO, top=f'[auth]\nstore = "{tmp_path / "state.db"}"\n'))
    port = server.port()
    assert ask(port, "lan.test")[0] == 403             # 127.0.0.1 is not listed, not exempt
    entry = allow_command(server.config_path, "add", "127.0.0.1", "--comment", "this test")
    wait_status(port, 200)
    assert ask(port, "lan.test") == (200, b"hello")
    assert "this test" in allow_command(server.config_path, "list")
    allow_command(server.config_path, "remove", entry.strip())
    wait_status(port, 403)


def test_outside_a_config_directory_it_asks_for_the_config(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["allow", "list"]) == 2
    err = capsys.readouterr().err
    assert f"no ./nestgate.toml in {tmp_path}; pass --config FILE" in err
    assert "default" not in err                 # not the embedded default's file
