"""HTTP dates written and read without email.utils: the same text, the same instants."""

import email.utils
import random

import pytest

from nestgate.base.httpdate import http_date, parse_http_date


def test_written_as_email_utils_writes_it():
    rng = random.Random(7)
    for seconds in [0, -1, 784111777, 2**31, 253402300799] + \
            [rng.randint(-2**31, 2**34) for _ in range(20000)]:
        text = http_date(seconds)
        assert text == email.utils.formatdate(seconds, usegmt=True)
        assert parse_http_date(text) == seconds


@pytest.mark.parametrize("text", [
    "Sun, 06 Nov 1994 08:49:37 GMT",        # IMF-fixdate
    "Sunday, 06-Nov-94 08:49:37 GMT",       # rfc850-date
    "Sun Nov  6 08:49:37 1994",             # asctime-date
    "sun, 06 nov 1994 08:49:37 gmt",
])
def test_the_three_forms_read_as_one_instant(text):
    assert parse_http_date(text) == 784111777.0


@pytest.mark.parametrize("text", [
    "", "yesterday", "Sun, 06 Nov 1994 08:49:37", "Sun, 06 Foo 1994 08:49:37 GMT",
    "Sun, 32 Nov 1994 08:49:37 GMT", "Sun, 06 Nov 1994 24:00:00 GMT",
    "Sun, 06 Nov 1994 08:49:37 +0100", "Sun, 6 Nov 1994 08:49:37 GMT\x00",
])
def test_anything_else_is_refused(text):
    with pytest.raises(ValueError):
        parse_http_date(text)
