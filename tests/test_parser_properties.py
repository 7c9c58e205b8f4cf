"""Property tests (Hypothesis) of the hand-written parsers that take outsiders' bytes:
request paths, Range headers, PROXY protocol headers, and the config's sizes and
durations. Each property is what the rest of nestgate relies on."""

from __future__ import annotations

import os
import struct

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from nestgate.base.clientip import V2_SIGNATURE, ProxyHeaderError, parse_proxy_header
from nestgate.base.errors import RequestError
from nestgate.handlers.static import parse_range
from nestgate.base.paths import decode_path
from nestgate.base.units import parse_duration, parse_size

PATH_BYTES = st.lists(st.sampled_from([b"/", b".", b"..", b"a", b"%2e", b"%2E", b"%2f",
                                       b"%5c", b"%00", b"%25", b"\\", b"%c3%a9", b"%ff",
                                       b"~", b"%", b"%2", b"\xc3\xa9"]), max_size=12)


@settings(max_examples=2000, deadline=None)
@given(PATH_BYTES)
def test_a_decoded_path_never_climbs_out_of_its_root(parts):
    raw = b"/" + b"".join(parts)
    try:
        path = decode_path(raw)
    except RequestError as exc:
        assert exc.status == 400
        return
    assert path.startswith("/") and "\x00" not in path and "\\" not in path
    assert ".." not in path.split("/") and "." not in path.split("/")[:-1]
    assert "//" not in path
    root = "/srv/site"
    joined = os.path.normpath(os.path.join(root, path.lstrip("/")))
    assert joined == root or joined.startswith(root + "/")


@settings(max_examples=2000, deadline=None)
@given(st.binary(max_size=40), st.integers(min_value=0, max_value=10**12))
def test_a_range_is_ignored_unsatisfiable_or_inside_the_file(value, size):
    result = parse_range(value, size)
    if result is None or result is False:
        return
    start, end = result
    assert 0 <= start <= end < size


@settings(max_examples=1000, deadline=None)
@given(st.integers(min_value=1, max_value=10**12), st.data())
def test_a_well_formed_range_is_read_as_written(size, data):
    start = data.draw(st.integers(min_value=0, max_value=size - 1))
    end = data.draw(st.integers(min_value=start, max_value=size - 1))
    assert parse_range(b"bytes=%d-%d" % (start, end), size) == (start, end)
    assert parse_range(b"bytes=%d-" % start, size) == (start, size - 1)
    suffix = data.draw(st.integers(min_value=1, max_value=size))
    assert parse_range(b"bytes=-%d" % suffix, size) == (size - suffix, size - 1)


@settings(max_examples=3000, deadline=None)
@given(st.one_of(st.binary(max_size=120),
                 st.binary(max_size=60).map(lambda b: b"PROXY " + b),
                 st.binary(max_size=60).map(lambda b: V2_SIGNATURE + b)))
def test_a_proxy_header_is_read_refused_or_awaited_never_a_crash(data):
    try:
        parsed = parse_proxy_header(data)
    except ProxyHeaderError:
        return
    if parsed is not None:
        consumed, source = parsed
        assert 0 < consumed <= len(data)
        assert source is None or isinstance(source, str)


def _v1(a: tuple, b: tuple, sp: int, dp: int) -> bytes:
    return b"PROXY TCP4 %d.%d.%d.%d %d.%d.%d.%d %d %d\r\n" % (*a, *b, sp, dp)


def _v2(a: tuple, b: tuple, sp: int, dp: int) -> bytes:
    body = bytes(a) + bytes(b) + struct.pack("!HH", sp, dp)
    return V2_SIGNATURE + bytes([0x21, 0x11]) + struct.pack("!H", len(body)) + body


OCTETS = st.tuples(*[st.integers(0, 255)] * 4)
PORTS = st.integers(0, 65535)


@settings(max_examples=500, deadline=None)
@given(st.sampled_from([_v1, _v2]), OCTETS, OCTETS, PORTS, PORTS, st.binary(max_size=20))
def test_a_valid_proxy_header_is_awaited_until_whole_then_read(make, src, dst, sp, dp, after):
    header = make(src, dst, sp, dp)
    for cut in range(len(header)):
        assert parse_proxy_header(header[:cut]) is None, cut
    consumed, source = parse_proxy_header(header + after)
    assert consumed == len(header)
    assert source == "%d.%d.%d.%d" % src


SIZE_UNITS = {"": 1, "b": 1, "kb": 1000, "kib": 1024, "mb": 1000**2, "mib": 1024**2}
DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(sorted(SIZE_UNITS)),
       st.sampled_from(["", " "]))
def test_sizes_read_as_written(n, unit, space):
    assert parse_size(f"{n}{space}{unit.upper()}") == n * SIZE_UNITS[unit]
    assert parse_size(n) == n


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(sorted(DURATION_UNITS)))
def test_durations_read_as_written(n, unit):
    assert parse_duration(f"{n}{unit}") == pytest.approx(n * DURATION_UNITS[unit])


@given(st.one_of(st.text(max_size=12), st.integers(max_value=-1), st.booleans(),
                 st.floats(allow_nan=True)))
@example(float("nan"))
@example(float("inf"))
@example(float("-inf"))
def test_a_bad_size_or_duration_is_a_value_error_naming_what_was_expected(value):
    for parse in (parse_size, parse_duration):
        try:
            result = parse(value)
        except ValueError as exc:
            assert "such as" in str(exc) or "not negative" in str(exc)
        else:
            assert 0 <= result < float("inf")
