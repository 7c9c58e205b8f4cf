"""The command line: nestgate serve | check | allow | ban | passwd | cert | trust | ctl | bench."""

from __future__ import annotations

import argparse
import sys

from nestgate import __version__


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE",
                        help="config file (default: ./nestgate.toml, else the embedded default)")
    parser.add_argument("--listen", metavar="HOST:PORT", action="append",
                        help="replace the configured plain listeners (repeatable)")
    parser.add_argument("--workers", metavar="N", type=int, help="number of worker processes")


def _warned(count: int) -> str:
    return "" if not count else f", {count} warning{'s' * (count > 1)} above"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:
        from nestgate.bench.cli import main as bench_main
        return bench_main(argv[1:])
    if argv[:1] == ["passwd"]:
        from nestgate.handlers.auth.passwords import passwd_main
        return passwd_main(argv[1:])
    if argv[:1] == ["allow"]:
        from nestgate.allowcli import allow_main
        return allow_main(argv[1:])
    if argv[:1] == ["ban"]:
        from nestgate.bans.cli import ban_main
        return ban_main(argv[1:])
    if argv[:1] == ["cert"]:
        from nestgate.certs.cli import cert_main
        return cert_main(argv[1:])
    if argv[:1] == ["trust"]:
        from nestgate.certs.cli import trust_main
        return trust_main(argv[1:])
    if argv[:1] == ["ctl"]:
        from nestgate.admin.ctl import ctl_main
        return ctl_main(argv[1:])

    parser = argparse.ArgumentParser(prog="nestgate", description="The front door of a "
                                     "self-hosted server.")
    parser.add_argument("--version", action="version", version=f"nestgate {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    _add_config_flags(commands.add_parser("serve", help="run the server"))
    _add_config_flags(commands.add_parser("check", help="validate the config and exit"))
    commands.add_parser("bench", help="benchmark against nginx (see `nestgate bench -h`)")
    commands.add_parser("passwd", help="print an argon2 hash for [[auth.user]] "
                        "(see `nestgate passwd -h`)")
    commands.add_parser("allow", help="add, list or remove dynamic allow entries "
                        "(see `nestgate allow -h`)")
    commands.add_parser("ban", help="list, add or lift bans (see `nestgate ban -h`)")
    commands.add_parser("cert", help="list, renew or install certificates "
                        "(see `nestgate cert -h`)")
    commands.add_parser("trust", help="the local CA's root and how to trust it "
                        "(see `nestgate trust -h`)")
    commands.add_parser("ctl", help="ask the running server's admin API: status, ready, "
                        "metrics, reload (see `nestgate ctl -h`)")
    args = parser.parse_args(argv)

    from nestgate.config import ConfigError, config_warnings, report_config_problems
    from nestgate.server.supervisor import Supervisor, load
    try:
        config = load(args.config, args.listen, args.workers)
    except ConfigError as exc:
        return report_config_problems(exc)
    if args.command == "check":
        from nestgate.server.supervisor import unavailable_addresses
        # An address that cannot be bound now is told, not failed: the machine may
        # change before `serve` runs (the running nestgate of this config is left out).
        warnings = config_warnings(config) + [
            f"{problem}: `serve` would fail on it now"
            for problem in unavailable_addresses(config)]
        for warning in warnings:
            print(f"nestgate: warning: {warning}", file=sys.stderr)
        print(f"{config.source}: ok ({len(config.listeners)} listeners, "
              f"{len(config.sites)} sites{_warned(len(warnings))})")
        return 0
    try:
        return Supervisor(config, args.config, args.listen, args.workers).run()
    except OSError as exc:
        print(f"nestgate: cannot start: {exc}", file=sys.stderr)
        return 1
