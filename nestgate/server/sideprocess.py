"""Processes the supervisor keeps beside the workers for work that must be done once
for the whole server, not once per worker: talking to the ACME CA (nestgate.certs), and
polling the CrowdSec Local API (nestgate.bans.crowdsec).

Each `SideProcess` is forked when the config wants it, restarted (after
`RESTART_DELAY`) when it dies, replaced on reload by one running the new config, and
stopped with the server. Its body runs with the parent's death signal set, so it never
outlives the supervisor, and leaves through `os._exit`.
"""

from __future__ import annotations

import os
import signal
import time

RESTART_DELAY = 5.0          # seconds before a side process that died is started again


class SideProcess:
    """The supervisor's side of one such process. `wanted(config)` says whether the
    config needs it; `main(config)` is its body, run in the forked child, under the
    name `title` in `ps` and `top` when one is given; `dropped()`, if given, runs in
    the supervisor once the process has exited for a config that no longer wants it:
    it clears what the process kept in shared state."""

    def __init__(self, name: str, wanted, main, dropped=None, title: str = "") -> None:
        self.name = name
        self.title = title
        self.wanted = wanted
        self.main = main
        self.dropped = dropped
        self.pid = 0
        self.restart_at = 0.0
        self.config = None

    def start(self, config, close_in_child) -> None:
        self.config = config
        if self.pid or not self.wanted(config):
            return
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                close_in_child()
                from nestgate.server.worker import die_with_parent
                die_with_parent()
                if self.title:
                    name_process(self.title)
                self.main(config)
            except BaseException:             # noqa: BLE001 - reported, then exit
                import traceback
                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        self.pid = pid

    def replace(self, config) -> None:
        """On reload: the process for the new config, once the old one has exited."""
        self.config = config
        if self.pid:
            self.restart_at = time.monotonic()
            os.kill(self.pid, signal.SIGTERM)
        elif self.wanted(config):
            self.restart_at = time.monotonic()

    def exited(self, pid: int, stopping: bool, say) -> bool:
        if not pid or pid != self.pid:
            return False
        self.pid = 0
        if not stopping and self.dropped is not None and not self.wanted(self.config):
            self.dropped()
        if not stopping and not self.restart_at:
            self.restart_at = time.monotonic() + RESTART_DELAY
            say(f"{self.name} process {pid} exited; restarting in {RESTART_DELAY:g}s")
        return True

    def restart_due(self) -> bool:
        """Whether the process should be started again now."""
        if not self.pid and self.restart_at and time.monotonic() >= self.restart_at:
            self.restart_at = 0.0
            return True
        return False

    def stop(self) -> None:
        self.restart_at = 0.0
        if self.pid:
            try:
                os.kill(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass


def process_name() -> str:
    try:
        with open("/proc/self/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def name_process(name: str) -> None:
    """The name `ps` and `top` show (the kernel keeps 15 characters)."""
    try:
        with open("/proc/self/comm", "w") as f:
            f.write(name)
    except OSError:
        pass
