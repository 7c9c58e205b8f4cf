"""The admin listener's endpoints, and the token gate in front of them.

    GET /v1/health   liveness: 200 while the admin process answers (no token needed)
    GET /v1/ready    200 when the current generation's workers all listen, else 503
    GET /metrics     the Prometheus text exposition (nestgate.admin.metrics)
    /v1/allow, /v1/sessions, /v1/passkeys   the shared store's state (nestgate.admin.stateapi)
    /v1/oidc/*       the OpenID provider's clients and grants (nestgate.admin.oidcapi)
    GET /v1/users    the serving config's users and groups (never a hash or a secret)
    GET /v1/providers  its OpenID providers for "Sign in with ..." (never a client secret)
    GET /docs/json   the OpenAPI 3.1 document of all of these (nestgate.admin.openapi)
    /v1/config       the config, its validation and reload (nestgate.admin.configapi)
    GET /v1/status   version, uptime, config file and hash, generations, each worker's
                     figures (pid, uptime, open connections, requests served), listeners,
                     recent reloads

Every answer is JSON; an error is `{"error": {"code", "message", "details"}}`.
"""

from __future__ import annotations

import hmac
import json
import sys
import time
from pathlib import Path

from nestgate import __version__
from nestgate.admin import metrics
from nestgate.admin.answers import AnswerCounts
from nestgate.admin.guessing import Guesses, Held, given_token
from nestgate.admin.origin import OwnAddress, SameOrigin, ip_loopback
from nestgate.admin.stateapi import AllowList, Passkeys, ProviderBindings, Sessions
from nestgate.admin.configapi import ConfigAPI
from nestgate.admin.operations import Operations
from nestgate.admin.replies import error, method_not_allowed, reply
from nestgate.base.clock import CLOCK
from nestgate.base.handler import GATED, ReadyChoice
from nestgate.base.responses import Prebuilt
from nestgate.pipeline.routing import Router, SiteRoutes

NOT_FOUND = error(404, "not_found", "no such endpoint on the admin listener")
METHOD = method_not_allowed("GET, HEAD")
NO_TOKEN = error(401, "unauthorized", "send Authorization: Bearer <token>",
                 headers=[("www-authenticate", 'Bearer realm="nestgate-admin"')])
NO_TOKEN_SET = error(403, "forbidden", "no admin token is set, and only loopback clients "
                     "are answered without one; set [admin] token to reach it from "
                     "elsewhere")


class TokenGate:
    """In front of every endpoint but liveness (behind the Host and Origin checks of
    nestgate.admin.origin). `Authorization: Bearer` compared in constant time; a right
    token is always admitted, a wrong one is counted and its answer held
    (nestgate.admin.guessing); a request with no Authorization at all gets 401 at once
    and is not counted. With `loopback_without_token`, loopback clients need none."""

    is_async = GATED
    __slots__ = ("inner", "token", "guesses", "loopback_free")

    def __init__(self, inner, token: bytes, guesses: Guesses, loopback_free: bool) -> None:
        self.inner = inner
        self.token = token
        self.guesses = guesses              # shared by the gates and the status page
        self.loopback_free = loopback_free

    def admit(self, conn, headers):
        client = conn.client
        if self.loopback_free and ip_loopback(client):
            return self.inner
        if not self.token:
            return NO_TOKEN_SET
        given = given_token(headers)
        if not given:
            # Not an attempt: a browser's own requests (favicon.ico, a page opened
            # before signing in) must not count against anyone.
            return NO_TOKEN
        if hmac.compare_digest(given, self.token):
            return self.inner
        hold, over = self.guesses.failed(client)
        if over:
            wait = self.guesses.retry_after(client)
            refusal = error(429, "too_many_attempts", "too many failed token checks from "
                            "this client; its wrong tokens are answered slowly",
                            {"retry_after_s": wait}, [("retry-after", str(wait))])
        else:
            refusal = NO_TOKEN
        return Held(refusal, hold) if hold else refusal


class Endpoint:
    """A GET endpoint answering what `produce()` -> (status, value) makes: JSON, or
    bytes as they are in `content_type`."""

    is_async = True
    __slots__ = ("produce", "content_type")

    def __init__(self, produce, content_type: str = "application/json") -> None:
        self.produce = produce
        self.content_type = content_type

    async def handle(self, request) -> None:
        if request.method not in (b"GET", b"HEAD"):
            await request.send_prebuilt(METHOD)
            return
        status, value = self.produce()
        if not isinstance(value, bytes):
            await reply(request, status, value)
            return
        request.start(status, [("content-type", self.content_type),
                               ("cache-control", "no-store")], len(value))
        if request.method == b"GET":
            await request.write(value)
        request.end()


class AdminState:
    """What the admin process knows: the supervisor's latest report and the workers'
    shared table; and where it writes the audit of changes made through it."""

    def __init__(self, table, audit_log: str = "-", token_set: bool = False) -> None:
        self.table = table
        self.report: dict = {}
        self.audit_log = audit_log
        self.token_set = token_set
        from nestgate.admin.page import History
        self.history = History()          # for the status page's chart
        self.answers = AnswerCounts()     # the sites' answers, over every worker
        self.store_counts = None          # () -> (allow entries, live sessions), or None
        self.bans_active = None           # () -> {origin: bans in force}, or None

    def reported(self, report: dict) -> None:
        """A report from the supervisor (about once a second): keep it, and a sample of
        the requests served for the status page."""
        for pid, tally in report.pop("departed", ()):
            self.answers.depart(pid, tally)
        self.report = report
        self.history.add(sum(f.requests for f in self.table.read()))
        self.answers.refresh(self.table)

    def audit(self, request, action: str, details: dict) -> None:
        """One JSON line per change: when, who (the token, or a loopback client when
        there is none), from where, what."""
        record = {"time": round(time.time(), 3), "who": "token" if self.token_set else
                  "loopback", "client": request.client, "action": action, **details}
        line = json.dumps(record, separators=(",", ":"), ensure_ascii=True) + "\n"
        if self.audit_log in ("-", ""):
            sys.stderr.write("nestgate: audit " + line)
            sys.stderr.flush()
            return
        try:
            with open(self.audit_log, "a", encoding="ascii") as f:
                f.write(line)
        except OSError as exc:
            sys.stderr.write(f"nestgate: audit log {self.audit_log}: {exc.strerror}; "
                             "the record: " + line)

    # ------------------------------------------------------------ answers
    def health(self):
        return 200, {"status": "ok"}

    def ready(self):
        """Ready when every worker of the serving generation is up and every listener
        bound. The upstreams' state is shown but does not make nestgate unready: one
        app that is down must not take the front door out of a load balancer."""
        self.answers.refresh(self.table)
        upstreams = [{key: u[key] for key in ("route", "upstream", "healthy",
                                               "failing_in_workers", "last_check")}
                     for u in self.answers.upstreams()]
        now = time.time()
        certificates = [{**c, "expires_in_days": round((c["not_after"] - now) / 86400, 1)}
                        if "not_after" in c else c
                        for c in self.report.get("certificates", ())]
        shown = {"upstreams": upstreams, "certificates": certificates}
        reasons = self.not_ready()
        if reasons:
            return 503, {"ready": False, "reasons": reasons, **shown}
        return 200, {"ready": True, "generation": self.report.get("generation"), **shown}

    def serving_pids(self) -> list[int]:
        """The workers of the serving generation that are up."""
        current = self.report.get("generation")
        return [w["pid"] for g in self.report.get("generations", ()) if g["number"] == current
                for w in g["workers"] if w["pid"]]

    def not_ready(self) -> list[str]:
        report = self.report
        if not report:
            return ["no report from the supervisor yet"]
        if report.get("stopping"):
            return ["stopping"]
        current = report.get("generation")
        if current is None:
            return ["no generation of workers has started serving yet"]
        generation = next((g for g in report["generations"] if g["number"] == current), None)
        reasons = []
        if generation is None:
            return [f"generation {current} is gone"]
        for worker in generation["workers"]:
            if not worker["pid"]:
                reasons.append(f"worker slot {worker['slot']} is restarting")
            elif not worker["ready"]:
                reasons.append(f"worker {worker['pid']} is starting")
        for listener in report.get("listeners", ()):
            if not listener.get("bound"):
                reasons.append(f"listener {listener['address']} is not bound")
        return reasons

    def metrics(self):
        self.answers.refresh(self.table)
        return 200, metrics.render(self)

    def users(self):
        """The users of the config the workers serve, as the supervisor reports them
        (so a users file re-read at a reload shows at once)."""
        return 200, {"users": self.report.get("users", [])}

    def oidc_clients(self):
        """The OpenID provider's clients of the config the workers serve."""
        return 200, {"clients": self.report.get("oidc_clients", [])}

    def providers(self):
        """The OpenID providers of the config the workers serve ([[auth.oidc]])."""
        return 200, {"providers": self.report.get("providers", [])}

    def status(self):
        report = self.report
        now = CLOCK.wall
        figures = {f.pid: f for f in self.table.read()}
        generations = []
        for gen in report.get("generations", ()):
            workers = []
            for worker in gen["workers"]:
                shown = {"pid": worker["pid"], "ready": worker["ready"],
                         "restarts": worker["restarts"]}
                fig = figures.get(worker["pid"])
                if fig is not None and fig.generation == gen["number"]:
                    shown.update(
                        # (the admin's ticking clock may be a tick behind a worker
                        # that has just started)
                        uptime_s=round(max(0.0, now - fig.started), 1),
                        requests=fig.requests,
                        connections={"http1": fig.http1, "http2": fig.http2,
                                      "tls": fig.tls, "tls_handshakes": fig.handshakes},
                        figures_age_s=round(max(0.0, now - fig.updated), 1))
                workers.append(shown)
            generations.append({"number": gen["number"], "ready": gen["ready"],
                                "stopping": gen["stopping"], "workers": workers})
        started = report.get("started", now)
        return 200, {
            "version": __version__,
            "pid": report.get("pid"),
            "uptime_s": round(max(0.0, now - started), 1),
            "config": report.get("config", {}),
            "generation": report.get("generation"),
            "generations": generations,
            "listeners": report.get("listeners", []),
            "worker_restarts": report.get("restarts", 0),
            "reloads": report.get("reloads", []),
        }


def admin_router(state: AdminState, config, store_path: str = "") -> Router:
    """The admin listener's only site, for every Host that names it (nestgate.admin.
    origin): a request on it never reaches a site's routes, and a site's Host gets
    the admin's 421."""
    admin = config.admin
    own = OwnAddress(admin.scheme, admin.host, admin.allowed_hosts)
    guesses = Guesses()
    secret = admin.token.encode()
    body_types = {"/v1/config/validate": b"application/toml",
                  "/login": b"application/x-www-form-urlencoded"}

    def guard(handler, access=None, sign_in: bool = True, limit=None, label: str = "",
              policy=None):
        # Liveness is open to every client and Host (probes); the status page decides
        # its access itself; everything else needs the token. All but liveness are
        # behind the Host, Origin and Content-Type checks.
        if label == "/v1/health":
            return handler
        if sign_in:
            handler = TokenGate(handler, secret, guesses, admin.loopback_without_token)
        return SameOrigin(handler, own, body_types.get(label, b"application/json"))

    site = SiteRoutes("admin", NOT_FOUND, guard)
    site.add_exact("/v1/health", Endpoint(state.health), sign_in=False)
    # The status page decides access itself (a browser goes to the sign-in form).
    from nestgate.admin.page import StatusPage
    state.store_counts = (lambda: store_counts(store_path)) if store_path else None
    page = StatusPage(state, admin, guesses, state.store_counts)
    site.add_exact("/", page, sign_in=False)
    site.add_exact("/login", page, sign_in=False)
    # The API's description holds nothing secret: open, so that a client (or Swagger
    # UI) can read it before it has the token.
    site.add_exact("/docs/json", Endpoint(lambda: (200, openapi_document()),
                                          "application/json"), sign_in=False)
    # Swagger UI, bundled (no CDN: the admin listener is often on a machine without
    # the internet, and a page that loads outside scripts could be made to leak the
    # token). Open like the document it shows; its requests carry the token typed
    # into "Authorize".
    site.add_exact("/docs", GetOnly(swagger_page()), sign_in=False)
    site.add_prefix("/docs/", swagger_assets(), "/docs/*", sign_in=False)
    site.add_exact("/v1/ready", Endpoint(state.ready))
    site.add_exact("/v1/status", Endpoint(state.status))
    site.add_exact("/v1/users", Endpoint(state.users))
    site.add_exact("/v1/providers", Endpoint(state.providers))
    site.add_exact("/metrics", Endpoint(state.metrics, metrics.CONTENT_TYPE))
    allow = AllowList(store_path, state.audit, error, reply)
    site.add_exact("/v1/allow", allow)
    site.add_exact("/v1/allow/{id}", allow)
    from nestgate.admin.banapi import Bans
    bans = Bans(config.bans.store if config.bans.enabled else "", state.audit, error, reply,
                config.crowdsec is not None)
    for path in ("/v1/bans", "/v1/bans/{address}", "/v1/bans/{address}/{prefix}"):
        site.add_exact(path, bans)
    if config.bans.enabled or config.crowdsec is not None:
        state.bans_active = bans_active
    sessions = Sessions(store_path, state.audit, error, reply)
    site.add_exact("/v1/sessions", sessions)
    site.add_exact("/v1/sessions/{id}", sessions)
    site.add_exact("/v1/users/{user}/sessions", sessions)
    site.add_exact("/v1/users/{user}/providers",
                   ProviderBindings(store_path, state.audit, error, reply))
    from nestgate.admin.oidcapi import Grants
    site.add_exact("/v1/oidc/clients", Endpoint(state.oidc_clients))
    grants = Grants(store_path, state.audit, error, reply)
    site.add_exact("/v1/oidc/grants", grants)
    site.add_exact("/v1/oidc/grants/{id}", grants)
    passkeys = Passkeys(store_path, state.audit, error, reply)
    site.add_exact("/v1/passkeys", passkeys)
    site.add_exact("/v1/passkeys/{id}", passkeys)
    operations = Operations(state, error, reply)
    for path in ("/v1/notes/purge", "/v1/notes/reread", "/v1/upstreams",
                 "/v1/upstreams/drain", "/v1/upstreams/undrain"):
        site.add_exact(path, operations)
    settings = ConfigAPI(state, config, error, reply)
    for path in ("/v1/config", "/v1/config/validate", "/v1/config/reload"):
        site.add_exact(path, settings)
    from nestgate.admin.certapi import CertificateInstall
    site.add_exact("/v1/certificates/{name}",
                   CertificateInstall(settings, state.audit, error, reply))
    router = Router(site)
    router.add_site(["*"], site)
    return router


def openapi_document() -> bytes:
    """The OpenAPI document's bytes, built when first asked for: nobody reads it at
    idle, and built at import it is a few hundred KiB the supervisor would hold too."""
    from nestgate.admin.openapi import DOCUMENT_BYTES
    return DOCUMENT_BYTES


SWAGGER_DIR = Path(__file__).parent / "swagger_ui"
# The page runs only its own scripts; Swagger UI sets inline styles.
SWAGGER_CSP = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
               "img-src 'self' data:; connect-src 'self'; font-src 'self' data:; "
               "frame-ancestors 'none'; base-uri 'none'; form-action 'none'")


class GetOnly(ReadyChoice):
    """A ready page for GET and HEAD; 405 (with Allow) for any other method."""

    __slots__ = ("page",)

    def __init__(self, page: Prebuilt) -> None:
        self.page = page

    def peek(self, path: str, method: bytes, headers) -> Prebuilt:
        return self.page if method in (b"GET", b"HEAD") else METHOD

    def choose(self, headers) -> Prebuilt:
        return self.page


def swagger_page() -> Prebuilt:
    return Prebuilt(200, (SWAGGER_DIR / "index.html").read_bytes(), "text/html; charset=utf-8",
                    [("content-security-policy", SWAGGER_CSP), ("cache-control", "no-cache"),
                     ("x-content-type-options", "nosniff"),
                     # Not no-referrer: under it a browser sends `Origin: null` with the
                     # page's own POSTs, which the Origin check refuses.
                     ("referrer-policy", "same-origin")])


def swagger_assets():
    from nestgate.handlers.static import StaticFiles
    from nestgate.sites.routetypes import StaticOptions
    # Cached whole (the bundle is 1.7 MB) so its compressed variants are made once.
    options = StaticOptions(root=str(SWAGGER_DIR), cache_file_max=4 << 20,
                            sendfile_min=4 << 20, cache_control="public, max-age=3600")
    return StaticFiles(options, "/docs/", [("x-content-type-options", "nosniff")], NOT_FOUND)


def bans_active() -> dict[str, int]:
    """Bans in force by origin, from the table every process shares."""
    from nestgate.bans.table import ban_table
    return ban_table().counts()


def store_counts(store_path: str):
    """(allow-list entries, live sessions) for the status page; None without a store."""
    if not store_path:
        return None
    from nestgate.handlers.auth.store import open_store
    store = open_store(store_path)
    try:
        return len(store.allow_entries()), len(store.live_sessions())
    finally:
        store.close()
