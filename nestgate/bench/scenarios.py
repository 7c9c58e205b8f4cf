"""The scenario table: what is requested, how, and what every peer must serve for it.

A scenario names one `Route` in neutral terms (health, a file, a static directory, a proxy,
notes); each peer renders that route into its own config (see peers.py). Adding a scenario
is one entry here; adding a kind of route is one renderer per peer. A scenario whose
nestgate feature is missing is skipped with a message, not failed (see runner.py).
"""

from dataclasses import dataclass

HEALTH = "/api/v1/health"
# The session a private scenario's requests carry: made in the store before the run.
BENCH_SESSION = "bench-session-token-not-a-secret-0123456789"
SESSION_COOKIE = f"Cookie: nestgate_session={BENCH_SESSION}"


@dataclass(frozen=True)
class Route:
    kind: str           # "health" | "file" | "static" | "proxy" | "notes"
    path: str           # exact path, or a prefix ending in "/"
    source: str = ""    # file: content name; proxy: backend path prefix


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    route: Route
    request: str                        # the path the driver requests
    driver: str = "wrk"                 # "wrk" | "h2load" | "h3py" | "cold" | "write"
    tls: bool = False
    connections: int = 64
    streams: int = 1                    # h2load -m
    host: str = ""                      # Host header; "" = the URL's
    headers: tuple[str, ...] = ()       # more request headers, "Name: value"
    expect_status: int = 200
    nestgate_only: bool = False         # no peer does the same work (notes write path)
    needs: str = ""                     # nestgate feature it depends on, for skip messages
    sweep: bool = False                 # part of the concurrency sweep when asked for
    rate_limit: tuple[int, int] | None = None   # (requests per second, burst) on the route
    state: str = ""                     # behind sign-in, sessions in "sqlite" or "redis"
    policy: bool = False                # behind sign-in: the site admits one group only
    bans: int = 0                       # bans in the table (none of them the driver's)

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"


_health = Route("health", HEALTH)
_page = Route("file", "/page", "page.html")
_static = Route("static", "/static/")
_notes = Route("notes", "/notes")
_proxy = Route("proxy", "/proxy/", "/")

SCENARIOS: tuple[Scenario, ...] = (
    Scenario("health", "small response: the health JSON, HTTP/1.1", _health, HEALTH, sweep=True),
    # A limit far above what the load reaches: what checking one costs per request. Run
    # right after `health`, its baseline, so that the two see the same machine.
    Scenario("health-limited", "health JSON behind a per-client rate limit that never "
             "refuses (nginx: limit_req, its JSON served as a file)", _health, HEALTH,
             rate_limit=(1_000_000, 1_000_000), needs="rate limits"),
    # 10,000 bans in the table: what the lookup at accept costs a client not banned
    # (the drivers keep their connections, so it is paid once per connection).
    Scenario("health-bans-10k", "health JSON with 10,000 bans in the table (nginx: none)",
             _health, HEALTH, bans=10_000, needs="bans"),
    Scenario("page", "cached page (~11 KB), HTTP/1.1", _page, "/page", needs="return body_file"),
    Scenario("page-br", "cached page (~11 KB) asked with Accept-Encoding: br, gzip "
             "(nginx: its gzip_static file)", _page, "/page",
             headers=("Accept-Encoding: br, gzip",), needs="compression"),
    Scenario("static-12b", "static file 12 B", _static, "/static/f12b.txt", needs="static files"),
    Scenario("static-10k", "static file 10 KB", _static, "/static/f10k.bin", needs="static files"),
    Scenario("static-100k", "static file 100 KB", _static, "/static/f100k.bin", needs="static files"),
    Scenario("static-1m", "static file 1 MB (sendfile)", _static, "/static/f1m.bin",
             connections=16, needs="static files"),
    Scenario("notes-list", "notes list, warm cache", _notes, "/notes", needs="notes"),
    Scenario("notes-page", "note page (~10 KB), warm cache", _notes, "/notes/medium-note",
             needs="notes"),
    Scenario("notes-detail", "note page (~25 KB), warm cache", _notes, "/notes/long-note",
             needs="notes"),
    Scenario("notes-cold", "note page, first request after a write (cache invalidated)", _notes,
             "/notes/long-note", driver="cold", nestgate_only=True, needs="notes"),
    Scenario("notes-write", "notes write path: sequential PUT with fsync", _notes,
             "/api/v1/notes/bench-write", driver="write", nestgate_only=True, needs="notes API"),
    Scenario("proxy-2b", "reverse proxy, 2 B answers, keep-alive both sides", _proxy,
             "/proxy/2b", needs="reverse proxy"),
    Scenario("proxy-4k", "reverse proxy, 4 KB answers, keep-alive both sides", _proxy,
             "/proxy/4k", needs="reverse proxy"),
    # The proxy-4k route behind sign-in, each request with a valid session cookie: what
    # the session check costs (nginx, with no sign-in of its own, proxies as in proxy-4k).
    Scenario("private-proxy-4k", "proxy-4k behind sign-in, a valid session cookie, SQLite "
             "state (nginx: no sign-in)", _proxy, "/proxy/4k", headers=(SESSION_COOKIE,),
             state="sqlite", needs="sign-in"),
    # The same with a group policy on the site: what deciding the user's group costs.
    Scenario("private-proxy-4k-policy", "private-proxy-4k on a site that admits one group "
             "(allow_groups; nginx: no sign-in)", _proxy, "/proxy/4k",
             headers=(SESSION_COOKIE,), state="sqlite", policy=True, needs="user policies"),
    Scenario("private-proxy-4k-redis", "proxy-4k behind sign-in, a valid session cookie, "
             "state in Redis (nginx: no sign-in)", _proxy, "/proxy/4k",
             headers=(SESSION_COOKIE,), state="redis", needs="Redis state"),
    Scenario("https-health", "health JSON over HTTPS (TLS 1.3), HTTP/1.1", _health, HEALTH,
             tls=True),
    Scenario("https-page", "cached page (~11 KB) over HTTPS (TLS 1.3), HTTP/1.1", _page,
             "/page", tls=True, needs="return body_file"),
    Scenario("h2-health", "health JSON over HTTP/2 + TLS 1.3 (h2load -c64 -m10)", _health, HEALTH,
             driver="h2load", tls=True, streams=10, needs="HTTP/2"),
    # No HTTP/3 load tool is packaged here (Debian 12's h2load has no --h3): a Python
    # aioquic client drives it (nestgate.bench.h3load), nestgate only, and is the
    # bottleneck itself; compare its rounds with each other, not with h2-health's.
    Scenario("h3-health", "health JSON over HTTP/3 (QUIC), Python aioquic client "
             "(-c8 -m10), not comparable with h2load's figures", _health, HEALTH,
             driver="h3py", tls=True, connections=8, streams=10, nestgate_only=True,
             needs="HTTP/3"),
    Scenario("h2-page", "cached page (~11 KB) over HTTP/2 + TLS 1.3 (h2load -c64 -m10)", _page,
             "/page", driver="h2load", tls=True, streams=10, needs="HTTP/2"),
    # 16 x 4 streams in flight: as many as each server keeps upstream connections
    # alive (64), as proxy-4k's 64 connections; more would measure connection churn.
    Scenario("h2-proxy-4k", "reverse proxy, 4 KB answers, HTTP/2 + TLS 1.3 client (h2load "
             "-c16 -m4), HTTP/1.1 upstream with keep-alive", _proxy, "/proxy/4k",
             driver="h2load", tls=True, connections=16, streams=4, needs="HTTP/2"),
    Scenario("https-404-cidr", "HTTPS 404 for an unmatched Host, 1,000-entry CIDR list checked",
             _health, "/no-such-page", tls=True, host="unknown.example", expect_status=404,
             needs="access lists"),
)

BY_NAME = {s.name: s for s in SCENARIOS}
QUICK = ("health", "https-health")
STANDARD = tuple(s.name for s in SCENARIOS)


def select(names: list[str] | None, quick: bool) -> list[Scenario]:
    if not names:
        names = list(QUICK if quick else STANDARD)
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise ValueError(f"unknown scenario {', '.join(unknown)}; known: {', '.join(BY_NAME)}")
    return [BY_NAME[n] for n in names]
