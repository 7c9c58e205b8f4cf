"""Client IP: address sets, X-Forwarded-For walking, the X-Forwarded-Proto a trusted
proxy gives, PROXY protocol v1/v2 parsing."""

from __future__ import annotations

import ipaddress
import socket
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nestgate.base.clientip import (LOCAL, V2_SIGNATURE, Networks, ProxyHeaderError,
                                    forwarded_client, forwarded_scheme, normalise,
                                    parse_networks,
                                    parse_proxy_header, starts_like_proxy,
                                    take_proxy_header)


def test_networks_match_addresses_and_cidrs():
    nets = Networks(["10.0.0.0/8", "192.0.2.7", "2001:db8::/32", "::ffff:198.51.100.0/120"])
    assert "10.200.3.4" in nets and "192.0.2.7" in nets and "192.0.2.8" not in nets
    assert "2001:db8:1::5" in nets and "2001:db9::1" not in nets
    assert "198.51.100.20" in nets                  # a mapped CIDR is folded to IPv4
    assert "::ffff:10.1.1.1" in nets                # and so is a mapped address
    assert "not an ip" not in nets and "" not in nets


def test_invalid_entries_are_named():
    with pytest.raises(ValueError) as info:
        parse_networks(["10.0.0.0/8", "10.0.0.300", "fe80::/200", "example.com"])
    text = str(info.value)
    assert "'10.0.0.300'" in text and "'fe80::/200'" in text and "'example.com'" in text
    assert "'10.0.0.0/8'" not in text


def test_local_exemption_ranges():
    for ip in ("127.0.0.1", "::1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.1.1",
               "fe80::1", "fd00::1", "100.64.0.1"):
        assert ip in LOCAL, ip
    for ip in ("8.8.8.8", "172.32.0.1", "100.128.0.1", "2001:4860::1"):
        assert ip not in LOCAL, ip


ipv4 = st.integers(0, 2**32 - 1).map(lambda n: str(ipaddress.IPv4Address(n)))
cidr4 = st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 32)).map(
    lambda t: str(ipaddress.IPv4Network((t[0], t[1]), strict=False)))
ipv6 = st.integers(0, 2**128 - 1).map(lambda n: str(ipaddress.IPv6Address(n)))
cidr6 = st.tuples(st.integers(0, 2**128 - 1), st.integers(0, 128)).map(
    lambda t: str(ipaddress.IPv6Network((t[0], t[1]), strict=False)))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(cidr4, cidr6), max_size=30), st.lists(st.one_of(ipv4, ipv6),
                                                                  min_size=1, max_size=10))
def test_networks_agree_with_ipaddress(entries, addresses):
    nets = Networks(entries)
    parsed = [ipaddress.ip_network(e) for e in entries]
    for address in addresses:
        addr = ipaddress.ip_address(address)
        if addr.version == 6 and addr.ipv4_mapped is not None:
            continue
        expected = any(addr in n for n in parsed if n.version == addr.version)
        assert (address in nets) == expected


def test_forwarded_for_walks_only_through_trusted_hops():
    trusted = Networks(["10.0.0.0/8"])
    # peer trusted, the hop it names is trusted too, the next is the client
    assert forwarded_client("10.0.0.1", [b"203.0.113.5, 10.0.0.2"], trusted) == "203.0.113.5"
    # a client-supplied spoof to the left of the real client is ignored
    assert forwarded_client("10.0.0.1", [b"1.1.1.1, 203.0.113.5"], trusted) == "203.0.113.5"
    # several headers are one list
    assert forwarded_client("10.0.0.1", [b"1.1.1.1", b"203.0.113.5"], trusted) == "203.0.113.5"
    # untrusted peer: its header means nothing
    assert forwarded_client("198.51.100.1", [b"10.0.0.9"], trusted) == "198.51.100.1"
    # garbage stops the walk at the last trusted hop
    assert forwarded_client("10.0.0.1", [b"nonsense"], trusted) == "10.0.0.1"
    assert forwarded_client("10.0.0.1", [b"::ffff:192.0.2.1"], trusted) == "192.0.2.1"
    # The port some proxies write after the address is not garbage: without it read,
    # every client of such a proxy was the proxy (its place in allow lists).
    for hop, client in ((b"203.0.113.5:4711", "203.0.113.5"), (b"[2001:db8::5]:443",
                        "2001:db8::5"), (b"[2001:db8::5]", "2001:db8::5"),
                        (b" 203.0.113.5:1 ", "203.0.113.5"),
                        (b"[::ffff:192.0.2.1]:80", "192.0.2.1")):
        assert forwarded_client("10.0.0.1", [hop], trusted) == client, hop
    assert forwarded_client("10.0.0.1", [b"10.0.0.2:80, 10.0.0.3:80"], trusted) == "10.0.0.2"
    for bad in (b"203.0.113.5:", b"203.0.113.5:x", b"[2001:db8::5", b"[2001:db8::5]x",
                b"[2001:db8::5]:", b"2001:db8::5]:80", b"203.0.113.5:80:80"):
        assert forwarded_client("10.0.0.1", [bad], trusted) == "10.0.0.1", bad


def test_forwarded_proto_is_believed_only_when_it_is_one_plain_value():
    def scheme(*values: bytes):
        headers = [(b"host", b"a"), *((b"x-forwarded-proto", v) for v in values),
                   (b"x-forwarded-for", b"203.0.113.5")]
        return forwarded_scheme(headers)
    assert scheme(b"https") == "https" and scheme(b"http") == "http"
    assert scheme(b"HTTPS") == "https" and scheme(b" Http\t") == "http"      # any case, OWS
    assert scheme() is None                                                # absent
    # Two field lines, a list in one, or anything else: the listener's scheme stands.
    for bad in ((b"https", b"https"), (b"https", b"http"), (b"https, http",), (b"",),
                (b"wss",), (b"https;",), (b"ftp",), (b"h t t p s",)):
        assert scheme(*bad) is None, bad
    # Only the header's own name counts (names reach here in lower case).
    assert forwarded_scheme([(b"x-forwarded-protocol", b"https"),
                             (b"forwarded", b"proto=https")]) is None


def test_normalise():
    assert normalise("::ffff:192.0.2.1") == "192.0.2.1"
    assert normalise("2001:DB8::0001") == "2001:db8::1"
    # A zone names the sender's interface, not the client: each spelling would be a
    # client of its own to the limits.
    assert normalise("2001:db8::1%eth0") == normalise("2001:db8::1%7") == "2001:db8::1"
    assert normalise("fe80::1%lo") == "fe80::1"
    with pytest.raises(ValueError):
        normalise("300.1.1.1")


# ------------------------------------------------------------------ PROXY protocol


def v2(command=1, family=0x11, src="192.0.2.9", dst="192.0.2.1", extra=b"") -> bytes:
    if family == 0x11:
        body = socket.inet_aton(src) + socket.inet_aton(dst) + struct.pack("!HH", 5000, 80)
    elif family == 0x21:
        body = (socket.inet_pton(socket.AF_INET6, src) + socket.inet_pton(socket.AF_INET6, dst)
                + struct.pack("!HH", 5000, 80))
    else:
        body = b""
    body += extra
    return V2_SIGNATURE + bytes([0x20 | command, family]) + struct.pack("!H", len(body)) + body


def test_proxy_v1():
    data = b"PROXY TCP4 192.0.2.9 192.0.2.1 5000 80\r\nGET / HTTP/1.1\r\n"
    assert parse_proxy_header(data) == (40, "192.0.2.9")
    assert parse_proxy_header(b"PROXY TCP6 2001:db8::9 2001:db8::1 5000 80\r\n")[1] == \
        "2001:db8::9"
    assert parse_proxy_header(b"PROXY UNKNOWN\r\n") == (15, None)
    assert parse_proxy_header(b"PROXY TCP4 192.0.2.9 192.0") is None        # needs more
    for bad in (b"PROXY TCP4 192.0.2.999 192.0.2.1 5000 80\r\n",
                b"PROXY TCP4 192.0.2.9 192.0.2.1 5000\r\n",
                b"PROXY TCP5 192.0.2.9 192.0.2.1 5000 80\r\n",
                b"PROXY TCP4 192.0.2.9 192.0.2.1 99999 80\r\n",
                b"PROXY " + b"x" * 120):
        with pytest.raises(ProxyHeaderError):
            parse_proxy_header(bad)


def test_proxy_v2():
    header = v2()
    assert parse_proxy_header(header + b"GET") == (len(header), "192.0.2.9")
    assert parse_proxy_header(v2(family=0x21, src="2001:db8::9", dst="2001:db8::1"))[1] == \
        "2001:db8::9"
    assert parse_proxy_header(v2(command=0, family=0)) == (16, None)        # LOCAL
    assert parse_proxy_header(header[:20]) is None
    assert parse_proxy_header(header[:10]) is None
    tlv = v2(extra=b"\x04\x00\x02ab")                                        # TLVs skipped
    assert parse_proxy_header(tlv) == (len(tlv), "192.0.2.9")
    with pytest.raises(ProxyHeaderError):
        parse_proxy_header(V2_SIGNATURE + b"\x31\x11\x00\x0c" + b"\x00" * 12)   # version 3
    with pytest.raises(ProxyHeaderError):
        parse_proxy_header(V2_SIGNATURE + b"\x21\x11\x00\x04" + b"\x00" * 4)    # too short


def test_detection_does_not_confuse_requests():
    assert starts_like_proxy(b"PROXY ") and starts_like_proxy(V2_SIGNATURE[:5])
    for request in (b"POST / HTTP/1.1", b"PUT /", b"PATCH /", b"GET /"):
        assert not starts_like_proxy(request)


def test_take_proxy_header_applies_the_listener_rules():
    trusted, header = Networks(["127.0.0.1/32"]), v2()
    tls_hello = b"\x16\x03\x01\x02\x00\x01"
    assert take_proxy_header(header + tls_hello, "127.0.0.1", trusted) == (len(header),
                                                                          "192.0.2.9")
    assert take_proxy_header(b"PROXY UNKNOWN\r\n", "127.0.0.1", trusted) == (15, None)
    for other in (b"GET / HTTP/1.1\r\n", tls_hello):          # optional for a trusted peer
        assert take_proxy_header(other, "127.0.0.1", trusted) == (0, None)
        assert take_proxy_header(other, "192.0.2.50", trusted) == (0, None)
    for part in (b"PROX", header[:5], header[:20], b"PROXY TCP4 192.0.2.9"):
        assert take_proxy_header(part, "127.0.0.1", trusted) is None        # needs more
    assert take_proxy_header(b"PROX", "192.0.2.50", trusted) is None        # POST? PROXY?
    for refused in (header, b"PROXY TCP4 192.0.2.9 192.0.2.1 5000 80\r\n"):
        with pytest.raises(ProxyHeaderError):
            take_proxy_header(refused, "192.0.2.50", trusted)               # not trusted
    with pytest.raises(ProxyHeaderError):
        take_proxy_header(V2_SIGNATURE + b"\x21\x11\x04\x00", "127.0.0.1", trusted)  # 1 KiB
