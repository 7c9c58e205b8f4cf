"""`[[ban]]` rules and the `[bans]` table: what a client does to be banned, and for
how long. Read into frozen `BanRule`s with every problem named by file and key.

    [[ban]]
    name = "scanners"
    on = "scanner"              # signin | scanner | malformed | ratelimit | status
    paths = ["/wp-login.php", "/.env", "*.php"]   # scanner: 404s on these paths
    count = 10                  # this many events ...
    window = "10m"              # ... within this long
    ban_for = ["10m", "1h", "1d"]   # the 1st ban, the 2nd, the 3rd and later
    remember = "7d"             # past bans count toward the next for this long
    exempt = ["192.0.2.0/24"]
    ban_loopback = false        # loopback is never banned unless this is true
    ban_answer = "close"        # or "403": the page saying until when
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

from nestgate.base.clientip import parse_networks

KINDS = ("signin", "scanner", "malformed", "ratelimit", "status")
DEFAULT_BAN_FOR = (600.0, 3600.0, 86400.0)
DEFAULT_STORE = "nestgate-state.db"


@dataclass(frozen=True)
class BanRule:
    name: str
    on: str                                 # one of KINDS
    count: int = 5
    window: float = 600.0
    ban_for: tuple[float, ...] = DEFAULT_BAN_FOR
    remember: float = 7 * 86400.0
    paths: tuple[str, ...] = ()             # scanner: glob patterns of request paths
    status: tuple[int, ...] = ()            # status: the answers that count
    site: str = ""                          # status, scanner: only this site ("": all)
    route: str = ""                         # status: only this route's label ("": all)
    exempt: tuple[str, ...] = ()
    ban_loopback: bool = False
    ban_answer: str = "close"
    ipv4_prefix: int = 32
    ipv6_prefix: int = 64

    def path_matcher(self):
        """One compiled regex for `paths` (fnmatch patterns; `*` also crosses `/`)."""
        return re.compile("|".join(fnmatch.translate(p) for p in self.paths)) \
            if self.paths else None


@dataclass(frozen=True)
class BansConfig:
    rules: tuple[BanRule, ...] = ()
    enabled: bool = False                   # rules, or a [bans] table: the table is kept
    store: str = ""                         # where bans are kept (SQLite file or Redis)


def read_bans(top, auth, state) -> BansConfig:
    """`[[ban]]` rules and `[bans]` from the top-level section `top` (config._Section)."""
    present = "bans" in top.data
    table = top.table("bans")
    store_name = table.path("store", "")
    table.check_unknown()
    rules, names = [], set()
    for i, section in enumerate(top.tables("ban")):
        rule = _read_rule(section, i)
        if rule.name in names:
            section.fail("name", "a name no other [[ban]] rule has", rule.name)
        names.add(rule.name)
        rules.append(rule)
    if not rules and not present:
        return BansConfig()
    return BansConfig(tuple(rules), True, _store(table, store_name, auth, state))


def _store(table, name: str, auth, state) -> str:
    """The bans' store: Redis under `[state] backend = "redis"`; else the [auth] store
    file (one file for all the state), else `[bans] store`, else the default file."""
    if state.backend == "redis":
        from nestgate.handlers.auth.redisstore import redis_locator
        return redis_locator(state.url, state.prefix)
    if auth is not None and not name:
        return auth.store
    import os
    name = name or DEFAULT_STORE
    if name == ":memory:":
        table.fail("store", "a file the workers share", name)
        return name
    from nestgate.base.configpath import resolved
    return str(resolved(table.state_base, os.path.expanduser(name)))


def _read_rule(s, index: int) -> BanRule:
    d = BanRule("", "")
    on = s.data.get("on")
    s.seen.add("on")
    if on not in KINDS:
        s.fail("on", "one of " + ", ".join(repr(k) for k in KINDS), on)
        on = "status"
    name = s.str("name", f"{on}-{index + 1}")
    count = s.int("count", d.count, 1, 1_000_000)
    window = s.get("window", d.window, _positive_duration, "a duration above 0")
    ban_for = s.get("ban_for", d.ban_for, _durations, "")
    remember = s.duration("remember", d.remember)
    paths = s.strings("paths")
    status = s.get("status", (), _statuses, "")
    site, route = s.str("site"), s.str("route")
    exempt = s.get("exempt", (), _cidrs, "")
    ban_loopback = s.bool("ban_loopback", d.ban_loopback)
    ban_answer = s.choice("ban_answer", d.ban_answer, ("close", "403"))
    ipv4_prefix = s.int("ipv4_prefix", d.ipv4_prefix, 8, 32)
    ipv6_prefix = s.int("ipv6_prefix", d.ipv6_prefix, 16, 128)
    if on == "scanner" and not paths:
        s.fail("paths", "at least one path pattern such as \"/wp-login.php\" or \"*.php\" "
               "(on = \"scanner\" counts 404s on these paths)")
    if on != "scanner" and paths:
        s.fail("paths", "no paths unless on = \"scanner\"", list(paths))
    if on == "status" and not status:
        s.fail("status", "a list of statuses such as [401, 403] (on = \"status\" counts "
               "those answers)")
    if on != "status" and status:
        s.fail("status", "no status unless on = \"status\"", list(status))
    if route and not site:
        s.fail("route", "a route only together with the site it belongs to", route)
    if route and on != "status":
        s.fail("route", "a route only with on = \"status\"", route)
    s.check_unknown()
    return BanRule(name, on, count, window, ban_for, remember, paths, status, site, route,
                   exempt, ban_loopback, ban_answer, ipv4_prefix, ipv6_prefix)


def check_sites(bans: BansConfig, sites, file: str) -> list[str]:
    """Problems with rules that name a site or route the config does not have."""
    problems = []
    known = {site.name: site for site in sites}
    for i, rule in enumerate(bans.rules):
        if not rule.site:
            continue
        site = known.get(rule.site)
        if site is None:
            problems.append(f"{file}: ban[{i}].site: expected the name of a [[site]], "
                            f"got {rule.site!r}")
        elif rule.route and rule.route not in {r.label for r in site.routes}:
            labels = ", ".join(repr(r.label) for r in site.routes) or "none"
            problems.append(f"{file}: ban[{i}].route: expected the path (or prefix*) of a "
                            f"route of site {rule.site!r} ({labels}), got {rule.route!r}")
    return problems


def _positive_duration(value) -> float:
    from nestgate.base.units import parse_duration
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError("a duration above 0")
    return seconds


def _durations(value) -> tuple[float, ...]:
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or not value:
        raise ValueError("a duration or a list of them, such as [\"10m\", \"1h\", \"1d\"]")
    return tuple(_positive_duration(v) for v in value)


def _statuses(value) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) and 100 <= v <= 599 for v in value):
        raise ValueError("a list of HTTP statuses (100..599), such as [401, 403]")
    return tuple(value)


def _cidrs(value) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise ValueError("a list of IP addresses or CIDRs")
    parse_networks(value)
    return tuple(value)
