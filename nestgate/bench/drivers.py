"""Load drivers: wrk for HTTP/1.1, h2load for HTTP/2. Commands in, one `RunResult` out.

Parsing is pure (text in, result out) so the tests feed it outputs captured from the real
tools. wrk's text report rounds and has no P99.9, so wrk runs with a small Lua `done()`
hook that prints its exact totals as one JSON line; the text is the fallback. h2load reports
no percentiles at all, so it writes a per-request log (`--log-file`) that is reduced to
percentiles here. Neither hook adds a Lua call per response: that would slow the client,
which shares the cores with the server.
"""

import json
import math
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from . import BenchError, tools

LATENCY_KEYS = ("p50", "p90", "p99", "p99.9", "mean", "max")
ERROR_KEYS = ("connect", "read", "write", "timeout", "other")

_TIME_UNITS_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3, "h": 3600e3}
_SIZE_UNITS = {"B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3, "TB": 1024**4}


@dataclass
class RunResult:
    """What one driver run measured, from the client's side."""
    requests: int
    duration_s: float
    bytes: int
    latency_ms: dict[str, float | None]
    errors: dict[str, int]
    # Responses by status class. wrk only tells "status >= 400" apart unless the counting
    # script runs, so its keys are then "2xx/3xx" and "4xx/5xx".
    status: dict[str, int]
    protocol: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def rps(self) -> float:
        return self.requests / self.duration_s if self.duration_s else 0.0

    @property
    def bytes_per_s(self) -> float:
        return self.bytes / self.duration_s if self.duration_s else 0.0

    def unexpected(self, expect_status: int) -> int:
        """Responses whose class is not the expected one (e.g. any non-2xx when 200 is)."""
        wanted = f"{expect_status // 100}xx"
        return sum(n for cls, n in self.status.items() if wanted not in cls)

    def as_dict(self) -> dict:
        return {"requests": self.requests, "duration_s": self.duration_s, "bytes": self.bytes,
                "requests_per_s": self.rps, "bytes_per_s": self.bytes_per_s,
                "latency_ms": self.latency_ms, "errors": self.errors, "status": self.status,
                "protocol": self.protocol, **self.extra}


def time_ms(text: str) -> float:
    """'811.21us' / '0.91ms' / '1.20s' / '1.03m' -> milliseconds."""
    m = re.fullmatch(r"\s*([\d.]+)\s*(us|ms|s|m|h)\s*", text)
    if not m:
        raise ValueError(f"not a duration: {text!r}")
    return float(m.group(1)) * _TIME_UNITS_MS[m.group(2)]


def size_bytes(text: str) -> int:
    """'20.40MB' (wrk's binary units) -> bytes."""
    m = re.fullmatch(r"\s*([\d.]+)\s*(B|KB|MB|GB|TB)\s*", text)
    if not m:
        raise ValueError(f"not a size: {text!r}")
    return round(float(m.group(1)) * _SIZE_UNITS[m.group(2)])


def percentile(sorted_values: list[float], pct: float) -> float | None:
    """Nearest-rank percentile of an ascending list (the value at or above pct% of samples)."""
    if not sorted_values:
        return None
    # round() first: 99.9 / 100 * 1000 is 999.0000000000001 in floating point.
    rank = max(1, math.ceil(round(pct * len(sorted_values) / 100, 9)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


# ---------------------------------------------------------------- wrk

WRK_MARK = "NESTGATE-WRK "

# done() sees wrk's own counters; `response()` is defined only by the counting variant
# because it makes wrk hand every response to Lua (about 10-15% fewer requests/s here).
_WRK_DONE = r'''
local function num(x) if x == nil or x ~= x then return 0 end return x end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '%s{"duration_us":%%d,"requests":%%d,"bytes":%%d,' ..
    '"errors":{"connect":%%d,"read":%%d,"write":%%d,"status":%%d,"timeout":%%d},' ..
    '"latency_us":{"mean":%%.2f,"stdev":%%.2f,"max":%%d,"p50":%%d,"p90":%%d,"p99":%%d,"p99.9":%%d}%%s}\n',
    summary.duration, summary.requests, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    num(latency.mean), num(latency.stdev), num(latency.max),
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency:percentile(99.9), classes_json()))
end
''' % WRK_MARK

_WRK_NO_COUNT = "function classes_json() return '' end\n"

_WRK_COUNT = r'''
counts = {0, 0, 0, 0, 0}
local threads = {}
setup = function(thread) table.insert(threads, thread) end
response = function(status, headers, body)
  local c = math.floor(status / 100)
  if c >= 1 and c <= 5 then counts[c] = counts[c] + 1 end
end
function classes_json()
  local t = {0, 0, 0, 0, 0}
  for _, thread in ipairs(threads) do
    local c = thread:get("counts")
    for i = 1, 5 do t[i] = t[i] + c[i] end
  end
  return string.format(',"status":{"1xx":%d,"2xx":%d,"3xx":%d,"4xx":%d,"5xx":%d}',
                       t[1], t[2], t[3], t[4], t[5])
end
'''


def wrk_script(count_status: bool) -> str:
    return "-- written by nestgate bench\n" + (_WRK_COUNT if count_status else _WRK_NO_COUNT) + _WRK_DONE


def parse_wrk(text: str) -> RunResult:
    if "requests in" not in text:
        first = text.strip().splitlines()[0] if text.strip() else "no output"
        raise BenchError(f"wrk did not run: {first}")
    result = _parse_wrk_text(text)
    for line in text.splitlines():
        if line.startswith(WRK_MARK):
            _apply_wrk_json(result, json.loads(line[len(WRK_MARK):]))
    return result


def _parse_wrk_text(text: str) -> RunResult:
    m = re.search(r"(\d+) requests in ([\d.]+\w+), ([\d.]+\w+) read", text)
    requests, duration_s, nbytes = int(m.group(1)), time_ms(m.group(2)) / 1e3, size_bytes(m.group(3))
    latency: dict[str, float | None] = dict.fromkeys(LATENCY_KEYS)
    m = re.search(r"Latency\s+([\d.]+\w+)\s+([\d.]+\w+)\s+([\d.]+\w+)", text)
    if m and requests:
        latency["mean"], latency["max"] = time_ms(m.group(1)), time_ms(m.group(3))
    for pct, value in re.findall(r"^\s+(50|90|99)%\s+([\d.]+\w+)\s*$", text, re.M):
        latency[f"p{pct}"] = time_ms(value) if requests else None
    errors = dict.fromkeys(ERROR_KEYS, 0)
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    if m:
        errors.update(zip(ERROR_KEYS, map(int, m.groups())))
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    bad = int(m.group(1)) if m else 0
    return RunResult(requests, duration_s, nbytes, latency, errors,
                     {"2xx/3xx": requests - bad, "4xx/5xx": bad}, "http/1.1")


def _apply_wrk_json(result: RunResult, data: dict) -> None:
    """The exact figures replace the rounded ones read from the text."""
    result.requests = data["requests"]
    result.duration_s = data["duration_us"] / 1e6
    result.bytes = data["bytes"]
    e = data["errors"]
    result.errors.update({k: e[k] for k in ("connect", "read", "write", "timeout")})
    if result.requests:
        lat = data["latency_us"]
        result.latency_ms.update({k: lat[k] / 1e3 for k in LATENCY_KEYS})
    if "status" in data:
        result.status = {k: v for k, v in data["status"].items() if v or k == "2xx"}
    else:
        result.status = {"2xx/3xx": result.requests - e["status"], "4xx/5xx": e["status"]}


# ---------------------------------------------------------------- h2load

def parse_h2load(text: str, log_text: str | None = None) -> RunResult:
    m = re.search(r"finished in ([\d.]+\w+), ([\d.]+) req/s", text)
    if not m:
        raise BenchError("h2load did not finish: " + text.strip()[-300:])
    duration_s = time_ms(m.group(1)) / 1e3
    m = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, "
                  r"(\d+) failed, (\d+) errored, (\d+) timeout", text)
    done, errored, timeouts = int(m.group(3)), int(m.group(6)), int(m.group(7))
    m = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", text)
    status = dict(zip(("2xx", "3xx", "4xx", "5xx"), map(int, m.groups())))
    m = re.search(r"traffic: \S+ \((\d+)\) total", text)
    nbytes = int(m.group(1))
    errors = dict.fromkeys(ERROR_KEYS, 0)
    # h2load does not say which step failed; errored streams or connections go to "other".
    errors.update(timeout=timeouts, other=errored)
    m = re.search(r"Application protocol: (\S+)", text)
    protocol = m.group(1) if m else ""
    answered = sum(status.values())
    latency: dict[str, float | None] = dict.fromkeys(LATENCY_KEYS)
    m = re.search(r"time for request:\s+(\S+)\s+(\S+)\s+(\S+)", text)
    if m and answered:
        latency["max"], latency["mean"] = time_ms(m.group(2)), time_ms(m.group(3))
    if log_text:
        latency.update(_h2load_log_percentiles(log_text))
    result = RunResult(done, duration_s, nbytes, latency, errors, status, protocol)
    m = re.search(r"TLS Protocol: (\S+)", text)
    if m:
        result.extra["tls"] = m.group(1)
    return result


def _h2load_log_percentiles(log_text: str) -> dict[str, float | None]:
    # Each line: request start (us since epoch), status, time to the whole response (us).
    samples = sorted(int(line.split("\t")[2]) / 1e3 for line in log_text.splitlines() if line)
    return {f"p{p}": percentile(samples, float(p)) for p in ("50", "90", "99", "99.9")}


# ---------------------------------------------------------------- running

@dataclass(frozen=True)
class Load:
    """What one run sends: the same for every peer of a scenario."""
    url: str
    connections: int = 64
    threads: int = 1
    duration_s: int = 5
    streams: int = 1                # h2load -m: concurrent streams per connection
    host: str = ""                  # Host header when the URL's host is not the one to send
    headers: tuple[str, ...] = ()   # more request headers, "Name: value"
    timeout_s: int = 5
    count_status: bool = False      # wrk: count every status class (slower client)


class Wrk:
    name = "wrk"

    def command(self, load: Load, workdir: Path) -> list[str]:
        script = workdir / ("wrk_count_status.lua" if load.count_status else "wrk_report.lua")
        if not script.exists():
            script.write_text(wrk_script(load.count_status))
        cmd = [tools.require("wrk"), f"-t{load.threads}", f"-c{load.connections}",
               f"-d{load.duration_s}s", f"--timeout={load.timeout_s}s", "--latency", "-s", str(script)]
        if load.host:
            cmd += ["-H", f"Host: {load.host}"]
        for header in load.headers:
            cmd += ["-H", header]
        return cmd + [load.url]

    def parse(self, stdout: str, workdir: Path) -> RunResult:
        return parse_wrk(stdout)


class H2load:
    name = "h2load"
    LOG = "h2load_requests.log"

    def command(self, load: Load, workdir: Path) -> list[str]:
        # Timing mode without h2load's own warm-up: h2load 1.52 reports zero requests when
        # --warm-up-time is set, and the harness runs its own warm-up anyway.
        cmd = [tools.require("h2load"), f"-t{load.threads}", f"-c{load.connections}",
               f"-m{load.streams}", f"-D{load.duration_s}", f"--log-file={workdir / self.LOG}"]
        if load.host:
            cmd += ["-H", f":authority: {load.host}"]
        for header in load.headers:
            cmd += ["-H", header]
        return cmd + [load.url]

    def parse(self, stdout: str, workdir: Path) -> RunResult:
        log = workdir / self.LOG
        try:
            log_text = log.read_text() if log.exists() else None
        finally:
            log.unlink(missing_ok=True)     # hundreds of thousands of lines: keep the summary only
        return parse_h2load(stdout, log_text)


DRIVERS = {"wrk": Wrk(), "h2load": H2load()}


def run(driver_name: str, load: Load, raw_path: Path) -> RunResult:
    """Run the driver once; its raw output is kept in `raw_path` whatever happens."""
    driver = DRIVERS[driver_name]
    cmd = driver.command(load, raw_path.parent)
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=load.duration_s + 60)
    except subprocess.TimeoutExpired as exc:
        raise BenchError(f"{driver_name} did not finish within {load.duration_s + 60}s") from exc
    # h2load prints a line per 10% of progress: noise in the raw file.
    stdout = "\n".join(l for l in out.stdout.splitlines() if not l.startswith("progress: "))
    raw_path.write_text("$ " + " ".join(cmd) + "\n" + stdout + "\n" + out.stderr)
    return driver.parse(stdout + "\n" + out.stderr, raw_path.parent)
