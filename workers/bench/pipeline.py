"""`dpstream bench pipeline`: the worker's end-to-end events/s against two baselines in the same run,
and its close→publish latency on a live tail.

Pre-loads N events (half the units heavy enough to hit the contribution caps) into a fresh
4-partition topic, then measures (a) a raw aiokafka `getmany` + JSON decode loop over it (the Python
client's limit), (b) a plain per-event Faust agent counting per window into a changelogged Table
(the naive design; measured on the first `--naive-events` events because its rate is steady and
slow), and (c) `dpstream worker` over the backlog, timed from the moment its ingest process is
ready (group joined, as the raw loop is timed after its consumer started) until every window of
the backlog is released: the windows close by the clock, so the backlog's closing is part of the
work. Then (d) a live tail: `--live-seconds` of events at `--live-rate`, stamped as they are sent;
close→publish latency is taken on the windows that close during the tail only (the backlog closes
all its windows at once, which measures a burst, not a running deployment): partial → release
(the release side's share) and close time end + lateness → release (what a dashboard waits,
including the close poll and its grace). Also worker CPU seconds per million backlog events and
peak RSS. Needs a broker and a Redis: `--bootstrap` / `--redis`, or a local stack is started in a
temp dir.
"""

from __future__ import annotations

__all__ = ["register", "run"]

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpstream.workers.bench.worker_ready import wait_ready

_WINDOW_S = 10
_TOPOLOGY = """\
version: 1
start: {start}
publish_delay: 0s                 # no hold until P(w): the bench measures processing, not the public delay
sources:
  clicks:
    topic: {prefix}.clicks
    privacy_unit: user_id
    timestamp: ts
    allowed_lateness: 1s
    keyed_by_unit: true
    arrival: create_time          # the pre-loaded backlog keeps its record times (a CreateTime topic)
budgets:
  {prefix}: {{epsilon: 1.0, delta: 1.0e-6, accounting: zcdp, period: 1d}}
metrics:
  views:
    source: clicks
    budget: {prefix}
    weight: 1
    window: {{tumbling: {window}s}}
    aggregate: count
    group_by: page
    keys: [home, search, product, cart, checkout]
    contribution: {{max_keys: 2, max_per_key: 3}}
    mechanism: gaussian
  basket:
    source: clicks
    budget: {prefix}
    weight: 1
    window: {{tumbling: {window}s}}
    aggregate: sum
    value: basket_eur
    bounds: [0, 200]
    contribution: {{max_per_key: 2}}
    mechanism: gaussian
sinks:
  releases: {prefix}.releases
  dead_letter: {prefix}.dlq
"""


def register(targets: argparse._SubParsersAction) -> None:
    """Add `bench pipeline`."""
    parser = targets.add_parser("pipeline", help="worker events/s vs raw aiokafka and a per-event Faust agent")
    parser.add_argument("--events", type=int, default=1_000_000, help="events to pre-load (default 1,000,000)")
    parser.add_argument("--naive-events", type=int, default=60_000, help="events the per-event Faust agent runs over")
    parser.add_argument("--windows", type=int, default=20, help="event-time windows the events span (10 s each)")
    parser.add_argument("--live-seconds", type=int, default=60, help="length of the live tail (default 60 s)")
    parser.add_argument("--live-rate", type=int, default=2000, help="events/s of the live tail (default 2000)")
    parser.add_argument("--bootstrap", default=None, help="Kafka bootstrap (default: start a local stack)")
    parser.add_argument("--redis", default=None, help="Redis URL (default: start a local stack)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--single-process",
        action="store_true",
        help="one `worker --role all` process instead of an ingest and a release process",
    )
    parser.add_argument(
        "--ingest-nice",
        type=int,
        default=19,
        metavar="N",
        help="`worker --nice N` for the ingest process (default 19; 0 = same priority as the rest)",
    )
    parser.set_defaults(func=run)


def _events(n: int, windows: int, t0: int) -> list[tuple[bytes, bytes, int]]:
    """Half the units heavy (many events per window: they hit the caps), half light; event time
    ordered; each with the record time (ms) it is stamped with: its own event time (a backlog that
    arrived on time, so windows close by the clock as soon as it is consumed)."""
    import numpy as np  # bench path: a non-cryptographic RNG is fine here

    rng = np.random.default_rng(7)
    heavy_units, light_units = 50, max(50, n // 40)
    pages = ("home", "search", "product", "cart", "checkout")
    out = []
    span = windows * _WINDOW_S
    for i in range(n):
        unit = f"h{int(rng.integers(heavy_units))}" if i % 2 == 0 else f"l{int(rng.integers(light_units))}"
        ts = t0 + span * i / n
        doc = {
            "user_id": unit,
            "ts": round(ts, 3),
            "page": pages[i % 5],
            "basket_eur": round(float(rng.random()) * 250, 2),
        }
        out.append((unit.encode(), json.dumps(doc, separators=(",", ":")).encode(), int(round(ts, 3) * 1000)))
    return out


async def _preload(bootstrap: str, topic: str, events: list[tuple[bytes, bytes, int]]) -> None:
    """Produce the events with their record times (the bench topic keeps producer times: CreateTime)."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=50, max_batch_size=512 * 1024, acks=1)
    await producer.start()
    try:
        futures = []
        for key, value, stamp in events:
            futures.append(await producer.send(topic, value, key=key, timestamp_ms=stamp))
            if len(futures) >= 20_000:
                await asyncio.gather(*futures)
                futures.clear()
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def _raw_rate(bootstrap: str, topic: str, total: int) -> float:
    """Events/s of a bare aiokafka getmany + JSON decode loop over the whole topic."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    try:
        from orjson import loads
    except ImportError:  # pragma: no cover
        from json import loads  # type: ignore[assignment]  # the stdlib fallback: same use, wider signature
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        max_partition_fetch_bytes=4 * 1024 * 1024,
        fetch_max_bytes=32 * 1024 * 1024,
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(4)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        seen = 0
        started = time.perf_counter()
        while seen < total:
            for records in (await consumer.getmany(timeout_ms=200, max_records=5000)).values():
                for rec in records:
                    loads(rec.value)
                seen += len(records)
        return seen / (time.perf_counter() - started)
    finally:
        await consumer.stop()


def _naive_rate(bootstrap: str, topic: str, count: int, workdir: Path) -> float:
    progress = workdir / "naive.progress"
    proc = subprocess.Popen(
        [sys.executable, "-m", "dpstream.workers.bench._faust_count", bootstrap, topic, str(_WINDOW_S), str(progress)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    first: tuple[int, float] | None = None
    last: tuple[int, float] = (0, 0.0)
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.25)
            try:
                n, t = progress.read_text().split()
            except (OSError, ValueError):
                continue
            last = (int(n), float(t))
            first = first or last
            if last[0] >= count:
                break
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
    if first is None or last[1] <= first[1]:
        return 0.0
    return (last[0] - first[0]) / (last[1] - first[1])


def _proc_cpu(pid: int) -> float:
    """CPU seconds the process used; 0 once it has exited (the bench then reports the worker's exit)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _proc_hwm_mb(pid: int) -> float:
    """Peak RSS of the process in MB; 0 once it has exited."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return 0.0
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


class _Releases:
    """Follows the releases topic for the whole run: (metric, window start) → its record's Kafka time (s).
    One consumer, so the bench driver takes little CPU from the workers it measures."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from aiokafka import AIOKafkaConsumer

        self.seen: dict[tuple[str, int], float] = {}
        self._consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
        )

    async def start(self) -> None:
        await self._consumer.start()

    async def stop(self) -> None:
        await self._consumer.stop()

    async def poll(self) -> None:
        """Take the releases that arrived (waiting at most 200 ms), each stamped when received."""
        for records in (await self._consumer.getmany(timeout_ms=200)).values():
            for rec in records:
                doc = json.loads(rec.value)
                # received now: the record's own timestamp is its public time P(w), not when it was ready
                self.seen.setdefault((doc["metric"], doc["window"]["start_epoch"]), time.time())

    async def until(self, expected: set[tuple[str, int]], alive: Callable[[], bool]) -> float | None:
        """perf_counter() once every expected window was released; None if a worker died or time ran out."""
        while not expected <= self.seen.keys():
            if not alive():
                return None
            await self.poll()
        return time.perf_counter()


async def _feed(bootstrap: str, topic: str, rate: int, seconds: int) -> int:
    """The live tail: `rate` events/s for `seconds`, each stamped (event time and record time) as sent."""
    from aiokafka import AIOKafkaProducer

    pages = ("home", "search", "product", "cart", "checkout")
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks=1)
    await producer.start()
    sent = 0
    try:
        begin = time.monotonic()
        while (elapsed := time.monotonic() - begin) < seconds:
            due = int(elapsed * rate) + 1
            now = time.time()
            while sent < due:
                unit = f"u{sent % 5000}"
                doc = {"user_id": unit, "ts": round(now, 3), "page": pages[sent % 5], "basket_eur": sent % 250}
                value = json.dumps(doc, separators=(",", ":")).encode()
                await producer.send(topic, value, key=unit.encode(), timestamp_ms=int(now * 1000))
                sent += 1
            await asyncio.sleep(0.01)
        await producer.flush()
    finally:
        await producer.stop()
    return sent


@dataclass
class _Timings:
    """What the worker phases measured (perf_counter seconds and process CPU seconds)."""

    backlog_start: float | None = None
    backlog_end: float | None = None
    backlog_cpu_s: float = 0.0
    backlog_cpu_by_process: list[float] = field(default_factory=list)
    """The backlog's CPU seconds per worker process, in start order (release first, then ingest)."""
    live_from: float = 0.0
    live_to: float = 0.0
    live_events: int = 0
    live_done: bool = False


async def _worker_phases(
    bootstrap: str,
    releases_topic: str,
    source_topic: str,
    backlog: set[tuple[str, int]],
    metrics: list[str],
    procs: list[subprocess.Popen],
    ingest_log: Path,
    args: argparse.Namespace,
) -> tuple[_Timings, dict[tuple[str, int], float]]:
    """Backlog from the ingest process's readiness to its last window released, then the live tail
    until every window it touched was released."""
    deadline = time.monotonic() + 900

    def alive() -> bool:
        return time.monotonic() < deadline and all(p.poll() is None for p in procs)

    timings = _Timings()
    releases = _Releases(bootstrap, releases_topic)
    await releases.start()
    try:
        await asyncio.to_thread(wait_ready, procs[-1], ingest_log, 120, "bench pipeline")
        timings.backlog_start, cpu0 = time.perf_counter(), [_proc_cpu(p.pid) for p in procs]
        timings.backlog_end = await releases.until(backlog, alive)
        timings.backlog_cpu_by_process = [_proc_cpu(p.pid) - c for p, c in zip(procs, cpu0, strict=True)]
        timings.backlog_cpu_s = sum(timings.backlog_cpu_by_process)
        if timings.backlog_end is None or args.live_seconds <= 0:
            return timings, releases.seen
        timings.live_from = time.time()
        feed = asyncio.create_task(_feed(bootstrap, source_topic, args.live_rate, args.live_seconds))
        while not feed.done():  # releases are stamped when received, so they are read while the tail runs
            await releases.poll()
        timings.live_events = await feed
        timings.live_to = time.time()
        last = int(timings.live_to // _WINDOW_S) * _WINDOW_S
        live = {(m, s) for m in metrics for s in range(_live_first(timings.live_from), last + 1, _WINDOW_S)}
        timings.live_done = await releases.until(live, alive) is not None
        return timings, releases.seen
    finally:
        await releases.stop()


def _live_first(live_from: float) -> int:
    """The first window wholly inside the live tail."""
    return -(-int(live_from) // _WINDOW_S) * _WINDOW_S


def _read(bootstrap: str, topic: str) -> list[Any]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        if not tps:
            return []
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        out: list[Any] = []
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            for records in consumer.poll(timeout_ms=300).values():
                out.extend(r for r in records if r.offset < ends[TopicPartition(r.topic, r.partition)])
        return out
    finally:
        consumer.close()


def _measure(bootstrap: str, redis_url: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from dpstream.topology.loader import load_topology
    from dpstream.workers.runtime.admin import create_topics
    from dpstream.workers.runtime.topics import topic_names

    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    path = workdir / "bench.yaml"
    t0 = (int(time.time()) // _WINDOW_S - args.windows - 5) * _WINDOW_S
    path.write_text(_TOPOLOGY.format(prefix=prefix, window=_WINDOW_S, start=t0))
    topology = load_topology(path)
    # CreateTime topics (not the worker's LogAppendTime): the pre-loaded backlog keeps the record
    # times it was stamped with, as if each event had arrived at its own time
    create_topics(bootstrap, topic_names(topology).all, 4)
    topic = topology.sources["clicks"].topic
    events = _events(args.events, args.windows, t0)
    asyncio.run(_preload(bootstrap, topic, events))
    del events
    total = args.events
    raw = asyncio.run(_raw_rate(bootstrap, topic, total))
    naive = _naive_rate(bootstrap, topic, min(args.naive_events, args.events), workdir)

    backlog = {(m, s) for m in topology.metrics for s in range(t0, t0 + args.windows * _WINDOW_S, _WINDOW_S)}
    roles = ("all",) if args.single_process else ("release", "ingest")
    nice = {"ingest": ["--nice", str(args.ingest_nice)]} if args.ingest_nice else {}
    procs: list[subprocess.Popen] = []
    exited: dict[str, int | None] = {}
    log_path = workdir / "worker.log"
    try:  # every started worker is stopped below, whatever fails first
        for role in roles:
            # the release process is started first and measured once ready, as in a running deployment
            # (its Faust group join and table recovery are startup, not close→publish latency)
            log_path = workdir / f"worker-{role}.log"
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "dpstream.workers.cli",
                        "worker",
                        str(path),
                        "--bootstrap",
                        bootstrap,
                        "--redis",
                        redis_url,
                        "--worker-id",
                        f"bench-{role}",
                        "--role",
                        role,
                        "--loglevel",
                        "INFO",
                        *nice.get(role, []),
                    ],
                    stdout=log_path.open("wb"),
                    stderr=subprocess.STDOUT,
                )
            )
            if role == "release":
                wait_ready(procs[-1], log_path, 120, "bench pipeline")
        timings, released_at = asyncio.run(
            _worker_phases(
                bootstrap, topology.sinks.releases, topic, backlog, list(topology.metrics), procs, log_path, args
            )
        )
        rss = sum(_proc_hwm_mb(p.pid) for p in procs)
        exited = {f"bench-{role}": p.poll() for role, p in zip(roles, procs, strict=False)}
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
    partial_at: dict[tuple[str, int], float] = {}
    for rec in _read(bootstrap, topology.sinks.partials_topic):
        if rec.value.startswith(b"dpstream-tick:"):
            continue
        doc = json.loads(rec.value)
        key = (doc["metric"], doc["start"])
        partial_at[key] = max(partial_at.get(key, 0.0), rec.timestamp / 1000)
    lateness = topology.sources["clicks"].allowed_lateness_s
    live_first = _live_first(timings.live_from) if timings.live_from else None
    live = sorted(k for k in released_at if live_first is not None and k[1] >= live_first and k in partial_at)
    partial_lat = sorted(released_at[k] - partial_at[k] for k in live)
    close_lat = sorted(released_at[k] - (k[1] + _WINDOW_S + lateness) for k in live)
    elapsed = (
        timings.backlog_end - timings.backlog_start
        if timings.backlog_end is not None and timings.backlog_start is not None
        else float("nan")
    )
    worker = args.events / elapsed if elapsed == elapsed and elapsed > 0 else 0.0

    def pct(values: list[float], q: float) -> float:
        return round(values[min(len(values) - 1, int(q * len(values)))] * 1000, 1) if values else float("nan")

    return {
        "events": args.events,
        "windows_released": len(backlog & released_at.keys()),
        "windows_expected": len(backlog),
        "backlog_seconds": round(elapsed, 2),
        "worker_events_per_s": round(worker),
        "raw_aiokafka_events_per_s": round(raw),
        "naive_faust_events_per_s": round(naive),
        "naive_faust_events_measured": min(args.naive_events, args.events),
        "ratio_vs_raw": round(worker / raw, 3) if raw else None,
        "ratio_vs_naive_faust": round(worker / naive, 2) if naive else None,
        "live_events": timings.live_events,
        "live_rate_per_s": args.live_rate,
        "live_windows_released": len(live),
        "live_all_released": timings.live_done,
        "workers_exited_early": {name: code for name, code in exited.items() if code is not None},
        "close_to_publish_ms_p50": pct(partial_lat, 0.5),
        "close_to_publish_ms_p90": pct(partial_lat, 0.9),
        "close_to_publish_ms_p99": pct(partial_lat, 0.99),
        "close_time_to_publish_ms_p50": pct(close_lat, 0.5),
        "close_time_to_publish_ms_p99": pct(close_lat, 0.99),
        "worker_cpu_s_per_million": round(timings.backlog_cpu_s / args.events * 1e6, 2),
        "worker_cpu_s_per_million_by_process": {
            role: round(cpu / args.events * 1e6, 2)
            for role, cpu in zip(roles, timings.backlog_cpu_by_process, strict=False)
        },
        "worker_peak_rss_mb": round(rss, 1),
        "worker_processes": "+".join(sorted(roles)),
        "ingest_nice": args.ingest_nice if not args.single_process else 0,
    }


def run(args: argparse.Namespace) -> int:
    """Run the benchmark and print the figures (text or JSON)."""
    workdir = Path(tempfile.mkdtemp(prefix="dpstream-bench-pipeline-"))
    stack = None
    bootstrap, redis_url = args.bootstrap, args.redis
    if not (bootstrap and redis_url):
        from dpstream.workers.localstack import free_port, start_kafka, start_redis

        kport = free_port()
        kafka = start_kafka(kport, free_port(avoid=frozenset({kport})), workdir / "kafka")
        redis = start_redis(free_port(), workdir / "redis")
        stack = (kafka, redis)
        bootstrap, redis_url = bootstrap or kafka.bootstrap, redis_url or redis.url
    try:
        result = _measure(bootstrap, redis_url, args, workdir)
    finally:
        if stack is not None:
            for handle in stack:
                handle.stop()
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    width = max(len(k) for k in result)
    for key, value in result.items():
        print(f"{key:<{width}}  {value}")
    return 0
