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
from nestgate.base.tally import TALLY
from nestgate.pipeline.routing import Router
from nestgate.wire.tls import server_context
from nestgate.server.worker import run_worker

REPORT_MAX = 1 << 20         # bytes of one report datagram
ADMIN_PROCESS_NAME = "nestgate-admin"


def admin_listener(admin) -> Listener:
    """The admin address as a listener: HTTPS with `[admin] certificate`, HTTP/1.1 only
    (curl, Prometheus and the ctl speak it; there is nothing for HTTP/2 to speed up)."""
    certificates = (admin.certificate,) if admin.certificate is not None else ()
    return Listener(admin.host, admin.port, certificates, http2=False, key=admin.key)


def build_admin(config, table) -> tuple[AdminState, Router]:
    """What the admin process answers from: its state and its router. The supervisor
    builds them before it forks the workers (AdminKeeper.prepare), so that the code
    building them runs once, there, and the objects are shared by every process: built
    in the admin process after its fork, the same work wrote about 2 MB of pages it
    shared with the supervisor (measured). Nothing in them is the process's own until
    it serves: the stores are opened per request, the report service is added by
    `run_admin`. Their route counts and cache are none of the workers' figures."""
    admin = config.admin
    with TALLY.not_counted():
        state = AdminState(table, admin.audit_log,
                           bool(admin.token) and not admin.loopback_without_token)
        store = config.auth.store if config.auth is not None and \
            config.auth.store != ":memory:" else ""
        return state, admin_router(state, config, store)


def run_admin(config, sock: socket.socket, reports: socket.socket, table, ready_fd: int,
              built: tuple[AdminState, Router] | None = None):
    """Entry point in the forked child; never returns. `built`: what `build_admin` made
    for `config` before the fork, if it did."""
    state, router = built if built is not None else build_admin(config, table)

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

    router.services.append(Reports())
    # The admin's own requests are not the sites' traffic: they go to no request log,
    # and X-Forwarded-For is never believed on it.
    listener = admin_listener(config.admin)
    contexts = {listener: server_context(listener)} if listener.tls else {}
    run_worker(replace(config, trusted_proxies=()), [(listener, sock)],
               contexts, ready_fd, router=router, log_requests=False)
