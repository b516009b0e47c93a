"""End-to-end on a three-broker KRaft cluster: the leader of the releases topic's first partition is
SIGKILLed mid-stream; every window is still released exactly once and none is lost (`verify`).

The cluster is the local stack's (`workers.localstack.kafka.KafkaCluster`, as `stack up --brokers 3`),
on free loopback ports, for this module only.
"""

from __future__ import annotations

import asyncio
import collections
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dpstream.workers.localstack.kafka import KafkaCluster
from dpstream.workers.localstack.ports import free_port, port_open
from tests.e2e.harness import Deployment, deploy, event, poll, releases, send

pytestmark = pytest.mark.e2e

WINDOW = 2
FEED_S = 16
KILL_AT_S = 6


def _cluster_ports() -> tuple[int, int]:
    """A broker and a controller port such that port + 100·k and controller + 100·k (k < 3) are all free."""
    for _ in range(50):
        port, controller = free_port(), free_port()
        wanted = {p + 100 * k for p in (port, controller) for k in range(3)}
        if len(wanted) == 6 and max(wanted) < 65536 and not any(port_open(p) for p in wanted):
            return port, controller
    raise RuntimeError("no free port block for a three-broker cluster")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """Three KRaft nodes (broker + controller each) on loopback, replication 3, min.insync.replicas 2."""
    port, controller = _cluster_ports()
    kafka = KafkaCluster(3, port, controller, tmp_path_factory.mktemp("kafka3"), heap="384m")
    kafka.start()
    try:
        yield kafka
    finally:
        kafka.stop()


async def _describe(bootstrap: str, topics: list[str]) -> dict[str, Any]:
    """topic → (partition → (leader, replicas)), and topic → min.insync.replicas."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics(topics)
        parts = {t["topic"]: {p["partition"]: (p["leader"], p["replicas"]) for p in t["partitions"]} for t in described}
        configs = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, t) for t in topics])
        isr = {
            res[3]: dict((e[0], e[1]) for e in res[4]).get("min.insync.replicas")
            for response in configs
            for res in response.resources
        }
        return {"partitions": parts, "min_isr": isr}
    finally:
        await admin.close()


def _described(bootstrap: str, topics: list[str]) -> dict[str, Any]:
    """`_describe` once the answering broker knows every topic's partitions and config (a topic just
    created takes a moment to reach all three nodes; until then a node answers without its config)."""

    def complete() -> dict[str, Any] | None:
        found = asyncio.run(_describe(bootstrap, topics))
        known = all(found["partitions"].get(t) and found["min_isr"].get(t) is not None for t in topics)
        return found if known else None

    found = poll(complete, timeout_s=60)
    assert found is not None, f"the cluster never described {topics} completely"
    return found


def _changelog(bootstrap: str) -> str | None:
    """The release agent's table changelog topic, once Faust created it."""
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        return next((t for t in consumer.topics() if t.endswith("dpstream-mergers-changelog")), None)
    finally:
        consumer.close()


@pytest.fixture
def deployment(tmp_path: Path, cluster: KafkaCluster, fresh_redis) -> Iterator[Deployment]:
    """A fresh topology (unique topics) on the cluster and an emptied Redis; workers stopped after. The
    topics are created once every node lists all three brokers again: a node that a loaded machine kept
    from its heartbeats drops out for a moment, and a topic created then gets fewer replicas."""
    cluster.wait_brokers(3)
    dep = deploy(tmp_path, cluster.bootstrap, fresh_redis.url)
    yield dep
    dep.stop_all()


def test_leader_broker_killed_mid_stream_every_window_once(deployment: Deployment, cluster: KafkaCluster) -> None:
    """Internal topics have 3 replicas and min.insync.replicas 2; after the leader of releases partition 0
    is SIGKILLed mid-feed, every fed window is released exactly once, and verify finds no violation."""
    from dpstream.workers.verify.run import VerifyOptions, verify_deployment

    sinks = deployment.topology.sinks
    internal = [deployment.source_topic, sinks.partials_topic, sinks.releases, sinks.dead_letter]
    before = _described(cluster.bootstrap, internal)
    assert all(len(r) == 3 for parts in before["partitions"].values() for _l, r in parts.values())
    assert set(before["min_isr"].values()) == {"2"}

    deployment.start_worker("w1")
    changelog = poll(lambda: _changelog(cluster.bootstrap), timeout_s=90)
    assert changelog, deployment.log("w1")[-3000:]
    faust_topic = _described(cluster.bootstrap, [changelog])
    assert all(len(r) == 3 for _l, r in faust_topic["partitions"][changelog].values())
    assert faust_topic["min_isr"][changelog] == "2"

    t0 = (int(time.time()) // WINDOW + 1) * WINDOW
    while time.time() < t0:
        time.sleep(0.01)
    victim = None
    step = 0
    while time.time() < t0 + FEED_S:
        now = time.time()
        send(cluster.bootstrap, deployment.source_topic, [event(f"u{step}-{i}", now) for i in range(20)])
        step += 1
        if victim is None and now >= t0 + KILL_AT_S:
            leader = asyncio.run(_describe(cluster.bootstrap, [sinks.releases]))["partitions"][sinks.releases][0][0]
            victim = cluster.nodes[leader - 1]
            assert victim.kill()
        time.sleep(0.25)
    assert victim is not None and not victim.is_running()
    fed_end = t0 + FEED_S
    starts = list(range(t0, fed_end, WINDOW))
    want = {(m, s) for m in deployment.topology.metrics for s in starts}

    def released() -> list[dict[str, Any]] | None:
        recs = releases(cluster.bootstrap, sinks.releases)
        return recs if want <= {(r["metric"], r["window"]["start_epoch"]) for r in recs} else None

    recs = poll(released, timeout_s=240)
    assert recs, deployment.log("w1")[-3000:]
    payloads: dict[str, set[str]] = collections.defaultdict(set)
    ids: dict[tuple[str, int], set[str]] = collections.defaultdict(set)
    for r in recs:
        payloads[r["release_id"]].add(json.dumps(r, sort_keys=True))
        ids[(r["metric"], r["window"]["start_epoch"])].add(r["release_id"])
    assert all(len(p) == 1 for p in payloads.values()), "a release_id was published with two payloads"
    assert all(len(v) == 1 for v in ids.values()), "a window was released under two release_ids"

    first: dict[tuple[str, int], float] = {}
    for r in recs:  # published_at is whole seconds
        at = time.mktime(time.strptime(r["published_at"], "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
        key = (r["metric"], r["window"]["start_epoch"])
        first[key] = min(first.get(key, at), at)
    lag = max(first[(m, s)] - (s + WINDOW + 1) for m, s in want)
    options = VerifyOptions(bootstrap=cluster.bootstrap, redis_url=deployment.redis_url, until_s=fed_end, grace_s=0)
    report = asyncio.run(verify_deployment(deployment.topology, options))
    assert report.ok, "\n".join(v.line() for v in report.violations)
    print(
        f"\nbroker failover: node {victim.node_id} (leader of {sinks.releases}/0) killed; {len(want)} windows once, "
        f"max release lag {lag:.0f} s"
    )
