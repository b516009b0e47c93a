"""Chaos harness: its own Redis and Kafka, supervised worker pairs, a live producer and timed injections.

The chaos test owns its servers (it kills and stops them), so it does not use the session fixtures.
Workers run as `dpstream worker` subprocesses; a supervisor restarts any that died (SIGKILLed by the
test or by the crash hook of `workers.release.faults`) once the ledger is reachable again.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafka import KafkaProducer

from dpstream.topology.loader import load_topology
from dpstream.topology.model import Topology
from dpstream.workers.localstack import KafkaHandle, RedisHandle, free_port
from dpstream.workers.localstack.sentinel import SentinelLedger
from dpstream.workers.release.faults import ARM_ENV, ARM_PHRASE, CRASH_ENV, STEPS
from dpstream.workers.runtime.topics import ensure_topics

WINDOW_S = 2
LATENESS_S = 1

TOPOLOGY = """\
version: 1
start: {start}
sources:
  clicks:
    topic: {source_topic}
    privacy_unit: user_id
    timestamp: ts
    allowed_lateness: {lateness}s
    keyed_by_unit: true
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
    window: {{tumbling: {window}s}}
    aggregate: count
    group_by: page
    keys: [home, cart, search]
    contribution: {{max_keys: 2, max_per_key: 3}}
    mechanism: gaussian
  spend:
    source: clicks
    budget: b
    weight: 1
    window: {{tumbling: {window}s}}
    aggregate: sum
    value: basket_eur
    bounds: [0, 100]
    contribution: {{max_per_key: 2}}
    mechanism: gaussian
  users:
    source: clicks
    budget: b
    weight: 1
    window: {{tumbling: {window}s}}
    aggregate: count_units
    mechanism: gaussian
sinks:
  releases: {prefix}.releases
  dead_letter: {prefix}.dlq
"""


@dataclass(frozen=True)
class ChaosSettings:
    """How long and how hard: the CI-sized default, or the long run (`DPSTREAM_CHAOS_LONG=<minutes>`)."""

    feed_s: float
    """How long the producer feeds (injections happen within it)."""
    cycle_s: float
    """One round of injections: worker kills, Redis SIGKILL, Redis stop, Kafka restart."""
    redis_pause_s: float
    """How long Redis stays stopped."""
    rate: float = 40.0
    """Events per second."""
    drain_s: float = 240.0
    """How long every window may take to come out after the feed stops."""

    @classmethod
    def from_env(cls, short_feed_s: float = 64.0) -> ChaosSettings:
        minutes = float(os.environ.get("DPSTREAM_CHAOS_LONG", "0") or 0)
        if minutes > 0:
            return cls(feed_s=minutes * 60, cycle_s=150.0, redis_pause_s=30.0, drain_s=420.0)
        return cls(feed_s=short_feed_s, cycle_s=short_feed_s, redis_pause_s=6.0)


@dataclass
class Servers:
    """The chaos test's own Kafka broker and ledger (one Redis, or a primary + replica under Sentinel),
    plus a second Redis for the clean run."""

    kafka: KafkaHandle
    redis: RedisHandle
    clean_redis: RedisHandle
    sentinel: SentinelLedger | None = None

    @classmethod
    def start(cls, base: Path, sentinel: bool = False) -> Servers:
        kport = free_port()
        kafka = KafkaHandle(kport, free_port(avoid=frozenset({kport})), base / "kafka")
        group = SentinelLedger(base / "ledger", replicas=1, sentinels=1) if sentinel else None
        redis = group.nodes[0] if group is not None else RedisHandle(free_port(), base / "redis")
        clean = RedisHandle(free_port(), base / "redis-clean")
        servers = cls(kafka, redis, clean, group)
        try:
            if group is not None:
                group.start()
            else:
                redis.start()
            clean.start()
            kafka.start()
        except BaseException:
            servers.stop()
            raise
        return servers

    @property
    def ledger_url(self) -> str:
        """The URL workers and verify use for the chaos deployment's ledger."""
        return self.sentinel.url if self.sentinel is not None else self.redis.url

    def failover(self) -> tuple[float, float]:
        """SIGKILL the primary, wait for Sentinel to promote the replica, then start the old primary
        again (Sentinel makes it the new primary's replica); returns (killed at, promoted at)."""
        assert self.sentinel is not None
        old = self.sentinel.primary()
        t0 = time.time()
        old.kill()
        self.sentinel.wait_failover(old.port)
        t1 = time.time()
        old.start()
        return t0, t1

    def stop(self) -> None:
        handles = [self.kafka, self.clean_redis]
        handles += [] if self.sentinel is not None else [self.redis]
        for handle in handles:
            handle.stop()
        if self.sentinel is not None:
            self.sentinel.stop()


def write_topology(
    base: Path, bootstrap: str, start: int, epsilon: float, source_topic: str | None, period: str = "1d"
) -> Topology:
    """A three-metric topology with unique topic names and budget `period`; its topics are created."""
    prefix = f"chaos-{uuid.uuid4().hex[:10]}"
    path = base / prefix / "topology.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        TOPOLOGY.format(
            prefix=prefix,
            start=start,
            epsilon=epsilon,
            window=WINDOW_S,
            lateness=LATENESS_S,
            source_topic=source_topic or f"{prefix}.clicks",
            period=period,
        )
    )
    topology = load_topology(path)
    ensure_topics(bootstrap, topology)
    return topology


@dataclass
class Injection:
    """One fault the test caused (or a crash hook fired), with its wall-clock time."""

    kind: str
    at: float
    detail: str = ""


@dataclass
class Slot:
    """One worker slot: the process running in it now and how often it was started."""

    name: str
    index: int = 0
    proc: subprocess.Popen | None = None
    starts: int = 0
    armed: str | None = None
    """The crash-hook step the running process was armed with."""
    killed_by_test: bool = False
    reported: bool = False
    """Its death is recorded (it is recorded once, however long it stays dead)."""


@dataclass
class Supervisor:
    """Keeps `slots` workers of one topology running; arms crash hooks while `arm_left` > 0."""

    path: Path
    bootstrap: str
    redis_url: str
    slots: list[Slot]
    rng: random.Random
    arm: dict[str, int] = field(default_factory=dict)
    """Crash-hook target per step: a launch is armed while a step has fired fewer times than this."""
    injections: list[Injection] = field(default_factory=list)
    paused: bool = False
    """While True (ledger or broker down) dead workers are not restarted."""

    def _launch(self, slot: Slot) -> None:
        env = dict(os.environ)
        env.pop(CRASH_ENV, None)
        env.pop(ARM_ENV, None)
        slot.armed = None
        busy = {s.armed for s in self.slots if s is not slot and s.proc is not None and s.proc.poll() is None}
        wanted = [st for st in STEPS if self.fired(st) < self.arm.get(st, 0) and st not in busy]
        if wanted:
            step = wanted[(slot.starts + slot.index) % len(wanted)]
            env[CRASH_ENV] = f"{step}@{self.rng.randint(1, 4)}"
            env[ARM_ENV] = ARM_PHRASE
            slot.armed = step
        slot.starts += 1
        datadir = self.path.parent / f"data-{slot.name}-{slot.starts}"
        log = open(self.path.parent / f"{slot.name}.log", "ab")  # noqa: SIM115 - closed with the process
        argv = [sys.executable, "-m", "dpstream.workers.cli", "worker", str(self.path)]
        argv += ["--bootstrap", self.bootstrap, "--redis", self.redis_url, "--worker-id", slot.name]
        argv += ["--datadir", str(datadir)]
        slot.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        slot.killed_by_test = slot.reported = False
        log.close()

    def fired(self, step: str) -> int:
        """How often the crash hook at `step` has killed a worker."""
        return sum(1 for i in self.injections if i.kind == f"worker_crash_{step}")

    def start(self) -> None:
        for slot in self.slots:
            self._launch(slot)

    def tend(self) -> None:
        """Record each worker that died by itself (a crash hook fired) and restart dead ones."""
        for slot in self.slots:
            proc = slot.proc
            if proc is None or proc.poll() is None:
                continue
            if not slot.killed_by_test and not slot.reported:
                kind = f"worker_crash_{slot.armed}" if slot.armed and proc.returncode == -signal.SIGKILL else None
                self.injections.append(
                    Injection(kind or "worker_exit", time.time(), f"{slot.name} exit {proc.returncode}")
                )
            slot.reported = True
            if not self.paused:
                self._launch(slot)

    def kill_random(self) -> None:
        """SIGKILL one running worker, as a crash would."""
        live = [s for s in self.slots if s.proc is not None and s.proc.poll() is None]
        if not live:
            return
        slot = self.rng.choice(live)
        assert slot.proc is not None
        slot.killed_by_test = True
        slot.proc.send_signal(signal.SIGKILL)
        slot.proc.wait()
        self.injections.append(Injection("worker_sigkill", time.time(), slot.name))

    def stop(self) -> None:
        """SIGTERM every worker, SIGKILL after a grace period."""
        procs = [s.proc for s in self.slots if s.proc is not None and s.proc.poll() is None]
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class Producer(threading.Thread):
    """Live clicks at `rate`/s (event time = now) until `stop_at` (epoch s); acks=all, retried across
    a broker restart. Unit ids, pages and amounts are synthetic."""

    def __init__(self, bootstrap: str, topic: str, rate: float, stop_at: float, seed: int) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.rate, self.stop_at = bootstrap, topic, rate, stop_at
        self.rng = random.Random(seed)
        self.sent = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            producer = KafkaProducer(
                bootstrap_servers=self.bootstrap,
                acks="all",
                linger_ms=20,
                retries=1_000,
                max_block_ms=120_000,
                request_timeout_ms=30_000,
                reconnect_backoff_max_ms=2_000,
            )
            tick = 0.1
            owed = 0.0
            next_at = time.monotonic()
            while time.time() < self.stop_at:
                owed += self.rate * tick
                n, owed = int(owed), owed - int(owed)
                now = time.time()
                for _ in range(n):
                    user = f"u{self.rng.randrange(300)}"
                    doc = {
                        "user_id": user,
                        "ts": round(now, 3),
                        "page": self.rng.choice(("home", "cart", "search")),
                        "basket_eur": round(self.rng.uniform(0, 120), 2),
                    }
                    producer.send(self.topic, json.dumps(doc).encode(), key=user.encode())
                self.sent += n
                next_at += tick
                time.sleep(max(0.0, next_at - time.monotonic()))
            producer.flush(timeout=180)
            producer.close(timeout=30)
        except BaseException as exc:  # reported by the test
            self.error = exc


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (nearest rank) of `values`; nan when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(q * len(ordered) + 0.999999) - 1))]


class ReleaseWatcher(threading.Thread):
    """Reads a releases topic live from its beginning and notes when each release_id first arrives.

    A record's Kafka timestamp is its public time P(w) however late it was published (DESIGN §1
    "Release time is public"), so only the time a consumer receives it says when it came out.
    `received`: release_id → (receive time, epoch s, the decoded record of its first copy);
    `payloads`: release_id → every distinct record (sorted-key JSON) received under it."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.received: dict[str, tuple[float, dict[str, Any]]] = {}
        self.payloads: dict[str, set[str]] = {}
        self.error: BaseException | None = None
        self._stop_event = threading.Event()
        self._ready = threading.Event()

    def run(self) -> None:
        from kafka import KafkaConsumer, TopicPartition

        try:
            consumer = KafkaConsumer(
                bootstrap_servers=self.bootstrap, enable_auto_commit=False, reconnect_backoff_max_ms=2_000
            )
            try:
                parts = consumer.partitions_for_topic(self.topic) or set()
                tps = [TopicPartition(self.topic, p) for p in sorted(parts)]
                consumer.assign(tps)
                consumer.seek_to_beginning(*tps)
                self._ready.set()
                while not self._stop_event.is_set():
                    for records in consumer.poll(timeout_ms=200).values():
                        now = time.time()
                        for m in records:
                            doc = json.loads(m.value)
                            rid = doc["release_id"]
                            self.payloads.setdefault(rid, set()).add(json.dumps(doc, sort_keys=True))
                            self.received.setdefault(rid, (now, doc))  # after its payload: readers look both up
            finally:
                consumer.close()
        except BaseException as exc:  # reported by the test
            self.error = exc
            self._ready.set()

    def begin(self) -> ReleaseWatcher:
        """Start and wait until the consumer is assigned (the topic must exist)."""
        self.start()
        assert self._ready.wait(60), "release watcher did not start"
        assert self.error is None, repr(self.error)
        return self

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=30)


def release_lags(received: dict[str, tuple[float, dict[str, Any]]], since: float, until: float) -> list[float]:
    """Per release_id: the time a live consumer first received it (`ReleaseWatcher.received`) − the
    window's close C(w), for windows closing in [since, until]. It includes publish_delay (a release
    comes out at P(w) = C(w) + publish_delay at the earliest); the record's Kafka time, always P(w),
    would show that delay and nothing else."""
    lags: list[float] = []
    for at, doc in received.values():
        close = doc["window"]["end_epoch"] + LATENESS_S
        if since <= close <= until:
            lags.append(at - close)
    return lags
