"""The tunnels a sign-in session opened (a WebSocket through a proxy route), cut when
the session ends: signed out, revoked through the admin API, expired.

A tunnel is let through by its upgrade request; after the 101 no request comes for the
gate to refuse, so a session ended meanwhile went on through the tunnel for as long as
bytes flowed (a web terminal, an editor, a home-automation socket opened with a stolen
cookie outlived the revocation meant to end it). `SignIn` notes the connection of each
request it admits to a route that passes upgrades, under the request's session; the
guard's tick (`sweep`) asks the store about the sessions that have a tunnel open, as a
request would (one question per session and RECHECK), and cuts the tunnels of a session
the store no longer has. A store that cannot be asked cuts nothing.
"""

from __future__ import annotations

import weakref


class SessionTunnels:
    """Connections by session token hash, for those of them that become tunnels."""

    def __init__(self, signin) -> None:
        self.signin = signin            # nestgate.handlers.auth.portal.SignIn
        self._by_session: dict[bytes, weakref.WeakSet] = {}

    def note(self, hashed: bytes, conn) -> None:
        """`conn` carries a request of the session `hashed` that may become a tunnel."""
        conns = self._by_session.get(hashed)
        if conns is None:
            conns = self._by_session[hashed] = weakref.WeakSet()
        conns.add(conn)

    def sweep(self) -> None:
        """Ask about each session with a tunnel open whose last check is RECHECK old."""
        for hashed, conns in list(self._by_session.items()):
            if not conns:
                del self._by_session[hashed]       # its connections have all gone
            elif any(conn.tunnelled() for conn in conns) and \
                    not self.signin.still_live(hashed):
                asking = self.signin.ask_store(hashed)
                asking.add_done_callback(lambda done, hashed=hashed: self._asked(hashed, done))

    def _asked(self, hashed: bytes, done) -> None:
        if done.cancelled() or done.exception() is not None or done.result() is not None:
            return                  # live, or the store could not say: nothing is cut
        for conn in list(self._by_session.pop(hashed, ())):
            conn.cut_tunnel()
