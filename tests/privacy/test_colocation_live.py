"""A live worker on a keyed source of 8 partitions, with adversaries writing their own key to every one.

Honest units produce as a keyed_by_unit source is meant to be written (Kafka key = unit, the client's
default murmur2 partitioner); four adversaries name the partitions themselves and put the same event
on each of the 8 partitions inside one window. The metric counts each unit at most once per window
(`max_per_key: 1`). From the source topic alone the expected true count of each window is recomputed:
the units with a record in the partition their key belongs in (aiokafka's own partitioner says which),
once each. Every window's true aggregate (the merged partials) equals it exactly, every release is it
plus noise, and every adversary record outside its key's partition is dead-lettered `wrong_partition`.
Bounded once per partition, each adversary would count 8 times.

A second deployment runs the honest records alone (D; the one above is D′), on its own ledger: after
the last P(w) the data-independent series of the two workers (/metrics without `--curator-metrics`,
at one clock tick) and of the two ledgers (the budget collector at one injected instant) are identical.
"""

from __future__ import annotations

import collections
import json
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlunparse

import pytest
from aiokafka.partitioner import DefaultPartitioner
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from dpstream.topology.loader import load_topology
from dpstream.workers.runtime.admin import create_topics
from dpstream.workers.runtime.topics import APPEND_TIME, ensure_topics
from tests.e2e.harness import Deployment, poll, read_all, releases
from tests.privacy import _neighbours as nb

pytestmark = pytest.mark.e2e

PARTITIONS = 8
WINDOW = 2
ADVERSARIES = 4
MARGIN_SIGMAS = 7.0
"""Per released value, |noisy − true| ≤ 7σ (Gaussian two-sided tail 2.6e-12; a handful of values)."""

_TOPOLOGY = """\
version: 1
start: {start}
publish_delay: 2s
sources:
  clicks: {{topic: {prefix}.clicks, privacy_unit: user_id, timestamp: ts, allowed_lateness: 1s, keyed_by_unit: true}}
budgets:
  b: {{epsilon: 8000.0, delta: 1.0e-6, accounting: zcdp, period: 1h}}
metrics:
  visitors:
    source: clicks
    budget: b
    window: {{tumbling: {window}s}}
    aggregate: count
    contribution: {{max_per_key: 1}}
    mechanism: gaussian
sinks: {{releases: {prefix}.releases, dead_letter: {prefix}.dlq}}
"""


def _deploy(tmp_path: Path, bootstrap: str, redis_url: str, start: int) -> Deployment:
    prefix = f"coloc-{uuid.uuid4().hex[:10]}"
    path = tmp_path / prefix / "topology.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(_TOPOLOGY.format(start=start, prefix=prefix, window=WINDOW))
    topology = load_topology(path)
    source = topology.sources["clicks"].topic
    create_topics(bootstrap, [source], PARTITIONS, configs={source: dict(APPEND_TIME)})  # before the rest: 8
    ensure_topics(bootstrap, topology)
    return Deployment(path, topology, bootstrap, redis_url)


def _home(key: bytes) -> int:
    """The partition the Kafka clients' default partitioner gives `key` (aiokafka's implementation)."""
    every = list(range(PARTITIONS))
    return int(DefaultPartitioner()(key, every, every))


def _send(bootstrap: str, topic: str, honest: list[dict], adversaries: list[tuple[int, dict]]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    for doc in honest:  # the client's default partitioner
        producer.send(topic, json.dumps(doc).encode(), key=doc["user_id"].encode())
    for p, doc in adversaries:  # the partition named by the producer
        producer.send(topic, json.dumps(doc).encode(), key=doc["user_id"].encode(), partition=p)
    producer.flush()
    producer.close()


def _source_records(bootstrap: str, topic: str) -> list[tuple[int, int, bytes, dict]]:
    """(partition, offset, key, event) of every record of the source topic."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        out = []
        deadline = time.monotonic() + 60
        while any(consumer.position(tp) < ends[tp] for tp in tps) and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                out += [(m.partition, m.offset, m.key, json.loads(m.value)) for m in records]
        assert sum(ends.values()) == len(out)
        return out
    finally:
        consumer.close()


def _expected(records: list[tuple[int, int, bytes, dict]], starts: list[int]) -> dict[int, int]:
    """Window start → units with a record of that window in their key's partition (each counted once)."""
    units: dict[int, set[str]] = {s: set() for s in starts}
    for partition, _offset, key, doc in records:
        start = int(doc["ts"]) // WINDOW * WINDOW
        if start in units and key == doc["user_id"].encode() and _home(key) == partition:
            units[start].add(doc["user_id"])
    return {s: len(u) for s, u in units.items()}


def _merged_partials(dep: Deployment) -> dict[int, int]:
    """Window start → true count from the partials topic (one partial per partition and window)."""
    merged: dict[int, int] = collections.defaultdict(int)
    seen = set()
    for _k, raw in read_all(dep.bootstrap, dep.topology.sinks.partials_topic):
        p = json.loads(raw)
        if p["metric"] != "visitors" or (p["start"], p["partition"]) in seen:
            continue
        seen.add((p["start"], p["partition"]))
        merged[p["start"]] += sum(p["values"].values())
    return merged


def test_adversaries_on_every_partition_count_once_in_a_live_worker(
    tmp_path: Path, kafka_broker: Any, fresh_redis: Any
) -> None:
    """Each window's true aggregate equals the per-unit count recomputed from the source topic, each
    release is that plus noise, and the 7 misplaced copies of every adversary record are dead letters;
    the data-independent series equal those of the honest stream alone, sample by sample."""
    # S six windows ahead: the first window's events must be appended before its close (the source
    # is LogAppendTime), and creating two deployments' topics takes seconds on a loaded machine
    start = (int(time.time()) // WINDOW + 6) * WINDOW
    dep = _deploy(tmp_path, kafka_broker.bootstrap, fresh_redis.url, start)
    own = urlunparse(urlparse(fresh_redis.url)._replace(path="/2"))  # D's own ledger: no shared spend
    plain = _deploy(tmp_path, kafka_broker.bootstrap, own, start)
    starts = [start + WINDOW * i for i in range(3)]
    attacked = starts[1]
    honest = [{"user_id": f"u{i:02d}", "ts": s + 0.2 + i / 100} for s in starts for i in range(20)]
    adversaries = [
        (p, {"user_id": f"mallory{a}", "ts": attacked + 0.5 + a / 10})
        for a in range(ADVERSARIES)
        for p in range(PARTITIONS)
    ]
    _send(dep.bootstrap, dep.source_topic, honest, adversaries)
    _send(plain.bootstrap, plain.source_topic, honest, [])
    ports = nb.start_worker_web(plain, "plain"), nb.start_worker_web(dep, "coloc")

    def released(d: Deployment) -> dict[int, dict] | None:
        got = {r["window"]["start_epoch"]: r for r in releases(d.bootstrap, d.topology.sinks.releases)}
        return got if all(s in got for s in starts) else None

    try:
        recs = poll(lambda: released(dep), timeout_s=120)
        assert recs, dep.log("coloc")[-3000:]
        assert poll(lambda: released(plain), timeout_s=120), plain.log("plain")[-3000:]
        a, b = nb.aligned_scrapes(*ports)
        series = nb.compare_series(a, b, "worker /metrics: ")
    finally:
        dep.stop_all()
        plain.stop_all()
    # the ledgers are read once their workers have stopped: no charge lands while one of them is read
    topo = dep.topology
    at = max(topo.publish_time(topo.metrics["visitors"], s + WINDOW) for s in starts) + 0.5
    la, lb = nb.ledger_series(plain.topology, plain.redis_url, at), nb.ledger_series(topo, dep.redis_url, at)
    assert nb.spent_somewhere(a) and nb.spent_somewhere(la), sorted(a)
    series += nb.compare_series(la, lb, "ledger at the last P(w): ")

    expected = _expected(_source_records(dep.bootstrap, dep.source_topic), starts)
    assert expected == {starts[0]: 20, attacked: 20 + ADVERSARIES, starts[2]: 20}
    truth = _merged_partials(dep)
    assert {s: truth[s] for s in starts} == expected  # bounded once per partition: 20 + 4 × 8 in `attacked`
    for s in starts:
        rec = recs[s]
        sigma = max(float(rec["noise"]["scale"]), float(rec["noise"]["stddev"]))
        assert abs(float(rec["values"][""]) - expected[s]) <= MARGIN_SIGMAS * sigma, (s, rec["values"], sigma)
    assert MARGIN_SIGMAS * sigma < ADVERSARIES * (PARTITIONS - 1)  # the noisy check alone would see 8 counts

    letters = [json.loads(v) for _k, v in read_all(dep.bootstrap, dep.topology.sinks.dead_letter)]
    assert collections.Counter(d["reason"] for d in letters) == {"wrong_partition": ADVERSARIES * (PARTITIONS - 1)}
    assert series == [], "\n".join(series[:20])
