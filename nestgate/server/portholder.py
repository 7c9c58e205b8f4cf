"""Who holds a listening TCP address, for `check`: an address that cannot be bound is
reported with the program holding it, and one held by the running nestgate that serves
the very config being checked is not reported at all (its reload keeps its sockets).

Read from the kernel's socket tables through psutil; a process this user may not look
into is simply not named.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

import psutil

from nestgate.config import DEFAULT_CONFIG_NAME, EMBEDDED_DEFAULT


@dataclass(frozen=True)
class Holder:
    pid: int
    name: str
    config: str | None        # the config file it serves, when it is a nestgate

    def describe(self) -> str:
        if self.config is None:
            return f"held by {self.name} (pid {self.pid})"
        return f"held by nestgate (pid {self.pid}) serving {self.config}"


def holder_of(host: str, port: int) -> Holder | None:
    """The process listening on `host`:`port`, or on its family's wildcard address."""
    wanted = ipaddress.ip_address(host)
    try:
        sockets = psutil.net_connections("tcp")
    except (psutil.Error, OSError):
        return None
    for sock in sockets:
        if sock.status != psutil.CONN_LISTEN or sock.laddr.port != port or sock.pid is None:
            continue
        held = ipaddress.ip_address(sock.laddr.ip.split("%")[0])
        if held == wanted or (held.is_unspecified and held.version == wanted.version):
            return _describe(sock.pid)
    return None


def _describe(pid: int) -> Holder | None:
    try:
        process = psutil.Process(pid)
        argv, cwd = process.cmdline(), process.cwd()
        name = process.name()
    except (psutil.Error, OSError):
        return None
    return Holder(pid, name, _served_config(argv, cwd))


def _served_config(argv: list[str], cwd: str) -> str | None:
    """The config a `nestgate serve` command line reads (as `read_config` finds it:
    --config, else ./nestgate.toml in its folder, else the embedded default), resolved;
    None for any other program."""
    words = [os.path.basename(a) for a in argv[:3]]
    if "serve" not in argv or not ("nestgate" in words or "-m" in argv and "nestgate" in argv):
        return None
    path = None
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            path = argv[i + 1]
        elif arg.startswith("--config="):
            path = arg.partition("=")[2]
    if path is None:
        local = Path(cwd, DEFAULT_CONFIG_NAME)
        path = str(local) if local.exists() else str(EMBEDDED_DEFAULT)
    return os.path.realpath(os.path.join(cwd, path))
