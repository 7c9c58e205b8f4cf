"""Config: units, validation messages naming file, key and expectation, `nestgate check`."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from nestgate.config import ConfigError, parse_config, read_config, with_overrides
from nestgate.base.units import parse_duration, parse_size

from conftest import REPO, _env


@pytest.mark.parametrize("text, value", [("64KiB", 65536), ("1MiB", 1048576), ("10KB", 10000),
                                         ("512", 512), (4096, 4096), ("1.5KiB", 1536)])
def test_sizes(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text, value", [("30s", 30.0), ("250ms", 0.25), ("5m", 300.0),
                                         ("1h", 3600.0), (10, 10.0)])
def test_durations(text, value):
    assert parse_duration(text) == value


@pytest.mark.parametrize("bad", ["lots", "-1", "12 parsecs", True, [1]])
def test_bad_sizes_say_what_was_expected(bad):
    with pytest.raises(ValueError, match="size"):
        parse_size(bad)


def problems_of(data: dict) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(data, "site.toml")
    return info.value.problems


def test_every_problem_is_listed_with_file_key_and_expectation():
    problems = problems_of({
        "server": {"workers": -2, "colour": "blue"},
        "limits": {"max_body": "huge", "header_timeout": "soon"},
        "log": {"format": "xml"},
        "listen": [{"address": "127.0.0.1:99999"},
                   {"address": "127.0.0.1:8443",
                    "certificate": [{"cert": "/nonexistent.pem", "key": "/nonexistent.key"}]}],
        "site": [{"hosts": ["a b"], "route": [{"path": "x", "type": "teleport"}]}],
    })
    text = "\n".join(problems)
    for expected in ("site.toml: server.workers: expected an integer 0..512",
                     "site.toml: server.colour: unknown key",
                     "site.toml: limits.max_body: expected a size",
                     "site.toml: limits.header_timeout: expected a duration",
                     "site.toml: log.format: expected one of 'json', 'combined'",
                     "site.toml: listen[0].address: expected HOST:PORT with a port 0..65535",
                     "site.toml: listen[1].certificate[0].cert: expected a path to a readable file",
                     "site.toml: listen[1].certificate[0].key: expected a path to a readable file",
                     "site.toml: site[0].hosts: expected host names",
                     "site.toml: site[0].route[0].path: expected a path starting with /",
                     "site.toml: site[0].route[0].type: expected one of"):
        assert expected in text, f"missing: {expected}\n{text}"


def test_body_chunk_limits_are_read_and_checked():
    config = parse_config({"listen": [{"address": "127.0.0.1:0"}],
                           "limits": {"body_chunk_allowance": 100,
                                      "min_body_chunk_average": "1KiB"}})
    assert (config.limits.body_chunk_allowance, config.limits.min_body_chunk_average) \
        == (100, 1024)
    defaults = parse_config({"listen": [{"address": "127.0.0.1:0"}]}).limits
    assert (defaults.body_chunk_allowance, defaults.min_body_chunk_average) == (4096, 64)
    text = "\n".join(problems_of({"listen": [{"address": "127.0.0.1:0"}], "limits": {
        "body_chunk_allowance": 0, "min_body_chunk_average": "1MiB"}}))
    assert "site.toml: limits.body_chunk_allowance: expected an integer 1..1000000000" in text
    assert "site.toml: limits.min_body_chunk_average: expected a size from 0 (no check) " \
        "to 16KiB" in text


def test_no_listener_is_a_problem():
    assert any("at least one [[listen]]" in p for p in problems_of({}))


def test_defaults_are_nginx_like():
    config = parse_config({"listen": [{"address": "127.0.0.1:0"}]})
    assert config.limits.max_body == 1024 * 1024
    assert config.limits.header_timeout == 60.0
    assert config.log.log_loopback is False


def test_listen_flag_replaces_plain_listeners_only(certs):
    config = parse_config({"listen": [
        {"address": "0.0.0.0:80"},
        {"address": "0.0.0.0:443", "certificate": [{"cert": certs["local"][0],
                                                    "key": certs["local"][1]}]}]})
    changed = with_overrides(config, ["127.0.0.1:9000", "[::1]:9001"], workers=3)
    assert [(l.host, l.port, l.tls) for l in changed.listeners] == [
        ("127.0.0.1", 9000, False), ("::1", 9001, False), ("0.0.0.0", 443, True)]
    assert changed.worker_count == 3
    with pytest.raises(ConfigError, match="--listen 'nowhere'"):
        with_overrides(config, ["nowhere"])
    with pytest.raises(ConfigError, match="TLS listener 0.0.0.0:443: expected an address "
                       "--listen ':443' does not already take"):
        with_overrides(config, [":443"])
    with pytest.raises(ConfigError, match="--listen '127.0.0.1:80': expected an address "
                       "--listen ':80' does not already take"):
        with_overrides(config, [":80", "127.0.0.1:80"])


def test_embedded_default_is_valid():
    config = read_config()
    assert (config.listeners[0].host, config.listeners[0].port) == ("127.0.0.1", 8080)


def run_check(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "nestgate", "check", *args], cwd=cwd or REPO,
                          env=_env(), capture_output=True, text=True, timeout=30)


def test_check_accepts_a_good_file(tmp_path):
    path = tmp_path / "nestgate.toml"
    path.write_text('[[listen]]\naddress = "127.0.0.1:8080"\n')
    result = run_check("--config", str(path))
    assert result.returncode == 0 and "ok" in result.stdout


def test_check_says_when_a_listener_address_is_taken(tmp_path):
    path = tmp_path / "nestgate.toml"
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        path.write_text(f'[[listen]]\naddress = "127.0.0.1:0"\n'
                        f'[[listen]]\naddress = "127.0.0.1:{port}"\n')
        result = run_check("--config", str(path))
    # Still valid (a running nestgate holds its own address while it is checked).
    assert result.returncode == 0 and "ok" in result.stdout
    assert f"{path}: listen[1].address: cannot bind 127.0.0.1:{port} " \
        "(Address already in use)" in result.stderr
    assert "listen[0]" not in result.stderr


def test_a_site_without_hosts_is_refused():
    problems = problems_of({"listen": [{"address": "127.0.0.1:0"}],
                            "site": [{"hosts": ["*"]}, {"hosts": []}]})
    assert problems == ["site.toml: site[1].hosts: expected at least one host name "
                        "(\"*\" for every Host), got []"]


def test_check_reads_nestgate_toml_from_the_working_directory(tmp_path):
    (tmp_path / "nestgate.toml").write_text('[limits]\nmax_url = "tiny"\n[[listen]]\n'
                                            'address = "127.0.0.1:1"\n')
    result = run_check(cwd=tmp_path)
    assert result.returncode != 0 and "nestgate.toml: limits.max_url" in result.stderr


def test_check_lists_every_problem_and_fails(tmp_path, certs):
    path = tmp_path / "bad.toml"
    path.write_text(f'''
[limits]
max_body = "12 bananas"
[[listen]]
address = "127.0.0.1:8443"
[[listen.certificate]]
cert = "{certs["local"][0]}"
key = "{certs["other"][1]}"
''')
    result = run_check("--config", str(path))
    assert result.returncode == 2
    assert "bad.toml: limits.max_body: expected a size" in result.stderr
    assert "certificate[0]: expected a matching PEM certificate and key" in result.stderr


def test_check_reports_toml_syntax_errors(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text("[server\n")
    result = run_check("--config", str(path))
    assert result.returncode == 2 and "broken.toml: not valid TOML" in result.stderr


@pytest.mark.parametrize("body_file", ["nope.html", "/proc/self/mem"])
def test_check_lists_an_unreadable_body_file(tmp_path, body_file):
    path = tmp_path / "nestgate.toml"
    path.write_text('[[listen]]\naddress = "127.0.0.1:8080"\n[[site]]\n[[site.route]]\n'
                    f'path = "/missing"\ntype = "return"\nbody_file = "{body_file}"\n')
    result = run_check("--config", str(path))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert ("nestgate.toml: site[*].route[0].body_file: expected a path to a readable file"
            in result.stderr)


def test_check_reports_a_file_that_is_not_utf8(tmp_path):
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'# caf\xe9\n[[listen]]\naddress = "127.0.0.1:8080"\n')
    result = run_check("--config", str(path))
    assert result.returncode == 2 and "latin1.toml: expected UTF-8 text" in result.stderr


def test_listeners_that_cannot_bind_together_are_named_both():
    problems = problems_of({"listen": [{"address": "127.0.0.1:8080"},
                                       {"address": "127.0.0.1:0"},
                                       {"address": "127.0.0.1:0"},
                                       {"address": ":8443"},
                                       {"address": "127.0.0.1:8443"},
                                       {"address": "127.0.0.1:8080"}]})
    assert problems == [
        "site.toml: listen[4].address: expected an address that listen[3].address does not "
        "already take, got '127.0.0.1:8443'",
        "site.toml: listen[5].address: expected an address that listen[0].address does not "
        "already take, got '127.0.0.1:8080'"]


def test_the_same_address_spelt_two_ways_is_one_address():
    problems = problems_of({"listen": [{"address": "127.0.0.1:8080"},
                                       {"address": "localhost:8080"},
                                       {"address": "[::1]:8080"},
                                       {"address": "[0:0::1]:8080"},
                                       {"address": "[::]:9090"},
                                       {"address": "[::1]:9090"},
                                       {"address": "127.0.0.1:9090"}]})
    assert problems == [
        "site.toml: listen[1].address: expected an address that listen[0].address does not "
        "already take, got 'localhost:8080'",
        "site.toml: listen[3].address: expected an address that listen[2].address does not "
        "already take, got '[0:0::1]:8080'",
        "site.toml: listen[5].address: expected an address that listen[4].address does not "
        "already take, got '[::1]:9090'"]


def test_a_listener_host_that_does_not_resolve_is_named(monkeypatch):
    import socket

    def unknown(host, *args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    monkeypatch.setattr(socket, "getaddrinfo", unknown)
    problems = problems_of({"listen": [{"address": "nas.home.arpa:8080"},
                                       {"address": "127.0.0.1:8081"}]})
    assert problems == ["site.toml: listen[0].address: expected a host name that resolves "
                        "to an IPv4 address, got 'nas.home.arpa'"]


@pytest.mark.parametrize("section, key", [
    ("server", "restart_backoff_max"), ("limits", "header_timeout"),
    ("limits", "send_timeout"), ("limits", "keepalive_timeout"), ("limits", "body_timeout")])
def test_durations_that_must_be_above_zero(section, key):
    problems = problems_of({section: {key: "0s"}, "listen": [{"address": "127.0.0.1:0"}]})
    assert problems == [f"site.toml: {section}.{key}: expected a duration above 0, got '0s'"]
    config = parse_config({section: {key: "1ms"}, "listen": [{"address": "127.0.0.1:0"}]})
    assert getattr(getattr(config, section), key) == 0.001


def test_sizes_out_of_range():
    problems = problems_of({"limits": {"max_header_bytes": "2GiB", "max_body": 0},
                            "listen": [{"address": "127.0.0.1:0"}]})
    assert problems == [
        "site.toml: limits.max_header_bytes: expected a size from 1 byte to 2147483647 bytes "
        "(HTTP/2 SETTINGS carry it in 31 bits), got '2GiB'",
        "site.toml: limits.max_body: expected a size above 0 (there is no unlimited; "
        "nginx's 0 means no limit), got 0"]
    config = parse_config({"limits": {"max_header_bytes": 2**31 - 1, "max_body": 1},
                           "listen": [{"address": "127.0.0.1:0"}]})
    assert (config.limits.max_header_bytes, config.limits.max_body) == (2**31 - 1, 1)


def test_log_path_must_be_a_file_that_can_be_appended_to(tmp_path):
    listen = [{"address": "127.0.0.1:0"}]
    assert problems_of({"log": {"path": str(tmp_path)}, "listen": listen}) == [
        f"site.toml: log.path: expected a file, not a directory, got '{tmp_path}'"]
    assert problems_of({"log": {"path": str(tmp_path / "no" / "a.log")}, "listen": listen}) == [
        f"site.toml: log.path: expected a file in a writable directory, "
        f"got '{tmp_path / 'no' / 'a.log'}'"]
    if os.geteuid() != 0:                       # root may write anything
        locked = tmp_path / "locked.log"
        locked.write_text("")
        locked.chmod(0o444)
        assert problems_of({"log": {"path": str(locked)}, "listen": listen}) == [
            f"site.toml: log.path: expected a file this user can append to, got '{locked}'"]
    assert parse_config({"log": {"path": str(tmp_path / "a.log")}, "listen": listen})


def test_a_site_proxied_at_its_root_leaves_the_health_path_to_its_app():
    site = {"hosts": ["app.test"], "route": [
        {"prefix": "/", "type": "proxy", "upstream": "http://127.0.0.1:9"}]}
    listen = [{"address": "127.0.0.1:0"}]
    proxied, plain = parse_config({"listen": listen, "site": [site, {"hosts": ["*"]}]}).sites
    assert proxied.health is False and plain.health is True
    asked = parse_config({"listen": listen, "site": [{**site, "health": True}]}).sites[0]
    assert asked.health is True


def proxy_route(**keys) -> dict:
    return {"listen": [{"address": "127.0.0.1:0"}], "site": [{"hosts": ["app.test"], "route": [
        {"prefix": "/", "type": "proxy", "upstream": "http://127.0.0.1:9", **keys}]}]}


@pytest.mark.parametrize("keys, upgrade", [
    pytest.param({}, ("websocket",), id="default"),
    pytest.param({"websocket": True}, ("websocket",), id="websocket-true"),
    pytest.param({"websocket": False}, (), id="websocket-false"),
    pytest.param({"upgrade": []}, (), id="none"),
    pytest.param({"upgrade": ["WebSocket", "websocket", "x-custom"]}, ("websocket", "x-custom"),
                 id="lower-case-once-each"),
])
def test_a_proxy_route_names_the_upgrades_it_passes(keys, upgrade):
    opts = parse_config(proxy_route(**keys)).sites[0].routes[0].options
    assert opts.upgrade == upgrade
    assert opts.tunnel_idle_timeout == 60.0


@pytest.mark.parametrize("keys, problem", [
    pytest.param({"upgrade": ["h2c"]}, "upgrade: expected no 'h2c': an HTTP upgrade would "
                 "carry requests past the route's rules", id="h2c"),
    pytest.param({"upgrade": ["websocket", "H2C"]}, "upgrade: expected no 'H2C'", id="H2C"),
    pytest.param({"upgrade": ["HTTP"]}, "upgrade: expected no 'HTTP'", id="http"),
    pytest.param({"upgrade": ["web socket"]}, "upgrade: expected protocol names that are "
                 "tokens, not 'web socket'", id="not-a-token"),
    pytest.param({"upgrade": "websocket"}, "upgrade: expected a list of Upgrade protocol "
                 "names", id="not-a-list"),
    pytest.param({"upgrade": ["websocket"], "websocket": True}, "websocket: expected either "
                 "upgrade or websocket, not both", id="both"),
    pytest.param({"tunnel_idle_timeout": "0s"}, "tunnel_idle_timeout: expected a duration "
                 "above zero", id="idle-zero"),
    pytest.param({"tunnel_idle_timeout": "forever"}, "tunnel_idle_timeout: expected",
                 id="idle-not-a-duration"),
])
def test_proxy_upgrade_problems_name_the_key(keys, problem):
    [found] = problems_of(proxy_route(**keys))
    assert found.startswith("site.toml: site[app.test].route[0].") and problem in found, found


def test_an_unknown_key_near_a_known_one_says_which_was_meant():
    problems = problems_of({"site": [{"hosts": ["a.test"], "protcted": True}],
                            "limits": {"max_bodyy": "1MiB", "zzz": 1}})
    assert "site.toml: site[a.test].protcted: unknown key (did you mean 'protected'?)" in problems
    assert "site.toml: limits.max_bodyy: unknown key (did you mean 'max_body'?)" in problems
    assert "site.toml: limits.zzz: unknown key" in problems       # nothing near it


def test_relative_state_paths_resolve_in_the_state_folder(tmp_path, monkeypatch):
    """[auth] store and [acme] storage, when relative: in `[server] state_dir`; else in
    systemd's $STATE_DIRECTORY (the one folder the unit lets nestgate write); else
    beside the config file."""
    conf, state, systemd = tmp_path / "etc", tmp_path / "state", tmp_path / "systemd"
    for folder in (conf, state, systemd):
        folder.mkdir()
    data = {"listen": [{"address": "127.0.0.1:0"}], "site": [{"hosts": ["*"]}],
            "auth": {"store": "nestgate-state.db"}, "acme": {"storage": "certs"}}

    def paths():
        config = parse_config(data, str(conf / "nestgate.toml"), conf)
        return config.auth.store, config.acme.storage

    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    assert paths() == (str(conf / "nestgate-state.db"), str(conf / "certs"))
    monkeypatch.setenv("STATE_DIRECTORY", f"{systemd}:{tmp_path}/other")
    assert paths() == (str(systemd / "nestgate-state.db"), str(systemd / "certs"))
    data["server"] = {"state_dir": "../state"}
    assert paths() == (str(state / "nestgate-state.db"), str(state / "certs"))
    data["auth"]["store"] = str(tmp_path / "kept.db")                # absolute: as written
    assert paths()[0] == str(tmp_path / "kept.db")
    data["server"] = {"state_dir": "../no/such/folder"}
    with pytest.raises(ConfigError) as info:
        paths()
    assert any("server.state_dir: expected a folder" in p for p in info.value.problems)


def test_a_route_of_an_unknown_type_is_one_problem_with_a_suggestion():
    problems = problems_of({"listen": [{"address": "127.0.0.1:0"}], "site": [{"route": [
        {"prefix": "/", "type": "proxi", "upstream": "http://127.0.0.1:9"}]}]})
    assert problems == ["site.toml: site[*].route[0].type: expected one of 'return', "
                        "'redirect', 'static', 'proxy' (did you mean 'proxy'?), got 'proxi'"]


@pytest.mark.parametrize("secret, says", [
    ("otpauth://totp/nas:alice?secret=GEZDGNBVGY3TQOJQGEZDGNBVGY3TQOJQ&issuer=nas",
     "not the otpauth:// URI: give only the value of its secret= parameter"),
    ("3132333435363738393031323334353637383930", "this looks like hex: convert it"),
    ("JBSWY3DPEHPK3PXP", "at least 128 bits (26 base32 characters), got 80 bits"),
    ("not a secret!", "a base32 TOTP secret (letters A-Z and digits 2-7)"),
])
def test_a_totp_secret_that_cannot_serve_says_how_to_fix_it(secret, says):
    problems = problems_of({"listen": [{"address": "127.0.0.1:0"}], "site": [{}],
                            "auth": {"user": [{"name": "alice", "password": "$argon2id$x",
                                               "totp": secret}]}})
    totp = [p for p in problems if ".totp:" in p]
    assert len(totp) == 1 and says in totp[0], problems
    assert secret not in totp[0]                          # a secret is never printed


def test_a_good_totp_secret_passes():
    config = parse_config({"listen": [{"address": "127.0.0.1:0"}], "site": [{}],
                           "auth": {"user": [{"name": "alice", "password": "$argon2id$x",
                                              "totp": "GEZD GNBV GY3T QOJQ GEZD GNBV GY3T QOJQ"}]}},
                          "site.toml")
    assert config.auth.users[0].totp == "GEZDGNBVGY3TQOJQGEZDGNBVGY3TQOJQ"


def _without_noise(config):
    """What a config means, for comparing two spellings of it."""
    return ([(l.host, l.port, l.redirect_https, [(c.managed, c.names) for c in l.certificates])
             for l in config.listeners],
            [(s.hosts, [(r.type, r.path, r.prefix, r.options) for r in s.routes])
             for s in config.sites])


def test_site_shorthands_expand_to_the_tables_they_stand_for(tmp_path):
    (tmp_path / "www").mkdir()
    short = {"site": [
        {"hosts": ["example.com"], "https": "acme", "static": "www"},
        {"hosts": ["media.example.com", "tv.example.com"], "https": "acme",
         "proxy": "http://127.0.0.1:8096"},
        {"hosts": ["nas.home.arpa"], "https": "internal", "proxy": "http://127.0.0.1:5000"}]}
    full = {
        "listen": [{"address": "0.0.0.0:443", "certificate": [
                       {"acme": True, "names": ["example.com", "media.example.com",
                                                "tv.example.com"]},
                       {"internal": True, "names": ["nas.home.arpa"]}]},
                   {"address": "0.0.0.0:80", "redirect_https": True}],
        "site": [
            {"hosts": ["example.com"],
             "route": [{"prefix": "/", "type": "static", "root": "www"}]},
            {"hosts": ["media.example.com", "tv.example.com"],
             "route": [{"prefix": "/", "type": "proxy", "upstream": "http://127.0.0.1:8096"}]},
            {"hosts": ["nas.home.arpa"],
             "route": [{"prefix": "/", "type": "proxy", "upstream": "http://127.0.0.1:5000"}]}]}
    expanded = parse_config(short, str(tmp_path / "a.toml"), tmp_path)
    written = parse_config(full, str(tmp_path / "b.toml"), tmp_path)
    assert _without_noise(expanded) == _without_noise(written)
    assert "listen" not in short                      # the caller's data is left alone


def test_shorthands_use_the_listeners_there_are_and_keep_the_rules(tmp_path):
    data = {"listen": [{"address": "127.0.0.1:8080"}, {"address": "192.168.1.2:443"}],
            "site": [{"hosts": ["a.example"], "https": "internal",
                      "proxy": "http://127.0.0.1:1",
                      "route": [{"prefix": "/", "type": "return", "body": "x"}]}]}
    problems = problems_of(data)
    # A route of its own on "/" beside the shorthand's: the usual refusal names both.
    assert any("site[a.example].route[1].prefix: expected a prefix no other route" in p
               for p in problems), problems
    del data["site"][0]["route"]
    config = parse_config(data, "site.toml", tmp_path)
    assert [(l.host, l.port, [c.managed for c in l.certificates]) for l in config.listeners] \
        == [("127.0.0.1", 8080, []), ("192.168.1.2", 443, ["internal"])]
    assert problems_of({"listen": [{"address": "127.0.0.1:0"}],
                        "site": [{"https": "letsencrypt"}]}) == [
        "site.toml: site[*].https: expected one of '', 'acme', 'internal', got 'letsencrypt'"]


def test_the_embedded_defaults_state_goes_to_the_users_state_folder(tmp_path, monkeypatch):
    """The embedded default sits inside the installed package: its state (the made
    admin token, certificates) goes to $XDG_STATE_HOME/nestgate, made 0700."""
    from nestgate.config import EMBEDDED_DEFAULT
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    config = read_config(EMBEDDED_DEFAULT)
    assert config.acme.storage.startswith(str(tmp_path / "state" / "nestgate") + os.sep)
    assert (tmp_path / "state" / "nestgate").stat().st_mode & 0o777 == 0o700
