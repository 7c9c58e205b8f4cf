"""A worker: one uvloop event loop serving the listeners the supervisor bound.

Owns its connections, the coarse clock tick that enforces their deadlines, and
the buffered request log. SIGTERM: stop accepting, let connections finish, exit
by the shutdown deadline. SIGUSR1: reopen the log file.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import socket
import sys

import uvloop

from nestgate.pipeline.accesslog import AccessLog, should_log
from nestgate.bans.watch import BANS
from nestgate.admin.stats import TALLY_BYTES
from nestgate.base.clock import CLOCK
from nestgate.base.clientip import parse_networks
from nestgate.wire.h1proxyheader import ProxyProtocolConnection
from nestgate.wire.http1 import HTTP1Connection
from nestgate.wire.proxytls import ProxyThenTLS, TLSHandshake
from nestgate.pipeline.ratelimit import shared_limits
from nestgate.base.responses import announce_http3
from nestgate.sites.build import build_router, https_redirect_router
from nestgate.base.control import CONTROLS
from nestgate.server.heap import HeapTrim, trim_heap
from nestgate.base.tally import TALLY
from nestgate.wire.tls import alpn_protocols

_PR_SET_PDEATHSIG = 1
PUBLISH_INTERVAL = 0.5       # seconds between writes of a worker's figures
IDLE_STEP = 1.0              # the tick's longest sleep with no connection open


def _timeouts_quarter(limits) -> float:
    """A quarter of the shortest connection timeout: how late, at most, a sweep may
    find a connection past its deadline."""
    return min(limits.header_timeout, limits.body_timeout, limits.keepalive_timeout,
               limits.send_timeout) / 4


class LiveConnections(set):
    """The worker's open connections. The first to arrive after none were open reads
    the clock: the tick may have been asleep for its idle step (`IDLE_STEP`), and the
    `Date`, the log's time and every deadline of the new connection start from it.
    Once per connection, and only then; requests never pass here."""

    __slots__ = ()

    def add(self, conn) -> None:
        if not self:
            CLOCK.tick()
        set.add(self, conn)


class ServerContext:
    """What every connection on one listener shares."""

    trusted_proxies: frozenset = frozenset()      # peers whose X-Forwarded-For is believed
    proxy_protocol_from: frozenset = frozenset()  # peers allowed to send a PROXY header
    certificate_book = None      # managed certificates of a TLS listener (nestgate.certs)
    https_router = None          # what routes a trusted proxy's https request, if not `router`

    def __init__(self, worker: Worker, listener, router) -> None:
        self.loop = worker.loop
        self.limits = worker.config.limits
        self.connections = worker.connections
        self.access_log = worker.access_log
        self.scheme = listener.scheme
        self.draining = False            # set by the worker on graceful stop
        # by the connections that have closed (open ones are added when published)
        self.requests_done = 0
        self.bytes_in_done = 0
        self.bytes_out_done = 0
        self.router = https_redirect_router(listener, worker.config) \
            if listener.redirect_https else router
        self._log_loopback = worker.config.log.log_loopback
        # Client IP: None/empty when not configured, so plain peers pay nothing.
        trusted = worker.config.trusted_proxies
        self.trusted_proxies = parse_networks(trusted) if trusted else None
        # A listener that sends visitors to HTTPS serves the sites to a trusted proxy's
        # request that says it came over HTTPS (dispatch.refresh_client): that proxy
        # ended TLS in front, and a redirect would come straight back to it.
        if listener.redirect_https and self.trusted_proxies:
            self.https_router = router
        self.proxy_protocol_from = parse_networks(listener.proxy_protocol_from)
        self.alpn_protocols = tuple(alpn_protocols(listener))   # a TLS listener's offer
        # The bans clients are looked up in where they arrive; None: no bans to look up.
        self.bans = BANS if BANS.enabled and worker.router is None else None
        self.max_per_client = listener.max_connections_per_client   # 0: not counted
        self.alt_svc = listener.http3    # HTTPS answers name the listener's HTTP/3

    @staticmethod
    def client_address(peer) -> str:
        if not peer:
            return ""
        host = peer[0]
        if host.startswith("::ffff:") and "." in host:
            return host[7:]                      # IPv4-mapped IPv6
        return host

    def should_log(self, client: str) -> bool:
        return should_log(self._log_loopback, client)


def protocol_factory(ctx, listener, sslcontext):
    """The protocol each new connection on `listener` starts with. Every server
    accepts in clear: on a TLS listener the handshake is a stage of the connection
    (nestgate.wire.proxytls), counted toward `max_connections` and bounded by
    `header_timeout`, after a PROXY header where the listener takes them. On TLS
    listeners that offer h2, ALPN then decides between HTTP/2 and HTTP/1.1."""
    def http1():
        return HTTP1Connection(ctx)
    if listener.speaks_http2:
        # Only then is the HTTP/2 engine loaded (1 MB, hpack's tables with it): by the
        # supervisor, before the fork (nestgate.sites.build.handler_modules).
        from nestgate.wire.h2select import ALPNSwitch, PriorKnowledge
    usual = (lambda: ALPNSwitch(ctx, http1)) if listener.tls and listener.http2 else http1
    if sslcontext is not None:
        stage = ProxyThenTLS if listener.proxy_protocol_from else TLSHandshake
        return lambda: stage(ctx, sslcontext, usual)
    if listener.proxy_protocol_from:
        return lambda: ProxyProtocolConnection(ctx)
    if listener.http2_cleartext:
        return lambda: PriorKnowledge(ctx, http1)
    return usual


class Worker:
    def __init__(self, config, sockets, ssl_contexts, ready_fd: int, *,
                 figures=None, router=None, shared=None, log_requests: bool = True) -> None:
        self.config = config
        self.figures = figures           # (WorkerTable, slot, generation) or None
        self.router = router             # the admin process brings its own
        self.shared = shared             # the sites' router the supervisor built, or None
        self.tally_shown = router is None   # sites' answers are published, the admin's not
        self.tally_too_big = False
        self.log_requests = log_requests
        self.sockets = sockets
        self.ssl_contexts = ssl_contexts
        self.ready_fd = ready_fd
        self.connections: set[HTTP1Connection] = LiveConnections()
        self.draining = False
        self.access_log = None
        self.loop = None
        self._stop = None
        self.contexts: list[ServerContext] = []
        self.started = 0.0
        self.counting_clients = False    # a listener has max_connections_per_client
        self.certificate_books: list = []   # reloaded from storage when it changes

    async def serve(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        if self.log_requests:
            self.access_log = AccessLog(self.config.log)
        quic_ports = [sock.getsockname()[1] for _l, sock in self.sockets
                      if sock.type == socket.SOCK_DGRAM]
        if quic_ports:
            announce_http3(quic_ports)   # before any route's answers are built
        if self.router is None:
            BANS.configure(self.config, shared_limits().rates)   # before the routes: they
                                                                  # ask what it counts
        router = self.router or (self.shared.take() if self.shared is not None
                                 else build_router(self.config))
        if self.access_log is not None:
            self.access_log.geo = router.geo
        self.started = CLOCK.wall
        self.counting_clients = self.figures is not None and any(
            listener.max_connections_per_client for listener, _sock in self.sockets)
        if self.counting_clients:
            shared_limits().connections.adopt(self.figures[1])
        servers, contexts, quic = [], self.contexts, []
        for listener, sock in self.sockets:
            ctx = ServerContext(self, listener, router)
            contexts.append(ctx)
            sslcontext = self.ssl_contexts.get(listener)
            tls_book = getattr(sslcontext, "certificate_book", None)
            if sock.type == socket.SOCK_DGRAM:       # the listener's HTTP/3 (http3 = true)
                from nestgate.wire.h3quic import serve_quic   # aioquic: an optional dependency
                server = await serve_quic(ctx, listener, sock, tls_book)
                if server.certificates.book is not None:
                    self.certificate_books.append(server.certificates.book)
                quic.append(server)
                continue
            ctx.certificate_book = tls_book
            if ctx.certificate_book is not None:
                self.certificate_books.append(ctx.certificate_book)
            factory = protocol_factory(ctx, listener, sslcontext)
            server = await self.loop.create_server(factory, sock=sock, backlog=1024)
            servers.append(server)
        self.loop.add_signal_handler(signal.SIGTERM, self._stop.set)
        if self.access_log is not None:
            self.loop.add_signal_handler(signal.SIGUSR1, self.access_log.reopen)
        services = router.services
        if self.router is None and BANS.keeps:
            services = [*services, BANS]      # its table kept in step with the store
        tick = asyncio.create_task(self._tick(services))
        tick.add_done_callback(self._tick_ended)
        for service in services:            # proxy health checks, the shared store
            service.start()
        self.publish()
        # What starting freed in the C heap (the admin's router and its modules' first
        # import above all) is given back before idling rather than kept resident:
        # 0.7 MiB less anonymous PSS for the admin process, measured; once, a few ms.
        trim_heap()
        os.write(self.ready_fd, b"%d\n" % os.getpid())
        await self._stop.wait()

        # Graceful stop: no new connections; in-flight requests finish.
        self.draining = True
        for ctx in contexts:
            ctx.draining = True
        for server in servers:
            server.close()
        for server in quic:
            server.draining = True        # no new QUIC connection; open ones go on
        # Drop this process's copies of the listening sockets: once every process
        # has, the kernel refuses new connections instead of queueing them unserved.
        # (A UDP socket carries the open QUIC connections: it closes after them.)
        for _listener, sock in self.sockets:
            if sock.type != socket.SOCK_DGRAM:
                sock.close()
        try:
            # Tell the supervisor: from now on no new connection can reach this worker
            # (the admin API's reload answers once every old worker has said so).
            os.write(self.ready_fd, b"-%d\n" % os.getpid())
        except OSError:
            pass
        for conn in list(self.connections):
            conn.finish_and_close()
        deadline = CLOCK.now + self.config.server.shutdown_timeout
        while self.connections and CLOCK.now < deadline:
            await asyncio.sleep(0.05)
            CLOCK.tick()
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.abort()
        for server in quic:
            server.close()
        tick.cancel()
        self.publish()                  # the last counts, for the supervisor to pass on
        for service in services:
            service.stop()
        if self.access_log is not None:
            self.access_log.close()

    def _tick_ended(self, tick: asyncio.Task) -> None:
        # Without its tick a worker has no timeouts, no log flush and a frozen clock:
        # it stops (and the supervisor starts another) rather than serve on like that.
        if not tick.cancelled() and tick.exception() is not None:
            print(f"nestgate: worker {os.getpid()}: its tick failed: {tick.exception()!r}",
                  file=sys.stderr)
            self._stop.set()

    async def _tick(self, services) -> None:
        """Every timer of the worker: connections' deadlines, the log's flush, the
        figures, certificates, the heap's free memory (nestgate.server.heap), and each
        service's `tick` at its `tick_every`."""
        limits = self.config.limits
        shortest = min(limits.header_timeout, limits.body_timeout, limits.keepalive_timeout,
                       limits.send_timeout, self.config.log.flush_interval)
        interval = max(0.05, min(1.0, shortest / 4))
        ticking = [service for service in services if service.tick_every]
        # The loop wakes as often as the most pressed service needs; connections are
        # swept at their own pace, whatever that is.
        step = min([interval] + [service.tick_every for service in ticking])
        # With no connection and no log line waiting, nothing needs the clock sooner
        # than the timeouts' own quarter (a new connection's first deadline is then
        # missed by no more than when it is busy) or a service's next tick: an idle
        # server on a home box wakes once a second, not four times.
        waking = [service.tick_every for service in ticking]
        idle_step = max(step, min([IDLE_STEP, _timeouts_quarter(limits)] + waking))
        last_flush = last_tick = last_publish = CLOCK.now
        heap = HeapTrim()
        bans = BANS if BANS.enabled and self.router is None else None
        log = self.access_log
        while True:
            idle = not self.connections and (log is None or not log.pending())
            await asyncio.sleep(idle_step if idle else step)
            CLOCK.tick()
            now = CLOCK.now
            for service in ticking:
                service.tick(now)
            if now - last_tick < interval - step / 2:
                continue
            elapsed, last_tick = now - last_tick, now
            for conn in list(self.connections):
                conn.tick(elapsed)
            if bans is not None:
                bans.sweep(self.connections)   # clients banned since they connected
            heap.tick(now)
            if now - last_flush >= self.config.log.flush_interval \
                    and self.access_log is not None:
                last_flush = now
                self.access_log.flush()
            if now - last_publish >= PUBLISH_INTERVAL:
                last_publish = now
                self.publish()
                for book in self.certificate_books:  # renewed certificates, challenges
                    book.refresh()

    def publish(self) -> None:
        """Write this worker's figures into its slot of the shared table (see
        nestgate.admin.stats): once a tick, never per request."""
        if self.figures is None:
            return
        table, slot, generation = self.figures
        requests = bytes_in = bytes_out = 0
        for ctx in self.contexts:
            requests += ctx.requests_done
            bytes_in += ctx.bytes_in_done
            bytes_out += ctx.bytes_out_done
        http1 = http2 = tls = handshakes = 0
        for conn in self.connections:
            requests += conn.served
            bytes_in += conn.bytes_in
            bytes_out += conn.bytes_out
            protocol = conn.protocol
            if protocol == "HTTP/2":
                http2 += 1
            elif not protocol:               # a TLS handshake, or no preface read yet
                handshakes += 1
                continue
            elif protocol != "HTTP/3":       # the table has no HTTP/3 column yet
                http1 += 1
            if conn.ctx.scheme == "https":
                tls += 1
        table.write(slot, os.getpid(), generation, self.started, requests, http1, http2,
                    tls, handshakes, CLOCK.wall, bytes_in, bytes_out)
        if self.counting_clients:
            # Every worker's region must be read by a connection check: draining
            # generations and restarts can take slots beyond the first ones.
            counts = shared_limits().connections
            counts.span = max([counts.span] + [f.slot + 1 for f in table.read()])
        if not self.tally_shown:
            return                  # the admin process: its own requests are not the sites'
        CONTROLS.poll(table)
        TALLY.control = CONTROLS.seq
        if self.access_log is not None:
            TALLY.log_dropped = self.access_log.dropped
        if not table.write_tally(slot, TALLY.snapshot()) and not self.tally_too_big:
            self.tally_too_big = True
            print(f"nestgate: worker {os.getpid()}: the answer counts outgrew their "
                  f"{TALLY_BYTES} bytes of shared memory; /metrics shows them as they were",
                  file=sys.stderr)


def run_worker(config, sockets, ssl_contexts, ready_fd: int, **options) -> None:
    """Entry point in the forked child; never returns. `options` go to `Worker`."""
    code = 0
    try:
        die_with_parent()
        signal.signal(signal.SIGINT, signal.SIG_IGN)   # the supervisor decides
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        CLOCK.begin()
        uvloop.run(Worker(config, sockets, ssl_contexts, ready_fd, **options).serve())
    except BaseException as exc:  # noqa: BLE001 - report and leave with an error code
        print(f"nestgate: worker {os.getpid()} failed: {exc!r}", file=sys.stderr)
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def die_with_parent() -> None:
    # A worker (or the certificate process) whose supervisor was killed must not
    # keep going alone.
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass
