"""A release-only process measures the worker-broker clock skew and holds publication past the bound (real broker).

The release side publishes each release no earlier than its public time P(w) by its own clock. A clock that
runs ahead of the broker's would publish early by the broker's (and every consumer's) time, so it runs the
ingest's probe and gate: while the skew is past `max_clock_skew_s`, a due release is held, counted and
exported. The worker's clock is shifted here (injected), the broker's is the machine's.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import faust
import pytest
from prometheus_client import CollectorRegistry

from dpstream.topology.model import Sinks, Source
from dpstream.workers.ledger.testing import one_scope_topology
from dpstream.workers.runtime.releases import ReleaseSide
from dpstream.workers.runtime.settings import RuntimeSettings
from dpstream.workers.runtime.topics import ensure_topics
from dpstream.workers.telemetry.worker import WorkerCollector
from dpstream.workers.verify.sources import read_topic

pytestmark = pytest.mark.integration

WAIT_S = 60.0
"""Upper bound of each wait on the side (a hang fails the test instead of blocking it)."""


def test_a_release_only_side_holds_publication_while_its_clock_runs_ahead_of_the_broker(
    kafka_broker: Any, fresh_redis: Any
) -> None:
    """With the worker's clock 5 s ahead, a release whose P(w) passed on the worker's clock is not published:
    the hold is counted and `dpstream_clock_skew_publishes_held` is 1; once the clock is put right and
    measured again, the release goes out, stamped P(w) (without the gate it went out at once)."""
    prefix = f"skew-rel-{uuid.uuid4().hex[:10]}"
    base = one_scope_topology(metrics=(("m", 1.0, 60, 60, False),))
    topology = replace(
        base,
        sources={"src": Source("src", f"{prefix}.events", "user_id", timestamp="ts", keyed_by_unit=True)},
        sinks=Sinks(f"{prefix}.releases", f"{prefix}.dead"),
    )
    ensure_topics(kafka_broker.bootstrap, topology, partitions=1)
    offset = [5.0]
    settings = RuntimeSettings(kafka_broker.bootstrap, fresh_redis.url, clock_probe_interval_s=3600.0)
    app = faust.App(f"test-{prefix}", broker=f"kafka://{kafka_broker.bootstrap}", web_enabled=False)
    side = ReleaseSide(app, topology, settings, {"m": 1}, clock=lambda: time.time() + offset[0])
    due = int(time.time()) - 1  # P(w) passed on both clocks: only the skew can hold it
    stamp = datetime.fromtimestamp(due, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    record = json.dumps({"release_id": "r1", "published_at": stamp}, separators=(",", ":")).encode()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkerCollector(topology, releases=side))

    async def body() -> tuple[int, float | None, float | None, list[Any], list[Any]]:
        await side.start()
        try:
            reading = side.clock_skew.last
            assert reading is not None and reading.skew_s < -4.0  # the start's probe saw the worker 5 s ahead
            held_gauge = registry.get_sample_value("dpstream_clock_skew_publishes_held")
            skew_gauge = registry.get_sample_value("dpstream_clock_skew_seconds")
            publishing = asyncio.ensure_future(side._publish(record, b"r1"))  # noqa: SLF001 - every publication's path
            deadline = time.monotonic() + WAIT_S
            while side.stats.skew_holds < 1:
                assert time.monotonic() < deadline and not publishing.done()
                await asyncio.sleep(0.05)
            during = await read_topic(kafka_broker.bootstrap, topology.sinks.releases, timeout_s=30)
            assert not publishing.done()
            offset[0] = 0.0  # the worker's clock is put right; the next reading opens the gate
            await side.measure_clock_skew()
            await asyncio.wait_for(publishing, WAIT_S)
            after = await read_topic(kafka_broker.bootstrap, topology.sinks.releases, timeout_s=30)
            return side.stats.skew_holds, held_gauge, skew_gauge, during, after
        finally:
            await side.stop()

    holds, held_gauge, skew_gauge, during, after = asyncio.run(body())
    assert holds >= 1 and held_gauge == 1.0 and skew_gauge is not None and skew_gauge < -4.0
    assert during == []
    assert [(r.value, r.timestamp) for r in after] == [(record, due * 1000)]
    assert registry.get_sample_value("dpstream_clock_skew_publishes_held") == 0.0
