"""Redirects: a fixed target, and plain listeners told to send everyone to HTTPS."""

from __future__ import annotations

from nestgate.base.responses import Prebuilt, html_page
from nestgate.base.hosts import plain_host_name


def fixed_redirect(to: str, status: int) -> Prebuilt:
    return Prebuilt(status, html_page(status, to), "text/html; charset=utf-8", [("location", to)])


class HttpsRedirect:
    """Send the same Host and path to https. The target host is the one the client
    asked for, so this cannot redirect anywhere the client did not already name;
    a Host with characters outside a host name gets 400 instead."""

    is_async = True

    def __init__(self, https_port: int) -> None:
        self.port_suffix = b"" if https_port == 443 else b":%d" % https_port

    async def handle(self, request) -> None:
        host = plain_host_name(request.host)
        if host is None:
            await request.send(400, [], b"bad Host\n")
            return
        location = b"https://" + host + self.port_suffix + request.raw_target
        await request.send(308, [(b"location", location)], b"")



class SlashRedirect:
    """`/admin` to `/admin/`, for a prefix route on `/admin/` (nginx does the same for
    a prefix location ending in `/`). Without it `/admin` fell to a shorter route, `/`,
    and its policy, while many upstreams (Express, `app.use("/admin", ...)`) serve
    `/admin` as `/admin/`: the route's access list and user policy were passed by
    leaving out the slash. The redirect goes through the route's own guard, so it is
    answered only to whoever may follow it. 308 keeps the method and the body."""

    is_async = True

    def __init__(self, prefix: str) -> None:
        self.location = prefix.encode()

    async def handle(self, request) -> None:
        query = request.query
        location = self.location + b"?" + query if query else self.location
        await request.send(308, [(b"location", location)], b"")
