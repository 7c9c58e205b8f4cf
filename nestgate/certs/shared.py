"""Certificates shared by several instances through Redis (`[state] backend = "redis"`):
one instance orders, every instance serves.

Each instance keeps its own storage folder (its workers read nothing else); Redis
holds what they must agree on, under the state's key prefix:

    <prefix>cert:<kind>:<name>    hash: chain, key, directory       the current certificate
    <prefix>certlock:<kind>:<name> the order lock (SET NX with an expiry, owner token)
    <prefix>acme-http             hash: token -> key authorization  HTTP-01 being validated
    <prefix>acme-alpn             hash: name -> PEM                 TLS-ALPN-01 being validated
    <prefix>internal-ca           hash: cert, key                   the local CA's root
    <prefix>certs:version         INCR on every change above

Every certificate process looks at `certs:version` once a second and, when it moved,
copies what changed into its storage (which its workers then reload): a certificate
another instance obtained, and the challenge answers of another instance's order (the
CA may reach any instance behind the balancer). The instance that orders waits
`MIRROR_WAIT` after publishing an answer before telling the CA.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from urllib.parse import urlsplit, urlunsplit

MIRROR_WAIT = 2.5              # seconds: every instance's poll (1 s) has seen the answer
LOCK_TTL_MS = 10 * 60 * 1000   # an order never takes this long; a crashed holder frees it
_RELEASE = """if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1]) else return 0 end"""


class RedisShare:
    def __init__(self, state) -> None:
        import redis
        self.errors = (redis.RedisError, OSError)
        self.db = redis.Redis.from_url(urlunsplit(urlsplit(state.url)._replace(fragment="")),
                                       socket_timeout=5.0, socket_connect_timeout=5.0)
        self.prefix = state.prefix
        self.seen_version = None

    def _key(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    def _changed(self, pipe) -> None:
        pipe.incr(self._key("certs", "version"))

    # ------------------------------------------------------------ lock
    @contextlib.contextmanager
    def lock(self, kind: str, name: str, wait: float = 0.0):
        """The order lock across instances; yields False when another holds it."""
        key, token = self._key("certlock", kind, name), secrets.token_hex(16)
        deadline = time.monotonic() + wait
        while not self.db.set(key, token, nx=True, px=LOCK_TTL_MS):
            if time.monotonic() >= deadline:
                yield False
                return
            time.sleep(0.2)
        try:
            yield True
        finally:
            with contextlib.suppress(*self.errors):
                self.db.eval(_RELEASE, 1, key, token)

    # ------------------------------------------------------------ publishing
    def publish_certificate(self, kind: str, name: str, chain: bytes, key: bytes,
                            directory: str) -> None:
        pipe = self.db.pipeline()
        pipe.hset(self._key("cert", kind, name),
                  mapping={"chain": chain, "key": key, "directory": directory})
        self._changed(pipe)
        pipe.execute()

    def _answer(self, table: str, field: str, value: bytes | str | None) -> None:
        """Set (or, with None, remove) one challenge answer, and tell the others."""
        pipe = self.db.pipeline()
        if value is None:
            pipe.hdel(self._key(table), field)
        else:
            pipe.hset(self._key(table), field, value)
        self._changed(pipe)
        pipe.execute()

    def publish_http(self, token: str, key_authorization: str) -> None:
        self._answer("acme-http", token, key_authorization)

    def withdraw_http(self, token: str) -> None:
        self._answer("acme-http", token, None)

    def publish_alpn(self, name: str, pem: bytes) -> None:
        self._answer("acme-alpn", name, pem)

    def withdraw_alpn(self, name: str) -> None:
        self._answer("acme-alpn", name, None)

    def local_ca(self) -> tuple[bytes, bytes] | None:
        """The local CA's root (certificate, key) the instances share, if one exists."""
        found = self.db.hgetall(self._key("internal-ca"))
        return (found[b"cert"], found[b"key"]) if found else None

    def publish_local_ca(self, cert: bytes, key: bytes) -> None:
        self.db.hset(self._key("internal-ca"), mapping={"cert": cert, "key": key})

    # ------------------------------------------------------------ mirroring
    def pull(self, storage, managed) -> list[str]:
        """Copy into `storage` what changed in Redis since the last look: names whose
        certificate was replaced (empty when nothing moved)."""
        version = self.db.get(self._key("certs", "version"))
        if version == self.seen_version:
            return []
        replaced = []
        for item in managed:
            found = self.db.hgetall(self._key("cert", item.kind, item.name))
            if not found:
                continue
            stored = storage.load(item.kind, item.name)
            if stored is None or stored.chain_pem != found[b"chain"]:
                storage.save(item.kind, item.name, found[b"chain"], found[b"key"],
                             directory=found.get(b"directory", b"").decode(),
                             shared=False, from_instance=True)
                replaced.append(item.name)
        tokens = {k.decode(): v for k, v in self.db.hgetall(self._key("acme-http")).items()}
        storage.mirror_http(tokens)
        alpn = {k.decode(): v for k, v in self.db.hgetall(self._key("acme-alpn")).items()}
        storage.mirror_alpn(alpn)
        self.seen_version = version
        return replaced
