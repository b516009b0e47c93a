"""End-to-end: `dpstream worker` subprocesses on the real Kafka + Redis fixtures."""

from __future__ import annotations

import asyncio
import collections
import json
import math
import time
from pathlib import Path

import pytest

from dpstream.workers.pipeline.fixed_point import value_exponent
from dpstream.workers.release import faults
from dpstream.workers.release.display import release_line
from dpstream.workers.runtime.app import READY_LINE
from tests.e2e.harness import Deployment, binomial_upper, deploy, event, poll, read_all, releases, send

pytestmark = pytest.mark.e2e

WINDOW = 2


@pytest.fixture
def deployment(tmp_path: Path, kafka_broker, fresh_redis):
    """A fresh topology (unique topics) on the session broker and an emptied Redis; workers stopped after."""
    dep = deploy(tmp_path, kafka_broker.bootstrap, fresh_redis.url)
    yield dep
    dep.stop_all()


def _t0() -> int:
    return (int(time.time()) // WINDOW + 1) * WINDOW


def _partials(dep: Deployment) -> dict[tuple[str, int], dict[str, float]]:
    """True merged values per (metric, window start), summed over the partitions' partials."""
    merged: dict[tuple[str, int], dict[str, float]] = collections.defaultdict(dict)
    seen = set()
    for _k, raw in read_all(dep.bootstrap, dep.topology.sinks.partials_topic):
        if raw.startswith(b"dpstream-tick:"):
            continue
        p = json.loads(raw)
        if (p["metric"], p["start"], p["partition"]) in seen:
            continue
        seen.add((p["metric"], p["start"], p["partition"]))
        into = merged[(p["metric"], p["start"])]
        metric = dep.topology.metrics[p["metric"]]
        scale = 2 ** value_exponent(metric.bounds) if metric.value is not None and metric.bounds else 1
        for key, v in p["values"].items():  # sums are integer grid units: back to values
            into[key] = into.get(key, 0) + (v[0] if isinstance(v, list) else v) / scale
    return merged


def _by_window(records: list[dict]) -> dict[tuple[str, int], set[str]]:
    ids: dict[tuple[str, int], set[str]] = collections.defaultdict(set)
    for r in records:
        ids[(r["metric"], r["window"]["start_epoch"])].add(r["release_id"])
    return ids


def _released_all(dep: Deployment, starts: list[int]) -> list[dict] | None:
    recs = releases(dep.bootstrap, dep.topology.sinks.releases)
    have = _by_window(recs)
    want = {(m, s) for m in dep.topology.metrics for s in starts}
    return recs if want <= set(have) else None


def _assert_exactly_once(recs: list[dict]) -> None:
    payloads: dict[str, set[str]] = collections.defaultdict(set)
    for r in recs:
        payloads[r["release_id"]].add(json.dumps(r, sort_keys=True))
    assert all(len(p) == 1 for p in payloads.values()), "a release_id was published with two payloads"
    assert all(len(ids) == 1 for ids in _by_window(recs).values()), "a window has two release_ids"


def test_ground_truth_every_window_once_values_within_ci(deployment: Deployment) -> None:
    """Every window of every metric is released once; noisy values sit in their CIs at the stated rate."""
    t0 = _t0()
    starts = [t0 + WINDOW * i for i in range(4)]
    events, truth = [], collections.defaultdict(float)
    for s in starts:  # in event-time order: a window is final once the watermark passes it
        for i in range(120):
            user = f"u{i:03d}"
            page = "home" if i % 3 else "cart"
            basket = float((i * 7) % 100)
            events.append(event(user, s + 0.5 + i / 1000, page, basket))
            truth[("views", s, page)] += 1
            truth[("spend", s, "__sum")] += basket
    send(deployment.bootstrap, deployment.source_topic, events)
    deployment.start_worker("w1")
    recs = poll(lambda: _released_all(deployment, starts), timeout_s=120)
    assert recs, deployment.log("w1")[-3000:]
    _assert_exactly_once(recs)
    deployment.stop_all()  # its log complete: one INFO line per published window, from the record
    lines = deployment.log("w1").splitlines()
    assert sum(READY_LINE in ln for ln in lines) == 1, lines[:40]  # the line `bench pipeline` waits for
    for r in (r for r in recs if r["window"]["start_epoch"] in starts):
        assert sum("[INFO]" in ln and f"published {release_line(r)}" in ln for ln in lines) == 1, lines[-40:]
    merged = _partials(deployment)
    for s in starts:
        assert merged[("views", s)].get("home", 0) == truth[("views", s, "home")]
        assert merged[("views", s)].get("cart", 0) == truth[("views", s, "cart")]
        assert math.isclose(sum(merged[("spend", s)].values()), truth[("spend", s, "__sum")], rel_tol=1e-9)
    inside = total = 0
    for r in recs:
        key = (r["metric"], r["window"]["start_epoch"])
        if key[1] not in starts:
            continue
        true_values = merged[key]
        for k, noisy in r["values"].items():
            tv = true_values.get(k, 0.0) if r["metric"] == "views" else sum(true_values.values())
            total += 1
            inside += abs(noisy - tv) <= r["ci"]["half_width"]
    level = recs[0]["ci"]["level"]
    assert total >= 12
    assert total - inside <= binomial_upper(total, 1 - level)


def test_bounding_caps_one_heavy_unit_and_clamps(deployment: Deployment) -> None:
    """10,000 events of one unit in one window move views by ≤ max_keys×max_per_key; values are clamped."""
    t0 = _t0()
    heavy = [event("heavy", t0 + 0.1 + i * 1e-4, ("home", "cart", "search")[i % 3], 500.0) for i in range(10_000)]
    send(deployment.bootstrap, deployment.source_topic, heavy)
    deployment.start_worker("w1")
    assert poll(lambda: _released_all(deployment, [t0]), timeout_s=120), deployment.log("w1")[-3000:]
    merged = _partials(deployment)
    assert sum(merged[("views", t0)].values()) == 2 * 3  # max_keys × max_per_key
    assert sum(merged[("spend", t0)].values()) == 2 * 100.0  # max_per_key × upper bound (clamped)


def test_malformed_events_go_to_dlq_and_worker_continues(deployment: Deployment) -> None:
    """Bad JSON, missing unit, non-numeric value, a record keyed by another unit land in the DLQ with their
    reason; good windows still release."""
    t0 = _t0()
    bad = [
        (b"x", b"{not json"),
        (b"y", json.dumps({"ts": t0 + 0.2, "page": "home"}).encode()),
        (b"z", json.dumps({"user_id": "z", "ts": t0 + 0.3, "basket_eur": "NaN"}).encode()),
        (b"w", json.dumps({"user_id": "w", "ts": "yesterday"}).encode()),
        (b"not-the-unit", json.dumps({"user_id": "v", "ts": t0 + 0.4, "page": "home"}).encode()),
    ]
    good = [event(f"g{i}", t0 + 0.5) for i in range(20)]
    send(deployment.bootstrap, deployment.source_topic, bad + good)
    deployment.start_worker("w1")
    assert poll(lambda: _released_all(deployment, [t0]), timeout_s=120), deployment.log("w1")[-3000:]
    dlq = [json.loads(v) for _k, v in read_all(deployment.bootstrap, deployment.topology.sinks.dead_letter)]
    assert sorted(d["reason"] for d in dlq) == [
        "bad_timestamp",
        "bad_value",
        "key_mismatch",
        "missing_unit",
        "not_json",
    ]
    assert all(d["source"] == "clicks" and d["topic"] == deployment.source_topic for d in dlq)
    assert deployment.workers[0].poll() is None  # still running


def test_a_quiet_source_closes_its_windows_by_the_clock(deployment: Deployment) -> None:
    """No event after the first window: the windows still close once their close time passed and the
    (unchanged) end offsets were consumed, and the following empty windows are released too."""
    t0 = _t0()
    send(deployment.bootstrap, deployment.source_topic, [event(f"u{i}", t0 + 0.5) for i in range(10)])
    deployment.start_worker("w1")
    starts = [t0, t0 + WINDOW, t0 + 2 * WINDOW]
    recs = poll(lambda: _released_all(deployment, starts), timeout_s=120)
    assert recs, deployment.log("w1")[-3000:]
    _assert_exactly_once(recs)
    assert all("complete" not in r for r in recs)  # no data-dependent completeness flag in a release


def test_two_workers_rebalance_exactly_once(deployment: Deployment) -> None:
    """A second worker joins mid-stream and the first leaves: still one release per window, one payload per id."""
    t0 = _t0()
    deployment.start_worker("w1")
    starts = []
    for step in range(6):
        s = t0 + WINDOW * step
        starts.append(s)
        while time.time() < s:
            time.sleep(0.05)
        send(deployment.bootstrap, deployment.source_topic, [event(f"u{i}", s + 0.2) for i in range(30)])
        if step == 1:
            deployment.start_worker("w2")
        if step == 4:
            deployment.workers[0].terminate()
    recs = poll(lambda: _released_all(deployment, starts), timeout_s=300)
    assert recs, _missing_windows(deployment, starts) + deployment.log("w1")[-6000:] + deployment.log("w2")[-6000:]
    _assert_exactly_once(recs)


def _missing_windows(dep: Deployment, starts: list[int]) -> str:
    """Which (metric, start) pairs of `starts` never reached the releases topic: the failure's first line."""
    have = set(_by_window(releases(dep.bootstrap, dep.topology.sinks.releases)))
    missing = sorted({(m, s) for m in dep.topology.metrics for s in starts} - have)
    return f"missing windows {missing} of starts {starts}\n"


def test_sigkill_between_charge_and_publish_sweeper_publishes_once(deployment: Deployment) -> None:
    """Killed after charging, before publish: the restarted worker's sweeper publishes the stored bytes; one charge."""
    from dpstream.workers.ledger import open_ledger

    t0 = _t0()
    send(deployment.bootstrap, deployment.source_topic, [event(f"u{i}", t0 + 0.5) for i in range(10)])
    armed = {faults.CRASH_ENV: "after_charge@1", faults.ARM_ENV: faults.ARM_PHRASE}  # charged, not published
    first = deployment.start_worker("w1", env=armed)
    assert poll(lambda: first.poll() is not None, timeout_s=120), deployment.log("w1")[-3000:]
    assert first.returncode == -9

    async def pending() -> list:
        ledger = await open_ledger(deployment.redis_url, deployment.topology)
        try:
            return await ledger.pending(0.0)
        finally:
            await ledger.close()

    stuck = asyncio.run(pending())
    assert len(stuck) == 1 and not releases(deployment.bootstrap, deployment.topology.sinks.releases)
    deployment.start_worker("w2")
    recs = poll(lambda: _released_all(deployment, [t0]), timeout_s=120)
    assert recs, deployment.log("w2")[-3000:]
    _assert_exactly_once(recs)
    # the stuck release may be an earlier (empty) window of the schedule than t0, which the sweeper
    # publishes on its own round, after w2 has released t0's windows: wait for it by its id
    stuck_id = stuck[0].release_id.encode()

    def stored_on_topic() -> dict[bytes, bytes] | None:
        raw = {k: v for k, v in read_all(deployment.bootstrap, deployment.topology.sinks.releases)}
        return raw if stuck_id in raw else None

    raw = poll(stored_on_topic, timeout_s=120)
    assert raw, deployment.log("w2")[-3000:]
    assert raw[stuck_id] == stuck[0].payload
    # committed now (later windows of the schedule keep being released, so others may be in flight)
    assert poll(lambda: stuck[0].release_id not in {p.release_id for p in asyncio.run(pending())}, timeout_s=60)


def test_budget_exhaustion_stops_releases(tmp_path: Path, kafka_broker, fresh_redis) -> None:
    """With an operator-opened breaker (budget closed), windows are refused and counted, nothing is published."""
    from dpstream.workers.ledger import open_ledger

    dep = deploy(tmp_path, kafka_broker.bootstrap, fresh_redis.url)
    try:

        async def open_breaker() -> None:
            ledger = await open_ledger(dep.redis_url, dep.topology)
            try:
                await ledger.open_breaker("b", "e2e: budget closed", "test")
            finally:
                await ledger.close()

        asyncio.run(open_breaker())
        t0 = _t0()
        send(dep.bootstrap, dep.source_topic, [event(f"u{i}", t0 + 0.5) for i in range(10)])
        dep.start_worker("w1")
        partials = poll(lambda: _partials(dep).get(("views", t0)) is not None and _partials(dep), timeout_s=120)
        assert partials, dep.log("w1")[-3000:]
        time.sleep(3)  # let the release owner process what it has (content asserted below, not timing)

        async def status():
            ledger = await open_ledger(dep.redis_url, dep.topology)
            try:
                return await ledger.status("b")
            finally:
                await ledger.close()

        assert not releases(dep.bootstrap, dep.topology.sinks.releases)
        assert asyncio.run(status()).spent == 0
    finally:
        dep.stop_all()


def test_split_ingest_and_release_processes_release_every_window_once(deployment: Deployment) -> None:
    """`--role ingest` and `--role release` in two processes: every window of every metric released exactly once."""
    t0 = _t0()
    starts = [t0 + WINDOW * i for i in range(3)]
    events = [
        event(f"u{i:03d}", s + 0.5 + i / 1000, "home" if i % 2 else "cart", 5.0) for s in starts for i in range(50)
    ]
    send(deployment.bootstrap, deployment.source_topic, events)
    deployment.start_worker("ingest", role="ingest")
    deployment.start_worker("release", role="release")
    recs = poll(lambda: _released_all(deployment, starts), timeout_s=120)
    assert recs, deployment.log("ingest")[-2000:] + deployment.log("release")[-2000:]
    _assert_exactly_once(recs)
    assert {r["metric"] for r in recs} == set(deployment.topology.metrics)


def _copy_as_the_hop_did(dep: Deployment) -> int:
    """Copy every record of the source topic to its by-unit topic as the hop does (key = unit, source
    append time, source position header): a hop that died before committing leaves these behind."""
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    from dpstream.workers.pipeline.copies import SOURCE_POSITION_HEADER, source_position
    from dpstream.workers.runtime.topics import repartition_topic

    source = next(iter(dep.topology.sources.values()))
    consumer = KafkaConsumer(bootstrap_servers=dep.bootstrap, enable_auto_commit=False)
    producer = KafkaProducer(bootstrap_servers=dep.bootstrap, acks="all")
    try:
        tps = [TopicPartition(source.topic, p) for p in sorted(consumer.partitions_for_topic(source.topic) or ())]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        copied = 0
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            for tp, records in consumer.poll(timeout_ms=500).items():
                for m in records:
                    unit = json.loads(m.value)[source.privacy_unit].encode()
                    where = [(SOURCE_POSITION_HEADER, source_position(tp.partition, m.offset))]
                    producer.send(repartition_topic(source), m.value, key=unit, timestamp_ms=m.timestamp, headers=where)
                    copied += 1
        producer.flush()
        return copied
    finally:
        producer.close()
        consumer.close()


def test_a_hop_that_copied_twice_changes_no_aggregate(tmp_path: Path, kafka_broker, fresh_redis) -> None:
    """A hop that died after copying and before committing copies the same records again on restart:
    every event is then twice on the by-unit topic, and every window is still counted as once."""
    dep = deploy(tmp_path, kafka_broker.bootstrap, fresh_redis.url, keyed=False)
    try:
        t0 = _t0() + 2 * WINDOW  # room for the copies below before the first window closes
        starts = [t0, t0 + WINDOW]
        events = [
            (f"k{i % 5}".encode(), event(f"u{i:03d}", s + 0.3, "home", 1.0)[1]) for s in starts for i in range(40)
        ]
        send(dep.bootstrap, dep.source_topic, events)
        assert _copy_as_the_hop_did(dep) == 80  # the first hop's copies, whose commit was lost
        dep.start_worker("w1")  # its hop copies everything again
        recs = poll(lambda: _released_all(dep, starts), timeout_s=150)
        assert recs, dep.log("w1")[-3000:]
        _assert_exactly_once(recs)
        merged = _partials(dep)
        for s in starts:
            assert merged[("views", s)].get("home", 0) == 40  # 80 copies of 40 events, each counted once
    finally:
        dep.stop_all()


def test_a_repartitioned_source_counts_by_the_source_append_time(tmp_path: Path, kafka_broker, fresh_redis) -> None:
    """A source not keyed by its unit goes through the by-unit hop (keys are anything); windows close
    only once the hop has copied everything the source held, and every event is counted once."""
    dep = deploy(tmp_path, kafka_broker.bootstrap, fresh_redis.url, keyed=False)
    try:
        t0 = _t0()
        starts = [t0, t0 + WINDOW]
        events = [
            (f"k{i % 5}".encode(), event(f"u{i:03d}", s + 0.3, "home", 1.0)[1]) for s in starts for i in range(40)
        ]
        send(dep.bootstrap, dep.source_topic, events)
        dep.start_worker("w1")
        recs = poll(lambda: _released_all(dep, starts), timeout_s=150)
        assert recs, dep.log("w1")[-3000:]
        _assert_exactly_once(recs)
        merged = _partials(dep)
        for s in starts:
            assert merged[("views", s)].get("home", 0) == 40
        dlq = [json.loads(v) for _k, v in read_all(dep.bootstrap, dep.topology.sinks.dead_letter)]
        assert dlq == []  # the hop keys by unit: no key_mismatch on the by-unit topic
    finally:
        dep.stop_all()
