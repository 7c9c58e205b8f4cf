"""The reverse proxy: upstream pools, load balancing and health, the proxy handler.

`options` reads a `type = "proxy"` route's keys at config load; `handler.ProxyHandler`
answers requests from the upstream pools in `upstream`; `balancer` picks targets
and keeps their health. Nothing here touches the client socket except through the
engine's `Request`.
"""
