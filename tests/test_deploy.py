"""The deployment files in deploy/ and what they rely on: the systemd unit passes
`systemd-analyze verify` without a warning, nestgate speaks sd_notify to a real
NOTIFY_SOCKET (READY when every worker listens, RELOADING and READY around a reload,
STOPPING), and the logrotate snippet's signal makes nestgate reopen its log."""

from __future__ import annotations

import os
import pwd
import re
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
    unit.write_text(UNIT.read_text().replace("/opt/nestgate/bin/nestgate", str(nestgate)))
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
    assert published == listening == {80, 443}
    volume = next(v for v in nestgate["volumes"] if v.endswith(":/var/lib/nestgate"))
    assert volume.split(":")[0] in compose["volumes"]            # a named volume
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
    assert "ENV STATE_DIRECTORY=/var/lib/nestgate" in dockerfile.splitlines()


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


# ---------------------------------------------------------------- the documented install

SERVICE_CONFIG = """
[server]
workers = 1

[[listen]]
address = "127.0.0.1:0"

[admin]
address = "127.0.0.1:0"

[auth]
store = "nestgate-state.db"

[acme]
storage = "certificates"

[[site]]
hosts = ["*"]
allow = ["127.0.0.0/8"]
allow_dynamic = true

[[site.route]]
path = "/"
type = "return"
body = "served"
"""


def _documented_commands() -> list[str]:
    """The shell lines of docs/deploy.md's Install and systemd sections, in order."""
    text = (REPO / "docs" / "deploy.md").read_text()
    section = text[text.index("## Install"):text.index("## Without systemd")]
    lines, inside = [], False
    for line in section.splitlines():
        if line.startswith("```"):
            inside = not inside
        elif inside and line.strip():
            lines.append(line.split("  #")[0].strip())
    return lines


def _as_test_paths(line: str, paths: dict[str, str], user: str, config: Path) -> str | None:
    """A documented line with the test's own folders and user, run as root (this test's
    privilege), or None for what needs a running systemd or the network's packages."""
    if line.startswith("sudo -u "):                               # sudo -u USER VAR=x cmd
        _sudo, _u, who, rest = line.split(" ", 3)
        line = f"runuser -u {who} -- env {rest}"
    line = re.sub(r"(^|&&\s*)sudo ", r"\1", line)
    if line.startswith(("systemctl", "apt-get")):
        return None                    # systemd is not the init system here; debian-deps
    for real, ours in paths.items():
        line = line.replace(real, ours)
    line = re.sub(r"(?<=\s)nestgate(?=\s|$)", user, line)        # the user, not a path
    line = re.sub(r"(?<=\s)nestgate\.toml(?=\s)", str(config), line)   # the one written
    return line.replace(" install .", f" install {REPO}")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("systemd-analyze") is None
                    or not os.path.exists("/usr/bin/python3"),
                    reason="the install creates a system user and folders: root only")
def test_the_documented_install_runs_as_the_service_user(tmp_path):
    """docs/deploy.md's commands from a fresh machine, with this test's own folders and
    user in place of /opt/nestgate, /etc/nestgate, /var/lib/nestgate and `nestgate`: the
    unit as installed passes `systemd-analyze verify`, the service user runs `check` and
    `serve` on the installed config with the unit's directories, and the state is
    written in the state folder the unit allows."""
    tag = os.urandom(3).hex()
    user = f"nestgate-t{tag}"
    opt, etc, state, units = (Path(f"/opt/nestgate-t{tag}"), Path(f"/etc/nestgate-t{tag}"),
                              Path(f"/var/lib/nestgate-t{tag}"), tmp_path / "units")
    units.mkdir()
    paths = {"/opt/nestgate": str(opt), "/etc/nestgate": str(etc),
             "/var/lib/nestgate": str(state), "/etc/systemd/system/": f"{units}/"}
    (tmp_path / "nestgate.toml").write_text(SERVICE_CONFIG)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
    env["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin"            # python3 is Debian's
    server = None
    built_here = not (REPO / "build").exists()      # pip's build folder in the checkout
    try:
        for line in _documented_commands():
            command = _as_test_paths(line, paths, user, tmp_path / "nestgate.toml")
            if command is None:
                continue
            run = subprocess.run(["bash", "-c", command], cwd=REPO, env=env,
                                 capture_output=True, text=True, timeout=400)
            assert run.returncode == 0, (command, run.stdout[-2000:], run.stderr[-2000:])
        assert (opt / "bin" / "nestgate").exists() and (etc / "nestgate.toml").exists()

        unit = (units / "nestgate.service").read_text()
        for real, ours in paths.items():
            unit = unit.replace(real, ours)
        unit = re.sub(r"^(User|Group)=nestgate$", rf"\1={user}", unit, flags=re.M)
        unit = unit.replace("StateDirectory=nestgate", f"StateDirectory=nestgate-t{tag}")
        (units / "nestgate.service").write_text(unit)
        verify = subprocess.run(["systemd-analyze", "verify", str(units / "nestgate.service")],
                                capture_output=True, text=True, timeout=60)
        assert verify.returncode == 0 and verify.stdout + verify.stderr == "", verify.stderr

        # The unit's ExecStart, as its user, in its WorkingDirectory with its STATE_DIRECTORY.
        exec_start = re.search(r"^ExecStart=(.*)$", unit, re.M).group(1).split()
        server = subprocess.Popen(
            ["runuser", "-u", user, "--", "env", f"STATE_DIRECTORY={state}", *exec_start],
            cwd=state, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline, seen = time.monotonic() + 60, ""
        while "ready" not in seen and time.monotonic() < deadline:
            line = server.stdout.readline()
            if not line:
                break
            seen += line
        assert "ready" in seen, seen
        store = state / "nestgate-state.db"
        assert store.exists() and store.stat().st_uid == pwd.getpwnam(user).pw_uid
        assert not (etc / "nestgate-state.db").exists()
    finally:
        if server is not None:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
        subprocess.run(["userdel", user], capture_output=True, timeout=30)
        if built_here:
            shutil.rmtree(REPO / "build", ignore_errors=True)
        for folder in (opt, etc, state):
            shutil.rmtree(folder, ignore_errors=True)
