"""The route table: exact, prefix and {name} routes, and the raw paths it remembers."""

import pytest

from nestgate.errors import RequestError
from nestgate.routing import FOUND_LIMIT, FOUND_PATH_MAX, NO_PARAMS, SiteRoutes
from nestgate.worker import ServerContext

route = ServerContext.route_slow


@pytest.fixture
def site():
    table = SiteRoutes("test", "not-found")
    table.add_prefix("/files/", "files")
    table.add_prefix("/", "root")
    table.add_exact("/notes/{slug}", "note")
    return table


def test_prefix_routes_are_found_by_longest_prefix_and_remembered(site):
    assert route(site, b"/files/a%20b.txt") == ("files", NO_PARAMS, "/files/*", "/files/a b.txt")
    assert site.found[b"/files/a%20b.txt"][0] == "files"
    assert route(site, b"/other")[0] == "root"


def test_a_new_exact_route_is_not_shadowed_by_a_remembered_prefix_match(site):
    assert route(site, b"/about")[0] == "root"
    site.add_exact("/about", "about")
    assert b"/about" not in site.found
    assert site.exact_raw[b"/about"][0] == "about"
    site.remove_exact("/about")
    assert b"/about" not in site.exact_raw and route(site, b"/about")[0] == "root"


def test_named_segments_and_long_paths_are_not_remembered(site):
    handler, params, _, _ = route(site, b"/notes/hello")
    assert handler == "note" and params == {"slug": "hello"}
    long_path = b"/files/" + b"x" * FOUND_PATH_MAX
    assert route(site, long_path)[0] == "files"
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
