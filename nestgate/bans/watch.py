"""A worker's side of bans: counting what clients do, banning them, keeping the shared
table in step with the store, and refusing banned clients where they arrive.

Theory of operation
-------------------
`BANS` is the process's `BanWatch`, configured by the worker from its config. Events
come from the few places where a client did something a rule may count, all of them
off the path of a good request: a failed or refused sign-in (the portal), a request
refused as malformed (the protocol adapters' 400), a rate-limit refusal (429), and an
answer whose status a rule watches (`answered`: a handler's answer, from
`dispatch.record`, and the built-in 404 of an unmatched path, through `NotedNotFound`,
which the site's guard (nestgate.sites.guard) hands the route table to put in front
of that 404 only when some rule counts 404s).

Each rule counts per client network (the address, an IPv6 client's /64) in the rate
table every worker shares (nestgate.pipeline.ratelimit.RateTable), as a leaky bucket: `count`
events in a burst, draining at `count` per `window`. The event that overflows it bans
the network: at once in the shared table (`nestgate.bans.table`), for the rule's first
duration, so every worker refuses it from its next accept; then in the store, which
answers with the duration its strikes call for (a repeat offender's longer ban), and
the table entry is brought up to that.

Every SYNC_INTERVAL the worker asks the store for its bans' version; when it changed
(a ban from another instance, `nestgate ban add` or `remove`, the admin API), it loads
the bans in force into the table and lifts those it loaded before that are gone.

A banned client is looked up once per connection, where its address becomes known
(accept, a PROXY header, or per request for clients named by a trusted proxy in
X-Forwarded-For): `refuses` closes it (before TLS on a TLS listener; an HTTP/3
client's QUIC connection is closed with CONNECTION_REFUSED at its first datagram), or with
`ban_answer = "403"` gives the connection a router whose every route is the page
saying until when. A client that is not banned pays one shared-memory read per
connection while the table is empty, and one lookup (a probe per prefix length in
use) while it is not; nothing per request.

CrowdSec's decisions are in the same table (the bouncer process writes them,
nestgate.bans.crowdsec) and are refused here the same way: with `[crowdsec]` the table is
looked up even when there are no [[ban]] rules, and without a [bans] table or rules
there is no store to keep in step.
"""

from __future__ import annotations

import sys
import time
from datetime import datetime, timezone

from nestgate.bans.store import said_unreadable
from nestgate.bans.table import ban_table, client_network
from nestgate.base.clientip import Networks, parse_networks
from nestgate.base.errorpages import DEFAULT_PAGES, HTML, error_html
from nestgate.base.handler import GATED, Periodic, Service
from nestgate.base.responses import Prebuilt
from nestgate.base.route import NO_PARAMS, Route
from nestgate.base.tally import TALLY

SYNC_INTERVAL = 0.5          # seconds: a ban made elsewhere is in force here within 1 s
PURGE_INTERVAL = 600.0
LOOPBACK = Networks(["127.0.0.0/8", "::1/128"])


class CountedRule:
    """A `BanRule` ready to count: its exemptions parsed, its path patterns compiled,
    its leaky bucket's figures."""

    __slots__ = ("rule", "exempt", "paths", "interval", "tolerance", "identity")

    def __init__(self, rule, trusted_proxies=()) -> None:
        self.rule = rule
        exempt = parse_networks(rule.exempt)
        if not rule.ban_loopback:
            for entry in LOOPBACK.entries:
                exempt.add(entry)
        # A trusted proxy carries every client behind it: an event counted under its own
        # address (a request refused before X-Forwarded-For was read, or one whose
        # X-Forwarded-For names nobody) is one client's, and banning the proxy would
        # close the connections of all of them.
        for entry in trusted_proxies:
            exempt.add(entry)
        self.exempt = exempt
        self.paths = rule.path_matcher()
        self.interval = rule.window / rule.count
        # The count-th event within the window overflows: count - 1 pass in a burst.
        self.tolerance = (rule.count - 2) * self.interval
        self.identity = f"ban:{rule.name}|"

    def counts(self, site: str, label: str, path: str, status: int) -> bool:
        rule = self.rule
        if rule.site and rule.site != site:
            return False
        if rule.on == "scanner":
            return status == 404 and self.paths.fullmatch(path) is not None
        if rule.route and rule.route != label:
            return False
        return status in rule.status


class BanWatch(Service):
    """This process's counting, banning and store sync (see the module docstring)."""

    tick_every = SYNC_INTERVAL

    def __init__(self) -> None:
        self.enabled = False            # clients are looked up in the table
        self.keeps = False              # rules or [bans]: the store is kept in step
        self.table = None
        self.kinds: dict[str, list[CountedRule]] = {}
        self.statuses: frozenset[int] = frozenset()   # answers `answered` is told of
        self.unmatched_404 = False      # some rule counts the 404 of unmatched paths
        self.locator = ""
        self.rates = None               # the shared RateTable, given by configure
        self.pages: dict[tuple, object] = {}
        self._bans = None               # the store's bans (nestgate.bans.store)
        self._executor = None
        self._syncer = None
        self._version = -1
        self._loaded: set[str] = set()  # networks of the store's bans loaded last
        self._purged = 0.0
        self._down = False
        self._swept = -1                # the table's version `sweep` last looked at

    def configure(self, config, rates) -> None:
        """Take `config`'s rules (the worker does this before building its routes), and
        the rate table every worker shares (nestgate.pipeline.ratelimit's), where rules count."""
        self.rates = rates
        bans = config.bans
        self.keeps = bans.enabled
        self.enabled = bans.enabled or config.crowdsec is not None
        self.locator = bans.store
        self.kinds = {}
        statuses = set()
        for rule in bans.rules:
            self.kinds.setdefault(rule.on, []).append(CountedRule(rule, config.trusted_proxies))
            statuses.update(rule.status)
            if rule.on == "scanner":
                statuses.add(404)
        self.statuses = frozenset(statuses)
        self.unmatched_404 = 404 in statuses
        self.table = ban_table() if self.enabled else None

    # ------------------------------------------------------------ events
    def note(self, kind: str, client: str, conn=None) -> None:
        """`client` did something rules of `kind` count (signin, malformed, ratelimit),
        on `conn` when the caller has it (a ban then ends that connection too)."""
        for counted in self.kinds.get(kind, ()):
            self._count(counted, client, conn)

    def answered(self, client: str, site: str, label: str, path: str, status: int,
                 conn=None) -> None:
        """`client` was answered `status` (one of `statuses`) on `site`'s route `label`."""
        for kind in ("scanner", "status"):
            for counted in self.kinds.get(kind, ()):
                if counted.counts(site, label, path, status):
                    self._count(counted, client, conn)

    def watching(self, site: str, label: str, handler):
        """`handler` as the route `label` of `site` is given it: behind `NotedAnswers`
        when a status rule watches that route (or all of the site's)."""
        for counted in self.kinds.get("status", ()):
            rule = counted.rule
            if rule.site in ("", site) and rule.route in ("", label):
                return NotedAnswers(handler, site, label)
        return handler

    def _count(self, counted: CountedRule, client: str, conn) -> None:
        if not client or client in counted.exempt:
            return
        rule = counted.rule
        network = client_network(client, rule.ipv4_prefix, rule.ipv6_prefix)
        if not network:
            return
        if rule.count > 1:
            rates = self.rates
            tag, at = rates.place(hash(counted.identity + network))
            if not rates.take(tag, at, time.monotonic(), counted.interval, counted.tolerance):
                return
        self.ban(rule, network, client, conn)

    def ban(self, rule, network: str, client: str, conn=None) -> None:
        """Ban `network` under `rule`: now in the shared table, then in the store. The
        client's connection the event came on (not a trusted proxy's, which carries
        others) answers its later requests with the page, and with `ban_answer =
        "close"` ends after the answer under way."""
        table = self.table
        if table.lookup(client) is not None:
            return                          # banned already (by another worker, just now)
        table.add(network, time.time() + rule.ban_for[0], "rule", rule.name, rule.ban_answer)
        TALLY.banned(rule.name)
        if conn is not None and conn.client == conn.peer == client:
            conn.serve_only(self.banned_router(table.lookup(client), client))
            if rule.ban_answer == "close":
                conn.finish_and_close()
        print(f"nestgate: banned {network} ({rule.name}: {rule.count} x {rule.on} "
              f"within {rule.window:g}s)", file=sys.stderr, flush=True)
        if self._executor is not None:
            import asyncio
            loop = asyncio.get_running_loop()
            future = loop.run_in_executor(self._executor, self._store_ban, rule, network)
            future.add_done_callback(lambda done: self._stored(done, rule, network))

    def _store_ban(self, rule, network: str) -> tuple[float, int]:
        return self._store().ban(network, rule.ban_for, rule.remember, "rule", rule.name,
                                 rule.name, rule.ban_answer)

    def _stored(self, done, rule, network: str) -> None:
        exc = done.exception()
        if exc is not None:
            self._complain(exc)
            return
        until, strikes = done.result()
        self._loaded.add(network)
        self.table.add(network, until, "rule", rule.name, rule.ban_answer)
        if strikes > 1:
            print(f"nestgate: {network} banned for the {_ordinal(strikes)} time "
                  f"({rule.name}): until {utc(until)}", file=sys.stderr, flush=True)

    # ------------------------------------------------------------ refusing
    def refuses(self, conn) -> bool:
        """At accept (or once a PROXY header named the client): True when `conn`'s
        client is banned with the connection closed; with `ban_answer = "403"`, the
        connection is given the page's router instead and False is returned."""
        if self.turns_away(conn):
            conn.transport.close()
            return True
        return False

    def turns_away(self, conn) -> bool:
        """`refuses` but for the closing, which the caller does (a QUIC connection has
        no transport of its own to close: nestgate.wire.http3 closes it by QUIC's means)."""
        table = self.table
        if not len(table):
            return False
        ban = table.lookup(conn.client)
        if ban is None:
            return False
        if ban.answer == "403":
            conn.serve_only(self.banned_router(ban, conn.client))
            return False
        TALLY.ban_refusal(ban.origin)
        return True

    def sweep(self, connections) -> None:
        """The worker's tick: once the table changed (a ban by another worker or
        instance, the operator, CrowdSec), the connections already open to a client
        banned since are treated as a new one would be: given the page, and with
        `ban_answer = "close"` ended once the answers under way are out (at once when
        idle). Without this a client kept its keep-alive, HTTP/2 and
        HTTP/3 connections, and everything it sent on them, for as long as it kept them
        busy. A trusted proxy's connection is judged per request (`forwarded`); one
        still in its TLS handshake when its protocol takes over. One read of shared
        memory per tick while nothing changes."""
        table = self.table
        version = table.version
        if version == self._swept:
            return
        self._swept = version
        if not len(table):
            return
        for conn in list(connections):
            if not hasattr(conn, "serve_only") or conn.xff_trusted or not conn.client:
                continue                    # a handshake, a proxy's, or a QUIC one unheard
            ban = table.lookup(conn.client)
            if ban is None:
                continue
            conn.serve_only(self.banned_router(ban, conn.client))
            if ban.answer == "close":
                conn.end_banned()

    def closes(self, client: str) -> bool:
        """Before a TLS handshake: True (counted) when `client` is banned and is to be
        closed; a ban answered with the page lets the handshake go on."""
        table = self.table
        if not len(table):
            return False
        ban = table.lookup(client)
        if ban is None or ban.answer == "403":
            return False
        TALLY.ban_refusal(ban.origin)
        return True

    def forwarded(self, client: str):
        """For a client a trusted proxy named: the page's router when it is banned
        (the proxy's connection carries others: it is never closed for one), else None."""
        table = self.table
        if not len(table):
            return None
        ban = table.lookup(client)
        return None if ban is None else self.banned_router(ban, client)

    def banned_router(self, ban, client: str):
        key = (ban.network, round(ban.until), client)
        found = self.pages.get(key)
        if found is None:
            if len(self.pages) > 256:
                self.pages.clear()
            found = self.pages[key] = BannedRouter(ban, client)
        TALLY.ban_refusal(ban.origin)
        return found

    # ------------------------------------------------------------ the store
    def start(self) -> None:
        """Load the store's bans before the first request, then poll for changes."""
        if not self.keeps or self._syncer is not None:
            return
        from concurrent.futures import ThreadPoolExecutor
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="nestgate-bans")
        try:
            self._load(self._store().version(), self._store().live())
        except Exception as exc:  # noqa: BLE001 - the store down: the poller retries
            self._complain(exc)
        self._syncer = Periodic(SYNC_INTERVAL, self._sync)

    def stop(self) -> None:
        if self._syncer is not None:
            self._syncer.stop()
            self._syncer = None
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None

    def tick(self, now: float) -> None:
        if self._syncer is not None:
            self._syncer.tick(now)

    def _store(self):
        if self._bans is None:
            from nestgate.bans.store import open_bans
            self._bans = open_bans(self.locator)
        return self._bans

    async def _sync(self) -> None:
        import asyncio
        loop = asyncio.get_running_loop()
        try:
            changed = await loop.run_in_executor(self._executor, self._changes)
        except Exception as exc:  # noqa: BLE001 - any store failure: the table stays
            self._complain(exc)
            return
        if self._down:
            self._down = False
            print("nestgate: bans: the store answers again", file=sys.stderr, flush=True)
        if changed is not None:
            self._load(*changed)

    def _changes(self):
        """(version, bans in force) when the store's bans changed; else None."""
        store = self._store()
        if time.monotonic() - self._purged > PURGE_INTERVAL:
            self._purged = time.monotonic()
            store.purge()
        version = store.version()
        if version == self._version:
            return None
        return version, store.live()

    def _load(self, version: int, rows) -> None:
        table = self.table
        now, unreadable = set(), []
        for row in rows:
            try:
                table.add(row.network, row.until, row.origin, row.reason, row.answer)
            except ValueError:               # not a network, origin or answer: a hand edit
                unreadable.append(row.network)
                continue
            now.add(row.network)
        if unreadable:
            said_unreadable(unreadable)
        for network in self._loaded - now:
            table.remove(network)            # lifted through the store
        self._loaded = now
        self._version = version

    def _complain(self, exc: Exception) -> None:
        if not self._down:
            self._down = True
            print(f"nestgate: bans: the store cannot be used ({exc}); bans are kept in "
                  "memory until it answers", file=sys.stderr, flush=True)


class NotedAnswers:
    """A route some `on = "status"` rule watches: a ready answer it gives (the route's
    own, or its guard's refusal) is told to `BANS`; a handler's answer is told by
    `dispatch.record`. Only watched routes have one, so others pay nothing."""

    is_async = GATED
    __slots__ = ("inner", "site", "label", "upgrades")

    def __init__(self, inner, site: str, label: str) -> None:
        self.inner = inner
        self.site = site
        self.label = label
        self.upgrades = getattr(inner, "upgrades", False)

    def admit(self, conn, headers):
        handler = self.inner
        while handler.is_async is GATED:
            handler = handler.admit(conn, headers)
        if not handler.is_async and handler.status in BANS.statuses:
            BANS.answered(conn.client, self.site, self.label, "", handler.status, conn)
        return handler


class NotedNotFound:
    """The built-in 404 of an unmatched path, told to `BANS` when a client is given it
    (put in front of a site's 404 by the route table when some rule counts 404s)."""

    is_async = GATED
    __slots__ = ("inner", "site", "path")

    def __init__(self, inner, site: str, path: str) -> None:
        self.inner = inner
        self.site = site
        self.path = path

    def admit(self, conn, headers):
        BANS.answered(conn.client, self.site, "", self.path, 404, conn)
        return self.inner


class BannedRouter:
    """What a connection of a client banned with `ban_answer = "403"` is routed by:
    every Host and path is the page saying until when (HTTP/1.1's and HTTP/2's lookups,
    `site_for` and `route`, are both answered; HTTP/1.1's memos, `exact_raw` and
    `found`, are empty)."""

    __slots__ = ("exact_raw", "found", "the_route")

    def __init__(self, ban, client: str) -> None:
        detail = (f"This address is banned until {utc(ban.until)} UTC "
                  f"({ban.reason or ban.origin}). Requests from it are refused until then.")
        page = Prebuilt(403, error_html(403, detail, client), HTML,
                        [("cache-control", "no-store")])
        self.exact_raw: dict = {}
        self.found: dict = {}
        self.the_route = Route(page, NO_PARAMS, "banned", "", DEFAULT_PAGES,
                               TALLY.route("-", "banned"))

    def site_for(self, host: bytes):
        return self

    def route(self, *raw) -> object:
        return self.the_route


def utc(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _ordinal(n: int) -> str:
    return f"{n}{'tsnrhtdd'[(n // 10 % 10 != 1) * (n % 10 < 4) * n % 10::4]}"


BANS = BanWatch()
