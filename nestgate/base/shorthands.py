"""Shorthands: keys of a `[[site]]` that stand for the tables they expand to, so the
common home setup (a site, services behind sign-in, HTTPS) takes a few lines.

    proxy = "http://127.0.0.1:8096"   [[site.route]] prefix = "/", type = "proxy", upstream
    static = "/srv/www"               [[site.route]] prefix = "/", type = "static", root
    https = "acme" | "internal"       a listener on port 443 with a certificate for the
                                      site's hosts (from the ACME CA or the local CA), and,
                                      when no listener has port 80, one there that sends
                                      plain HTTP to HTTPS (and still answers HTTP-01)

The expansion works on the TOML data before it is read, so the full tables' rules and
messages apply to what it makes (two routes on "/" are refused as ever). The shorthand
keys stay in the data; the site's reader checks their values and marks them known.
"""

from __future__ import annotations

import copy

HTTPS_KINDS = ("acme", "internal")


def expand(data: dict) -> dict:
    """`data` with every site's shorthands expanded (a copy; `data` is left alone)."""
    sites = data.get("site")
    if not isinstance(sites, list) or not any(
            isinstance(s, dict) and ("proxy" in s or "static" in s or "https" in s)
            for s in sites):
        return data
    data = copy.deepcopy(data)
    made: dict[str, dict] = {}              # the certificate table made for each kind
    for site in data["site"]:
        if not isinstance(site, dict):
            continue
        _root_route(site, "proxy", "proxy", "upstream")
        _root_route(site, "static", "static", "root")
        if site.get("https") in HTTPS_KINDS:
            _https(data, site, made)
    return data


def _root_route(site: dict, key: str, kind: str, option: str) -> None:
    target = site.get(key)
    if isinstance(target, str) and target:
        routes = site.setdefault("route", [])
        if isinstance(routes, list):
            routes.append({"prefix": "/", "type": kind, option: target})


def _https(data: dict, site: dict, made: dict[str, dict]) -> None:
    hosts = site.get("hosts")
    if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
        return                              # the site's reader names what is wrong
    listeners = data.setdefault("listen", [])
    if not isinstance(listeners, list):
        return
    secure = next((l for l in listeners if _port(l) == 443), None)
    if secure is None:
        secure = {"address": "0.0.0.0:443"}
        listeners.append(secure)
        if not any(_port(l) == 80 for l in listeners):
            listeners.append({"address": "0.0.0.0:80", "redirect_https": True})
    kind = site["https"]
    certificates = secure.setdefault("certificate", [])
    if not isinstance(certificates, list):
        return
    mine = made.get(kind)
    if mine is None:
        mine = made[kind] = {kind: True, "names": []}
        certificates.append(mine)
    mine["names"] += [h for h in hosts if h not in mine["names"]]


def _port(listener) -> int | None:
    address = listener.get("address") if isinstance(listener, dict) else None
    if not isinstance(address, str):
        return None
    port = address.rpartition(":")[2]
    return int(port) if port.isdigit() else None
