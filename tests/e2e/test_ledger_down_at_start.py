"""A worker started while its ledger's Redis is down waits for it (fail closed, no crash loop), then releases."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.e2e.harness import deploy, event, poll, releases, send

pytestmark = pytest.mark.e2e

WINDOW = 2


def test_worker_waits_for_the_ledger_at_start_then_releases(tmp_path: Path, kafka_broker, fresh_redis) -> None:
    """Redis down at start: the worker stays up, logs that it waits, publishes nothing; once Redis is back
    it releases the window that events were sent to while it waited."""
    dep = deploy(tmp_path, kafka_broker.bootstrap, fresh_redis.url)
    fresh_redis.kill()
    try:
        worker = dep.start_worker("w1")
        waited = poll(lambda: "ledger unavailable" in dep.log("w1") or worker.poll() is not None, timeout_s=90)
        assert waited and worker.poll() is None, dep.log("w1")[-3000:]
        t0 = (int(time.time()) // WINDOW + 1) * WINDOW
        send(dep.bootstrap, dep.source_topic, [event(f"u{i}", t0 + 0.5) for i in range(5)])
        assert releases(dep.bootstrap, dep.topology.sinks.releases) == []  # nothing without a ledger
        assert worker.poll() is None, dep.log("w1")[-3000:]
        fresh_redis.start()

        def released() -> bool:
            return any(r["window"]["start_epoch"] == t0 for r in releases(dep.bootstrap, dep.topology.sinks.releases))

        assert poll(released, timeout_s=120), dep.log("w1")[-3000:]
        assert worker.poll() is None
    finally:
        fresh_redis.ensure_running()
        dep.stop_all()
