"""End-to-end: per-unit period state (`contribution.max_windows` counts, a running total's
`max_per_period` amounts) survives SIGKILLs of a live worker mid-period.

Ten units click in every 2 s window of an hourly period; `views` counts a unit in at most 3 windows per
period (`max_windows: 3`), so from its fourth window on a unit's clicks are dropped; `clicks_total`, a
running-total count of at most 3 clicks per unit and step, lets a unit add at most 30 clicks per period
(`max_per_period: 30`), which it reaches about 20 s into the feed, after the first kill. Two workers
share the 4-partition source and are SIGKILLed and restarted mid-feed. A restarted partition resumes
from its committed progress with the state rebuilt from the deltas its predecessors wrote to
`dpstream-<version>-window-counts` (`runtime.window_counts`). Every partial on the partials topic, each
copy of a window re-emitted after a restart included, equals the one a clean in-process run of the same
source records produces (`PartitionPipeline` over each partition's records, with their broker append
times): state reset by a restart would count the units again. The workers run the release side too:
every running-total step on the releases topic has one payload (a restart continued the same noise from
the ledger, never drew a second value) and lies within 7 of its std of the clean run's total so far.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, TopicPartition

from dpstream.workers.pipeline.partition import PartitionPipeline
from dpstream.workers.pipeline.window_caps import CountDelta
from dpstream.workers.runtime.window_counts import counts_topic
from tests.e2e.harness import Deployment, deploy, event, feed_with_kills, poll, read_all

pytestmark = pytest.mark.e2e

WINDOW = 2
CAP = 3
BOUND = 30
"""`clicks_total`'s `max_per_period`: ten steps of 3 clicks a unit."""
UNITS = 10
FEED_S = 30
KILLS = {12: 0, 20: 1}
"""feed second → index of the worker SIGKILLed then (restarted one second later)."""
PARTITIONS = 4


def _start() -> int:
    """S: two windows ahead, or the next hour when fewer than 90 s of this hour are left (the feed
    must stay inside one period for the caps to matter after the kills)."""
    now = time.time()
    start = (int(now) // WINDOW + 2) * WINDOW
    hour_end = (int(now) // 3600 + 1) * 3600
    return hour_end if hour_end - start < 90 else start


def _source_records(dep: Deployment) -> dict[int, list[Any]]:
    """Every source record by partition, in offset order, with key, offset, value and append time."""
    consumer = KafkaConsumer(bootstrap_servers=dep.bootstrap, enable_auto_commit=False)
    try:
        tps = [TopicPartition(dep.source_topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        out: dict[int, list[Any]] = {tp.partition: [] for tp in tps}
        deadline = time.monotonic() + 60
        while any(len(out[tp.partition]) < ends[tp] for tp in tps) and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=500).items():
                out[tp.partition].extend(records)
        assert all(len(out[tp.partition]) == ends[tp] for tp in tps)
        return out
    finally:
        consumer.close()


def _clean_partials(dep: Deployment, start: int, until: int) -> dict[tuple[str, int, int], dict]:
    """(metric, window start, partition) → the partial a clean in-process run emits."""
    out = {}
    for p, records in _source_records(dep).items():
        pipe = PartitionPipeline(
            dep.topology, "clicks", p, schedule_start=start, partitions=PARTITIONS, until=until, check_keys=True
        )
        batch = pipe.process_batch(records)
        partials = [*batch.partials, *pipe.flush().partials]
        for partial in partials:
            doc = json.loads(partial.to_bytes())
            out[(doc["metric"], doc["start"], doc["partition"])] = doc
    return out


def _live_partials(dep: Deployment) -> dict[tuple[str, int, int], list[dict]]:
    """(metric, window start, partition) → every copy the live workers sent (a restart may re-send one)."""
    out: dict[tuple[str, int, int], list[dict]] = {}
    for _key, raw in read_all(dep.bootstrap, dep.topology.sinks.partials_topic):
        doc = json.loads(raw)
        out.setdefault((doc["metric"], doc["start"], doc["partition"]), []).append(doc)
    return out


def _running_steps(dep: Deployment) -> dict[str, set[bytes]]:
    """release id → the distinct payloads of `clicks_total`'s steps on the releases topic."""
    out: dict[str, set[bytes]] = {}
    for key, raw in read_all(dep.bootstrap, dep.topology.sinks.releases):
        if json.loads(raw)["metric"] == "clicks_total":
            out.setdefault((key or b"").decode(), set()).add(raw)
    return out


def test_sigkilled_workers_rebuild_window_counts_and_every_partial_equals_a_clean_run(
    tmp_path: Path, kafka_broker: Any, fresh_redis: Any
) -> None:
    """After two SIGKILLs mid-period, every copy of every window's partial equals the clean run's; the
    caps dropped clicks after the restarts (so the rebuilt counts were used), and deltas were written."""
    start = _start()
    dep = deploy(
        tmp_path,
        kafka_broker.bootstrap,
        fresh_redis.url,
        start=start,
        period="1h",
        views_max_windows=CAP,
        running_total_max_per_period=BOUND,
    )
    try:
        workers = [dep.start_worker("w0"), dep.start_worker("w1")]
        names = ["w0", "w1"]

        def batch(_step: int, now: float) -> list[tuple[bytes | None, bytes]]:
            return [event(f"u{i}", now, page="home") for i in range(UNITS)]  # the same units every time

        pending = feed_with_kills(dep, workers, names, start, FEED_S, KILLS, batch, every_s=0.4)
        until = start + FEED_S
        want = {(m, s, p) for m in dep.topology.metrics for s in range(start, until, WINDOW) for p in range(PARTITIONS)}
        live = poll(lambda: (lambda got: got if want <= set(got) else None)(_live_partials(dep)), timeout_s=180)
        logs = "".join(dep.log(n)[-1500:] for n in ("w0", "w1", *names))
        assert live, f"partials missing: {sorted(want - set(_live_partials(dep)))[:5]}\n{logs}"
        steps = poll(lambda: (lambda got: got if len(got) >= FEED_S // WINDOW else None)(_running_steps(dep)), 120)
        assert steps, f"running-total steps missing: {sorted(_running_steps(dep))}\n{logs}"
    finally:
        dep.stop_all()
    assert not pending, "the test did not kill each worker"
    clean = _clean_partials(dep, start, until)
    differing = [(k, copy["values"], clean[k]["values"]) for k in sorted(want) for copy in live[k] if copy != clean[k]]
    assert differing == [], differing[:5]
    # the caps were in force after the kills: a unit's clicks count in its first 3 windows only
    views = [
        sum(clean[("views", s, p)]["values"].get("home", 0) for p in range(PARTITIONS))
        for s in range(start, until, WINDOW)
    ]
    assert views[:CAP] == [views[0]] * CAP and views[0] > 0 and all(v == 0 for v in views[8:]), views
    # the running total's bound was reached after the first kill: every unit added exactly BOUND clicks
    totals = [
        sum(clean[("clicks_total", s, p)]["values"].get("", 0) for p in range(PARTITIONS))
        for s in range(start, until, WINDOW)
    ]
    first_kill = min(KILLS) // WINDOW
    assert sum(totals) == UNITS * BOUND and sum(totals[: first_kill + 1]) < UNITS * BOUND, totals
    assert totals[-1] == 0, totals
    # every step published once (one payload per release id), each total near the clean total so far
    assert all(len(payloads) == 1 for payloads in steps.values()), "a running-total step published twice"
    records = sorted((json.loads(next(iter(p))) for p in steps.values()), key=lambda r: r["window"]["start_epoch"])
    assert [r["running_total"]["step"] for r in records] == list(range(1, len(records) + 1))
    for r in records:
        t = (r["window"]["start_epoch"] - start) // WINDOW
        assert abs(r["values"][""] - sum(totals[: t + 1])) <= 7 * r["noise"]["stddev"], (t, r["values"], totals)
    assert len({r["cost"]["rho"] for r in records}) == 1, "a running total's steps carry one lump"
    restarted = sum(len(live[k]) - 1 for k in want)
    deltas = [CountDelta.from_bytes(raw) for _key, raw in read_all(dep.bootstrap, counts_topic(dep.topology))]
    assert {d.metric for d in deltas} == {"views", "clicks_total"}, "no delta was written for a bounded metric"
    print(
        f"\nwindow counts recovery: {len(want)} partials equal a clean run's, {restarted} re-sent after the "
        f"kills, {len(deltas)} state deltas, views per window {views}, clicks_total per step {totals}"
    )
