"""Peers: configs rendered from one scenario route, and a real nginx started and stopped."""

import os
import stat
import subprocess
import sys
import tomllib

import pytest

from nestgate.bench import content, peers, procstat, scenarios, tools
from nestgate.bench.ports import free_port, is_listening
from nestgate.bench.scenarios import Route

needs_nginx = pytest.mark.skipif(tools.which("nginx") is None, reason="nginx is not installed")
needs_caddy = pytest.mark.skipif(tools.which("caddy") is None,
                                 reason="caddy is not installed (make debian-deps)")

HEALTH_BODY = b'{"status":"ok","version":"0.1.0","uptime_s":1,"pid":5464}'


@pytest.fixture(scope="module")
def site_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("content")
    content.write_all(root)
    return root


def make_site(root, route, **kw):
    kw.setdefault("captured", {scenarios.HEALTH: (HEALTH_BODY, "application/json")})
    return peers.Site(root, free_port(), 1, route, **kw)


# ---------------------------------------------------------------- the table

def test_scenario_table_is_consistent():
    names = [s.name for s in scenarios.SCENARIOS]
    assert len(names) == len(set(names))
    assert set(scenarios.QUICK) <= set(names)
    for s in scenarios.SCENARIOS:
        assert s.driver in ("wrk", "h2load", "h3py", "cold", "write")
        for table in (peers._NESTGATE_ROUTES, peers._NGINX_ROUTES, peers._CADDY_ROUTES):
            assert s.route.kind in table, (s.name, s.route.kind)
    assert [s.name for s in scenarios.select(None, quick=True)] == list(scenarios.QUICK)
    with pytest.raises(ValueError, match="unknown scenario"):
        scenarios.select(["nope"], quick=False)


def test_health_json_has_the_asked_length():
    for length in (15, 40, 57, 80, 200):
        text = content.health_json(length)
        assert len(text.encode()) == length
        assert text.startswith('{"status":"ok"')


def test_cidr_list_matches_loopback_last():
    cidrs = content.cidr_list()
    assert len(cidrs) == content.CIDR_ENTRIES == len(set(cidrs))
    assert cidrs[-1] == "127.0.0.0/8"


# ---------------------------------------------------------------- rendering

def test_nestgate_config_is_valid_toml(site_root, tmp_path):
    cert = content.certificate(tmp_path)
    assert stat.S_IMODE(os.stat(cert.key).st_mode) == 0o600   # nestgate warns of a wider key
    site = make_site(site_root, Route("file", "/page", "page.html"), certificate=cert)
    data = tomllib.loads(peers.render_nestgate(site))
    assert data["server"]["workers"] == 1
    assert data["listen"][0]["address"] == f"127.0.0.1:{site.port}"
    assert data["listen"][0]["certificate"][0]["cert"] == str(cert.cert)
    route = data["site"][0]["route"][0]
    assert route["type"] == "return" and route["body_file"].endswith("page.html")


def test_nestgate_accepts_the_health_config(site_root, tmp_path):
    path = tmp_path / "nestgate.toml"
    path.write_text(peers.render_nestgate(make_site(site_root, Route("health", scenarios.HEALTH))))
    out = subprocess.run([sys.executable, "-m", "nestgate", "check", "--config", str(path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_the_bans_scenario_fills_the_store_the_config_names(site_root, tmp_path):
    from nestgate.bans.store import open_bans
    from nestgate.config import read_config
    scenario = scenarios.BY_NAME["health-bans-10k"]
    site = make_site(site_root, scenario.route, bans=scenario.bans)
    path = tmp_path / "nestgate.toml"
    path.write_text(peers.render_nestgate(site, tmp_path))
    peers._fill_bans(site, tmp_path)
    config = read_config(str(path))
    bans = open_bans(config.bans.store)
    rows = bans.live()
    bans.close()
    assert len(rows) == 10_000 and not any(r.network.startswith("127.") for r in rows)


def test_nginx_health_returns_the_same_length(site_root, tmp_path):
    conf = peers.render_nginx(make_site(site_root, Route("health", scenarios.HEALTH)),
                              tmp_path, tmp_path / "e.log", peers._nginx_health(
                                  make_site(site_root, Route("health", scenarios.HEALTH))))
    assert f"return 200 '{content.health_json(len(HEALTH_BODY))}'" in conf
    assert "keepalive_requests 100000000;" in conf


def test_caddy_renders_every_kind(site_root):
    for kind, path in (("health", scenarios.HEALTH), ("file", "/page"), ("static", "/static/"),
                       ("proxy", "/proxy/")):
        text = peers.render_caddy(make_site(site_root, Route(kind, path, "page.html"),
                                            backend_port=1234))
        assert text.count("{") == text.count("}")


@needs_caddy
@pytest.mark.parametrize("scenario", scenarios.SCENARIOS, ids=lambda s: s.name)
def test_every_caddyfile_passes_caddy_validate(site_root, tmp_path, scenario):
    site = make_site(site_root, scenario.route, backend_port=1234,
                     certificate=content.certificate(tmp_path) if scenario.tls else None,
                     site_host="known.example" if scenario.host else "",
                     cidrs=tuple(content.cidr_list()[-3:]) if scenario.host else ())
    caddy = peers.Caddy(tmp_path, tmp_path)
    config = caddy.configure(site)[0]
    out = subprocess.run(caddy.validate_argv(config), capture_output=True, text=True,
                         timeout=60, env={**os.environ, **caddy.env(site)})
    assert out.returncode == 0, f"{config.read_text()}\n{out.stderr[-2000:]}"


@needs_caddy
def test_caddy_serves_health_over_tls13_and_stops(site_root, tmp_path):
    site = make_site(site_root, Route("health", scenarios.HEALTH),
                     certificate=content.certificate(tmp_path / "tls"))
    caddy = peers.Caddy(tmp_path, tmp_path)
    caddy.start(site, scenarios.HEALTH)
    try:
        status, body, headers = peers.fetch("https", site.port, scenarios.HEALTH)
        assert (status, len(body), headers[":tls"]) == (200, len(HEALTH_BODY), "TLSv1.3")
    finally:
        caddy.stop()
    assert caddy.server.exited() is not None and not is_listening(site.port)


# ---------------------------------------------------------------- a real nginx

@needs_nginx
@pytest.mark.parametrize("route, path, length", [
    (Route("health", scenarios.HEALTH), scenarios.HEALTH, len(HEALTH_BODY)),
    (Route("file", "/page", "page.html"), "/page", content.PAGE_BYTES),
    (Route("static", "/static/"), "/static/f100k.bin", 100 * 1024),
    (Route("static", "/static/"), "/static/f12b.txt", 12),
])
def test_nginx_starts_serves_and_stops(site_root, tmp_path, route, path, length):
    site = make_site(site_root, route)
    nginx = peers.Nginx(tmp_path, tmp_path)
    nginx.start(site, path)
    try:
        status, body, headers = peers.fetch("http", site.port, path)
        assert (status, len(body)) == (200, length)
        tree = procstat.tree(nginx.pid)
        assert len(tree) == 2                   # master + worker_processes 1
    finally:
        nginx.stop()
    assert nginx.server.exited() is not None
    assert procstat.tree(tree[0].pid) == [] and not is_listening(site.port)
    assert (tmp_path / "nginx.conf").exists()


@needs_nginx
def test_nginx_tls13_and_unknown_host_404(site_root, tmp_path):
    cert = content.certificate(tmp_path / "tls")
    site = make_site(site_root, Route("health", scenarios.HEALTH), certificate=cert,
                     site_host="known.example", cidrs=tuple(content.cidr_list()))
    nginx = peers.Nginx(tmp_path, tmp_path)
    nginx.start(site, scenarios.HEALTH, "unknown.example")
    try:
        status, _, headers = peers.fetch("https", site.port, scenarios.HEALTH, "unknown.example")
        assert status == 404 and headers[":tls"] == "TLSv1.3"
        status, body, _ = peers.fetch("https", site.port, scenarios.HEALTH, "known.example")
        assert status == 200 and len(body) == len(HEALTH_BODY)
    finally:
        nginx.stop()


@needs_nginx
def test_nginx_proxy_to_nginx_backend(site_root, tmp_path):
    backend_site = make_site(site_root, Route("static", "/"))
    backend = peers.NginxBackend(tmp_path, tmp_path)
    backend.start(backend_site, "/2b")
    site = make_site(site_root, Route("proxy", "/proxy/", "/"), backend_port=backend_site.port)
    nginx = peers.Nginx(tmp_path, tmp_path)
    try:
        nginx.start(site, "/proxy/2b")
        assert peers.fetch("http", site.port, "/proxy/2b")[:2] == (200, b"ok")
        assert len(peers.fetch("http", site.port, "/proxy/4k")[1]) == 4096
    finally:
        nginx.stop()
        backend.stop()


@needs_nginx
def test_a_server_that_fails_to_start_is_reported(site_root, tmp_path):
    site = make_site(site_root, Route("health", scenarios.HEALTH))
    nginx = peers.Nginx(tmp_path, tmp_path)
    nginx.configure = lambda s: [_write(tmp_path / "bad.conf", "this is not nginx config;")]
    with pytest.raises(peers.BenchError, match="exited"):
        nginx.start(site, scenarios.HEALTH)


def _write(path, text):
    path.write_text(text)
    return path
