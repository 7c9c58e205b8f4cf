"""The deployment files in deploy/ and what they rely on: the systemd unit passes
`systemd-analyze verify` without a warning, nestgate speaks sd_notify to a real
NOTIFY_SOCKET (READY when every worker listens, RELOADING and READY around a reload,
STOPPING), and the logrotate snippet's signal makes nestgate reopen its log."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, RETURN_SITE, Server, _env

UNIT = REPO / "deploy" / "nestgate.service"
CONFIG = RETURN_SITE


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze is not installed (Debian: systemd)")
def test_the_unit_passes_systemd_analyze_verify(tmp_path):
    # verify checks that ExecStart's program exists: point it at this checkout's.
    nestgate = Path(sys.executable).parent / "nestgate"
    assert nestgate.exists()
    unit = tmp_path / "nestgate.service"
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/nestgate", str(nestgate)))
    result = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0 and result.stdout + result.stderr == "", result.stderr
    text = UNIT.read_text()
    for line in ("Type=notify", "ExecReload=/bin/kill -HUP $MAINPID", "User=nestgate",
                 "AmbientCapabilities=CAP_NET_BIND_SERVICE", "NoNewPrivileges=true",
                 "ProtectSystem=strict", "PrivateTmp=true"):
        assert line in text.splitlines(), line


def test_a_warning_from_verify_fails_the_check(tmp_path):
    """The check above can fail: an unknown key is a warning on stderr."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed (Debian: systemd)")
    unit = tmp_path / "bad.service"
    unit.write_text("[Service]\nExecStart=/bin/true\nBogus=1\n")
    result = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                            text=True, timeout=60)
    assert "Unknown key" in result.stderr


def read_states(sock: socket.socket, until: str, timeout: float = 20) -> list[str]:
    states, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            states += sock.recv(4096).decode().splitlines()
        except TimeoutError:
            break
        if until in states:
            break
    return states


def test_sd_notify_ready_reloading_and_stopping(tmp_path):
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    address = str(tmp_path / "notify.sock")
    listener.bind(address)
    config = tmp_path / "nestgate.toml"
    config.write_text(CONFIG.format(admin="", body="one"))
    server = Server(config, env=_env() | {"NOTIFY_SOCKET": address})
    try:
        states = read_states(listener, "READY=1")
        assert "READY=1" in states and "STATUS=serving with 2 workers" in states
        server.signal(signal.SIGHUP)
        states = read_states(listener, "READY=1")
        assert states[0] == "RELOADING=1" and states[1].startswith("MONOTONIC_USEC=")
        assert "READY=1" in states and "STATUS=serving generation 2" in states
        config.write_text("bogus = 1\n")
        server.signal(signal.SIGHUP)
        states = read_states(listener, "READY=1")
        assert "RELOADING=1" in states and "READY=1" in states
        assert "STATUS=reload refused, the running config stays" in states
    finally:
        server.stop()
    assert "STOPPING=1" in read_states(listener, "STOPPING=1", timeout=2)
    listener.close()


def test_the_logrotate_snippet_signals_the_main_process_with_usr1():
    text = (REPO / "deploy" / "logrotate" / "nestgate").read_text()
    assert "systemctl kill --signal=USR1 --kill-whom=main nestgate.service" in text
    assert "/var/log/nestgate/*.log" in text
    # That nestgate reopens its log on SIGUSR1 is tested in test_supervisor.py
    # (test_sigusr1_reopens_the_request_log).


def test_the_compose_example_publishes_what_its_nestgate_config_listens_on():
    import tomllib

    import yaml
    compose = yaml.safe_load((REPO / "deploy" / "compose.yaml").read_text())
    nestgate = compose["services"]["nestgate"]
    published = {int(p.split(":")[1]) for p in nestgate["ports"]}
    mounted = next(v.split(":")[0] for v in nestgate["volumes"]
                   if v.endswith(":/etc/nestgate/nestgate.toml:ro"))
    config_path = REPO / "deploy" / mounted
    config = tomllib.loads(config_path.read_text())
    listening = {int(l["address"].rpartition(":")[2]) for l in config["listen"]}
    assert published == listening
    upstream = config["site"][0]["route"][0]["upstream"]
    assert upstream == "http://app:80" and "app" in compose["services"]
    # The config itself passes `nestgate check` (the upstream's name needs no lookup).
    result = subprocess.run([sys.executable, "-m", "nestgate", "check", "--config",
                             str(config_path)], capture_output=True, text=True, env=_env(),
                            timeout=30)
    assert result.returncode == 0, result.stderr
    dockerfile = (REPO / "deploy" / "Dockerfile").read_text()
    assert "USER nestgate" in dockerfile and "HEALTHCHECK" in dockerfile
    assert "http://127.0.0.1:7998/v1/health" in dockerfile
    assert config["admin"]["address"] == "127.0.0.1:7998"
    assert "/etc/nestgate/nestgate.toml" in dockerfile


def proc_ids(pid: int) -> tuple[int, int]:
    fields = {line.split(":")[0]: line.split()[1:]
              for line in Path(f"/proc/{pid}/status").read_text().splitlines()}
    return int(fields["Uid"][0]), int(fields["Gid"][0])


@pytest.mark.skipif(os.getuid() != 0, reason="dropping to another user needs root")
def test_started_as_root_it_runs_as_the_configured_user(tmp_path):
    import pwd
    nobody = pwd.getpwnam("nobody")
    config = tmp_path / "nestgate.toml"
    config.write_text(CONFIG.format(admin="", body="x").replace("workers = 2",
                                                      'workers = 2\nuser = "nobody"'))
    tmp_path.chmod(0o755)
    server = Server(config)
    try:
        assert f"running as nobody (uid {nobody.pw_uid}" in server.wait_for("running as")
        for pid in [server.proc.pid, *server.children()]:
            assert proc_ids(pid) == (nobody.pw_uid, nobody.pw_gid), pid
        import http.client
        conn = http.client.HTTPConnection("127.0.0.1", server.port(), timeout=5)
        conn.request("GET", "/")
        assert conn.getresponse().read() == b"x"
        conn.close()
    finally:
        server.stop()


def test_an_unknown_user_is_named_by_check(tmp_path):
    config = tmp_path / "nestgate.toml"
    config.write_text(CONFIG.format(admin="", body="x").replace(
        "workers = 2", 'workers = 2\nuser = "no-such-user-here"\ngroup = "no-such-group"'))
    result = subprocess.run([sys.executable, "-m", "nestgate", "check", "--config",
                             str(config)], capture_output=True, text=True, env=_env(),
                            timeout=30)
    assert result.returncode == 2
    assert "server.user: expected a user of this system, got 'no-such-user-here'" in result.stderr
    assert "server.group: expected a group of this system" in result.stderr
