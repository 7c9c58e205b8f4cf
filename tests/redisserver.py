"""A redis-server of the tests' own (Debian's), as the Redis state and the shared
certificates are tested against."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest

from conftest import free_port

REDIS_PASSWORD = "redis-pass-for-the-tests"


class RedisServer:
    """A redis-server of our own on a free port, with a password, keeping its data in
    an append-only file so that a restart finds it again."""

    def __init__(self, folder) -> None:
        self.binary = shutil.which("redis-server")
        assert self.binary, "redis-server is installed by `make test` (debian-deps)"
        self.folder = folder
        self.port = free_port()
        self.url = f"redis://:{REDIS_PASSWORD}@127.0.0.1:{self.port}/3"
        self.proc = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes", "--dir", str(self.folder), "--requirepass", REDIS_PASSWORD],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis
        client = redis.Redis(port=self.port, password=REDIS_PASSWORD)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)
        client.close()

    def stop(self) -> None:
        """As an operator stops it (SIGTERM: the append-only file is flushed)."""
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture
def redis_server(tmp_path):
    """A RedisServer of the test's own, killed after it."""
    server = RedisServer(tmp_path)
    yield server
    server.proc.kill()
    server.proc.wait()
