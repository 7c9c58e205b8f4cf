"""Debian's CrowdSec as the Local API alone (`crowdsec -no-cs`) on a loopback port of
the test's, with its database in a folder of the test's: a bouncer key from
`cscli bouncers add`, decisions added and deleted with `cscli decisions`."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from nestgate.bench.ports import free_port

SYSTEM_CONFIG = Path("/etc/crowdsec/config.yaml")


class LocalApi:
    def __init__(self, folder: Path) -> None:
        crowdsec = shutil.which("crowdsec")
        assert crowdsec and shutil.which("cscli") and SYSTEM_CONFIG.exists(), \
            "the crowdsec package is installed by `make test` (debian-deps)"
        self.crowdsec = crowdsec
        self.folder = folder
        (folder / "data").mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = yaml.safe_load(SYSTEM_CONFIG.read_text())
        config["common"].update(daemonize=False, log_media="stdout", log_dir=str(folder),
                                working_dir=str(folder))
        config["config_paths"]["data_dir"] = str(folder / "data")
        config["db_config"]["db_path"] = str(folder / "data" / "crowdsec.db")
        config["db_config"]["use_wal"] = False
        server = config["api"]["server"]
        server.pop("online_client", None)     # no central API: nothing leaves the machine
        server["listen_uri"] = f"127.0.0.1:{self.port}"
        config["api"]["client"]["credentials_path"] = str(folder / "machine.yaml")
        config["prometheus"]["enabled"] = False
        self.config = folder / "config.yaml"
        self.config.write_text(yaml.safe_dump(config))
        self.proc: subprocess.Popen | None = None
        self.cscli("machines", "add", "--auto", "-f", str(folder / "machine.yaml"))
        self.start()
        self.bouncer_key = self.cscli("bouncers", "add", "nestgate-test", "-o", "raw").strip()

    def cscli(self, *args: str) -> str:
        done = subprocess.run(["cscli", "-c", str(self.config), *args], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, f"cscli {' '.join(args)}: {done.stderr}"
        return done.stdout

    def start(self) -> None:
        self.proc = subprocess.Popen([self.crowdsec, "-no-cs", "-c", str(self.config)],
                                     stdout=open(self.folder / "crowdsec.log", "ab"),
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.folder / "crowdsec.log").read_text()
            try:
                urllib.request.urlopen(self.url + "/health", timeout=1)
                return
            except urllib.error.HTTPError:
                return                          # answering (an older LAPI has no /health)
            except OSError:
                time.sleep(0.1)
        raise AssertionError("the Local API never answered")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def ban(self, *target: str, kind: str = "ban", duration: str = "1h") -> None:
        self.cscli("decisions", "add", *target, "-t", kind, "-d", duration, "-R", "test")

    def lift(self, *target: str) -> None:
        self.cscli("decisions", "delete", *target)
