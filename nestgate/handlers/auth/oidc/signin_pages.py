"""The portal's pages for signing in through an OpenID provider: OIDC_PATH + <name>
sends the browser to the provider, OIDC_PATH + <name>/callback takes it back
(nestgate.handlers.auth.oidc.client holds the protocol; this module holds the HTTP side of it).

Every callback counts as a failed sign-in of its client address until it succeeds,
as a password sign-in does: an address that sends made-up callbacks is held back by
`max_failures` per `failure_window` (429) before nestgate asks the provider anything.
"""

from __future__ import annotations

import hmac
import logging
from urllib.parse import parse_qs

from nestgate.handlers.auth.config import OIDC_PATH
from nestgate.handlers.auth.oidc.client import (FLOW_COOKIE, FLOW_TTL, Flow, Refused,
                                                bound_subject, callback_path, identity,
                                                provider_factor, session_identity)
from nestgate.handlers.auth.portal import cookies, safe_next
from nestgate.base.tally import TALLY

log = logging.getLogger("nestgate.auth")


def provider_pages(signin) -> list[tuple[str, object]]:
    """(path, handler) of each provider's two pages."""
    pages = []
    for name, provider in signin.providers.items():
        pages.append((OIDC_PATH + name, ProviderStart(signin, provider)))
        pages.append((callback_path(name), ProviderCallback(signin, provider)))
    return pages


class _ProviderPage:
    is_async = True
    upgrades = False

    def __init__(self, signin, provider) -> None:
        self.signin = signin
        self.provider = provider            # nestgate.handlers.auth.oidc.client.Provider

    async def handle(self, request) -> None:
        if request.method not in (b"GET", b"HEAD"):
            await request.send(405, [(b"allow", b"GET, HEAD")], b"")
            return
        try:
            query = parse_qs(request.query.decode("latin-1"), max_num_fields=20)
        except ValueError:
            query = {}
        await self.answer(request, {k: v[0] for k, v in query.items()})

    def _flow_cookie(self, request, value: str, max_age: int):
        # Lax: the provider's redirect back is a top-level GET from another site.
        return self.signin.cookie(request, FLOW_COOKIE, value, max_age, path=OIDC_PATH,
                                  samesite="Lax")

    async def refuse(self, request, refused: Refused, next_url: str = "/",
                     end_flow: bool = True) -> None:
        log.warning("sign-in through %s refused for %s: %s", self.provider.cfg.name,
                    request.client, refused)
        await self.signin.notice_page(request, refused.status, "Sign-in refused",
                                      refused.message, next_url,
                                      [self._flow_cookie(request, "", 0)] if end_flow else [])


class ProviderStart(_ProviderPage):
    """A new flow in a cookie, and the browser on to the provider."""

    async def answer(self, request, query: dict[str, str]) -> None:
        next_url = safe_next(query.get("next"))
        redirect_uri = self.signin.absolute(request, callback_path(self.provider.cfg.name))
        if redirect_uri is None:
            await request.send(400, [(b"content-type", b"text/plain")], b"bad Host\n")
            return
        flow = Flow.begin(self.provider.cfg.name, next_url, redirect_uri)
        try:
            location = await self.provider.authorization_url(flow)
        except Refused as refused:
            await self.refuse(request, refused, next_url)
            return
        sealed = flow.seal(await self.signin.state.secret())
        await request.send(303, [(b"location", location.encode("latin-1")),
                                 (b"cache-control", b"no-store"),
                                 (b"referrer-policy", b"no-referrer"),
                                 self._flow_cookie(request, sealed, FLOW_TTL)], b"")


class ProviderCallback(_ProviderPage):
    """The provider's answer: checked, then a session, or the reason there is none."""

    async def answer(self, request, query: dict[str, str]) -> None:
        signin = self.signin
        if not await signin.attempt(request):
            return
        flow = Flow.open(cookies(request.headers).get(FLOW_COOKIE, ""),
                         await signin.state.secret())
        given = query.get("state", "").encode("utf-8", "surrogateescape")
        if flow is None or flow.provider != self.provider.cfg.name \
                or not hmac.compare_digest(flow.state.encode(), given):
            # Not this browser's sign-in (another site may send it here): refused, and
            # the sign-in this browser has under way, if any, goes on.
            signin.failed(request)
            await self.refuse(request, Refused(
                400, "This sign-in was not started in this browser, or took too long. "
                "Start it again.", "state does not match the flow cookie"), end_flow=False)
            return
        try:
            user, identity_json = await self._signed_in_user(flow, query)
        except Refused as refused:
            signin.failed(request)
            await self.refuse(request, refused, flow.next_url)
            return
        TALLY.event("signin_success")
        await signin.start_session(request, user, flow.next_url,
                                   provider_factor(self.provider.cfg.name), identity_json,
                                   [self._flow_cookie(request, "", 0)])

    async def _signed_in_user(self, flow: Flow, query: dict[str, str]):
        """(user name, what the session keeps) for this browser's callback; Refused
        when the provider's answer does not make one."""
        provider, signin = self.provider, self.signin
        if "error" in query:
            raise Refused(403, f"{provider.cfg.label} did not sign you in.",
                          f"provider error {query['error'][:100]!r}")
        if not query.get("code"):
            raise Refused(400, "The sign-in provider sent no code.", "no code")
        claims, id_token = await provider.claims(query["code"], flow)
        user = identity(provider.cfg, claims, signin.cfg.users, signin.known_groups)
        configured = signin.cfg.user(user.name) is not None
        if configured:
            await bound_subject(signin.state, provider.cfg, user.name, str(claims["sub"]))
        return user.name, session_identity(provider.cfg.name, user, configured, id_token)
