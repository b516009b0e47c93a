"""Poison windows on the real stack (Redis ledger, Kafka producer): a release record the producer
refuses (over its max_request_size, a real and non-retriable failure) is charged, fails N times, is
parked (audited, shown by `dpstream budget`, exported as dpstream_releases_parked), and after the fix
and `dpstream budget retry` its stored bytes are published exactly once."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from prometheus_client import CollectorRegistry

from dpstream.topology.loader import load_topology_text
from dpstream.topology.model import Topology
from dpstream.workers.cli import main
from dpstream.workers.ledger import AuditKind, Ledger, open_ledger
from dpstream.workers.ledger.testing import ManualClock
from dpstream.workers.pipeline.merger import MergedWindow
from dpstream.workers.release import Releaser
from dpstream.workers.release.dispatch import ReleaseDispatcher
from dpstream.workers.release.parking import Parking, is_transient
from dpstream.workers.telemetry.budget import BudgetCollector, BudgetReader, LedgerSource

DAY = 86_400
HOUR = 3_600
T0 = 1_796_000_000
P0 = (T0 // DAY) * DAY
KEYS = [f"page-{i:03d}" for i in range(300)]
SENTINEL = b"end-of-test"

_YAML = f"""
version: 1
sources:
  s: {{topic: t, privacy_unit: user_id, timestamp: ts}}
budgets:
  web: {{epsilon: 1.0, accounting: pure, period: 1d, reserve: 0.2}}
metrics:
  pages:
    source: s
    budget: web
    window: {{tumbling: 1h}}
    aggregate: count
    group_by: page
    keys: [{", ".join(KEYS)}]
    contribution: {{max_keys: 1, max_per_key: 1}}
    mechanism: laplace
sinks: {{releases: r, dead_letter: d}}
"""


class _Side:
    """The release side's wiring (as runtime.releases.ReleaseSide) on a real ledger and producer."""

    def __init__(self, topology: Topology, ledger: Ledger, producer: AIOKafkaProducer, topic: str) -> None:
        self.clock = ManualClock(0.0)
        self.producer = producer
        self.topic = topic
        self.releaser = Releaser(topology, ledger)
        self.parking = Parking(topology, ledger, "worker-it")
        self.dispatcher = ReleaseDispatcher(
            self._release, park=self.parking.park, max_attempts=3, transient=is_transient, clock=self.clock
        )

    async def _publish(self, value: bytes, key: bytes) -> None:
        await self.producer.send_and_wait(self.topic, value, key=key)

    async def _release(self, window: MergedWindow) -> Any:
        return await self.parking.release(window, lambda w: self.releaser.release_merged(w, self._publish))

    async def attempt(self, window: MergedWindow) -> bool:
        self.clock.advance(61.0)  # past the backoff
        started = self.dispatcher.dispatch(window)
        await self.dispatcher.drain()
        return started


async def _scrape_parked(url: str, topology: Topology) -> float | None:
    collector = BudgetCollector(LedgerSource(url), BudgetReader(topology))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    assert await collector.refresh()
    await collector.source.close()
    return registry.get_sample_value("dpstream_releases_parked", {"scope": "web"})


async def _records_until_sentinel(bootstrap: str, topic: str) -> list[tuple[bytes, bytes]]:
    """Every record of the one-partition topic before the sentinel record (written last)."""
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()
    got: list[tuple[bytes, bytes]] = []
    try:
        while True:
            record = await asyncio.wait_for(consumer.getone(), 60.0)
            if record.value == SENTINEL:
                return got
            got.append((record.key, record.value))
    finally:
        await consumer.stop()


def test_a_refused_record_is_parked_shown_and_published_once_after_retry(
    fresh_redis: Any, kafka_broker: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Charged, then refused by the producer 3 times → parked (audit entry, gauge 1, `budget parked`
    and `budget status` show it, the sweep-like redispatch leaves it held); after the producer is
    fixed and `budget retry` (audited with the actor), exactly one record is on the releases topic,
    byte-identical to the stored payload, one charge in the ledger, and the parked list is empty."""
    topic = kafka_broker.new_topic("parked", partitions=1)
    topology = load_topology_text(_YAML)
    window = MergedWindow("pages", P0 + 9 * HOUR, P0 + 10 * HOUR, {k: 3 for k in KEYS})

    async def first_run() -> tuple[str, bytes]:
        ledger = await open_ledger(fresh_redis.url, topology, clock=ManualClock(T0))
        small = AIOKafkaProducer(
            bootstrap_servers=kafka_broker.bootstrap, enable_idempotence=True, acks="all", max_request_size=1024
        )
        await small.start()
        side = _Side(topology, ledger, small, topic)
        rid = side.parking.release_id(window)
        try:
            for _ in range(3):
                assert await side.attempt(window)
            assert side.dispatcher.parked("pages", window.start)
            assert not await side.attempt(window)  # held
            await side.parking.refresh()
            assert side.parking.redispatch(side.dispatcher, [window]) == 0  # no retry asked yet
        finally:
            await small.stop()
        stored = await ledger.stored_payload("web", rid)
        assert stored is not None and len(stored) > 1024
        (row,) = await ledger.parked("web")
        assert (row.release_id, row.attempts, row.error, row.state) == (rid, 3, "MessageSizeTooLargeError", "parked")
        await ledger.close()
        return rid, stored

    rid, stored = asyncio.run(first_run())
    assert asyncio.run(_scrape_parked(fresh_redis.url, topology)) == 1.0

    assert main(["budget", "parked", "--redis", fresh_redis.url, "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)["parked"]
    assert (listed["release_id"], listed["metric"], listed["state"]) == (rid, "pages", "parked")
    assert main(["budget", "status", "--redis", fresh_redis.url, "--json"]) == 0
    assert [s["parked"] for s in json.loads(capsys.readouterr().out)["scopes"]] == [1]
    assert main(["budget", "status", "--redis", fresh_redis.url]) == 0
    assert "PARKED windows: 1" in capsys.readouterr().out
    retry = ["budget", "retry", "--redis", fresh_redis.url, "--scope", "web", "--actor", "carol"]
    assert main([*retry, "--release-id", rid, "--reason", "raised max_request_size"]) == 0
    assert "1 parked window(s)" in capsys.readouterr().out
    assert main([*retry, "--release-id", rid, "--reason", "again"]) == 1  # already asked: not parked now

    async def after_fix() -> tuple[list[tuple[bytes, bytes]], list[Any], list[Any]]:
        ledger = await open_ledger(fresh_redis.url, topology, clock=ManualClock(T0 + 600))
        fixed = AIOKafkaProducer(bootstrap_servers=kafka_broker.bootstrap, enable_idempotence=True, acks="all")
        await fixed.start()
        side = _Side(topology, ledger, fixed, topic)  # a restarted worker: nothing held in memory
        try:
            await side.parking.refresh()
            assert side.parking.redispatch(side.dispatcher, [window]) == 1
            await side.dispatcher.drain()
            assert side.parking.redispatch(side.dispatcher, [window]) == 0
            await fixed.send_and_wait(topic, SENTINEL, key=b"sentinel")
        finally:
            await fixed.stop()
        records = await _records_until_sentinel(kafka_broker.bootstrap, topic)
        parked = await ledger.parked("web")
        audit = await ledger.audit("web")
        await ledger.close()
        return records, parked, audit

    records, parked, audit = asyncio.run(after_fix())
    assert records == [(rid.encode(), stored)]
    assert parked == []
    kinds = [e.kind for e in audit]
    assert kinds.count(AuditKind.CHARGE) == 1
    assert [k for k in kinds if k in (AuditKind.PARK, AuditKind.RETRY, AuditKind.UNPARK)] == [
        AuditKind.PARK,
        AuditKind.RETRY,
        AuditKind.UNPARK,
    ]
    (retry_entry,) = [e for e in audit if e.kind is AuditKind.RETRY]
    assert (retry_entry.fields["actor"], retry_entry.fields["reason"]) == ("carol", "raised max_request_size")
    (park_entry,) = [e for e in audit if e.kind is AuditKind.PARK]
    assert park_entry.fields["error"] == "MessageSizeTooLargeError" and park_entry.fields["attempts"] == "3"
    assert asyncio.run(_scrape_parked(fresh_redis.url, topology)) == 0.0


def test_a_window_parked_by_one_worker_is_held_by_the_next(fresh_redis: Any) -> None:
    """The ledger's parked list outlives the worker: a new owner (fresh dispatcher, nothing in memory)
    that finds the window in its releasing state does not release it (WindowParked holds it) until a
    retry is asked; `--all` retries every parked window of the scope."""
    topology = load_topology_text(_YAML)
    window = MergedWindow("pages", P0 + 2 * HOUR, P0 + 3 * HOUR, {})

    async def body() -> None:
        ledger = await open_ledger(fresh_redis.url, topology, clock=ManualClock(T0))
        parking = Parking(topology, ledger, "w1")
        await parking.park(window, 8, RuntimeError("boom"))
        sent: list[bytes] = []

        async def publish(value: bytes, key: bytes) -> None:
            sent.append(key)

        successor = Parking(topology, ledger, "w2")
        await successor.refresh()
        releaser = Releaser(topology, ledger)
        dispatcher = ReleaseDispatcher(lambda w: successor.release(w, lambda x: releaser.release_merged(x, publish)))
        assert dispatcher.dispatch(window)
        await dispatcher.drain()
        assert sent == [] and dispatcher.parked("pages", window.start)
        assert await ledger.retry_parked("web", None, "all of them", "dave") == 1
        await successor.refresh()
        assert successor.redispatch(dispatcher, [window]) == 1
        await dispatcher.drain()
        assert sent == [parking.release_id(window).encode()]
        assert await ledger.parked("web") == []
        await ledger.close()

    asyncio.run(body())
