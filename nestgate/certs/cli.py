"""`nestgate cert list | renew [NAME] | install NAME --cert F --key F` and
`nestgate trust [--install]`.

They read the same config as `serve` and work on its certificate storage directly,
under the same per-name locks as the certificate process, so they can run while the
server does: what they store is picked up by every worker within a second or two.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time

from nestgate.certs.install import install_certificate, when
from nestgate.certs.manager import CertManager, managed_certificates, storage_of

DEBIAN_ANCHORS = "/usr/local/share/ca-certificates/nestgate-local-ca.crt"


def _load_config(path):
    from nestgate.config import ConfigError, read_config, report_config_problems
    try:
        return read_config(path), 0
    except ConfigError as exc:
        return None, report_config_problems(exc)


def cert_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="nestgate cert", description="Certificates "
                                     "nestgate obtains (acme = true, tls = \"internal\") "
                                     "and ones another tool renews.")
    commands = parser.add_subparsers(dest="command", required=True)
    listing = commands.add_parser("list", help="names, issuer, expiry, next renewal, "
                                  "last error")
    renew = commands.add_parser("renew", help="order new certificates now")
    renew.add_argument("names", nargs="*", metavar="NAME", help="default: every name")
    install = commands.add_parser("install", help="store a certificate another tool got "
                                  "(certbot, acme.sh) and serve it at once")
    install.add_argument("name", metavar="NAME")
    install.add_argument("--cert", required=True, metavar="FILE", help="PEM chain, leaf first")
    install.add_argument("--key", required=True, metavar="FILE", help="PEM private key")
    for command in (listing, renew, install):
        command.add_argument("--config", metavar="FILE", help="config file (as for serve)")
    args = parser.parse_args(argv)
    config, status = _load_config(args.config)
    if config is None:
        return status
    if args.command == "list":
        return _list(config)
    if args.command == "renew":
        return _renew(config, args.names)
    return _install(config, args.name, args.cert, args.key)


def _list(config) -> int:
    storage = storage_of(config)
    manager = CertManager(config, log=lambda _m: None)
    managed = managed_certificates(config)
    rows = []
    now = time.time()
    for item in managed:
        stored = storage.load(item.kind, item.name)
        meta = storage.meta(item.kind, item.name)
        usable = manager.usable(item, stored, now)
        if item.kind == "installed":
            renewal = "by the tool that installs it"
        elif usable or meta:
            renewal = when(manager.next_look(item, now))
        else:
            renewal = "now"
        rows.append((item.name, item.kind, stored.issuer if stored else "-",
                     when(stored.not_after) if stored else "(none yet)", renewal,
                     meta.get("last_error", "") or "-"))
    if not rows:
        print(f"no certificates are managed by {config.source} (acme, internal or "
              "installed = true on a [[listen.certificate]], or tls = \"internal\")")
        return 0
    header = ("NAME", "SOURCE", "ISSUER", "NOT AFTER", "NEXT RENEWAL", "LAST ERROR")
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(5)]
    for row in [header] + rows:
        print("  ".join(str(v).ljust(w) for v, w in zip(row, widths)) + "  " + str(row[5]))
    print(f"storage: {storage.root}")
    return 0


def _renew(config, names: list[str]) -> int:
    managed = managed_certificates(config)
    chosen = [m for m in managed if not names or m.name in names]
    unknown = sorted(set(names) - {m.name for m in managed})
    if unknown:
        print(f"nestgate: not managed by {config.source}: {', '.join(unknown)} (managed: "
              f"{', '.join(m.name for m in managed) or 'none'})", file=sys.stderr)
        return 2
    storage_of(config).ensure()
    manager = CertManager(config)
    failed = 0
    for item in chosen:
        reason = manager.obtain(item, force=True, wait=120.0)
        if reason:
            failed += 1
            print(f"{item.name}: not renewed: {reason}", file=sys.stderr)
        else:
            stored = manager.storage.load(item.kind, item.name)
            print(f"{item.name}: renewed, valid until {when(stored.not_after)}")
    return 1 if failed else 0


def _install(config, name: str, cert_file: str, key_file: str) -> int:
    try:
        chain_pem, key_pem = open(cert_file, "rb").read(), open(key_file, "rb").read()
    except OSError as exc:
        print(f"nestgate: cannot read {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    outcome = install_certificate(config, name, chain_pem, key_pem,
                                  source=os.path.abspath(cert_file))
    if not outcome.ok:
        print(f"nestgate: {outcome.name}: not installed: {outcome.problem}", file=sys.stderr)
        return 2 if outcome.status == 404 else 1
    print(f"{outcome.name}: installed, valid until {when(outcome.not_after)}; served by "
          "every worker within seconds")
    return 0


def trust_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="nestgate trust", description="The local CA's "
                                     "root certificate (tls = \"internal\"): where it is "
                                     "and how devices trust it.")
    parser.add_argument("--config", metavar="FILE", help="config file (as for serve)")
    parser.add_argument("--install", action="store_true",
                        help="add it to this Debian/Ubuntu machine's trust store (root)")
    parser.add_argument("--pem", action="store_true", help="print the certificate itself")
    args = parser.parse_args(argv)
    config, status = _load_config(args.config)
    if config is None:
        return status
    from nestgate.certs.localca import LocalCA, trust_instructions
    storage = storage_of(config)
    storage.ensure()
    ca = LocalCA(storage)
    pem = ca.root_pem()
    if args.pem:
        sys.stdout.write(pem.decode())
        return 0
    if args.install:
        if not shutil.which("update-ca-certificates"):
            print("nestgate: update-ca-certificates is not here (Debian's ca-certificates "
                  "package); follow the steps below instead", file=sys.stderr)
            print(trust_instructions(str(ca.root_file)))
            return 1
        try:
            with open(DEBIAN_ANCHORS, "wb") as f:
                f.write(pem)
            subprocess.run(["update-ca-certificates"], check=True, stdout=subprocess.DEVNULL)
        except (OSError, subprocess.CalledProcessError) as exc:
            print(f"nestgate: cannot install the root: {exc}", file=sys.stderr)
            return 1
        print(f"installed {DEBIAN_ANCHORS}; programs that use the system store trust it")
        return 0
    print(trust_instructions(str(ca.root_file)))
    return 0


