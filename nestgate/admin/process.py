"""The admin process: forked and kept running by the supervisor, like a worker but
serving only the admin listener. It learns the supervisor's state from reports (one
JSON datagram each, sent on every change and once a second) and the workers' figures
from the shared table; it never touches their sockets or their requests."""

from __future__ import annotations

import asyncio
import json
import socket
from dataclasses import replace

from nestgate.admin.api import AdminState, admin_router
from nestgate.config import Listener
from nestgate.base.handler import Service
from nestgate.wire.tls import server_context
from nestgate.server.worker import run_worker

REPORT_MAX = 1 << 20         # bytes of one report datagram
ADMIN_PROCESS_NAME = "nestgate-admin"


def admin_listener(admin) -> Listener:
    """The admin address as a listener: HTTPS with `[admin] certificate`, HTTP/1.1 only
    (curl, Prometheus and the ctl speak it; there is nothing for HTTP/2 to speed up)."""
    certificates = (admin.certificate,) if admin.certificate is not None else ()
    return Listener(admin.host, admin.port, certificates, http2=False, key=admin.key)


def run_admin(config, sock: socket.socket, reports: socket.socket, table, ready_fd: int):
    """Entry point in the forked child; never returns."""
    admin = config.admin
    state = AdminState(table, admin.audit_log,
                       bool(admin.token) and not admin.loopback_without_token)

    class Reports(Service):
        """Read by the worker loop as a service: the latest report replaces the last."""

        def start(self) -> None:
            loop = asyncio.get_running_loop()
            reports.setblocking(False)
            loop.add_reader(reports.fileno(), self.read)

        def read(self) -> None:
            while True:
                try:
                    data = reports.recv(REPORT_MAX)
                except (BlockingIOError, InterruptedError):
                    return
                except OSError:
                    return
                try:
                    report = json.loads(data)
                except ValueError:
                    continue
                state.reported(report)

        def stop(self) -> None:
            asyncio.get_running_loop().remove_reader(reports.fileno())

    store = config.auth.store if config.auth is not None and \
        config.auth.store != ":memory:" else ""
    router = admin_router(state, config, store)
    router.services.append(Reports())
    # The admin's own requests are not the sites' traffic: they go to no request log,
    # and X-Forwarded-For is never believed on it.
    listener = admin_listener(config.admin)
    contexts = {listener: server_context(listener)} if listener.tls else {}
    run_worker(replace(config, trusted_proxies=()), [(listener, sock)],
               contexts, ready_fd, router=router, log_requests=False)
