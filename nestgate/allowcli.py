"""`nestgate allow add | list | remove`: the dynamic allow-list from the command line.

Edits the entries in the config's `[auth] store`, the file every worker polls, so a
change is in force everywhere within a second, without a reload. This module owns
the arguments and the printing only: addresses are checked by `clientip.Networks`
and durations by `units.parse_duration`, as the config's are, before the store is
opened; `auth.store.Store` does the rest.
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import datetime, timezone

from nestgate.admin.stateapi import every_address_refused
from nestgate.handlers.auth.store import DEFAULT_TTL
from nestgate.base.clientip import Networks, covers_every_address
from nestgate.base.units import parse_duration



def _network(text: str) -> str:
    try:
        Networks([text])
    except ValueError as exc:                  # "not an IP address or CIDR: '...'"
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text.strip()


def _ttl(text: str) -> float:
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected {exc}, got {text!r}") from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"expected a duration above zero, got {text!r}")
    return seconds


def _utc(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# ------------------------------------------------------------------ commands


def _add(store, args) -> int:
    print(store.add_allow(args.cidr, args.ttl, args.comment))
    return 0


def _refused_everyone(args) -> str:
    """Why `add` refuses its entry ("" when it does not): one that holds every address,
    unless --allow-everyone says it is meant (as the admin API's `allow_everyone` does)."""
    if args.run is _add and covers_every_address(args.cidr) and not args.allow_everyone:
        return every_address_refused(args.cidr, "pass --allow-everyone")
    return ""


def _list(store, args) -> int:
    print_table([("ID", "CIDR", "EXPIRES (UTC)", "COMMENT")] +
                [(str(i), cidr, _utc(expires), comment)
                 for i, cidr, expires, comment in store.allow_entries()])
    return 0


def print_table(rows: list[tuple[str, ...]]) -> None:
    """Columns padded to their widest cell; the last one (free text) as it is."""
    widths = [max(len(row[col]) for row in rows) for col in range(len(rows[0]) - 1)]
    for *cells, last in rows:
        print("  ".join([*(c.ljust(w) for c, w in zip(cells, widths)), last]).rstrip())


def _remove(store, args) -> int:
    if not store.remove_allow(args.id):
        print(f"nestgate allow: no entry with id {args.id}", file=sys.stderr)
        return 1
    return 0


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", metavar="FILE",
                        help="the config whose [auth] store to edit (default: ./nestgate.toml)")
    parser = argparse.ArgumentParser(
        prog="nestgate allow",
        description="Add, list and remove dynamic allow entries: addresses let through "
                    "every access list with allow_dynamic (and past sign-in) until they expire.")
    commands = parser.add_subparsers(dest="command", required=True)
    add = commands.add_parser("add", parents=[common], help="allow an address or CIDR; "
                              "prints the new entry's id")
    add.add_argument("cidr", metavar="CIDR", type=_network,
                     help="an IP address or CIDR, e.g. 203.0.113.7 or 2001:db8::/48")
    add.add_argument("--for", dest="ttl", metavar="DURATION", type=_ttl, default=DEFAULT_TTL,
                     help=f"how long it lasts: 90s, 30m, 2h, 7d (default {DEFAULT_TTL})")
    add.add_argument("--comment", default="", help="a note shown by `list`")
    add.add_argument("--allow-everyone", action="store_true",
                     help="take an entry that holds every address (0.0.0.0/0, ::/0), "
                          "which lets anyone in; refused without it")
    add.set_defaults(run=_add)
    commands.add_parser("list", parents=[common], help="the entries not yet expired"
                        ).set_defaults(run=_list)
    remove = commands.add_parser("remove", parents=[common], help="remove an entry by id")
    remove.add_argument("id", metavar="ID", type=int, help="as printed by `add` and `list`")
    remove.set_defaults(run=_remove)
    return parser


# --------------------------------------------------------------------- entry


def store_path(config) -> str:
    """The store file the workers of `config` poll; ConfigError when there is none."""
    from nestgate.config import ConfigError
    if config.auth is None:
        raise ConfigError([f"{config.source}: auth: expected an [auth] table; its store "
                           "file holds the dynamic allow-list"])
    if config.auth.store == ":memory:":
        raise ConfigError([f"{config.source}: auth.store: expected a file the workers share, "
                           "got ':memory:'"])
    return config.auth.store


def allow_main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    refused = _refused_everyone(args)
    if refused:
        print(f"nestgate allow: {refused}", file=sys.stderr)
        return 2
    return store_command("allow", args, store_path)


def store_command(name: str, args, path_of, opener=None) -> int:
    """Run `args.run(store, args)` on the store `path_of(config)` names for the config
    `args.config` (or ./nestgate.toml), opened with `opener` (default `open_store`):
    what `nestgate allow` and `nestgate ban` share."""
    from nestgate.handlers.auth.redisstore import shown
    from nestgate.handlers.auth.store import open_store, prepare_store, store_errors
    from nestgate.config import (DEFAULT_CONFIG_NAME, ConfigError, read_config,
                                 report_config_problems)
    if args.config is None and not os.path.exists(DEFAULT_CONFIG_NAME):
        # The embedded default has no store: naming its file would send the reader there.
        print(f"nestgate {name}: no ./{DEFAULT_CONFIG_NAME} in {os.getcwd()}; pass "
              "--config FILE, the config whose store the server uses", file=sys.stderr)
        return 2
    try:
        path = path_of(read_config(args.config))
    except ConfigError as exc:
        return report_config_problems(exc)
    try:
        prepare_store(path)
        store = (opener or open_store)(path)
        try:
            return args.run(store, args)
        finally:
            store.close()
    except (*store_errors(), OSError) as exc:
        print(f"nestgate {name}: store {shown(path)}: {exc}", file=sys.stderr)
        return 1
