"""`nestgate ctl status|ready|metrics|reload`: the admin API from a shell.

The address and token come from the config (`--config`, as `serve` finds it, with
NESTGATE_ADMIN and NESTGATE_ADMIN_TOKEN), or from `--address` and `--token`.
Exit status: 0 done (and ready, for `ready`), 1 not ready or refused by the API,
2 a config with problems, 3 the admin listener cannot be reached.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys

NOT_READY, CONFIG_PROBLEMS, UNREACHABLE = 1, 2, 3
PATHS = {"status": "/v1/status", "ready": "/v1/ready", "metrics": "/metrics",
         "reload": "/v1/config/reload"}


def ctl_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="nestgate ctl", description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=sorted(PATHS))
    parser.add_argument("--config", metavar="FILE", help="the server's config file")
    parser.add_argument("--address", metavar="HOST:PORT", help="the admin listener")
    parser.add_argument("--token", help="the admin token (default: the config's)")
    parser.add_argument("--json", action="store_true", help="print the API's JSON as it is")
    args = parser.parse_args(argv)

    host, port, token = _target(args)
    if host is None:
        return CONFIG_PROBLEMS
    try:
        conn = http.client.HTTPConnection(host, port, timeout=90)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        conn.request("POST" if args.what == "reload" else "GET", PATHS[args.what],
                     headers=headers)
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
    if "error" in answer:
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
    elif args.what == "ready":
        print("ready" if answer.get("ready") else
              "not ready: " + "; ".join(answer.get("reasons", ())))
    else:
        print(_status_text(answer))
    return 0 if resp.status == 200 else NOT_READY


def _target(args) -> tuple[str | None, int, str]:
    if args.address:
        from nestgate.config import parse_address
        try:
            host, port = parse_address(args.address)
        except ValueError as exc:
            print(f"nestgate ctl: --address: expected {exc}", file=sys.stderr)
            return None, 0, ""
        return host, port, args.token or ""
    from nestgate.cli import report_config_problems
    from nestgate.config import ConfigError, read_config
    try:
        config = read_config(args.config)
    except ConfigError as exc:
        report_config_problems(exc)
        return None, 0, ""
    admin = config.admin
    if not admin.enabled:
        print(f"nestgate ctl: {config.source}: the admin listener is off "
              "([admin] enabled = false or NESTGATE_ADMIN=off)", file=sys.stderr)
        return None, 0, ""
    host = "127.0.0.1" if admin.host in ("0.0.0.0", "") else \
        "::1" if admin.host == "::" else admin.host
    return host, admin.port, args.token or admin.token


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
