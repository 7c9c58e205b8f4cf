"""What every request goes through once an adapter has its head: routing (Host ->
site -> route), the gates a site's guard is made of (access, ratelimit, geoip), the
stream sequence (dispatch: resolve, answer, conclude, record), the protocol-neutral
Request, the request log. Handlers are reached only through their contract
(nestgate.base.handler).
"""
