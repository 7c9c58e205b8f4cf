"""`nestgate ban list | add | remove`: bans from the command line.

Edits the bans in the config's store (the `[auth] store` file, `[bans] store`, or
Redis under `[state] backend = "redis"`), which every worker polls: a ban added or
lifted here is in force everywhere within a second, without a reload. `list` also
shows CrowdSec's decisions in force, from the file the bouncer keeps them in
(nestgate.bans.decisions): they are lifted in CrowdSec (`cscli decisions delete`), not here.
This module owns the arguments and the printing; `nestgate.bans.store` does the rest.
"""

from __future__ import annotations

import argparse
import sys

from nestgate.allowcli import _ttl, _utc, print_table, store_command
from nestgate.bans.table import ANSWERS

DEFAULT_FOR = "1d"


def _network(text: str) -> str:
    from nestgate.bans.store import canonical
    try:
        return canonical(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add(bans, args) -> int:
    until, _strikes = bans.ban(args.network, (args.ttl,), 0.0, "operator", "", args.reason,
                               args.answer, replace=True)
    print(f"{args.network} banned until {_utc(until)}")
    return 0


def _list(bans, args) -> int:
    import time
    from nestgate.bans.decisions import read_snapshot
    decided = read_snapshot(args.decisions) if args.decisions else None
    now = time.time()
    print_table([("NETWORK", "UNTIL (UTC)", "ORIGIN", "RULE", "STRIKES", "ANSWER", "REASON")] +
                [(row.network, _utc(row.until), row.origin, row.rule or "-",
                  str(row.strikes), row.answer, row.reason) for row in bans.live()] +
                [(network, _utc(until), "crowdsec", "-", "-", args.crowdsec_answer,
                  scenario or "-")
                 for network, (until, scenario) in sorted((decided or {}).items(),
                                                          key=lambda item: -item[1][0])
                 if until > now])
    return 0


def _remove(bans, args) -> int:
    from nestgate.bans.store import lift
    lifted = lift(bans, args.network)
    if lifted is None:
        print(f"nestgate ban: no ban in force on {args.network}", file=sys.stderr)
        return 1
    print(f"{lifted} lifted")
    return 0


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", metavar="FILE",
                        help="the config whose store to edit (default: ./nestgate.toml)")
    parser = argparse.ArgumentParser(
        prog="nestgate ban",
        description="List, add and lift bans: clients refused at accept by every worker "
                    "(and every instance sharing the store) until the ban ends.")
    commands = parser.add_subparsers(dest="command", required=True)
    add = commands.add_parser("add", parents=[common], help="ban an address or CIDR")
    add.add_argument("network", metavar="CIDR", type=_network,
                     help="an IP address or CIDR, e.g. 203.0.113.7 or 2001:db8::/48")
    add.add_argument("--for", dest="ttl", metavar="DURATION", type=_ttl, default=DEFAULT_FOR,
                     help=f"how long: 90s, 30m, 2h, 7d (default {DEFAULT_FOR})")
    add.add_argument("--reason", default="operator", help="shown by `list` and the API")
    add.add_argument("--answer", choices=ANSWERS, default="close",
                     help="close the connection (default) or answer the 403 page")
    add.set_defaults(run=_add)
    commands.add_parser("list", parents=[common], help="the bans in force"
                        ).set_defaults(run=_list)
    remove = commands.add_parser("remove", parents=[common],
                                 help="lift the ban on an address (or covering it) or CIDR")
    remove.add_argument("network", metavar="ADDRESS", help="as `list` shows it, or an "
                        "address the ban covers")
    remove.set_defaults(run=_remove)
    return parser


def store_of(config, listing: bool = False) -> str:
    """The store the workers of `config` keep bans in; ConfigError when they keep none
    (":memory:", an empty one, for `list` where there are CrowdSec's to show)."""
    from nestgate.config import ConfigError
    if not config.bans.enabled and listing and config.crowdsec is not None:
        return ":memory:"
    if not config.bans.enabled:
        raise ConfigError([f"{config.source}: ban: expected [[ban]] rules or a [bans] "
                           "table; without them the server keeps no bans"])
    return config.bans.store


def ban_main(argv: list[str]) -> int:
    from nestgate.bans.store import open_bans
    args = _parser().parse_args(argv)

    def path_of(config) -> str:
        crowdsec = config.crowdsec
        args.decisions = crowdsec.snapshot if crowdsec is not None else ""
        args.crowdsec_answer = crowdsec.ban_answer if crowdsec is not None else ""
        return store_of(config, args.command == "list")
    return store_command("ban", args, path_of, open_bans)
