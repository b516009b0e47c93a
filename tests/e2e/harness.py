"""Helpers of the end-to-end tests: a tmp topology with unique topics, worker subprocesses, topic readers."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafka import KafkaConsumer, KafkaProducer

from dpstream.topology.loader import load_topology
from dpstream.topology.model import Topology

LOGLEVEL_ENV = "DPSTREAM_E2E_LOGLEVEL"
"""Set to a `--loglevel` (e.g. DEBUG) to start every e2e worker with it: Faust's and aiokafka's lines too."""

TOPOLOGY = """\
version: 1
start: {start}
sources:
  clicks:
    topic: {source_topic}
    privacy_unit: user_id
    timestamp: ts
    allowed_lateness: 1s
    keyed_by_unit: {keyed}
budgets:
  b:
    epsilon: {epsilon}
    delta: 1.0e-6
    accounting: zcdp
    period: {period}
metrics:
  views:
    source: clicks
    budget: b
    weight: 1
    window: {{tumbling: 2s}}
    aggregate: count
    group_by: page
    keys: [home, cart]
    contribution: {{max_keys: 2, max_per_key: 3}}
    mechanism: gaussian
  spend:
    source: clicks
    budget: b
    weight: 1
    window: {{tumbling: 2s}}
    aggregate: sum
    value: basket_eur
    bounds: [0, 100]
    contribution: {{max_per_key: 2}}
    mechanism: gaussian
sinks:
  releases: {prefix}.releases
  dead_letter: {prefix}.dlq
"""


RUNNING_TOTAL = """\
  clicks_total:
    source: clicks
    budget: b
    weight: 1
    window: {{tumbling: 2s}}
    aggregate: count
    release: running_total
    contribution: {{max_per_key: 3, max_per_period: {bound}}}
    mechanism: gaussian
"""
"""A running-total metric `deploy` appends on request (`running_total_max_per_period`)."""


@dataclass
class Deployment:
    """One test's topology file, its topics and the workers started for it."""

    path: Path
    topology: Topology
    bootstrap: str
    redis_url: str
    workers: list[subprocess.Popen] = field(default_factory=list)
    role: str = "all"
    """The `--role` of a worker started without one (`feed_with_kills` restarts workers with it)."""

    @property
    def source_topic(self) -> str:
        return self.topology.sources["clicks"].topic

    def start_worker(self, name: str, env: dict[str, str] | None = None, role: str | None = None) -> subprocess.Popen:
        """Start `dpstream worker` as a subprocess (its log next to the topology file), with `role` or else
        the deployment's."""
        log = open(self.path.parent / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        argv = [
            sys.executable,
            "-m",
            "dpstream.workers.cli",
            "worker",
            str(self.path),
            "--bootstrap",
            self.bootstrap,
            "--redis",
            self.redis_url,
            "--worker-id",
            name,
            "--role",
            role or self.role,
        ]
        if os.environ.get(LOGLEVEL_ENV):  # e.g. DEBUG to diagnose a flaky run: Faust's and aiokafka's lines too
            argv += ["--loglevel", os.environ[LOGLEVEL_ENV]]
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        self.workers.append(proc)
        return proc

    def stop_all(self) -> None:
        """SIGTERM every worker still running, SIGKILL after a grace period."""
        for proc in self.workers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.workers:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def log(self, name: str) -> str:
        return (self.path.parent / f"{name}.log").read_text(errors="replace")


def deploy(
    tmp_path: Path,
    bootstrap: str,
    redis_url: str,
    keyed: bool = True,
    epsilon: float = 1.0,
    start: int | None = None,
    source_topic: str | None = None,
    period: str = "1d",
    views_max_windows: int | None = None,
    running_total_max_per_period: int | None = None,
) -> Deployment:
    """Write a small topology (2 s windows) with unique topic names and a public start (default: the
    current 2 s window), and create its topics. `views_max_windows`: the `views` metric's
    `contribution.max_windows` (none by default); `running_total_max_per_period`: add `clicks_total`,
    a running-total count (3 clicks per unit and step) under that `contribution.max_per_period`.

    The broker does not auto-create topics, so tests may send events before any worker runs.
    """
    if start is None:
        start = int(time.time()) // 2 * 2
    from dpstream.workers.runtime.topics import ensure_topics

    prefix = f"e2e-{uuid.uuid4().hex[:10]}"
    path = tmp_path / prefix / "topology.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = TOPOLOGY.format(
        prefix=prefix,
        keyed=str(keyed).lower(),
        epsilon=epsilon,
        start=start,
        source_topic=source_topic or f"{prefix}.clicks",
        period=period,
    )
    if views_max_windows is not None:
        plain = "contribution: {max_keys: 2, max_per_key: 3}"
        text = text.replace(plain, plain[:-1] + f", max_windows: {views_max_windows}}}", 1)
    if running_total_max_per_period is not None:
        text = text.replace("sinks:\n", RUNNING_TOTAL.format(bound=running_total_max_per_period) + "sinks:\n", 1)
    path.write_text(text)
    topology = load_topology(path)
    ensure_topics(bootstrap, topology)
    return Deployment(path, topology, bootstrap, redis_url)


def feed_with_kills(
    dep: Deployment,
    workers: list[subprocess.Popen],
    names: list[str],
    t0: float,
    feed_s: float,
    kills: dict[int, int],
    batch: Callable[[int, float], list[tuple[bytes | None, bytes]]],
    every_s: float,
) -> dict[int, int]:
    """From wall time `t0` for `feed_s` seconds, send `batch(step, now)` every `every_s`; at feed second s
    in `kills`, SIGKILL worker `kills[s]` and restart it a second later under its name + "r" (`workers`
    and `names` are updated in place). Returns the kills not made (the feed ended first)."""
    while time.time() < t0:
        time.sleep(0.01)
    pending = dict(kills)
    step = 0
    while time.time() < t0 + feed_s:
        now = time.time()
        send(dep.bootstrap, dep.source_topic, batch(step, now))
        step += 1
        second = int(now - t0)
        if second in pending:
            idx = pending.pop(second)
            workers[idx].send_signal(signal.SIGKILL)
            workers[idx].wait()
            time.sleep(1.0)
            names[idx] += "r"
            workers[idx] = dep.start_worker(names[idx])
        time.sleep(every_s)
    return pending


def send(bootstrap: str, topic: str, events: list[tuple[bytes | None, bytes]]) -> None:
    """Produce (key, value) pairs in order and wait for every ack."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    for key, value in events:
        producer.send(topic, value=value, key=key)
    producer.flush()
    producer.close()


def event(user: str, ts: float, page: str = "home", basket: Any = 10.0) -> tuple[bytes, bytes]:
    """One well-formed click of `user` at event time `ts`."""
    doc = {"user_id": user, "ts": ts, "page": page, "basket_eur": basket}
    return user.encode(), json.dumps(doc).encode()


def read_all(bootstrap: str, topic: str, timeout_s: float = 30.0) -> list[tuple[bytes | None, bytes]]:
    """Every record of `topic` up to its end offsets as of now (a snapshot, so busy topics end too)."""
    from kafka import TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        parts = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        if not tps:
            return []
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        out: list[tuple[bytes | None, bytes]] = []
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < ends[tp] for tp in tps) and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                out.extend((m.key, m.value) for m in records if m.offset < ends[TopicPartition(m.topic, m.partition)])
        return out
    finally:
        consumer.close()


def poll(condition: Callable[[], Any], timeout_s: float = 90.0, every_s: float = 1.0) -> Any:
    """Call `condition` until it returns something truthy (returned) or the generous deadline passes (None)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(every_s)


def releases(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    """Decoded release records, in topic order."""
    return [json.loads(v) for _k, v in read_all(bootstrap, topic)]


def binomial_upper(n: int, p: float, alpha: float = 1e-6) -> int:
    """Smallest k with P(Binomial(n, p) > k) < alpha: a miss-count bound with false-failure rate < alpha."""
    tail = 1.0
    for k in range(n + 1):
        tail -= math.comb(n, k) * p**k * (1 - p) ** (n - k)
        if tail < alpha:
            return k
    return n
