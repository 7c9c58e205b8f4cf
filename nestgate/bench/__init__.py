"""The benchmark harness: nestgate measured against nginx (and Caddy when installed).

It owns load drivers (wrk, h2load), the peers it starts on free ports with generated
configs, the scenario table, per-run measurement of the servers from /proc, and the
summaries and plots written under `results/`. It never imports the engine: nestgate is
driven as a separate process, exactly like the peers, so both are measured the same way.
"""


class BenchError(Exception):
    """A benchmark cannot go on (missing tool, server that does not start, bad output)."""


class SkipScenario(BenchError):
    """The scenario cannot run here (a nestgate feature or a peer is missing); not a failure."""
