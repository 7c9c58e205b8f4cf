"""The operator's requests to every worker: purge the rendered pages, re-read the notes
folders, drain an upstream by hand (the admin API's /v1/notes/... and /v1/upstreams/...).

Theory of operation
-------------------
The admin process keeps one JSON document of what the operator asked in the shared
table's control frame (nestgate/admin/stats.py): counters for one-off actions
(`purge`, `reread`) and, as a state, the upstreams drained by hand. Each worker reads
the frame on its publish tick (twice a second: a memory read, and a parse only when the
sequence changed), does the actions whose counter moved since it last looked, sets
every target's drained flag to the document's, and publishes the sequence it applied
with its tally, so the admin process answers the operator once every worker has. A
worker that starts later (a restart, a reload) applies the state the same way on its
first tick; a purge it never saw has nothing to purge.
"""

from __future__ import annotations

import contextlib
import json

from nestgate.base.tally import TALLY


class Controls:
    def __init__(self) -> None:
        self.pages: list = []            # SitePages of this worker (notes/pages.py)
        self.seq = 0                     # the control frame's sequence last applied
        self.done = {"purge": 0, "reread": 0}

    @contextlib.contextmanager
    def not_kept(self):
        """Pages built inside are not this process's (as Tally.not_counted): yields the
        list of them, complete once the block ends, for the process that serves them."""
        kept = list(self.pages)
        built: list = []
        try:
            yield built
        finally:
            built.extend(pages for pages in self.pages if pages not in kept)
            self.pages[:] = kept

    def poll(self, table) -> None:
        """On the worker's publish tick: apply the operator's requests if they changed."""
        if table.control_seq() == self.seq:
            return                       # the usual tick: one struct read
        seq, data = table.read_control()
        if seq == self.seq or not data:
            return
        try:
            wanted = json.loads(data)
        except ValueError:
            return                       # a torn read the frame did not catch: next tick
        # A worker's first look adopts the counters: it has rendered nothing to purge.
        first = self.seq == 0
        reread = not first and wanted.get("reread", 0) > self.done["reread"]
        if reread or (not first and wanted.get("purge", 0) > self.done["purge"]):
            for pages in self.pages:
                pages.purge()
                if reread:
                    # On the loop, not the executor, so the admin API's answer means it
                    # is done: it clears dicts and unlinks the kept renderings (a few
                    # ms for hundreds of notes), once per operator request.
                    pages.reread()
        self.done = {"purge": wanted.get("purge", 0), "reread": wanted.get("reread", 0)}
        drained = {tuple(pair) for pair in wanted.get("drained", ())}
        for proxy in TALLY.proxies:
            for target in proxy.targets:
                target.drain((proxy.label, target.name) in drained)
        self.seq = seq


CONTROLS = Controls()                   # this worker's
