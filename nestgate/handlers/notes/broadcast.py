"""Note writes told to the other instances of a gateway through Redis pub/sub
(`[state] backend = "redis"`), so their pages follow within a second.

The notes folder is shared storage for the instances. On one machine every worker
sees a write at once (the store's generation counter is a shared memory-mapped file);
across machines that counter is not shared and a network filesystem may show a file's
new size and mtime late, so the directory check could miss or delay an edit. Here a
write or delete through the API publishes `{site, slug}` on `<prefix>notes`; every
other worker, of every instance, forgets what it read and rendered of that note and
marks its pages stale, so the next request reads the file again.

Publishing is one `PUBLISH` from the thread that wrote the note. Subscribing is one
connection per worker, kept by a task that reconnects (with back-off) when Redis goes
away; a message lost meanwhile is covered by the directory check, as without Redis.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import sys
from urllib.parse import urlsplit, urlunsplit

from nestgate.base.handler import Service

RETRY_MAX_S = 5.0


class NotesBroadcast(Service):
    def __init__(self, state) -> None:
        self.url = urlunsplit(urlsplit(state.url)._replace(fragment=""))
        self.channel = f"{state.prefix}notes"
        self.sender = secrets.token_hex(8)          # this worker: its own messages are skipped
        self.pages: dict[str, object] = {}          # site name -> SitePages
        self._publisher = None
        self._task = None
        self.down = False

    def watch(self, pages) -> None:
        self.pages[pages.site_name] = pages
        pages.broadcast = self

    # ------------------------------------------------------------ publishing
    def published(self, site: str, slug: str) -> None:
        """A note of `site` was written or deleted through this worker (runs in the
        thread that wrote it). A failure costs only the message."""
        import redis
        try:
            if self._publisher is None:
                self._publisher = redis.Redis.from_url(self.url, socket_timeout=2.0,
                                                       socket_connect_timeout=2.0)
            self._publisher.publish(self.channel, json.dumps(
                {"site": site, "slug": slug, "from": self.sender}))
        except redis.RedisError as exc:
            print(f"nestgate: notes: could not tell the other instances about {slug}: "
                  f"{exc}", file=sys.stderr, flush=True)

    # ------------------------------------------------------------ listening
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._listen())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _listen(self) -> None:
        import redis.asyncio
        wait = 0.1
        while True:
            client = redis.asyncio.Redis.from_url(self.url)
            try:
                async with client.pubsub() as pubsub:
                    await pubsub.subscribe(self.channel)
                    if self.down:
                        self.down = False
                        print("nestgate: notes: listening to the other instances again",
                              file=sys.stderr, flush=True)
                    wait = 0.1
                    async for message in pubsub.listen():
                        if message.get("type") == "message":
                            await self._heard(message["data"])
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - Redis away: try again later
                if not self.down:
                    self.down = True
                    print(f"nestgate: notes: not hearing the other instances ({exc}); "
                          f"the directory check still sees edits", file=sys.stderr, flush=True)
            finally:
                await client.aclose()
            await asyncio.sleep(wait)
            wait = min(wait * 2, RETRY_MAX_S)

    async def _heard(self, data: bytes) -> None:
        try:
            told = json.loads(data)
            pages = self.pages.get(told["site"])
            slug = str(told["slug"])
        except (ValueError, KeyError, TypeError):
            return                                  # not ours: ignored
        if pages is None or told.get("from") == self.sender:
            return
        await asyncio.get_running_loop().run_in_executor(None, pages.changed_elsewhere, slug)
