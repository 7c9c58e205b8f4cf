"""`nestgate check` on what a self-hoster writes in the first hour: clashes it refuses
(naming the file and both keys), traps it warns about, and the shipped configs."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import textwrap

import psutil
import pytest

from nestgate.config import ConfigError, config_warnings, parse_config

from conftest import HASH, REPO, _env, free_port

LISTEN = {"listen": [{"address": "127.0.0.1:0"}]}


def problems_of(data: dict) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config({**LISTEN, **data}, "site.toml")
    return info.value.problems


def ret(**where) -> dict:
    return {**where, "type": "return", "body": "x"}


def run_check(config, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nestgate", "check", "--config", str(config)],
                          capture_output=True, text=True, timeout=60, env=_env(),
                          cwd=cwd or REPO)


# ---------------------------------------------------------------- clashes


def test_two_sites_with_the_same_host_are_named():
    problems = problems_of({"site": [{"hosts": ["a.example", "b.example"]},
                                     {"hosts": ["B.example"]}]})
    assert problems == ["site.toml: site[b.example].hosts: expected hosts no other site claims, "
                        "got 'b.example' (site[a.example].hosts claims it too)"]


def test_two_catch_all_sites_are_refused():
    problems = problems_of({"site": [{"name": "one"}, {"hosts": ["*"]}]})
    assert problems == ["site.toml: site[1].hosts: expected hosts no other site claims, got "
                        "'*' (site[0].hosts claims it too)"]


def test_a_host_listed_twice_in_one_site_is_refused():
    problems = problems_of({"site": [{"hosts": ["a.example", "a.example"]}]})
    assert problems == ["site.toml: site[a.example].hosts: expected each host once, got 'a.example' twice"]


def test_two_routes_on_the_same_path_or_prefix_are_named():
    problems = problems_of({"site": [{"route": [
        ret(path="/x"), ret(prefix="/p/"), ret(path="/x"), ret(prefix="/p/"),
        ret(path="/n/{slug}"), ret(path="/n/{name}"), ret(prefix="/x")]}]})
    assert problems == [
        "site.toml: site[*].route[2].path: expected a path no other route of the site has, "
        "got '/x' (site[*].route[0].path has it too)",
        "site.toml: site[*].route[3].prefix: expected a prefix no other route of the site "
        "has, got '/p/' (site[*].route[1].prefix has it too)",
        "site.toml: site[*].route[5].path: expected a path no other route of the site has, "
        "got '/n/{name}' (site[*].route[4].path has it too)"]


def test_a_route_on_a_path_the_site_adds_by_itself_is_named(tmp_path):
    problems = problems_of({
        "auth": {"user": [{"name": "demo", "password": HASH}], "store": ":memory:"},
        "site": [{"protected": True, "home": {"path": "/"},
                  "notes": {"dir": str(tmp_path), "api_path": "/notes"},
                  "route": [ret(path="/api/v1/health"), ret(path="/"),
                            ret(path="/notes/feed.xml"), ret(path="/api/v1/notes/{id}"),
                            ret(path="/__auth__/login"), ret(path="/notes/{name}")]}]})
    assert problems == [
        "site.toml: site[*].route[0].path: expected a path no other route of the site has, "
        "got '/api/v1/health' (server.health_path (the health check) has it too)",
        "site.toml: site[*].home.path: expected a path no other route of the site has, "
        "got '/' (site[*].route[1].path has it too)",
        "site.toml: site[*].notes.path: expected a path no other route of the site has, "
        "got '/notes/feed.xml' (site[*].route[2].path has it too)",
        "site.toml: site[*].notes.path: expected a path no other route of the site has, "
        "got '/notes/{slug}' (site[*].route[5].path has it too)",
        "site.toml: site[*].notes.api_path: expected a path no other route of the site has, "
        "got '/notes' (site[*].notes.path (the notes list) has it too)",
        "site.toml: site[*].notes.api_path: expected a path no other route of the site has, "
        "got '/notes/{slug}' (site[*].route[5].path has it too)",
        "site.toml: site[*].protected: expected a path no other route of the site has, "
        "got '/__auth__/login' (site[*].route[4].path has it too)"]


def test_a_site_without_the_health_check_may_route_its_path():
    parse_config({**LISTEN, "site": [{"health": False, "route": [ret(path="/api/v1/health")]}]})


def test_check_names_both_routes_on_one_path(tmp_path):
    config = tmp_path / "nestgate.toml"
    config.write_text(textwrap.dedent(f"""
        [server]
        health_path = "/status"
        [[listen]]
        address = "127.0.0.1:0"
        [[site]]
        hosts = ["*"]
        [site.notes]
        dir = "{tmp_path}"
        api_path = "/status"
        [[site.route]]
        path = "/notes"
        type = "return"
        body = "mine"
    """))
    out = run_check(config)
    assert out.returncode == 2, out.stderr
    assert f"{config}: site[*].notes.path: expected a path no other route of the site has, " \
        "got '/notes' (site[*].route[0].path has it too)" in out.stderr
    assert f"{config}: site[*].notes.api_path: expected a path no other route of the site " \
        "has, got '/status' (server.health_path (the health check) has it too)" in out.stderr


def test_the_same_path_on_two_sites_is_fine():
    parse_config({**LISTEN, "site": [{"hosts": ["a.example"], "route": [ret(path="/x")]},
                                     {"hosts": ["b.example"], "route": [ret(path="/x")]}]})


def test_check_and_serve_refuse_a_clash(tmp_path):
    config = tmp_path / "nestgate.toml"
    config.write_text(textwrap.dedent("""
        [[listen]]
        address = "127.0.0.1:0"
        [[site]]
        hosts = ["*"]
        [[site]]
        hosts = ["*"]
    """))
    out = run_check(config)
    assert out.returncode == 2 and "site[1].hosts" in out.stderr and str(config) in out.stderr
    serve = subprocess.run([sys.executable, "-m", "nestgate", "serve", "--config", str(config)],
                           capture_output=True, text=True, timeout=60, env=_env())
    assert serve.returncode == 2 and "site[1].hosts" in serve.stderr


# ---------------------------------------------------------------- warnings


def protected(hosts: list[str], **extra) -> dict:
    return {**LISTEN, "auth": {"user": [{"name": "demo", "password": HASH}], "store": ":memory:"},
            "site": [{"name": "private", "hosts": hosts, "protected": True,
                      "route": [ret(prefix="/")]}], **extra}


def test_sign_in_over_plain_http_on_a_real_name_is_warned_about():
    config = parse_config(protected(["private.localhost", "private.test"]), "gw.toml")
    [warning] = config_warnings(config)
    assert warning.startswith("gw.toml: site[private.localhost]: protected, but reachable only over "
                              "plain HTTP as 'private.test'")
    assert "cookie_secure" in warning and "redirect_https" in warning


@pytest.mark.parametrize("data", [
    protected(["private.localhost", "localhost", "127.0.0.1"]),     # browsers keep it there
    protected(["private.test"], auth={"user": [{"name": "demo", "password": HASH}],
                                      "store": ":memory:", "cookie_secure": False}),
    protected(["private.test"], client_ip={"trusted_proxies": ["10.0.0.1"]}),
    protected(["private.test"], listen=[{"address": "127.0.0.1:0", "redirect_https": True}]),
])
def test_no_warning_where_the_cookie_comes_back(data):
    assert config_warnings(parse_config(data, "gw.toml")) == []


def test_notes_without_base_url_are_warned_about(tmp_path):
    data = {**LISTEN, "site": [{"notes": {"dir": str(tmp_path)}}]}
    [warning] = config_warnings(parse_config(data, "s.toml"))
    assert warning.startswith("s.toml: site[*].base_url: the Atom feed at /notes/feed.xml")
    data["site"][0]["base_url"] = "https://example.com"
    assert config_warnings(parse_config(data, "s.toml")) == []


def test_a_static_root_on_a_system_folder_is_warned_about(tmp_path):
    """`root = "/"` (or /etc, /home...) serves every file the server may read there."""
    def warnings(root):
        return config_warnings(parse_config({**LISTEN, "site": [{"route": [
            {"prefix": "/", "type": "static", "root": root}]}]}, "s.toml"))
    for root in ("/", "/etc", "/home", "/var", "/etc/../usr"):
        [warning] = warnings(root)
        assert warning.startswith("s.toml: site[*].route[0].root: '/") and \
            "serves the whole of a system folder" in warning, root
    assert warnings(str(tmp_path)) == [] and warnings("/usr/share") == []


@pytest.mark.parametrize("entry", ["0.0.0.0/0", "::/0", "::ffff:0:0/96", "0.0.0.0/0 "])
def test_an_allow_entry_holding_every_address_is_warned_about(entry):
    data = {**LISTEN, "site": [{"allow": ["10.0.0.0/8", entry], "route": [
        ret(path="/a", allow=[entry]), ret(path="/b", allow=["192.168.0.0/16"])]}]}
    assert config_warnings(parse_config(data, "s.toml")) == [
        f"s.toml: {where}.allow: {entry!r} holds every address, so the list lets anyone in; "
        "remove the allow list to mean that, or name the networks meant"
        for where in ("site[*]", "site[*].route[0]")]
    data["site"][0]["allow"] = ["0.0.0.0/1", "128.0.0.0/1", "::/1"]   # wide, not all
    data["site"][0]["route"] = [ret(path="/a")]
    assert config_warnings(parse_config(data, "s.toml")) == []


def test_check_warns_about_an_open_root_and_allow_list_and_still_passes(tmp_path):
    config = tmp_path / "nestgate.toml"
    config.write_text('[[listen]]\naddress = "127.0.0.1:0"\n[[site]]\nallow = ["::/0"]\n'
                      '[[site.route]]\nprefix = "/"\ntype = "static"\nroot = "/"\n')
    out = run_check(config)
    assert out.returncode == 0, out.stderr
    assert "site[*].allow: '::/0' holds every address" in out.stderr
    assert "site[*].route[0].root: '/' serves the whole of a system folder" in out.stderr
    assert out.stdout.strip().endswith("2 warnings above)")


PLAIN_SIGN_IN = f"""
[[listen]]
address = "127.0.0.1:0"
[auth]
[[auth.user]]
name = "demo"
password = "{HASH}"
[[site]]
hosts = ["private.localhost", "private.test"]
protected = true
[[site.route]]
prefix = "/"
type = "return"
"""


def test_check_prints_warnings_and_still_passes(tmp_path):
    config = tmp_path / "nestgate.toml"
    config.write_text(PLAIN_SIGN_IN)
    out = run_check(config)
    assert out.returncode == 0, out.stderr
    assert "warning:" in out.stderr and "'private.test'" in out.stderr
    assert out.stdout.strip().endswith("1 warning above)")


def test_serve_prints_the_warnings_at_start(start_server):
    server = start_server(PLAIN_SIGN_IN)
    line = server.wait_for("warning:")
    assert "site[private.localhost]: protected, but reachable only over plain HTTP" in line


# ---------------------------------------------------------------- shipped configs


def _warnings_but_taken_ports(stderr: str) -> list[str]:
    """Warnings other than "this port is taken now": the machine running the tests may
    have a nestgate (or anything else) on the examples' ports; that is its state, not
    the config's."""
    return [line for line in stderr.splitlines()
            if "warning" in line and "`serve` would fail on it now" not in line]


@pytest.mark.parametrize("name", ["site.toml", "home-server.toml", "home.toml"])
def test_shipped_examples_pass_check_without_warnings(name, tmp_path):
    # A copy, its TLS key made 0600 as the example's comment says: git keeps no such
    # mode, so a checkout's key is as the umask made it, which `check` warns of.
    examples = tmp_path / "examples"
    shutil.copytree(REPO / "examples", examples)
    for key in examples.rglob("*.key"):
        key.chmod(0o600)
    out = run_check(examples / name, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert _warnings_but_taken_ports(out.stderr) == [], out.stderr


def test_a_taken_port_is_reported_with_the_program_holding_it(tmp_path):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    config = tmp_path / "nestgate.toml"
    config.write_text(f'[[listen]]\naddress = "127.0.0.1:{port}"\n\n[[site]]\nhosts = ["*"]\n')
    try:
        out = run_check(config)
    finally:
        holder.close()
    assert out.returncode == 0, out.stderr
    name = psutil.Process().name()
    assert f"cannot bind 127.0.0.1:{port} (Address already in use), held by {name} " \
           f"(pid {os.getpid()}): `serve` would fail on it now" in out.stderr, out.stderr


def test_checking_the_config_of_the_running_nestgate_warns_of_nothing(start_server, tmp_path):
    """Its own listening sockets are not "taken": a reload keeps them."""
    port = free_port()
    server = start_server(f'[[listen]]\naddress = "127.0.0.1:{port}"\n\n[[site]]\n'
                          'hosts = ["*"]\n\n[[site.route]]\npath = "/"\ntype = "return"\n'
                          'body = "ok"\n')
    assert server.port() == port
    out = run_check(server.config_path, cwd=tmp_path)
    assert out.returncode == 0 and "warning" not in out.stderr, out.stderr


def test_https_home_server_example_passes_check():
    """Ports 80 and 443 may be taken on the machine running the tests: that warning,
    and only that one, is allowed."""
    out = run_check(REPO / "examples" / "home-server-https.toml")
    assert out.returncode == 0, out.stderr
    warnings = [l for l in out.stderr.splitlines() if "warning" in l]
    assert all("`serve` would fail on it now" in l for l in warnings), out.stderr


def test_embedded_default_passes_check_without_warnings(tmp_path):
    out = subprocess.run([sys.executable, "-m", "nestgate", "check"], capture_output=True,
                         text=True, timeout=60, env=_env(), cwd=tmp_path)
    assert out.returncode == 0 and _warnings_but_taken_ports(out.stderr) == [], out.stderr


def test_readme_minimal_config_passes_check(tmp_path):
    readme = (REPO / "README.md").read_text()
    start = readme.index("```toml\n", readme.index("A minimal `nestgate.toml`")) + len("```toml\n")
    (tmp_path / "nestgate.toml").write_text(readme[start:readme.index("```", start)])
    out = run_check(tmp_path / "nestgate.toml", cwd=tmp_path)
    assert out.returncode == 0, out.stderr


def test_home_server_store_is_kept_out_of_the_repository(tmp_path):
    example = tmp_path / "examples"
    shutil.copytree(REPO / "examples", example)
    from nestgate.config import read_config
    store = read_config(example / "home-server.toml").auth.store
    assert not store.startswith(str(example)), store


def test_the_common_home_setup_takes_under_25_lines():
    """A site, two services behind sign-in, HTTPS: shorter than the Caddyfile's 21 lines
    plus what nestgate adds (a user), thanks to the site shorthands."""
    text = (REPO / "examples" / "home.toml").read_text()
    assert len(text.splitlines()) < 25
    assert text.count('https = "acme"') == 3 and text.count("protected = true") == 2


# ---------------------------------------------------------------- files and text check cannot read


def test_files_that_loop_hold_nul_or_nest_too_deep_are_problems_of_their_key(tmp_path):
    """A symbolic link to itself, a NUL in a file name, arrays nested 5,000 deep and an
    integer of 100,000 digits each made `check` print a traceback (RuntimeError,
    ValueError, RecursionError from the standard library) instead of a problem."""
    (tmp_path / "loop").symlink_to("loop")
    site = '[[listen]]\naddress = "127.0.0.1:0"\n[[site]]\nhosts = ["*"]\n' \
           '[[site.route]]\npath = "/"\ntype = "return"\n'
    cases = {
        'body_file = "loop"\n':
            "site[*].route[0].body_file: expected a path to a readable file, got 'loop'",
        'body_file = "a\\u0000b"\n':
            "site[*].route[0].body_file: expected a path without a NUL character",
        'body = "x"\n[auth]\nstore = "a\\u0000b"\n':
            "auth.store: expected a path without a NUL character",
        'body = "x"\n[admin]\naudit_log = "loop/x"\n':
            "admin.audit_log: expected a file in a writable directory",
        'body = "x"\nx = ' + "[" * 5000 + "]" * 5000 + "\n": ": not valid TOML: nested too deeply",
        'body = "x"\nx = ' + "9" * 100_000 + "\n":
            ": not valid TOML: an integer of more than 4300 digits",
    }
    for tail, said in cases.items():
        config = tmp_path / "nestgate.toml"
        config.write_text(site + tail)
        out = run_check(config)
        assert out.returncode == 2 and f"{config}{'' if said[0] == ':' else ': '}{said}" \
            in out.stderr, out.stderr
        assert "Traceback" not in out.stderr
    # A byte-order mark (some editors write one) is no problem.
    config.write_text("\ufeff" + site + 'body = "x"\n')
    assert run_check(config).returncode == 0


@pytest.mark.parametrize(("host", "said"), [
    ("bücher.test", "an ASCII name (a Unicode name in its IDNA form: xn--bcher-kva.test)"),
    ("*.bücher.test", "IDNA form: *.xn--bcher-kva.test"),
    ("example.com.", "a name without the trailing dot (example.com)"),
    ("example.com:8443", "a name without a port"),
    ("a..test", "labels of 1 to 63 characters"),
    ("a" * 64 + ".test", "labels of 1 to 63 characters"),
    ("-a.test", "none starting or ending with -"),
    ("*.*.test", "none starting or ending with -"),
    ("[::g]", "an IPv6 address in brackets"),
])
def test_host_names_no_request_could_match_are_refused_with_the_reason(host, said):
    """Such names were taken, and then no request ever reached the site (a Host header
    is ASCII, and is compared without its port and trailing dot), nor could a CA
    certify them."""
    [problem] = problems_of({"site": [{"hosts": [host], "route": [ret(path="/")]}]})
    assert problem.startswith("site.toml: site[0].hosts: expected host names") \
        and said in problem and repr(host) in problem, problem


@pytest.mark.parametrize("host", ["127.0.0.1", "[::1]", "my_host.lan", "Example.COM",
                                  "*.example.com", "localhost"])
def test_host_names_requests_carry_are_taken(host):
    config = parse_config({**LISTEN, "site": [{"hosts": [host], "route": [ret(path="/")]}]},
                          "site.toml")
    assert config.sites[0].hosts == (host.lower(),)


def test_an_address_among_the_hosts_is_not_ordered_from_the_ca(tmp_path):
    """A client sends no SNI for an address, and a CA certifies DNS names: an address
    in a site's hosts is left out of the ACME certificate's names, like localhost."""
    config = parse_config({
        "listen": [{"address": "127.0.0.1:0", "certificate": [{"acme": True}]}],
        "acme": {"email": "ops@example.com", "storage": str(tmp_path / "certs")},
        "site": [{"hosts": ["a.example.com", "192.0.2.7", "[2001:db8::1]"],
                  "route": [ret(path="/")]}]}, "site.toml")
    assert config.listeners[0].certificates[0].names == ("a.example.com",)


# ---------------------------------------------------------------- secret files


def test_secret_files_others_can_read_are_warned_about_at_load(start_server, certs, tmp_path):
    """As ssh warns of a private key others can read: a TLS key, the admin token file
    and a users file (password hashes, TOTP secrets) that the group or other users may
    read are named once each, with their mode, by `serve` at start and by `check`.
    Before: not a word."""
    cert, key = certs["local"]
    key_copy = tmp_path / "site.key"
    key_copy.write_bytes(open(key, "rb").read())
    token = tmp_path / "admin.token"
    token.write_text("a-token-long-enough-for-the-admin-api-0123456789\n")
    users = tmp_path / "users.toml"
    users.write_text(f'[[user]]\nname = "ann"\npassword = "{HASH}"\n')
    modes = {key_copy: 0o644, token: 0o640, users: 0o604}
    for path, mode in modes.items():
        path.chmod(mode)
    server = start_server(f"""
[server]
workers = 1
[[listen]]
address = "127.0.0.1:0"
[[listen.certificate]]
cert = "{cert}"
key = "{key_copy}"
[admin]
address = "127.0.0.1:0"
token_file = "{token}"
[auth]
store = ":memory:"
users_file = "{users}"
[[site]]
hosts = ["*"]
""")
    warned = [line for line in server.lines if "warning:" in line]
    for path, mode in modes.items():
        mine = [line for line in warned if f" {path} can be read by other users" in line]
        assert len(mine) == 1, warned
        assert f"(mode {mode:04o}); `chmod 600` it" in mine[0]
    assert "listen[0].certificate[0].key:" in "".join(warned)
    assert "admin.token_file:" in "".join(warned) and "auth.users_file:" in "".join(warned)
    out = run_check(server.config_path, cwd=tmp_path)
    assert out.returncode == 0 and out.stderr.count("can be read by other users") == 3, \
        out.stderr
    for path in modes:
        path.chmod(0o600)
    out = run_check(server.config_path, cwd=tmp_path)
    assert out.returncode == 0 and "can be read by other users" not in out.stderr, out.stderr
