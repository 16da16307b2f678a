from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway.redis_server import REDIS_SERVER, RedisServer


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    if not os.path.exists(REDIS_SERVER):
        pytest.fail(
            f"redis-server not found at {REDIS_SERVER}: `make test` installs it (the Debian "
            "package redis-server), or set TOKENFAIR_REDIS_SERVER"
        )
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()
