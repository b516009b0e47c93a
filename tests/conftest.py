"""Shared pytest setup: `--runslow`, and real Redis / Kafka started on free loopback ports for the session.

The servers come from `workers.localstack` (the same code as `python -m workers.localstack up`) and run
in a temporary directory; Kafka's jars are shared with the local stack's cache, so they are fetched
once per machine. Set `DPSTREAM_TEST_REDIS=redis://host:port/db` or `DPSTREAM_TEST_KAFKA=host:port`
to use servers that already run instead (restart helpers then skip the test).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import pytest
from hypothesis.configuration import set_hypothesis_home_dir

from dpstream.workers.localstack import KafkaHandle, RedisHandle, create_topics, free_port

if TYPE_CHECKING:
    import redis

# hypothesis keeps its examples and caches outside the checkout (the top level holds only the project's folders)
_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dpstream"
set_hypothesis_home_dir(str(_CACHE / "hypothesis"))

_REDIS_ENV = "DPSTREAM_TEST_REDIS"
_KAFKA_ENV = "DPSTREAM_TEST_KAFKA"


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add `--runslow`, which runs the tests marked `@pytest.mark.slow`."""
    parser.addoption("--runslow", action="store_true", default=False, help="also run tests marked slow")


TIERS = ("unit", "integration", "e2e", "statistical", "chaos")
"""Every test carries exactly one tier marker (`slow` comes on top): `pytest -m unit` is the quick loop."""

_TIER_OF_DIR = {
    "unit": "unit",
    "integration": "integration",
    "e2e": "e2e",
    "statistical": "statistical",
    "privacy": "statistical",
    "chaos": "chaos",
}
"""The tier of a test that does not name one, by its directory (privacy tests are statistical claims)."""


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip slow tests unless `--runslow`; give every test without a tier marker its directory's tier."""
    runslow = config.getoption("--runslow")
    skip_slow = pytest.mark.skip(reason="slow: run with --runslow")
    root = Path(__file__).parent
    for item in items:
        if "slow" in item.keywords and not runslow:
            item.add_marker(skip_slow)
        if any(item.get_closest_marker(tier) for tier in TIERS):
            continue
        folder = item.path.relative_to(root).parts[0]
        tier = _TIER_OF_DIR.get(folder)
        if tier is None:
            raise pytest.UsageError(f"{item.nodeid}: no tier; mark it with one of {', '.join(TIERS)}")
        item.add_marker(getattr(pytest.mark, tier))


@dataclass
class RedisServer:
    """A Redis for tests: `.url`, `.port`, a client, and crash/restart helpers when the fixture owns it."""

    url: str
    port: int
    handle: RedisHandle | None = None

    def client(self, **kwargs: Any) -> redis.Redis:
        """A new redis-py client for this server (decode_responses etc. may be passed)."""
        import redis as redis_py

        return redis_py.Redis.from_url(self.url, **kwargs)

    def flush(self) -> None:
        """Empty every database (the server is the tests' own, or one given for tests)."""
        self.ensure_running()
        with self.client() as client:
            client.flushall()

    def kill(self) -> None:
        """SIGKILL the server, as a crash would (needs the fixture's own server)."""
        self._own().kill()

    def start(self) -> None:
        """Start it again on the same port and AOF (needs the fixture's own server)."""
        self._own().start()

    def restart(self, hard: bool = True) -> None:
        """Kill (hard) or stop (graceful), then start on the same data; the AOF replays everything acknowledged."""
        handle = self._own()
        handle.kill() if hard else handle.stop()
        handle.start()

    def ensure_running(self) -> None:
        """Start the fixture's server again if a test left it down."""
        if self.handle is not None and not self.handle.is_running():
            self.handle.start()

    def _own(self) -> RedisHandle:
        if self.handle is None:
            pytest.skip(f"needs the fixture's own Redis (unset {_REDIS_ENV})")
        return self.handle


@dataclass
class KafkaBroker:
    """A Kafka broker for tests: `.bootstrap`, `create_topics`, and the handle when the fixture owns it."""

    bootstrap: str
    handle: KafkaHandle | None = None

    def create_topics(self, names: list[str], partitions: int = 4) -> list[str]:
        """Create the missing topics (replication 1) and wait for their leaders; returns those created now."""
        return create_topics(self.bootstrap, names, partitions)

    def new_topic(self, prefix: str = "test", partitions: int = 4) -> str:
        """Create a topic with a unique name and return the name."""
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        self.create_topics([name], partitions)
        return name


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A real Redis (AOF, appendfsync always) on a free loopback port, for the whole session."""
    external = os.environ.get(_REDIS_ENV, "").strip()
    if external:
        yield RedisServer(url=external, port=urlparse(external).port or 6379)
        return
    handle = RedisHandle(free_port(), tmp_path_factory.mktemp("redis"))
    handle.start()
    try:
        yield RedisServer(url=handle.url, port=handle.port, handle=handle)
    finally:
        handle.stop()


@pytest.fixture
def fresh_redis(redis_server: RedisServer) -> RedisServer:
    """The session Redis, running and emptied for this test."""
    redis_server.flush()
    return redis_server


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """A real single-node KRaft Kafka on free loopback ports, started on first use, stopped at session end."""
    external = os.environ.get(_KAFKA_ENV, "").strip()
    if external:
        yield KafkaBroker(bootstrap=external)
        return
    port = free_port()
    handle = KafkaHandle(port, free_port(avoid=frozenset({port})), tmp_path_factory.mktemp("kafka"))
    handle.start()
    try:
        yield KafkaBroker(bootstrap=handle.bootstrap, handle=handle)
    finally:
        handle.stop()


@pytest.fixture
def kafka_topic(kafka_broker: KafkaBroker, request: pytest.FixtureRequest) -> str:
    """A fresh 4-partition topic with a unique name, for one test."""
    stem = "".join(ch if ch.isalnum() else "-" for ch in request.node.name)[:40].strip("-")
    return kafka_broker.new_topic(f"t-{stem}")
