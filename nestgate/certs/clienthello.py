"""Reading the server name and ALPN offers of a TLS ClientHello before the handshake.

Python's SNI callback cannot see what ALPN a client offers, and TLS-ALPN-01 (RFC 8737)
needs exactly that: the CA's validation handshake offers only `acme-tls/1` and must
get the challenge certificate, while a browser asking for the same name must not.
The ALPN offer also decides whether a handshake is refused with the
no_application_protocol alert (nestgate.wire.tls.refuses_alpn), so every ClientHello is read.
"""

from __future__ import annotations

HANDSHAKE = 22
CLIENT_HELLO = 1
EXT_SERVER_NAME = 0
EXT_ALPN = 16
MAX_HELLO = 16384 + 5          # one TLS record


class NotClientHello(ValueError):
    pass


def parse_client_hello(data: bytes) -> tuple[str | None, list[str]] | None:
    """(server name, ALPN protocols) of the ClientHello in the first TLS record of
    `data`; None while the record is incomplete; NotClientHello when it is not one."""
    # Read for every handshake on a TLS listener (nestgate.wire.tls.refuses_alpn): the record
    # is copied once and its lengths read by indexing, a third of the time memoryview
    # slices and int.from_bytes took.
    if len(data) < 5:
        return None
    if data[0] != HANDSHAKE:
        raise NotClientHello("not a TLS handshake record")
    length = data[3] << 8 | data[4]
    if len(data) < 5 + length:
        return None
    body = bytes(data[5:5 + length])
    if len(body) < 4 or body[0] != CLIENT_HELLO:
        raise NotClientHello("not a ClientHello")
    hello = body[4:4 + int.from_bytes(body[1:4], "big")]
    try:
        at = 2 + 32                                     # version, random
        at += 1 + hello[at]                             # session id
        at += 2 + (hello[at] << 8 | hello[at + 1])      # cipher suites
        at += 1 + hello[at]                             # compression methods
        if at >= len(hello):
            return None, []
        end = at + 2 + (hello[at] << 8 | hello[at + 1])
        at += 2
        server_name, alpn = None, []
        while at + 4 <= end:
            kind = hello[at] << 8 | hello[at + 1]
            size = hello[at + 2] << 8 | hello[at + 3]
            at += 4 + size
            if kind == EXT_SERVER_NAME:
                ext = hello[at - size:at]
                if len(ext) >= 5 and ext[2] == 0:
                    n = ext[3] << 8 | ext[4]
                    server_name = ext[5:5 + n].decode("ascii", "replace")
            elif kind == EXT_ALPN:
                ext = hello[at - size:at]
                i, stop = 2, 2 + int.from_bytes(ext[0:2], "big")
                while i < min(stop, len(ext)):
                    n = ext[i]
                    alpn.append(ext[i + 1:i + 1 + n].decode("ascii", "replace"))
                    i += 1 + n
    except IndexError:
        raise NotClientHello("truncated ClientHello") from None
    return server_name, alpn
