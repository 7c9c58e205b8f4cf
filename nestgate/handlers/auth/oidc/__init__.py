"""OpenID Connect, both ways. nestgate as an OpenID provider: `[auth] issuer` and
`[[auth.client]]` let the apps behind the gateway sign their users in through
nestgate's own sign-in. nestgate as a relying party: `[[auth.oidc]]` lets users sign
in to nestgate through another provider ("Sign in with ...").

config     the keys and their checks
state      codes, grants and signing keys in the shared store (SQLite or Redis)
keys       signing keys, made and rotated by period
server     Authlib's authorization server and grants, on the provider's threads
endpoints  the routes on the issuer's site, the consent page

client        the relying party: the flow, the ID token checks, who the claims make
signin_pages  its pages on each protected site (start and callback)
"""
