"""The supervisor: binds the listeners once, forks the workers, keeps them running.

It never serves a request. Listening sockets live here, so a reload keeps the
ones the new config still uses: new workers start on them while the old ones
stop accepting and drain. Once the new workers are ready, the listeners the new
config dropped are closed; a reload that fails keeps none it bound.

Signals: SIGTERM/SIGINT graceful stop, SIGHUP reload (validated first; a bad
config keeps the running one), SIGUSR1 forwarded to workers (log reopen).
A worker that dies unexpectedly is restarted with exponential back-off; but if
no generation has been ready yet and a worker has failed to start
FIRST_START_ATTEMPTS times, the supervisor stops and exits 1: a config that
cannot serve at all is an error to report, not a loop. (After a reload the old
generation keeps serving while the new one retries.)
"""

from __future__ import annotations

import errno
import gc
import importlib
import os
import select
import signal
import socket
import sys
import time
from dataclasses import dataclass, field

from nestgate.admin.keeper import REPORT_EVERY, AdminKeeper
from nestgate.admin.stats import SLOTS
from nestgate.certs.manager import managed_certificates, prepare_certificates, run_certificates
from nestgate.bans.crowdsec import BOUNCER_PROCESS_NAME, lift_decisions, run_bouncer
from nestgate.config import Config, ConfigError, config_warnings, read_config, with_overrides
from nestgate.bans.table import ban_table
from nestgate.pipeline.ratelimit import shared_limits
from nestgate.server.heap import trim_heap
from nestgate.server.sdnotify import notify
from nestgate.server.sideprocess import SideProcess
from nestgate.wire.tls import kernel_tls_problem, server_context

RESTART_BACKOFF_MIN = 0.1
STABLE_AFTER = 10.0          # a worker that lived this long resets its back-off
MIN_WAIT = 0.01              # seconds: the main loop's shortest wait
KILL_GRACE = 2.0             # after the shutdown deadline, SIGKILL stragglers
FIRST_START_ATTEMPTS = 5     # a worker dying this often before anything served: give up
# The signals the supervisor handles: blocked across fork, so none reaches a new
# worker while it still has the supervisor's handlers.
HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGCHLD)


def say(message: str) -> None:
    print(f"nestgate: {message}", file=sys.stderr, flush=True)


def share_before_fork(modules=()) -> None:
    """Let the forked processes share the supervisor's memory instead of copying it.
    The modules the workers would import after the fork (their handlers, templates,
    Markdown) are imported here once; and every object there is moved out of the
    garbage collector's reach (`gc.freeze`), whose passes would otherwise write to
    each object's header in every child and so copy the page it lies on. Last, the C
    heap's free pages go back to the system: left resident they are shared, and a
    child allocating there copies each page it writes while this process keeps the
    original (1.1 MB less anonymous PSS for the embedded default, measured)."""
    for name in modules:
        importlib.import_module(name)
    gc.freeze()
    trim_heap()


@dataclass
class Slot:
    """One worker position in a generation: restarts keep the slot."""
    generation: int
    index: int
    pid: int = 0
    started: float = 0.0
    backoff: float = RESTART_BACKOFF_MIN
    restart_at: float = 0.0
    last_pid: int = 0
    failed_starts: int = 0                  # exits before its worker reported ready
    restarts: int = 0
    figures: int = -1                       # its row of the admin's worker table


@dataclass
class Generation:
    number: int
    config: Config
    ssl_contexts: dict
    slots: list[Slot] = field(default_factory=list)
    ready: set[int] = field(default_factory=set)
    closed: set[int] = field(default_factory=set)   # workers that stopped accepting
    was_ready: bool = False                 # every slot has reported ready once
    shared: object = None                   # the workers' router, when built here (fork)
    stopping: bool = False
    stop_deadline: float = 0.0


def load(config_path, listen, workers) -> Config:
    """Read and validate everything a generation needs (certificates included)."""
    return with_overrides(read_config(config_path), listen, workers)


def side_processes() -> tuple[SideProcess, ...]:
    """The processes kept beside the workers, each forked when the config wants it,
    restarted if it dies, and replaced on reload: the one that talks to the ACME CA
    (nestgate.certs.manager), the one that polls CrowdSec's Local API (nestgate.bans.crowdsec)."""
    return (SideProcess("certificate", lambda config: bool(managed_certificates(config)),
                        run_certificates),
            SideProcess("crowdsec bouncer", lambda config: config.crowdsec is not None,
                        run_bouncer, lift_decisions, title=BOUNCER_PROCESS_NAME))


class Supervisor:
    def __init__(self, config: Config, config_path, listen, workers) -> None:
        self.config_path, self.listen, self.workers = config_path, listen, workers
        self.sockets: dict[tuple, socket.socket] = {}
        self.generations: list[Generation] = []
        self.started_generations = 0
        self.ever_ready = False             # some generation has served
        self.by_pid: dict[int, tuple[Generation, Slot]] = {}
        self.pending_signals: list[int] = []
        self.stopping = False
        self.exit_code = 0
        self.ready_r, self.ready_w = os.pipe()
        os.set_blocking(self.ready_r, False)
        self._first = config
        self.admin = AdminKeeper()
        # The one process that talks to the CA, the one that polls CrowdSec's Local API.
        self.sides = side_processes()
        # Rate-limit and per-client connection tables: mapped here, before any fork, so
        # every worker of every generation shares them (nestgate.pipeline.ratelimit). The ban
        # table likewise: a ban one worker makes is in force in all (nestgate.bans).
        shared_limits(SLOTS)
        ban_table()

    # ----------------------------------------------------------- listeners
    @staticmethod
    def _key(listener, position: int) -> tuple:
        # Port 0 asks the kernel for a free port: each such listener is its own socket.
        return (listener.host, listener.port, position if listener.port == 0 else -1)

    def bind(self, config: Config) -> list[tuple]:
        """Bind the listeners `config` adds; their keys. All or none: a listener that
        cannot be bound closes the ones this call bound before raising."""
        added: list[tuple] = []
        try:
            for position, listener in enumerate(config.listeners):
                key = self._key(listener, position)
                if key not in self.sockets:
                    self.sockets[key] = _listen(listener)
                    added.append(key)
                port = self.sockets[key].getsockname()[1]
                for udp in self._quic_keys(config, listener, position):
                    if udp not in self.sockets:
                        self.sockets[udp] = _quic_socket(listener, port)
                        added.append(udp)
        except BaseException:
            self.close_sockets(added)
            raise
        return added

    def close_sockets(self, keys) -> None:
        for key in keys:
            sock = self.sockets.pop(key)
            say(f"no longer listening on {_address(sock)}")
            sock.close()

    def close_unused(self) -> None:
        """Close the listeners no running generation uses any more. Draining workers
        close their own copies, and then the kernel refuses connections on them."""
        used = set()
        for gen in self.generations:
            if not gen.stopping:
                for position, listener in enumerate(gen.config.listeners):
                    used.add(self._key(listener, position))
                    used.update(self._quic_keys(gen.config, listener, position))
        self.close_sockets([key for key in self.sockets if key not in used])

    def _quic_keys(self, config: Config, listener, position: int) -> list[tuple]:
        """An `http3` listener's UDP sockets: one per worker slot, all bound to the
        listener's port with SO_REUSEPORT, so that the kernel hashes each client's
        address to one worker and its QUIC packets keep reaching that worker (one
        socket shared by every worker would hand them to any)."""
        if not listener.http3:
            return []
        base = self._key(listener, position)
        return [(*base, "udp", index) for index in range(config.worker_count)]

    def sockets_for(self, config: Config, slot: int = 0):
        """A worker's listening sockets: every TCP one, and its slot's UDP ones."""
        mine = []
        for position, listener in enumerate(config.listeners):
            mine.append((listener, self.sockets[self._key(listener, position)]))
            if listener.http3:
                key = self._quic_keys(config, listener, position)[slot]
                mine.append((listener, self.sockets[key]))
        return mine

    # ----------------------------------------------------------- workers
    def start_generation(self, config: Config) -> Generation:
        storage = prepare_certificates(config, say)
        contexts = {l: server_context(l, storage) for l in config.listeners if l.tls}
        if contexts and not self.started_generations:
            problem = kernel_tls_problem()
            say("kernel TLS: on (OpenSSL hands records to the kernel where it can)"
                if not problem else f"kernel TLS: off: {problem}")
        prepare_state(config)
        self.started_generations += 1
        number = self.started_generations
        gen = Generation(number, config, contexts)
        gen.slots = [Slot(number, i) for i in range(config.worker_count)]
        self.generations.append(gen)
        try:
            for slot in gen.slots:
                self.fork(gen, slot)
        except BaseException:
            # A generation that cannot fork all its workers (EAGAIN, ENOMEM) would
            # never be ready: the workers it has stop, and what runs goes on.
            self.stop_generation(gen)
            raise
        # A generation still starting is outdated by this one: were it to become
        # ready later, it would replace a newer config with an older one.
        outdated = [g for g in self.generations
                    if g is not gen and not g.was_ready and not g.stopping]
        for older in outdated:
            self.stop_generation(older)
        if outdated:
            self.close_unused()
        return gen

    def fork(self, gen: Generation, slot: Slot) -> None:
        from nestgate.sites.build import build_shared, handler_modules
        from nestgate.sites.shared import shared_router
        from nestgate.server.worker import run_worker
        if slot.figures < 0:
            slot.figures = self.admin.table.claim()
        build_shared(gen.config)
        if gen.number == 1 and gen.shared is None:
            # The first config's workers take the router built here (nestgate.sites.
            # shared); a reloaded one's build their own: this process would otherwise
            # keep one router for every generation it ran.
            gen.shared = shared_router(gen.config)
        share_before_fork(handler_modules(gen.config))
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
        try:
            pid = os.fork()
            if pid == 0:
                self._as_child()
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                mine = self.sockets_for(gen.config, slot.index)
                # A copy of a listener this worker does not serve would keep it accepting
                # after the supervisor closes it.
                for sock in set(self.sockets.values()) - {sock for _l, sock in mine}:
                    sock.close()
                self.admin.close_in_worker()
                run_worker(gen.config, mine, gen.ssl_contexts, self.ready_w,
                           figures=(self.admin.table, slot.figures, gen.number),
                           shared=gen.shared)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        slot.pid = pid
        slot.started = time.monotonic()
        self.by_pid[pid] = (gen, slot)

    def on_ready(self) -> None:
        try:
            data = os.read(self.ready_r, 4096)
        except BlockingIOError:
            return
        for line in data.split():
            pid = int(line)
            if pid < 0:                     # "-PID": that worker stopped accepting
                if -pid in self.by_pid:
                    self.by_pid[-pid][0].closed.add(-pid)
                continue
            if pid not in self.by_pid:
                continue
            gen, _slot = self.by_pid[pid]
            gen.ready.add(pid)
            if len(gen.ready) == len(gen.slots) and not gen.stopping and not gen.was_ready:
                self.generation_ready(gen)

    def generation_ready(self, gen: Generation) -> None:
        """`gen` serves from now on: older generations stop, newer ones keep starting."""
        gen.was_ready = True
        for old in self.generations:
            if old.number < gen.number and not old.stopping:
                self.stop_generation(old)
        self.close_unused()
        if not self.ever_ready:
            self.ever_ready = True
            say(f"ready ({len(gen.slots)} workers)")
            notify("READY=1", f"STATUS=serving with {len(gen.slots)} workers")
        else:
            say(f"reloaded ({len(gen.slots)} workers on the new config)")
            notify("READY=1", f"STATUS=serving generation {gen.number}")
            not_applied = self.admin.config_changed(gen.config, say)
            self.admin.reload_result(True, f"generation {gen.number} serving", not_applied)

    def stop_generation(self, gen: Generation) -> None:
        gen.stopping = True
        gen.stop_deadline = time.monotonic() + gen.config.server.shutdown_timeout + KILL_GRACE
        for slot in gen.slots:
            if slot.pid:
                _kill(slot.pid, signal.SIGTERM)

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            gen, slot = self.by_pid.pop(pid, (None, None))
            if gen is None:
                if not any(side.exited(pid, self.stopping, say) for side in self.sides):
                    self.admin.exited(pid, self.stopping, say, _describe(status))
                continue
            was_ready = pid in gen.ready
            gen.ready.discard(pid)
            self.admin.worker_gone(pid, slot.figures)
            shared_limits().connections.clear(slot.figures)   # its clients' connections
            slot.last_pid = pid
            slot.pid = 0
            if gen.stopping or self.stopping:
                continue
            slot.failed_starts += not was_ready
            if not self.ever_ready and slot.failed_starts >= FIRST_START_ATTEMPTS:
                say(f"worker {pid} exited ({_describe(status)}); its slot has failed "
                    f"{slot.failed_starts} times and the server was never ready (the "
                    "reason is above); giving up")
                self.exit_code = 1
                self.stop()
                continue
            lived = time.monotonic() - slot.started
            slot.backoff = RESTART_BACKOFF_MIN if lived > STABLE_AFTER else min(
                slot.backoff * 2, gen.config.server.restart_backoff_max)
            slot.restart_at = time.monotonic() + slot.backoff
            say(f"worker {pid} exited ({_describe(status)}); restarting in {slot.backoff:.1f}s")

    def wait_for(self) -> float:
        """How long the main loop may wait for a signal or a worker's word: until the
        next restart or kill deadline falls due, and at most `REPORT_EVERY` (the admin
        API's report). Signals (a child's exit among them) and the ready pipe wake it
        sooner, so an idle server's supervisor wakes once a second, not ten times."""
        now = time.monotonic()
        due = [gen.stop_deadline for gen in self.generations
               if gen.stopping and gen.stop_deadline > now]
        if not self.stopping:
            due += [slot.restart_at for gen in self.generations if not gen.stopping
                    for slot in gen.slots if not slot.pid and slot.restart_at]
            due += [keeper.restart_at for keeper in (self.admin, *self.sides)
                    if keeper.restart_at]
        # A deadline just past is served by this turn's checks; the floor keeps a
        # check that did not clear its deadline from spinning the loop.
        return min(max(min(due, default=now + REPORT_EVERY) - now, MIN_WAIT), REPORT_EVERY)

    def restart_due(self) -> None:
        now = time.monotonic()
        for gen in self.generations:
            if gen.stopping:
                continue
            for slot in gen.slots:
                if not slot.pid and slot.restart_at and now >= slot.restart_at:
                    slot.restart_at = 0.0
                    slot.restarts += 1
                    self.fork(gen, slot)
                    say(f"worker {slot.pid} started (replacing {slot.last_pid})")

    def forget_finished(self) -> None:
        now = time.monotonic()
        for gen in list(self.generations):
            if not gen.stopping:
                continue
            alive = [s for s in gen.slots if s.pid]
            if alive and now >= gen.stop_deadline:
                for slot in alive:
                    _kill(slot.pid, signal.SIGKILL)
            if not alive:
                self.generations.remove(gen)
                for slot in gen.slots:
                    self.admin.table.release(slot.figures)
                if not self.stopping:
                    say(f"previous workers finished (generation {gen.number})")

    # ----------------------------------------------------------- signals
    def reload(self) -> None:
        notify("RELOADING=1")
        try:
            config = load(self.config_path, self.listen, self.workers)
        except ConfigError as exc:
            self._refused("\n  " + "\n  ".join(exc.problems))
            return
        except Exception as exc:  # noqa: BLE001 - whatever breaks, the running config serves on
            self._refused(f" cannot load the config: {exc!r}")
            return
        try:
            added = self.bind(config)
        except OSError as exc:
            self._refused(f" {exc}")
            return
        try:
            gen = self.start_generation(config)
            say(f"reloading: generation {gen.number} starting")
            for side in self.sides:
                side.replace(config)
        except Exception as exc:  # noqa: BLE001 - e.g. a certificate that changed since load
            self.close_sockets(added)
            self._refused(f" cannot start: {exc!r}")

    def _refused(self, reason: str) -> None:
        say("reload refused, the running config stays:" + reason)
        notify("READY=1", "STATUS=reload refused, the running config stays")
        self.admin.reload_result(False, "refused, the running config stays:" + reason)

    def stop(self) -> None:
        notify("STOPPING=1")
        self.stopping = True
        self.admin.stop()
        for side in self.sides:
            side.stop()
        for gen in self.generations:
            if not gen.stopping:
                self.stop_generation(gen)
        for sock in self.sockets.values():
            sock.close()

    def forward(self, sig: int) -> None:
        for pid in list(self.by_pid):
            _kill(pid, sig)

    # ----------------------------------------------------------- main loop
    def run(self) -> int:
        self.bind(self._first)
        self._first = self.admin.with_token(self._first)
        self.admin.bind(self._first, _bound, say)
        drop_privileges(self._first.server)
        for warning in config_warnings(self._first):
            say(f"warning: {warning}")
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1,
                    signal.SIGCHLD):
            signal.signal(sig, self._note_signal)
        self.admin.prepare()            # shared with the workers: before their fork
        self.start_generation(self._first)
        self._fork_admin()
        for side in self.sides:
            self._fork_side(side, self._first)
        while True:
            try:
                readable, _, _ = select.select([wake_r, self.ready_r], [], [],
                                               self.wait_for())
            except InterruptedError:
                readable = []
            if wake_r in readable:
                try:
                    os.read(wake_r, 4096)
                except BlockingIOError:
                    pass
            if self.ready_r in readable:
                self.on_ready()
            signals, self.pending_signals = self.pending_signals, []
            for sig in signals:
                if sig in (signal.SIGTERM, signal.SIGINT) and not self.stopping:
                    say("stopping: finishing in-flight requests")
                    self.stop()
                elif sig == signal.SIGHUP and not self.stopping:
                    self.reload()
                elif sig == signal.SIGUSR1:
                    self.forward(signal.SIGUSR1)
            self.reap()
            self.restart_due()
            if not self.stopping:
                self.admin.restart_due(self._fork_admin)
                for side in self.sides:
                    if side.restart_due():
                        self._fork_side(side, side.config)
            self.forget_finished()
            self.admin.report(self)
            if self.stopping and not self.by_pid and not self.admin.pid \
                    and not any(side.pid for side in self.sides):
                break
        for sock in self.sockets.values():
            sock.close()
        say("stopped")
        return self.exit_code

    def _fork_admin(self) -> None:
        share_before_fork()
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
        try:
            self.admin.fork(self.ready_w, self._close_in_admin)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    def _fork_side(self, side, config) -> None:
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
        try:
            side.start(config, self._close_in_side)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    def _close_in_side(self) -> None:
        """In a forked side process (certificates, CrowdSec): none of the sites'
        sockets, no admin's."""
        self._close_in_admin()
        self.admin.close_in_worker()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED)

    def _as_child(self) -> None:
        """In a forked worker or admin process: not the supervisor's pipe, and the
        default signal handling (SIGINT and SIGHUP are the supervisor's to decide)."""
        os.close(self.ready_r)
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        for sig in (signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)

    def _close_in_admin(self) -> None:
        """In the forked admin process: none of the sites' sockets."""
        self._as_child()
        for sock in self.sockets.values():
            sock.close()

    def _note_signal(self, sig, _frame) -> None:
        self.pending_signals.append(sig)


# What workers import while they build their routes, loaded before the switch of user:
# an interpreter and libraries that only root may read (a pyenv under /root) still
# serve every route type afterwards. A reload that needs a module none of these
# loads needs the interpreter readable by `user`, as any service does.
ENGINE_MODULES = ("nestgate.server.worker", "nestgate.sites.build", "nestgate.base.compress",
                  "nestgate.base.errorpages", "nestgate.handlers.static",
                  "nestgate.handlers.redirect", "nestgate.handlers.proxy.handler",
                  "nestgate.handlers.notes.pages", "nestgate.handlers.notes.api", "nestgate.handlers.auth.portal",
                  "nestgate.handlers.auth.oidc.signin_pages",
                  "nestgate.handlers.auth.store", "nestgate.handlers.auth.totp", "nestgate.admin.page",
                  "nestgate.wire.http2", "nestgate.wire.h2engine", "encodings.unicode_escape", "encodings.idna")


def drop_privileges(server) -> None:
    """Started as root with `[server] user`: once the listeners are bound (ports below
    1024 need root), become that user for good, before any state file is made or a
    worker starts. As nginx's `user`, it means nothing when not started as root."""
    if not server.user:
        return
    import grp
    import pwd
    if os.getuid() != 0:
        say(f"warning: [server] user = {server.user!r} is for a server started as root; "
            "running as the user that started it")
        return
    entry = pwd.getpwnam(server.user)
    gid = grp.getgrnam(server.group).gr_gid if server.group else entry.pw_gid
    for module in ENGINE_MODULES:
        importlib.import_module(module)
    os.setgroups([])
    os.setgid(gid)
    os.setuid(entry.pw_uid)
    say(f"running as {server.user} (uid {entry.pw_uid}, gid {gid})")


def prepare_state(config: Config) -> None:
    """One-off set-up of the state workers share, done here so that they never race
    to do it: the store file is created and migrated before any of them opens it."""
    stores = {config.auth.store} if config.auth is not None else set()
    if config.bans.enabled:
        stores.add(config.bans.store)
    if not stores:
        return              # sqlite3 and the store's module: only for a config with a store
    import sqlite3
    from nestgate.handlers.auth.store import prepare_store
    for store in sorted(stores):
        try:
            prepare_store(store)
        except (sqlite3.Error, OSError) as exc:     # OSError: its folder could not be made
            raise StateError(f"store {store}: {exc}") from None


class StateError(OSError):
    """Shared state that cannot be set up: the server cannot start (or reload)."""


class BindError(OSError):
    """A listener that cannot be bound, named where the config (or --listen) sets it."""

    def __init__(self, listener, exc: OSError) -> None:
        host = f"[{listener.host}]" if ":" in listener.host else listener.host
        reason = exc.strerror or str(exc)
        super().__init__(f"{listener.key or 'listener'}: cannot bind {host}:{listener.port} "
                         f"({reason})")


def _bound(listener, kind: int = socket.SOCK_STREAM, port: int | None = None,
           option: int = socket.SO_REUSEADDR) -> socket.socket:
    """A socket of `kind` bound to the listener's address (its port unless `port` is
    given), with `option` set; BindError naming the listener if it cannot be bound."""
    family = socket.AF_INET6 if ":" in listener.host else socket.AF_INET
    sock = socket.socket(family, kind)
    try:
        sock.setsockopt(socket.SOL_SOCKET, option, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((listener.host, listener.port if port is None else port))
    except OSError as exc:
        sock.close()
        raise BindError(listener, exc) from exc
    except BaseException:
        sock.close()
        raise
    return sock


# Each way, per HTTP/3 socket: the kernel's default (net.core.rmem_default, 208 KiB on
# Debian) holds about 150 full datagrams, and a worker busy for a few milliseconds under
# load finds it overflowed; every datagram dropped there costs QUIC a loss timer and a
# resend. A ceiling, not an allocation: the kernel takes memory only for what waits.
QUIC_SOCKET_BUFFER = 4 << 20
_BUFFER_OPTIONS = ((socket.SO_RCVBUF, getattr(socket, "SO_RCVBUFFORCE", None), "receive"),
                   (socket.SO_SNDBUF, getattr(socket, "SO_SNDBUFFORCE", None), "send"))


def _quic_socket(listener, port: int) -> socket.socket:
    """A UDP socket for the listener's HTTP/3, on the port its TCP socket has, shared
    by the workers (SO_REUSEPORT), with room for `QUIC_SOCKET_BUFFER` each way."""
    sock = _bound(listener, socket.SOCK_DGRAM, port, socket.SO_REUSEPORT)
    sock.setblocking(False)
    for way in widen_buffers(sock, QUIC_SOCKET_BUFFER):
        say(way)
    return sock


def widen_buffers(sock: socket.socket, size: int) -> list[str]:
    """Ask for `size` bytes of receive and send buffer on `sock`, as quic-go and nginx's
    QUIC do. The kernel caps SO_RCVBUF/SO_SNDBUF at net.core.rmem_max/wmem_max; a
    process with CAP_NET_ADMIN (root) may go past that with the FORCE options. Returns
    a line for each way left short of `size`, naming the sysctl that would allow it."""
    short = []
    for option, force, way in _BUFFER_OPTIONS:
        sock.setsockopt(socket.SOL_SOCKET, option, size)
        # Linux reports twice what was set (its bookkeeping overhead included).
        if sock.getsockopt(socket.SOL_SOCKET, option) < 2 * size and force is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, force, size)
            except OSError:
                pass                         # no CAP_NET_ADMIN: keep what the cap gave
        got = sock.getsockopt(socket.SOL_SOCKET, option) // 2
        if got < size:
            limit = "net.core.rmem_max" if way == "receive" else "net.core.wmem_max"
            short.append(f"HTTP/3 on {_address(sock)}: UDP {way} buffer {got // 1024} KiB "
                         f"of the {size // 1024} KiB asked (raise {limit} to allow it)")
    return short


def _listen(listener) -> socket.socket:
    sock = _bound(listener)
    try:
        sock.listen(1024)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    say(f"listening on {listener.scheme}://{_address(sock)}")
    return sock


def unavailable_addresses(config: Config) -> list[str]:
    """For `check`: each listener whose address cannot be bound right now, with the
    program holding it when it can be told (a port below 1024 without the right to it
    says so). An address held by a running nestgate serving this same config file is
    not a problem: its reload keeps its own sockets. Port 0 always binds."""
    from nestgate.server.portholder import holder_of
    checked = os.path.realpath(config.source)
    problems = []
    for listener in config.listeners:
        if listener.port == 0:
            continue
        try:
            _bound(listener).close()
        except BindError as exc:
            cause = exc.__cause__
            holder = None
            if isinstance(cause, OSError) and cause.errno == errno.EADDRINUSE:
                try:
                    holder = holder_of(listener.host, listener.port)
                except ValueError:           # not an address psutil could compare
                    holder = None
            if holder is not None and holder.config == checked:
                continue
            problems.append(f"{exc}, {holder.describe()}" if holder is not None else str(exc))
    return problems


def _address(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError as exc:
        if exc.errno != errno.ESRCH:
            raise


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit code {os.WEXITSTATUS(status)}"
