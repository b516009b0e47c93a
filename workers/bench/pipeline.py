"""`dpstream bench pipeline`: the worker's end-to-end events/s against two baselines in the same run.

Pre-loads N events (half the units heavy enough to hit the contribution caps) into a fresh
4-partition topic, then measures (a) a raw aiokafka `getmany` + JSON decode loop over it (the Python
client's limit), (b) a plain per-event Faust agent counting per window into a changelogged Table
(the naive design; measured on the first `--naive-events` events because its rate is steady and
slow), and (c) `dpstream worker` (a subprocess) from its first commit until every window of every
metric is released. Also: close→publish latency p50/p99 (last partial's Kafka time → release's
Kafka time), worker CPU seconds per million events and peak RSS. Needs a broker and a Redis:
`--bootstrap` / `--redis`, or a local stack is started in a temp dir.
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
from pathlib import Path
from typing import Any

_WINDOW_S = 10
_TOPOLOGY = """\
version: 1
start: {start}
sources:
  clicks:
    topic: {prefix}.clicks
    privacy_unit: user_id
    timestamp: ts
    allowed_lateness: 1s
    keyed_by_unit: true
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
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _proc_hwm_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def _follow(
    bootstrap: str,
    group: str,
    releases_topic: str,
    expected: set[tuple[str, int]],
    procs: list[subprocess.Popen],
    deadline: float,
) -> tuple[float | None, float, float]:
    """Wait for the worker's first commit (start), then follow the releases topic until every expected
    window is in (end). One admin client and one consumer for the whole run, so the bench driver
    takes little CPU from the worker it measures. Returns (start, worker CPU s at start, end)."""
    from aiokafka import AIOKafkaConsumer
    from aiokafka.admin import AIOKafkaAdminClient

    def alive() -> bool:
        return time.monotonic() < deadline and all(p.poll() is None for p in procs)

    start: float | None = None
    cpu0 = 0.0
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        while start is None and alive():
            try:
                offsets = await admin.list_consumer_group_offsets(group)
            except Exception:  # the group does not exist yet
                offsets = {}
            if sum(max(0, meta.offset) for meta in offsets.values()) > 0:
                start, cpu0 = time.perf_counter(), sum(_proc_cpu(p.pid) for p in procs)
            else:
                await asyncio.sleep(0.02)
    finally:
        await admin.close()
    consumer = AIOKafkaConsumer(
        releases_topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()
    released: set[tuple[str, int]] = set()
    try:
        while start is not None and not expected <= released and alive():
            for records in (await consumer.getmany(timeout_ms=200)).values():
                for rec in records:
                    doc = json.loads(rec.value)
                    released.add((doc["metric"], doc["window"]["start_epoch"]))
    finally:
        await consumer.stop()
    return start, cpu0, time.perf_counter()


def _wait_ready(proc: subprocess.Popen, log_path: Path, timeout_s: float) -> None:
    """Wait for the Faust worker's "Ready" log line (group joined, tables recovered)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if b"Ready" in log_path.read_bytes():
            return
        time.sleep(0.1)
    raise RuntimeError(f"bench: the release worker did not become ready; see {log_path}")


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
    from dpstream.workers.runtime.settings import RuntimeSettings
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

    group = RuntimeSettings(bootstrap=bootstrap, redis_url=redis_url).group_id(topology) + "-ingest"
    expected = {(m, s) for m in topology.metrics for s in range(t0, t0 + args.windows * _WINDOW_S, _WINDOW_S)}
    roles = ("all",) if args.single_process else ("release", "ingest")
    nice = {"ingest": ["--nice", str(args.ingest_nice)]} if args.ingest_nice else {}
    procs: list[subprocess.Popen] = []
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
            _wait_ready(procs[-1], log_path, timeout_s=120)
    try:
        start, cpu0, end = asyncio.run(
            _follow(bootstrap, group, topology.sinks.releases, expected, procs, time.monotonic() + 900)
        )
        elapsed = end - start if start else float("nan")
        cpu = sum(_proc_cpu(p.pid) for p in procs) - (cpu0 or 0.0)
        rss = sum(_proc_hwm_mb(p.pid) for p in procs)
        released = {
            (r["metric"], r["window"]["start_epoch"])
            for r in (json.loads(rec.value) for rec in _read(bootstrap, topology.sinks.releases))
        }
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
    closes: dict[tuple[str, int], float] = {}
    for rec in _read(bootstrap, topology.sinks.partials_topic):
        if rec.value.startswith(b"dpstream-tick:"):
            continue
        doc = json.loads(rec.value)
        key = (doc["metric"], doc["start"])
        closes[key] = max(closes.get(key, 0.0), rec.timestamp / 1000)
    by_window = sorted(
        (rec.timestamp / 1000 - closes[k], k)
        for rec in _read(bootstrap, topology.sinks.releases)
        if (k := ((d := json.loads(rec.value))["metric"], d["window"]["start_epoch"])) in closes
    )
    latencies = [lat for lat, _ in by_window]
    order = sorted(closes.values())
    slowest = [f"{m}@{(closes[(m, s)] - order[0]):.1f}s: {lat * 1000:.0f} ms" for lat, (m, s) in by_window[-3:][::-1]]
    worker = args.events / elapsed if elapsed == elapsed and elapsed > 0 else 0.0

    def pct(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000 if latencies else float("nan")

    return {
        "events": args.events,
        "windows_released": len(released & expected),
        "windows_expected": len(expected),
        "worker_events_per_s": round(worker),
        "raw_aiokafka_events_per_s": round(raw),
        "naive_faust_events_per_s": round(naive),
        "naive_faust_events_measured": min(args.naive_events, args.events),
        "ratio_vs_raw": round(worker / raw, 3) if raw else None,
        "ratio_vs_naive_faust": round(worker / naive, 2) if naive else None,
        "close_to_publish_ms_p50": round(pct(0.5), 1),
        "close_to_publish_ms_p90": round(pct(0.9), 1),
        "close_to_publish_ms_p99": round(pct(0.99), 1),
        "close_to_publish_samples": len(latencies),
        "close_to_publish_slowest": slowest,
        "worker_cpu_s_per_million": round(cpu / args.events * 1e6, 2),
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
