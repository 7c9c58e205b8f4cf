"""HTTP dates (RFC 9110 section 5.6.7): written as IMF-fixdate, read in its three forms.

Why not `email.utils`: it loads the `email` package and `calendar` (a few hundred KiB
in every process) for two functions, when HTTP needs only its one fixed form out and
three fixed forms in.
"""

from __future__ import annotations

import re
import time

DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun",
          "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_MONTH_NUMBER = {name.lower(): number for number, name in enumerate(MONTHS, 1)}

# IMF-fixdate "Sun, 06 Nov 1994 08:49:37 GMT"; rfc850-date "Sunday, 06-Nov-94 08:49:37
# GMT"; asctime-date "Sun Nov  6 08:49:37 1994". Case-insensitive, as email.utils was.
_TIME = r"(\d\d):(\d\d):(\d\d)"
_IMF = re.compile(r"[a-z]{3}, (\d\d) ([a-z]{3}) (\d{4}) " + _TIME + r" gmt", re.I)
_RFC850 = re.compile(r"[a-z]{6,9}, (\d\d)-([a-z]{3})-(\d\d) " + _TIME + r" gmt", re.I)
_ASCTIME = re.compile(r"[a-z]{3} ([a-z]{3}) ([ \d]\d) " + _TIME + r" (\d{4})", re.I)


def http_date(seconds: float) -> str:
    """`seconds` since the epoch as an IMF-fixdate, the form every HTTP date is sent in."""
    t = time.gmtime(int(seconds))
    return (f"{DAYS[t.tm_wday]}, {t.tm_mday:02d} {MONTHS[t.tm_mon - 1]} {t.tm_year:04d} "
            f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} GMT")


def parse_http_date(text: str) -> float:
    """Seconds since the epoch of an HTTP date in any of its three forms; ValueError
    for anything else (a recipient ignores an invalid date, RFC 9110)."""
    text = text.strip()
    if m := _IMF.fullmatch(text):
        day, month, year, hour, minute, second = m.groups()
    elif m := _RFC850.fullmatch(text):
        day, month, year, hour, minute, second = m.groups()
        # Two-digit years: RFC 9110 reads one more than 50 years ahead as the past.
        year = int(year) + 2000
        if year > time.gmtime().tm_year + 50:
            year -= 100
    elif m := _ASCTIME.fullmatch(text):
        month, day, hour, minute, second, year = m.groups()
    else:
        raise ValueError(f"not an HTTP date: {text!r}")
    number = _MONTH_NUMBER.get(month.lower())
    if number is None:
        raise ValueError(f"not an HTTP date: {text!r}")
    fields = (int(year), number, int(day), int(hour), int(minute), int(second))
    if not (1 <= fields[2] <= 31 and fields[3] <= 23 and fields[4] <= 59 and fields[5] <= 60):
        raise ValueError(f"not an HTTP date: {text!r}")
    return float(_timegm(fields))


def _timegm(fields) -> int:
    """UTC fields to seconds since the epoch (calendar.timegm, without `calendar`)."""
    year, month, day, hour, minute, second = fields
    # Days from 1970-01-01 to the date, proleptic Gregorian (Howard Hinnant's days_from_civil).
    y = year - (month <= 2)
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    days = era * 146097 + doe - 719468
    return ((days * 24 + hour) * 60 + minute) * 60 + second
