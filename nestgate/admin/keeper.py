"""The supervisor's side of the admin listener: binds it, forks the admin process and
restarts it when it dies, and sends it a report of the supervisor's state on every
change and once a second (one JSON datagram; when the admin process is busy the report
is dropped, the next one replaces it)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import time
from collections import deque
from dataclasses import replace

from nestgate.admin.process import (ADMIN_PROCESS_NAME, REPORT_MAX, admin_listener,
                                    build_admin, run_admin)
from nestgate.admin.config import keys_not_applied, restarts_admin_process
from nestgate.admin.stats import WorkerTable
from nestgate.certs.info import certificate_expiry, certificate_stamp
from nestgate.server.sideprocess import name_process, process_name

REPORT_EVERY = 1.0           # seconds between reports when nothing changes
RESTART_DELAY = 0.5          # an admin process that died is started again after this
RELOADS_KEPT = 10            # recent reload results in /v1/status
DEPARTED_KEPT = 64           # exited workers' tallies waiting for a report


class AdminKeeper:
    def __init__(self) -> None:
        self.table = WorkerTable()
        self.config = None              # the config the admin process runs with
        self.sock: socket.socket | None = None
        self.pid = 0
        self.restart_at = 0.0
        self.reports_out, self.reports_in = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.reports_out.setblocking(False)
        self.reloads: deque = deque(maxlen=RELOADS_KEPT)
        self.reload_counts = {"ok": 0, "refused": 0}
        self.started = time.time()
        self.supervisor_pid = os.getpid()
        self.config_hash = ""
        self.certificates: list[dict] = []      # of the serving config (nestgate.certs.info)
        self.users: list[dict] = []             # of the serving config, without secrets
        self.oidc_clients: list[dict] = []      # the same: the OpenID provider's clients
        self.providers: list[dict] = []         # its [[auth.oidc]], without client secrets
        self._last_report = b""
        # Workers gone since the last report, with the last answer counts they
        # published: the admin process adds them to its totals (nestgate/admin/answers.py).
        self.departed: list[tuple[int, bytes]] = []
        self._last_sent = 0.0
        self._certificate_stamp = 0
        # What `prepare` built for the first admin process: (config, (state, router)).
        self.prebuilt = None
        self.prebuilt_taken = False
        self.bound = None               # the [admin] table the listener was bound with
        self.running = None             # ... and the one the admin process started with

    # ------------------------------------------------------------ listener
    def bind(self, config, bound, say) -> None:
        """Bind the admin address of the first config (`bound` is the supervisor's
        binder, which names the config key when the address is taken)."""
        self.config = config
        self.bound = self.running = config.admin
        self.config_hash = _file_hash(config.source)
        self.certificates = certificate_expiry(config)
        self.users = user_listing(config)
        self.oidc_clients = client_listing(config)
        self.providers = provider_listing(config)
        admin = config.admin
        if not admin.enabled:
            return
        self.sock = bound(admin_listener(admin))
        self.sock.listen(128)
        self.sock.setblocking(False)
        host, port = self.sock.getsockname()[:2]
        shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        access = "bearer token required" if not admin.loopback_without_token else \
            "loopback clients need no token" if not admin.token else \
            "bearer token required but from loopback clients"
        if admin.token_file:
            access += f"; the token is in {admin.token_file}"
        say(f"admin API on {admin.scheme}://{shown} ({access})")

    def with_token(self, config):
        """`config` with the admin token made at the first start when none is set."""
        from nestgate.admin.token import ensure_token
        self.config = ensure_token(config)
        return self.config

    def config_changed(self, config, say) -> list[str]:
        """A reload is serving: the admin process runs with the new config's token
        (started anew). The [admin] keys whose change the reload did not apply are
        logged and returned (`keys_not_applied`): they take effect at restart."""
        if self.sock is not None:         # no listener, no token to make
            config = self._token_kept(config, say)
        self.config = config
        self.config_hash = _file_hash(config.source)
        self.certificates = certificate_expiry(config)
        self.users = user_listing(config)
        self.oidc_clients = client_listing(config)
        self.providers = provider_listing(config)
        if self.bound is None:
            return []                     # never bound (a supervisor without its run)
        running = self.running if self.sock is not None else config.admin
        keys = keys_not_applied(self.bound, running, config.admin)
        if keys:
            say(f"warning: reloaded without {', '.join(keys)}: [admin] "
                f"{'changes' if len(keys) > 1 else 'a change'} there take effect when "
                "nestgate restarts")
        if self.sock is not None and restarts_admin_process(self.running, config.admin) \
                and self.pid:
            _signal(self.pid, signal.SIGTERM)      # restarted with the new token or cert
        return keys

    def _token_kept(self, config, say):
        """The reloaded config with its token: the made one (made again if its file
        went), or, when that cannot be, the token the admin process has."""
        from nestgate.admin.token import TokenError, ensure_token
        try:
            return ensure_token(config, self.config)
        except TokenError as exc:
            say(f"warning: {exc}; the admin process keeps the token it has")
            return replace(config, admin=replace(config.admin, token=self.config.admin.token))

    # ------------------------------------------------------------ the process
    def prepare(self) -> None:
        """Build the first admin process's state and router here, before the workers
        are forked, to be shared rather than written in the admin process (see
        nestgate.admin.process.build_admin). A later admin process (restarted, or on
        a reloaded config) builds its own: it reads what was asked of the workers
        before it started, and comes seldom. The objects stay referenced after the
        fork: freeing them here would write to pages the other processes share."""
        if self.sock is not None and self.prebuilt is None:
            self.prebuilt = (self.config, build_admin(self.config, self.table))

    def fork(self, ready_w: int, close_in_child) -> None:
        if self.sock is None:
            return
        built = None
        if self.prebuilt is not None and not self.prebuilt_taken \
                and self.prebuilt[0] is self.config:
            built = self.prebuilt[1]
        self.prebuilt_taken = True
        # The child is born with its name (`ps`, `top`, /proc/PID/comm): the name is
        # given to this process for the fork and taken back after it.
        own = process_name()
        name_process(ADMIN_PROCESS_NAME)
        try:
            pid = os.fork()
        finally:
            if os.getpid() == self.supervisor_pid:
                name_process(own)
        if pid == 0:
            close_in_child()
            self.reports_out.close()
            run_admin(self.config, self.sock, self.reports_in, self.table, ready_w, built)
        self.pid = pid
        self.running = self.config.admin

    def close_in_worker(self) -> None:
        """In a forked worker: the admin's sockets are not its own."""
        if self.sock is not None:
            self.sock.close()
        self.reports_in.close()
        self.reports_out.close()

    def exited(self, pid: int, stopping: bool, say, describe) -> bool:
        """Whether `pid` was the admin process (then restarted soon unless stopping)."""
        if pid != self.pid or not pid:
            return False
        self.pid = 0
        if not stopping:
            self.restart_at = time.monotonic() + RESTART_DELAY
            say(f"admin process {pid} exited ({describe}); restarting")
        return True

    def restart_due(self, fork) -> None:
        """`fork` is the supervisor's, which blocks its signals across the fork."""
        if self.restart_at and time.monotonic() >= self.restart_at:
            self.restart_at = 0.0
            fork()

    def stop(self) -> None:
        if self.pid:
            _signal(self.pid, signal.SIGTERM)
        if self.sock is not None:
            self.sock.close()

    # ------------------------------------------------------------ reports
    def worker_gone(self, pid: int, slot: int) -> None:
        """A worker exited: keep what it counted for the next report (its slot may be
        taken by the next worker before the admin process reads it)."""
        if self.sock is None or slot < 0:
            return
        data = self.table.read_tally(slot)
        if data and len(self.departed) < DEPARTED_KEPT:
            self.departed.append((pid, data))

    def reload_result(self, ok: bool, message: str, not_applied: list[str] = ()) -> None:
        """`not_applied`: the [admin] keys whose change waits for a restart."""
        self.reloads.append({"at": round(time.time(), 3), "ok": ok, "message": message,
                             "not_applied": list(not_applied)})
        self.reload_counts["ok" if ok else "refused"] += 1

    def report(self, supervisor) -> None:
        if self.sock is None:
            return
        stamp = certificate_stamp(self.config)       # managed certificates renewed
        if stamp != self._certificate_stamp:
            self._certificate_stamp = stamp
            self.certificates = certificate_expiry(self.config)
        current = max((g.number for g in supervisor.generations if g.was_ready
                       and not g.stopping), default=None)
        state = {
            "pid": os.getpid(),
            "started": self.started,
            "stopping": supervisor.stopping,
            "config": {"file": self.config.source, "sha256": self.config_hash},
            "listen": supervisor.listen, "workers": supervisor.workers,
            "generation": current,
            "generations": [{
                "number": g.number, "ready": g.was_ready, "stopping": g.stopping,
                "accepting": any(s.pid and s.pid not in g.closed for s in g.slots),
                "workers": [{"slot": s.index, "pid": s.pid, "ready": s.pid in g.ready,
                             "restarts": s.restarts} for s in g.slots],
            } for g in supervisor.generations],
            "listeners": [{"address": _shown(sock), "bound": sock.fileno() >= 0}
                          for sock in supervisor.sockets.values()],
            "restarts": sum(s.restarts for g in supervisor.generations for s in g.slots),
            "reloads": list(self.reloads),
            "reload_counts": self.reload_counts,
            "certificates": self.certificates,
            "users": self.users,
            "oidc_clients": self.oidc_clients,
            "providers": self.providers,
        }
        data = json.dumps(state, separators=(",", ":")).encode()
        now = time.monotonic()
        departed = self.departed
        if data == self._last_report and now - self._last_sent < REPORT_EVERY \
                and not departed:
            return
        sent, taken = data, 0
        if departed:
            # The tallies are JSON already: spliced in, not parsed and written again;
            # as many as one datagram holds, the rest with the next report.
            room = REPORT_MAX - len(data) - 64
            parts = []
            for pid, tally in departed:
                part = b"[%d,%s]" % (pid, tally)
                if len(part) > room:
                    break
                parts.append(part)
                room -= len(part) + 1
            taken = len(parts)
            sent = data[:-1] + b',"departed":[' + b",".join(parts) + b"]}"
        try:
            self.reports_out.send(sent)
        except (BlockingIOError, InterruptedError, OSError):
            return                       # the admin process is busy or restarting
        del self.departed[:taken]
        self._last_report, self._last_sent = data, now


def client_listing(config) -> list[dict]:
    """The OpenID provider's clients as the admin API lists them (`Client.listing`:
    never a secret's hash)."""
    auth = config.auth
    provider = auth.provider if auth is not None else None
    return [c.listing() for c in provider.clients] if provider is not None else []


def user_listing(config) -> list[dict]:
    """The config's users as the admin API lists them (`User.listing`: no secrets)."""
    return [user.listing() for user in config.auth.users] if config.auth is not None else []


def provider_listing(config) -> list[dict]:
    """The config's OpenID providers as the admin API lists them (no client secret)."""
    if config.auth is None:
        return []
    return [provider.listing() for provider in config.auth.providers]


def _shown(sock: socket.socket) -> str:
    try:
        host, port = sock.getsockname()[:2]
    except OSError:
        return "closed"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _file_hash(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return ""


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
