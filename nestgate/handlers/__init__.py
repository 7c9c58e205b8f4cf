"""What answers requests: static files, health, redirects, the notes pages and API
(notes/), the reverse proxy (proxy/), sign-in, passkeys and OpenID (auth/). They see
the protocol-neutral Request and implement the contract in nestgate.base.handler.
"""
