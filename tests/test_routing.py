"""The route table: exact, prefix and {name} routes, and the raw paths it remembers."""

import pytest

from nestgate.errors import RequestError
from nestgate.routing import FOUND_LIMIT, FOUND_PATH_MAX, NO_PARAMS, SiteRoutes


def route(site, raw_path):
    return site.route(raw_path)


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
    site.remove_exact("/about")
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
    def guard(handler, access=None, sign_in=True, limit=None, label=""):
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
