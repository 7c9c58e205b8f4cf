"""Who the client is: IP sets, X-Forwarded-For and -Proto through trusted proxies,
PROXY protocol.

Pure functions and data, no I/O. `Networks` answers "is this address in the set"
with one set lookup per distinct prefix length, so a list of thousands of CIDRs
costs about what a handful does. Addresses are text as the engine keeps them
("192.0.2.1", "2001:db8::1"); IPv4-mapped IPv6 is folded to IPv4 first.
"""

from __future__ import annotations

import ipaddress
import socket
import struct

_V4_BITS, _V6_BITS = 32, 128


def normalise(text: str) -> str:
    """The canonical text of an address; IPv4-mapped IPv6 becomes IPv4, and an IPv6
    zone (`%eth0`), which names an interface of the sender's and nothing of the client,
    is dropped: each spelling would otherwise be a client of its own to the limits.
    ValueError if `text` is not an address."""
    addr = ipaddress.ip_address(text.strip())
    if addr.version == 6:
        if addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        elif addr.scope_id is not None:
            addr = ipaddress.IPv6Address(int(addr))
    return str(addr)


def _as_int(ip: str) -> tuple[int, int] | None:
    """(bits, integer) of an address in canonical text, None if it is not one."""
    try:
        if ":" in ip:
            ip = ip.partition("%")[0]                      # fe80::1%eth0: the zone
            value = int.from_bytes(socket.inet_pton(socket.AF_INET6, ip), "big")
            if value >> 32 == 0xFFFF:                       # ::ffff:a.b.c.d
                return _V4_BITS, value & 0xFFFFFFFF
            return _V6_BITS, value
        return _V4_BITS, int.from_bytes(socket.inet_pton(socket.AF_INET, ip), "big")
    except (OSError, ValueError):
        return None


def covers_every_address(entry: str) -> bool:
    """Whether the address or CIDR `entry` holds every address of its family: 0.0.0.0/0,
    ::/0, or ::ffff:0:0/96 (every IPv4 address, as a client's mapped address spells
    it). An allow entry so wide lets anyone in, seldom what was meant."""
    try:
        network = ipaddress.ip_network(entry.strip(), strict=False)
    except ValueError:
        return False
    return network.prefixlen == 0 or (network.prefixlen == 96 and
                                      getattr(network.network_address, "ipv4_mapped", None)
                                      is not None)


class Networks:
    """A set of addresses and CIDR networks."""

    __slots__ = ("_v4", "_v6", "entries")

    def __init__(self, entries=()) -> None:
        self._v4: list[tuple[int, set[int]]] = []
        self._v6: list[tuple[int, set[int]]] = []
        self.entries: tuple[str, ...] = ()
        for entry in entries:
            self.add(entry)

    def add(self, entry: str) -> None:
        """Add an address or a CIDR; ValueError naming `entry` if it is neither."""
        try:
            net = ipaddress.ip_network(entry.strip(), strict=False)
        except (ValueError, TypeError, AttributeError):
            raise ValueError(f"not an IP address or CIDR: {entry!r}") from None
        if "%" in entry:
            # A client address never carries a zone: "fe80::1%eth0" would be kept as
            # written and shown so, yet match as fe80::1 on every interface.
            raise ValueError(f"not an IP address or CIDR (a zone such as %eth0 is not "
                             f"one): {entry!r}")
        if net.version == 6 and net.prefixlen >= 96 and \
                net.network_address.ipv4_mapped is not None:
            net = ipaddress.ip_network(f"{net.network_address.ipv4_mapped}/{net.prefixlen - 96}")
        bits = _V4_BITS if net.version == 4 else _V6_BITS
        table = self._v4 if net.version == 4 else self._v6
        shift = bits - net.prefixlen
        key = int(net.network_address) >> shift
        for length, keys in table:
            if length == shift:
                keys.add(key)
                break
        else:
            table.append((shift, {key}))
            table.sort()                       # most specific first
        self.entries += (entry,)

    def __len__(self) -> int:
        return len(self.entries)

    def __bool__(self) -> bool:
        return bool(self.entries)

    def __contains__(self, ip: str) -> bool:
        parsed = _as_int(ip)
        if parsed is None:
            return False
        bits, value = parsed
        for shift, keys in (self._v4 if bits == _V4_BITS else self._v6):
            if value >> shift in keys:
                return True
        return False


def parse_networks(entries, what: str = "entry") -> Networks:
    """Networks from config strings; ValueError naming every bad entry."""
    nets, bad = Networks(), []
    for entry in entries:
        try:
            nets.add(entry)
        except ValueError:
            bad.append(entry)
    if bad:
        raise ValueError("IP addresses or CIDRs; not valid: " + ", ".join(repr(b) for b in bad))
    return nets


# Loopback, private (RFC 1918, ULA), link-local and CGNAT (RFC 6598).
LOCAL = Networks(["127.0.0.0/8", "::1/128", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",
                  "fc00::/7", "169.254.0.0/16", "fe80::/10", "100.64.0.0/10"])


# ------------------------------------------------------------ X-Forwarded-For


def forwarded_client(peer: str, header_values, trusted: Networks) -> str:
    """Walk X-Forwarded-For right to left while the hop we stand on is trusted.

    `header_values` are the raw values of every X-Forwarded-For header, in order.
    The result is the first address (from the right) added by someone we do not
    trust, or the leftmost one if every hop is trusted. Garbage stops the walk."""
    hops = b",".join(header_values).split(b",")
    client = peer
    for raw in reversed(hops):
        if client not in trusted:
            break
        try:
            client = normalise(without_port(raw.decode("latin-1").strip()))
        except ValueError:
            break
    return client


def without_port(hop: str) -> str:
    """The address of an X-Forwarded-For entry that may carry the client's port, as
    some proxies write it (`192.0.2.1:4711`, `[2001:db8::1]:4711`; Azure's Application
    Gateway does): read as garbage, it stopped the walk, and every client of such a
    proxy was taken for the proxy itself (its place in `allow`, `exempt_local`, one
    rate limit for all). ValueError for brackets not closed or a port that is not one."""
    if hop.startswith("["):
        address, closed, rest = hop[1:].partition("]")
        if not closed or rest and not (rest[0] == ":" and rest[1:].isdigit()):
            raise ValueError(hop)
        return address
    if hop.count(":") == 1:                          # IPv4 and a port; IPv6 has two or more
        address, _, port = hop.partition(":")
        if not port.isdigit():
            raise ValueError(hop)
        return address
    return hop


# ------------------------------------------------------------ X-Forwarded-Proto

_PROTOS = {b"http": "http", b"https": "https"}


def forwarded_scheme(headers) -> str | None:
    """The scheme a trusted proxy says its client used: "http" or "https" when the
    request carries exactly one X-Forwarded-Proto field line whose value is one of
    them (any case, blanks around it allowed); None when there is none, or two, or a
    value that is anything else ("https, http" from a chain of proxies included),
    so the listener's own scheme stands. `Forwarded: proto=` is not read: the client
    is taken from X-Forwarded-For, and the scheme from the same family, so a proxy
    that sent both kinds cannot have said two things."""
    found = None
    for name, value in headers:
        if name == b"x-forwarded-proto":
            if found is not None:
                return None
            found = value
    return None if found is None else _PROTOS.get(found.strip(b" \t").lower())


# ------------------------------------------------------------ PROXY protocol

V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
V1_PREFIX = b"PROXY "
V1_MAX = 107                      # the spec's longest v1 line, CRLF included
V2_MAX = 16 + 216                 # header + the largest address block we accept


class ProxyHeaderError(ValueError):
    pass


def starts_like_proxy(data: bytes) -> bool:
    """True if `data` is (the start of) a PROXY protocol header, v1 or v2."""
    n = min(len(data), 12)
    return n > 0 and (data[:min(n, 6)] == V1_PREFIX[:min(n, 6)]
                      or data[:n] == V2_SIGNATURE[:n])


def take_proxy_header(data: bytes, peer: str, allowed: Networks) -> tuple[int, str | None] | None:
    """The PROXY header that may start a connection on a listener taking them, as
    (bytes it takes, source address or None); (0, None) when the connection starts
    with something else, None while more bytes are needed to tell. Only a peer in
    `allowed` may send one, and from it the header is optional: ProxyHeaderError for
    anyone else's header, a bad one, or one longer than any valid header."""
    if not starts_like_proxy(data):
        return 0, None
    if len(data) < len(V1_PREFIX):
        return None                              # too short to tell from a request line
    if peer not in allowed:
        raise ProxyHeaderError("PROXY header from a peer not in proxy_protocol_from")
    parsed = parse_proxy_header(data)
    if parsed is None and len(data) > V2_MAX:
        raise ProxyHeaderError("PROXY header too long")
    return parsed


def parse_proxy_header(data: bytes) -> tuple[int, str | None] | None:
    """(bytes consumed, source address or None for LOCAL/UNKNOWN), or None if more
    bytes are needed. ProxyHeaderError if this is not a valid header."""
    if data[:1] == b"P":
        return _parse_v1(data)
    return _parse_v2(data)


def _parse_v1(data: bytes):
    end = data.find(b"\r\n", 0, V1_MAX)
    if end < 0:
        if len(data) >= V1_MAX:
            raise ProxyHeaderError("PROXY v1 line too long")
        return None
    parts = data[:end].split(b" ")
    if parts[0] != b"PROXY" or len(parts) < 2:
        raise ProxyHeaderError("not a PROXY v1 line")
    if parts[1] == b"UNKNOWN":
        return end + 2, None
    if parts[1] not in (b"TCP4", b"TCP6") or len(parts) != 6:
        raise ProxyHeaderError("bad PROXY v1 line")
    family = socket.AF_INET if parts[1] == b"TCP4" else socket.AF_INET6
    try:
        for addr in parts[2:4]:
            socket.inet_pton(family, addr.decode("ascii"))
        for port in parts[4:6]:
            if not port.isdigit() or int(port) > 65535 or (port[:1] == b"0" and len(port) > 1):
                raise ValueError
        return end + 2, normalise(parts[2].decode("ascii"))
    except (OSError, ValueError, UnicodeDecodeError):
        raise ProxyHeaderError("bad address in PROXY v1 line") from None


def _parse_v2(data: bytes):
    if len(data) < 16:
        if data != V2_SIGNATURE[:len(data)] and not data.startswith(V2_SIGNATURE):
            raise ProxyHeaderError("not a PROXY header")
        return None
    if data[:12] != V2_SIGNATURE:
        raise ProxyHeaderError("not a PROXY header")
    ver_cmd, family, length = data[12], data[13], struct.unpack_from("!H", data, 14)[0]
    if ver_cmd >> 4 != 2 or ver_cmd & 0x0F > 1:
        raise ProxyHeaderError("bad PROXY v2 version or command")
    if 16 + length > V2_MAX:
        raise ProxyHeaderError("PROXY v2 header too long")
    if len(data) < 16 + length:
        return None
    consumed = 16 + length
    if ver_cmd & 0x0F == 0:                        # LOCAL: health check from the proxy
        return consumed, None
    body = data[16:consumed]
    af = family >> 4
    if af == 1 and length >= 12:
        return consumed, socket.inet_ntop(socket.AF_INET, body[:4])
    if af == 2 and length >= 36:
        return consumed, normalise(socket.inet_ntop(socket.AF_INET6, body[:16]))
    if af == 0:
        return consumed, None                      # UNSPEC: keep the socket peer
    raise ProxyHeaderError("bad PROXY v2 address block")
