"""The route table: exact, prefix and {name} routes, and the raw paths it remembers."""

import pytest

from nestgate.config import parse_config
from nestgate.base.errors import RequestError, RouteTaken
from nestgate.pipeline.routing import (FOUND_LIMIT, FOUND_PATH_MAX, NO_PARAMS, SiteRoutes,
                                       path_shape)


def route(site, raw_path):
    return site.route(raw_path)


def ret(**where) -> dict:
    return {**where, "type": "return", "body": "x"}


@pytest.fixture
def site():
    table = SiteRoutes("test", "not-found")
    table.add_prefix("/files/", "files")
    table.add_prefix("/", "root")
    table.add_exact("/notes/{slug}", "note")
    return table


def test_prefix_routes_are_found_by_longest_prefix_and_remembered(site):
    found = route(site, b"/files/a%20b.txt")
    assert (found.handler, found.params, found.label, found.path) == \
        ("files", NO_PARAMS, "/files/*", "/files/a b.txt")
    assert site.found[b"/files/a%20b.txt"].handler == "files"
    assert route(site, b"/other").handler == "root"


def test_a_new_exact_route_is_not_shadowed_by_a_remembered_prefix_match(site):
    assert route(site, b"/about").handler == "root"
    site.add_exact("/about", "about")
    assert b"/about" not in site.found
    assert site.exact_raw[b"/about"].handler == "about"
    site.remove_exact("/about", "about")
    assert b"/about" not in site.exact_raw and route(site, b"/about").handler == "root"


def test_named_segments_and_long_paths_are_not_remembered(site):
    found = route(site, b"/notes/hello")
    assert found.handler == "note" and found.params == {"slug": "hello"}
    long_path = b"/files/" + b"x" * FOUND_PATH_MAX
    assert route(site, long_path).handler == "files"
    assert b"/notes/hello" not in site.found and long_path not in site.found


def test_remembered_paths_are_bounded(site):
    for i in range(FOUND_LIMIT * 3):
        route(site, b"/files/%d" % i)
        assert len(site.found) <= FOUND_LIMIT


def test_bad_paths_are_refused_every_time(site):
    for _ in range(2):
        with pytest.raises(RequestError):
            route(site, b"/files/a%2fb")
    assert not any(key.startswith(b"/files/a%2") for key in site.found)


def test_every_handler_a_guarded_site_is_given_goes_through_its_guard():
    def guard(handler, access=None, sign_in=True, limit=None, label="", policy=None):
        return ("guarded", handler, access, sign_in, limit, label)
    table = SiteRoutes("private", "not-found", guard)
    table.add_exact("/a", "a")
    table.add_prefix("/files/", "files", access="lan", limit="10/s")
    table.add_exact("/login", "portal", sign_in=False)
    table.add_exact("/notes/{slug}", "note")
    # Added while serving, as notes pages are: guarded all the same.
    table.add_exact("/notes/late", "late")
    assert route(table, b"/a").handler == ("guarded", "a", None, True, None, "/a")
    assert route(table, b"/files/x").handler == \
        ("guarded", "files", "lan", True, "10/s", "/files/*")
    assert route(table, b"/login").handler == ("guarded", "portal", None, False, None, "/login")
    assert route(table, b"/notes/x").handler == \
        ("guarded", "note", None, True, None, "/notes/{slug}")
    assert route(table, b"/notes/late").handler == \
        ("guarded", "late", None, True, None, "/notes/late")
    assert route(table, b"/nowhere").handler == ("guarded", "not-found", None, True, None, "-")


# ---------------------------------------------------------------- one route per path


def test_a_path_that_has_a_route_is_refused_and_the_first_keeps_answering():
    table = SiteRoutes("site", "not-found")
    table.add_exact("/api/v1/health", "health", "health")
    table.add_exact("/n/{slug}", "note")
    with pytest.raises(RouteTaken) as taken:
        table.add_exact("/api/v1/health", "configured", "/api/v1/health")
    assert (taken.value.path, taken.value.taken_by) == ("/api/v1/health", "health")
    with pytest.raises(RouteTaken):
        table.add_exact("/n/{name}", "other")            # the same pattern, named otherwise
    assert route(table, b"/api/v1/health").handler == "health"
    assert route(table, b"/n/x").handler == "note" and route(table, b"/n/x").params == {"slug": "x"}


def test_removing_takes_out_only_the_owners_route():
    table = SiteRoutes("site", "not-found")
    mine, theirs = object(), object()
    table.add_exact("/x", theirs)
    assert table.remove_exact("/x", mine) is False       # not the one added there
    assert route(table, b"/x").handler is theirs
    assert table.remove_exact("/x", theirs) is True
    assert route(table, b"/x").handler == "not-found"
    table.add_exact("/x", mine)                          # free again: anyone may add it
    assert route(table, b"/x").handler is mine
    assert table.remove_exact("/nothing", mine) is False


def test_the_check_knows_every_path_a_site_adds_by_itself(tmp_path):
    """`check` reports clashes from `site_claims`; the route table refuses them when
    built. Both must list the same paths, or a clash would pass `check` and then stop
    the start."""
    from nestgate.config import site_claims
    from nestgate.sites.build import build_router
    from conftest import HASH
    config = parse_config({
        "listen": [{"address": "127.0.0.1:0"}],
        "auth": {"user": [{"name": "demo", "password": HASH}], "store": ":memory:"},
        "site": [{"hosts": ["*"], "protected": True, "home": {"path": "/"},
                  "notes": {"dir": str(tmp_path)},
                  "route": [ret(path="/about"), ret(path="/n/{slug}"), ret(prefix="/files/")]}]})
    table = build_router(config).catch_all
    claimed = {path_shape(value) for kind, value, _key, _what
               in site_claims(config.sites[0], config.server) if kind == "path"}
    assert set(table.owners) == claimed
