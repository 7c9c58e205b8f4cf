"""`nestgate ctl status|ready|metrics|validate|reload|...`: the admin API from a shell.

    nestgate ctl validate FILE                     the problems `check` would list, asked of
                                                   the running server (as its user sees them)
    nestgate ctl reload                            reload and wait for the new workers
    nestgate ctl upstreams                         the proxy routes' upstreams and health
    nestgate ctl drain|undrain ROUTE UPSTREAM      no new request to it in any worker / back
    nestgate ctl purge | reread                    notes: forget rendered pages / read again
    nestgate ctl install-cert NAME --cert F --key F   a certificate another tool renews
    nestgate ctl allow [list]                      the dynamic allow-list
    nestgate ctl allow add CIDR [--for 2h] [--comment TEXT] [--allow-everyone]
    nestgate ctl allow remove ID
    nestgate ctl sessions                          the live sign-in sessions
    nestgate ctl revoke ID | --user NAME           end one session, or all of a user's
    nestgate ctl users                             the users and their groups
    nestgate ctl unbind --user NAME                forget the provider accounts NAME signed
                                                   in through first (made anew there)
    nestgate ctl passkeys [--user NAME]            the registered passkeys
    nestgate ctl passkeys revoke ID                revoke one

The address and token come from the config (`--config`, as `serve` finds it, with
NESTGATE_ADMIN and NESTGATE_ADMIN_TOKEN; without a token in it, the one nestgate made in
its state folder), or from `--address` and `--token`.
Exit status: 0 done (and ready, for `ready`), 1 not ready or refused by the API,
2 a config with problems, 3 the admin listener cannot be reached.
"""

from __future__ import annotations

import argparse
import http.client
import json
import ssl
import sys
import time
from urllib.parse import quote

NOT_READY, CONFIG_PROBLEMS, UNREACHABLE = 1, 2, 3
PATHS = {"status": "/v1/status", "ready": "/v1/ready", "metrics": "/metrics",
         "reload": "/v1/config/reload", "allow": "/v1/allow", "sessions": "/v1/sessions",
         "revoke": "/v1/sessions", "users": "/v1/users", "unbind": "/v1/users", "validate": "/v1/config/validate",
         "upstreams": "/v1/upstreams", "drain": "/v1/upstreams/drain",
         "undrain": "/v1/upstreams/undrain", "purge": "/v1/notes/purge",
         "reread": "/v1/notes/reread", "install-cert": "/v1/certificates",
         "passkeys": "/v1/passkeys"}
# Commands that change something and take no arguments: a POST with no body.
_POSTS = frozenset(("reload", "purge", "reread"))


def ctl_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="nestgate ctl", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.split("\n")[2:22]))
    parser.add_argument("what", choices=sorted(PATHS))
    parser.add_argument("rest", nargs="*", help="for allow: list, add CIDR, remove ID; "
                        "for revoke: a session id; for validate: a file; for drain and "
                        "undrain: ROUTE UPSTREAM; for install-cert: NAME; for passkeys: "
                        "revoke ID")
    parser.add_argument("--for", dest="ttl", default="1h", help="allow add: how long")
    parser.add_argument("--comment", default="", help="allow add: a note")
    parser.add_argument("--allow-everyone", action="store_true",
                        help="allow add: take 0.0.0.0/0 or ::/0 (every address), which "
                        "is refused without it")
    parser.add_argument("--user", help="revoke: every session of this user; passkeys: "
                        "this user's; unbind: this user")
    parser.add_argument("--cert", help="install-cert: the PEM chain file")
    parser.add_argument("--key", help="install-cert: the PEM key file")
    parser.add_argument("--config", metavar="FILE", help="the server's config file")
    parser.add_argument("--address", metavar="HOST:PORT", help="the admin listener")
    parser.add_argument("--token", help="the admin token (default: the config's)")
    parser.add_argument("--cafile", help="HTTPS: the certificate (or CA) to trust "
                        "(default: [admin] certificate's cert; with --address: plain HTTP)")
    parser.add_argument("--json", action="store_true", help="print the API's JSON as it is")
    args, extra = parser.parse_known_args(argv)
    # An id may begin with "-" (a passkey's is base64url): one argparse does not know
    # is the id, not an option. A misspelt "--option" is still refused.
    if any(word.startswith("--") for word in extra):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.rest += extra

    request = _request(args)
    if request is None:
        parser.print_usage(sys.stderr)
        return CONFIG_PROBLEMS
    method, path, payload, content_type = request
    host, port, token, certificate = _target(args)
    if host is None:
        return CONFIG_PROBLEMS
    try:
        conn = http.client.HTTPConnection(host, port, timeout=90) if not certificate else \
            http.client.HTTPSConnection(host, port, timeout=90,
                                        context=pinned_context(certificate))
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if payload is not None:
            headers["Content-Type"] = content_type
        conn.request(method, path, headers=headers, body=payload)
        resp = conn.getresponse()
        body = resp.read()
        conn.close()
    except OSError as exc:
        print(f"nestgate ctl: cannot reach the admin listener at {host}:{port}: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return UNREACHABLE
    if args.what == "metrics" and resp.status == 200:
        sys.stdout.write(body.decode())
        return 0
    answer = json.loads(body) if body else {}
    if resp.status == 204:
        print("{}" if args.json else "done")
        return 0
    if "error" in answer:
        if args.json:
            print(json.dumps(answer, indent=2))
            return NOT_READY
        print(f"nestgate ctl: {resp.status}: {answer['error']['message']}", file=sys.stderr)
        for problem in answer["error"].get("details", {}).get("problems", ()):
            where = ": ".join(p for p in (problem["file"], problem["key"]) if p)
            print(f"  {where}: {problem['message']}", file=sys.stderr)
        return NOT_READY
    if args.json:
        print(json.dumps(answer, indent=2))
    elif args.what == "reload":
        print(f"reloaded: generation {answer['generation']} serving")
        for kind, change in answer["changed"].items():
            for name in change["added"]:
                print(f"  + {kind[:-1]} {name}")
            for name in change["removed"]:
                print(f"  - {kind[:-1]} {name}")
        for key in answer.get("not_applied", ()):
            print(f"  ! {key} not applied: it takes effect when nestgate restarts")
    elif args.what == "allow" and "entries" in answer:
        for e in answer["entries"]:
            print(f"{e['id']:>5}  {e['cidr']:<40}  until {_when(e['expires'])}  {e['comment']}")
    elif args.what == "allow":
        print(answer["id"])
    elif args.what == "sessions":
        for s in answer["sessions"]:
            print(f"{s['id']}  {s['user']:<16}  {s['client']:<40}  "
                  f"seen {_when(s['last_seen'])}  until {_when(s['expires'])}")
    elif args.what == "revoke":
        print(f"revoked {answer['revoked']}")
    elif args.what == "unbind":
        print(f"unbound {answer['unbound']}")
    elif args.what == "passkeys":
        for p in answer["passkeys"]:
            print(f"{p['id']}  {p['user']:<16}  {p['name']:<24}  "
                  f"added {_when(p['created'])}  used {_when(p['last_used'])}")
    elif args.what == "users":
        for u in answer["users"]:
            email = f" <{u['email']}>" if u["email"] else ""
            print(f"{u['name']:<16}  {','.join(u['groups']) or '-':<24}  "
                  f"{(u['display_name'] + email).strip() or '-':<40}  "
                  f"{'2FA' if u['second_factor'] else '1FA'}")
    elif args.what == "validate":
        print("ok")
        for warning in answer.get("warnings", ()):
            where = ": ".join(p for p in (warning["file"], warning["key"]) if p)
            print(f"  warning: {where}: {warning['message']}")
    elif args.what in ("drain", "undrain", "purge", "reread"):
        print(f"done: applied by {answer['applied_by_workers']} workers")
    elif args.what == "upstreams":
        for u in answer["upstreams"]:
            state = "drained" if u.get("drained") else \
                "healthy" if u.get("healthy", True) else "failing"
            print(f"{u['route']:<24}  {u['upstream']:<40}  {state:<8}  "
                  f"{u.get('requests', 0)} requests, {u.get('errors', 0)} errors")
    elif args.what == "install-cert":
        print(f"installed {answer['name']}: until {_when(answer['not_after'])}")
    elif args.what == "ready":
        print("ready" if answer.get("ready") else
              "not ready: " + "; ".join(answer.get("reasons", ())))
    else:
        print(_status_text(answer))
    return 0 if 200 <= resp.status < 300 else NOT_READY


def _json(value) -> tuple[bytes, str]:
    return json.dumps(value).encode(), "application/json"


def _request(args):
    """(method, path, body or None, its content type) for the command, or None when
    its arguments do not make one."""
    rest, what = args.rest, args.what
    if what == "allow":
        if not rest or rest == ["list"]:
            return "GET", "/v1/allow", None, ""
        if rest[0] == "add" and len(rest) == 2:
            entry = {"cidr": rest[1], "ttl": args.ttl, "comment": args.comment}
            if args.allow_everyone:
                entry["allow_everyone"] = True
            return ("POST", "/v1/allow", *_json(entry))
        if rest[0] == "remove" and len(rest) == 2:
            return "DELETE", f"/v1/allow/{quote(rest[1], safe='')}", None, ""
        return None
    if what == "revoke":
        if args.user and not rest:
            return "DELETE", f"/v1/users/{quote(args.user, safe='')}/sessions", None, ""
        if len(rest) == 1 and not args.user:
            return "DELETE", f"/v1/sessions/{quote(rest[0], safe='')}", None, ""
        return None
    if what == "unbind":
        return ("DELETE", f"/v1/users/{quote(args.user, safe='')}/providers", None, "") \
            if args.user and not rest else None
    if what == "passkeys":
        if not rest:
            query = f"?user={quote(args.user, safe='')}" if args.user else ""
            return "GET", PATHS[what] + query, None, ""
        if rest[0] == "revoke" and len(rest) == 2:
            return "DELETE", f"{PATHS[what]}/{quote(rest[1], safe='')}", None, ""
        return None
    if what == "validate":
        return ("POST", PATHS[what], _read_file(rest[0]), "application/toml") \
            if len(rest) == 1 else None
    if what in ("drain", "undrain"):
        return ("POST", PATHS[what], *_json({"route": rest[0], "upstream": rest[1]})) \
            if len(rest) == 2 else None
    if what == "install-cert":
        if len(rest) != 1 or not args.cert or not args.key:
            return None
        pems = {"cert": _read_file(args.cert).decode(), "key": _read_file(args.key).decode()}
        return "PUT", f"{PATHS[what]}/{quote(rest[0], safe='')}", *_json(pems)
    if rest:
        return None
    return ("POST" if what in _POSTS else "GET"), PATHS[what], None, ""


def _read_file(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise SystemExit(f"nestgate ctl: cannot read {path}: {exc.strerror}") from None


def _when(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))


def pinned_context(cert_file: str) -> ssl.SSLContext:
    """TLS to the admin listener trusting exactly the configured certificate (the
    address is usually loopback, which the certificate need not name)."""
    ctx = ssl.create_default_context(cafile=cert_file)
    ctx.check_hostname = False        # the certificate itself is the trust anchor
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN   # a leaf may be its own anchor
    return ctx


def _target(args) -> tuple[str | None, int, str, str]:
    if args.address:
        from nestgate.config import parse_address
        try:
            host, port = parse_address(args.address)
        except ValueError as exc:
            print(f"nestgate ctl: --address: expected {exc}", file=sys.stderr)
            return None, 0, "", ""
        return host, port, args.token or "", args.cafile or ""
    from nestgate.config import ConfigError, read_config, report_config_problems
    try:
        config = read_config(args.config)
    except ConfigError as exc:
        report_config_problems(exc)
        return None, 0, "", ""
    admin = config.admin
    if not admin.enabled:
        print(f"nestgate ctl: {config.source}: the admin listener is off "
              "([admin] enabled = false or NESTGATE_ADMIN=off)", file=sys.stderr)
        return None, 0, "", ""
    host = "127.0.0.1" if admin.host in ("0.0.0.0", "") else \
        "::1" if admin.host == "::" else admin.host
    certificate = admin.certificate.cert if admin.certificate is not None else ""
    token = args.token or admin.token
    if not token and admin.token_file:
        print(f"nestgate ctl: cannot read the admin token in {admin.token_file}: nestgate "
              "makes it at its first start, readable only by the user it runs as; run "
              "ctl as that user (or root), or give --token", file=sys.stderr)
        return None, 0, "", ""
    return host, admin.port, token, args.cafile or certificate


def _status_text(status: dict) -> str:
    lines = [f"nestgate {status['version']}, supervisor pid {status['pid']}, "
             f"up {status['uptime_s']:.0f} s, generation {status['generation']}",
             f"config {status['config'].get('file')} (sha256 "
             f"{status['config'].get('sha256', '')[:12]})"]
    for listener in status["listeners"]:
        lines.append(f"listening on {listener['address']}")
    for gen in status["generations"]:
        state = "stopping" if gen["stopping"] else "serving" if gen["ready"] else "starting"
        lines.append(f"generation {gen['number']} ({state}):")
        for w in gen["workers"]:
            conns = w.get("connections", {})
            lines.append(f"  worker {w['pid'] or '-':>7}  {'ready' if w['ready'] else 'not ready':9}"
                         f"  {w.get('requests', 0):>10} requests  "
                         f"{sum(conns.values()):>5} connections  {w['restarts']} restarts")
    for reload in status["reloads"][-3:]:
        lines.append(f"reload: {'ok' if reload['ok'] else 'refused'}: {reload['message']}")
    return "\n".join(lines)
