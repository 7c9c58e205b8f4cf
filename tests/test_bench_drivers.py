"""Parsing of wrk and h2load output, with samples captured from the installed tools
(wrk 4.1.0 Debian, h2load nghttp2/1.52.0) against nginx and small misbehaving servers."""

import pytest

from nestgate.bench import BenchError
from nestgate.bench import drivers as d

# ---------------------------------------------------------------- captured samples

WRK_OK = """\
Running 2s test @ http://127.0.0.1:18081/ok
  1 threads and 64 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   811.21us  639.06us   8.52ms   95.65%
    Req/Sec    63.66k     5.58k   73.36k    60.00%
  Latency Distribution
     50%  723.00us
     75%  819.00us
     90%    0.91ms
     99%    4.44ms
  126576 requests in 2.00s, 20.40MB read
Requests/sec:  63187.00
Transfer/sec:     10.18MB
"""

WRK_404 = """\
Running 1s test @ http://127.0.0.1:18081/slow
  1 threads and 16 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   244.24us  436.65us   4.38ms   96.48%
    Req/Sec    65.76k     3.18k   70.27k    50.00%
  Latency Distribution
     50%  174.00us
     75%  195.00us
     90%  225.00us
     99%    2.96ms
  65477 requests in 1.00s, 19.23MB read
  Non-2xx or 3xx responses: 65477
Requests/sec:  65360.72
Transfer/sec:     19.20MB
"""

WRK_SOCKET_ERRORS = """\
Running 2s test @ http://127.0.0.1:18202/
  1 threads and 8 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   203.80us  289.35us   6.14ms   95.87%
    Req/Sec    22.29k     2.09k   25.29k    47.62%
  Latency Distribution
     50%  154.00us
     75%  218.00us
     90%  313.00us
     99%    1.29ms
  46508 requests in 2.10s, 1.77MB read
  Socket errors: connect 0, read 6861, write 39646, timeout 0
Requests/sec:  22146.40
Transfer/sec:    865.09KB
"""

WRK_TIMEOUTS = """\
Running 4s test @ http://127.0.0.1:18203/
  1 threads and 8 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     0.00us    0.00us   0.00us    -nan%
    Req/Sec     6.00      0.00     6.00    100.00%
  Latency Distribution
     50%    0.00us
     75%    0.00us
     90%    0.00us
     99%    0.00us
  24 requests in 4.01s, 0.94KB read
  Socket errors: connect 0, read 0, write 0, timeout 24
Requests/sec:      5.98
Transfer/sec:     239.39B
"""

WRK_SECONDS = """\
Running 4s test @ http://127.0.0.1:18203/
  1 threads and 4 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.20s   254.00us   1.20s    75.00%
    Req/Sec     3.00      0.00     3.00    100.00%
  Latency Distribution
     50%    1.20s 
     75%    1.20s 
     90%    1.20s 
     99%    1.20s 
  12 requests in 4.01s, 480.00B read
Requests/sec:      2.99
Transfer/sec:     119.72B
"""

WRK_REFUSED = """\
unable to connect to 127.0.0.1:18099 Connection refused
"""

H2LOAD_H2_TLS13 = """\
starting benchmark...
spawning thread #0: 64 total client(s). Timing-based test with 0s of warm-up time and 3s of main duration for measurements.
Warm-up started for thread #0.
Warm-up phase is over for thread #0.
Main benchmark duration is started for thread #0.
TLS Protocol: TLSv1.3
Cipher: TLS_AES_128_GCM_SHA256
Server Temp Key: X25519 253 bits
Application protocol: h2
Main benchmark duration is over for thread #0. Stopping all clients.
Stopped all clients for thread #0

finished in 3.01s, 100856.67 req/s, 8.27MB/s
requests: 302570 total, 303210 started, 302570 done, 302570 succeeded, 0 failed, 0 errored, 0 timeout
status codes: 302570 2xx, 0 3xx, 0 4xx, 0 5xx
traffic: 24.82MB (26024156) total, 15.29MB (16036210) headers (space savings 49.52%), 4.33MB (4538550) data
                     min         max         mean         sd        +/- sd
time for request:       98us     23.65ms      4.11ms      1.67ms    74.31%
time for connect:     5.50ms     34.60ms     19.85ms      8.61ms    57.81%
time to 1st byte:    34.67ms     48.03ms     41.25ms      4.19ms    54.69%
req/s           :    1562.04     1588.46     1573.81        5.44    65.63%
"""

H2LOAD_404 = """\
starting benchmark...
spawning thread #0: 8 total client(s). 2000 total requests
TLS Protocol: TLSv1.2
Cipher: ECDHE-RSA-AES128-GCM-SHA256
Server Temp Key: X25519 253 bits
Application protocol: h2

finished in 23.27ms, 85966.04 req/s, 18.13MB/s
requests: 2000 total, 2000 started, 2000 done, 0 succeeded, 2000 failed, 0 errored, 0 timeout
status codes: 0 2xx, 0 3xx, 2000 4xx, 0 5xx
traffic: 432.02KB (442392) total, 97.66KB (100000) headers (space savings 49.49%), 298.83KB (306000) data
                     min         max         mean         sd        +/- sd
time for request:      171us      1.15ms       545us       132us    77.60%
time for connect:     4.85ms      6.54ms      5.66ms       685us    50.00%
time to 1st byte:     6.23ms      7.25ms      6.64ms       329us    75.00%
req/s           :   10942.02    11563.47    11270.02      189.38    75.00%
"""

H2LOAD_REFUSED = """\
starting benchmark...
spawning thread #0: 4 total client(s). 100 total requests

finished in 660us, 0.00 req/s, 0B/s
requests: 100 total, 0 started, 0 done, 0 succeeded, 100 failed, 100 errored, 0 timeout
status codes: 0 2xx, 0 3xx, 0 4xx, 0 5xx
traffic: 0B (0) total, 0B (0) headers (space savings 0.00%), 0B (0) data
                     min         max         mean         sd        +/- sd
time for request:        0us         0us         0us         0us     0.00%
time for connect:        0us         0us         0us         0us     0.00%
time to 1st byte:        0us         0us         0us         0us     0.00%
req/s           :       0.00        0.00        0.00        0.00   100.00%
"""

H2LOAD_H1_503 = """\
starting benchmark...
spawning thread #0: 8 total client(s). 2000 total requests
Application protocol: http/1.1

finished in 26.04ms, 76801.97 req/s, 27.39MB/s
requests: 2000 total, 2000 started, 2000 done, 0 succeeded, 2000 failed, 0 errored, 0 timeout
status codes: 0 2xx, 0 3xx, 0 4xx, 2000 5xx
traffic: 730.47KB (748000) total, 212.89KB (218000) headers (space savings 0.00%), 384.77KB (394000) data
                     min         max         mean         sd        +/- sd
time for request:       25us       371us        98us        47us    85.20%
time for connect:       91us       554us       280us       145us    75.00%
time to 1st byte:      291us       914us       526us       208us    75.00%
req/s           :    9766.34    10225.50     9980.11      151.68    75.00%
"""

# wrk with the harness's done() hook (text part cut: the JSON line wins).
WRK_JSON_LINE = (
    'NESTGATE-WRK {"duration_us":2027354,"requests":233217,"bytes":47576268,"errors":'
    '{"connect":0,"read":0,"write":0,"status":0,"timeout":0},"latency_us":{"mean":552.32,'
    '"stdev":1267.85,"max":22305,"p50":360,"p90":690,"p99":5790,"p99.9":18578}}\n')

# wrk with the status-counting script against a server answering 503.
WRK_COUNTED_503 = """\
Running 1s test @ http://127.0.0.1:18081/mix
  1 threads and 8 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   122.44us  205.60us   4.23ms   98.56%
    Req/Sec    53.72k     1.65k   55.76k    80.00%
  Latency Distribution
     50%  105.00us
     75%  115.00us
     90%  124.00us
     99%    0.95ms
  53290 requests in 1.00s, 19.01MB read
  Non-2xx or 3xx responses: 53290
Requests/sec:  53137.81
Transfer/sec:     18.95MB
NESTGATE-WRK {"duration_us":1002864,"requests":53290,"bytes":19930460,"errors":{"connect":0,"read":0,"write":0,"status":53290,"timeout":0},"latency_us":{"mean":122.44,"stdev":205.60,"max":4231,"p50":105,"p90":124,"p99":954,"p99.9":3061},"status":{"1xx":0,"2xx":0,"3xx":0,"4xx":0,"5xx":53290}}
"""

# h2load --log-file lines: start (us since epoch), status, response time (us).
H2LOAD_LOG = "".join(f"1796216970489646\t200\t{us}\n" for us in range(1000, 2000))


# ---------------------------------------------------------------- units

@pytest.mark.parametrize("text, ms", [
    ("811.21us", 0.81121), ("0.91ms", 0.91), ("4.44ms", 4.44), ("1.20s", 1200.0),
    ("1.20s ", 1200.0), ("1.03m", 61800.0), ("0.00us", 0.0)])
def test_time_units(text, ms):
    assert d.time_ms(text) == pytest.approx(ms)


@pytest.mark.parametrize("text, nbytes", [
    ("480.00B", 480), ("0.94KB", 963), ("20.40MB", round(20.40 * 1024**2)), ("1.5GB", 1610612736)])
def test_size_units(text, nbytes):
    assert d.size_bytes(text) == nbytes


def test_bad_unit_is_refused():
    with pytest.raises(ValueError):
        d.time_ms("12 parsecs")


def test_nearest_rank_percentile():
    values = list(range(1, 101))
    assert d.percentile(values, 50) == 50
    assert d.percentile(values, 99) == 99
    assert d.percentile(values, 99.9) == 100
    assert d.percentile([7.0], 99.9) == 7.0
    assert d.percentile([], 50) is None


# ---------------------------------------------------------------- wrk

def test_wrk_plain_run():
    r = d.parse_wrk(WRK_OK)
    assert r.requests == 126576
    assert r.duration_s == 2.0
    assert r.rps == pytest.approx(63288)
    assert r.bytes == round(20.40 * 1024**2)
    assert r.latency_ms["p50"] == pytest.approx(0.723)
    assert r.latency_ms["p90"] == pytest.approx(0.91)
    assert r.latency_ms["p99"] == pytest.approx(4.44)
    assert r.latency_ms["max"] == pytest.approx(8.52)
    assert r.latency_ms["p99.9"] is None        # only the done() hook gives it
    assert sum(r.errors.values()) == 0
    assert r.status == {"2xx/3xx": 126576, "4xx/5xx": 0}
    assert r.unexpected(200) == 0


def test_wrk_non2xx_count():
    r = d.parse_wrk(WRK_404)
    assert r.status == {"2xx/3xx": 0, "4xx/5xx": 65477}
    assert r.unexpected(200) == 65477
    assert r.unexpected(404) == 0           # the 404 scenario expects exactly this


def test_wrk_socket_errors_split():
    r = d.parse_wrk(WRK_SOCKET_ERRORS)
    assert r.errors == {"connect": 0, "read": 6861, "write": 39646, "timeout": 0, "other": 0}
    assert r.duration_s == pytest.approx(2.10)
    assert r.bytes == round(1.77 * 1024**2)


def test_wrk_timeouts():
    r = d.parse_wrk(WRK_TIMEOUTS)
    assert r.errors["timeout"] == 24
    assert r.requests == 24


def test_wrk_latency_in_seconds():
    r = d.parse_wrk(WRK_SECONDS)
    assert r.latency_ms["p50"] == pytest.approx(1200.0)
    assert r.latency_ms["p99"] == pytest.approx(1200.0)
    assert r.bytes == 480


def test_wrk_that_could_not_connect_raises():
    with pytest.raises(BenchError, match="Connection refused"):
        d.parse_wrk(WRK_REFUSED)


def test_wrk_json_line_replaces_rounded_figures():
    r = d.parse_wrk(WRK_OK + WRK_JSON_LINE)
    assert r.requests == 233217
    assert r.duration_s == pytest.approx(2.027354)
    assert r.bytes == 47576268
    assert r.latency_ms["p99.9"] == pytest.approx(18.578)
    assert r.latency_ms["p50"] == pytest.approx(0.360)
    assert r.status == {"2xx/3xx": 233217, "4xx/5xx": 0}


def test_wrk_counted_status_classes():
    r = d.parse_wrk(WRK_COUNTED_503)
    assert r.status == {"2xx": 0, "5xx": 53290}
    assert r.unexpected(200) == 53290
    assert r.latency_ms["p99.9"] == pytest.approx(3.061)


def test_wrk_scripts_differ_only_by_the_counting_part():
    plain, counting = d.wrk_script(False), d.wrk_script(True)
    assert "response = function" not in plain     # no Lua call per response by default
    assert "response = function" in counting
    assert d.WRK_MARK in plain and d.WRK_MARK in counting


# ---------------------------------------------------------------- h2load

def test_h2load_h2_over_tls13():
    r = d.parse_h2load(H2LOAD_H2_TLS13)
    assert r.requests == 302570
    assert r.duration_s == pytest.approx(3.01)
    assert r.bytes == 26024156
    assert r.protocol == "h2"
    assert r.extra["tls"] == "TLSv1.3"
    assert r.status == {"2xx": 302570, "3xx": 0, "4xx": 0, "5xx": 0}
    assert r.latency_ms["mean"] == pytest.approx(4.11)
    assert r.latency_ms["max"] == pytest.approx(23.65)
    assert r.latency_ms["p99"] is None          # h2load alone reports no percentiles


def test_h2load_percentiles_from_request_log():
    r = d.parse_h2load(H2LOAD_H2_TLS13, H2LOAD_LOG)
    assert r.latency_ms["p50"] == pytest.approx(1.499)
    assert r.latency_ms["p99"] == pytest.approx(1.989)
    assert r.latency_ms["p99.9"] == pytest.approx(1.998)


def test_h2load_status_classes():
    r = d.parse_h2load(H2LOAD_404)
    assert r.status["4xx"] == 2000
    assert r.unexpected(200) == 2000
    assert r.unexpected(404) == 0
    assert d.parse_h2load(H2LOAD_H1_503).status["5xx"] == 2000
    assert d.parse_h2load(H2LOAD_H1_503).protocol == "http/1.1"


def test_h2load_errors_when_nothing_listens():
    r = d.parse_h2load(H2LOAD_REFUSED)
    assert r.requests == 0
    assert r.errors["other"] == 100
    assert r.rps == 0
    assert r.latency_ms["mean"] is None


def test_h2load_without_a_summary_raises():
    with pytest.raises(BenchError):
        d.parse_h2load("starting benchmark...\n")


# ---------------------------------------------------------------- commands

def test_wrk_command_writes_its_script(tmp_path, monkeypatch):
    monkeypatch.setattr(d.tools, "require", lambda tool: f"/usr/bin/{tool}")
    load = d.Load("https://127.0.0.1:9/x", connections=64, duration_s=5, host="unknown.example")
    cmd = d.Wrk().command(load, tmp_path)
    assert cmd[:5] == ["/usr/bin/wrk", "-t1", "-c64", "-d5s", "--timeout=5s"]
    assert "--latency" in cmd and cmd[-1] == "https://127.0.0.1:9/x"
    assert cmd[cmd.index("-H") + 1] == "Host: unknown.example"
    assert (tmp_path / "wrk_report.lua").read_text() == d.wrk_script(False)


def test_h2load_command(tmp_path, monkeypatch):
    monkeypatch.setattr(d.tools, "require", lambda tool: f"/usr/bin/{tool}")
    cmd = d.H2load().command(d.Load("https://127.0.0.1:9/", streams=10, duration_s=5), tmp_path)
    assert "-m10" in cmd and "-D5" in cmd and "-c64" in cmd
    assert not any(a.startswith("--warm-up-time") for a in cmd)
