"""`dpstream bench soak --minutes M --rate R`: does a live worker drift? Slopes of RSS, release lag and ledger latency.

Runs one `dpstream worker` (a subprocess, `--role all`) on a three-metric topology with 5 s windows
against a local stack (or `--bootstrap` / `--redis`), feeds it R events/s of live traffic for M
minutes, and every `--every` seconds samples the worker's RSS (/proc), the release lag of the
windows released since the last sample (release record's Kafka time − the window's close time
C(w)) and the mean duration of the worker's ledger calls (its /metrics histogram, delta since the
last sample). Prints each series' least-squares slope per hour and as % of its mean per hour, after
a warm-up (`--warmup`, default 10 % of the run); the samples go to series.json in its work
directory. Pass line: RSS flat within 5 % per hour; exit 1 otherwise (lag and ledger latency are
reported, not judged: on a shared machine they follow the neighbours' load).
"""

from __future__ import annotations

__all__ = ["register", "run", "slope"]

import argparse
import asyncio
import json
import math
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpstream.workers.bench.worker_ready import wait_ready

_WINDOW_S = 5
_LATENESS_S = 1
_RSS_LIMIT_PCT_PER_H = 5.0
_TOPOLOGY = """\
version: 1
start: {start}
sources:
  clicks:
    topic: {prefix}.clicks
    privacy_unit: user_id
    timestamp: ts
    allowed_lateness: {lateness}s
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
  users:
    source: clicks
    budget: {prefix}
    weight: 1
    window: {{tumbling: {window}s}}
    aggregate: count_units
    mechanism: gaussian
sinks:
  releases: {prefix}.releases
  dead_letter: {prefix}.dlq
"""


def register(targets: argparse._SubParsersAction) -> None:
    """Add `bench soak`."""
    parser = targets.add_parser("soak", help="a worker under steady load: slopes of RSS, release lag, ledger latency")
    parser.add_argument("--minutes", type=float, default=30.0, help="how long to feed the worker (default 30)")
    parser.add_argument("--rate", type=float, default=500.0, help="events per second (default 500)")
    parser.add_argument("--every", type=float, default=10.0, metavar="S", help="sample period, seconds (default 10)")
    parser.add_argument(
        "--warmup", type=float, default=None, metavar="S", help="seconds left out of the fit (default 10 %% of the run)"
    )
    parser.add_argument("--bootstrap", default=None, help="Kafka bootstrap (default: start a local stack)")
    parser.add_argument("--redis", default=None, help="Redis URL (default: start a local stack)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.set_defaults(func=run)


def slope(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (slope per second, mean of y) of (t, y) points; slope nan with fewer than 2."""
    n = len(points)
    if n == 0:
        return math.nan, math.nan
    mt = sum(t for t, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    if n < 2 or var == 0:
        return math.nan, my
    return sum((t - mt) * (y - my) for t, y in points) / var, my


@dataclass
class _Series:
    """Samples (seconds since start, value) of the soak's three figures."""

    rss_mb: list[tuple[float, float]] = field(default_factory=list)
    lag_s: list[tuple[float, float]] = field(default_factory=list)
    ledger_ms: list[tuple[float, float]] = field(default_factory=list)


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return math.nan


def _ledger_totals(port: int) -> tuple[float, float]:
    """(sum of seconds, count) of the worker's ledger-call histogram, over every op."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:  # noqa: S310 - loopback
        text = resp.read().decode()
    total = count = 0.0
    for line in text.splitlines():
        if line.startswith("dpstream_ledger_request_duration_seconds_sum"):
            total += float(line.rsplit(" ", 1)[1])
        elif line.startswith("dpstream_ledger_request_duration_seconds_count"):
            count += float(line.rsplit(" ", 1)[1])
    return total, count


async def _produce(bootstrap: str, topic: str, rate: float, until: float, sent: list[int]) -> None:
    """Live events at `rate`/s (event time = now) in 100 ms batches until `until` (monotonic)."""
    import numpy as np  # bench path: a non-cryptographic RNG is fine for synthetic traffic
    from aiokafka import AIOKafkaProducer

    rng = np.random.default_rng(11)
    pages = ("home", "search", "product", "cart", "checkout")
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, acks=1)
    await producer.start()
    try:
        tick = 0.1
        next_at = time.monotonic()
        owed = 0.0
        while time.monotonic() < until:
            owed += rate * tick
            batch, owed = int(owed), owed - int(owed)
            now = time.time()
            for _ in range(batch):
                unit = f"u{int(rng.integers(20_000))}"
                doc = {
                    "user_id": unit,
                    "ts": round(now, 3),
                    "page": pages[int(rng.integers(5))],
                    "basket_eur": round(float(rng.random()) * 250, 2),
                }
                await producer.send(topic, json.dumps(doc, separators=(",", ":")).encode(), key=unit.encode())
            sent[0] += batch
            next_at += tick
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        await producer.flush()
    finally:
        await producer.stop()


async def _follow(bootstrap: str, topic: str, until: float, lags: list[float], released: list[int]) -> None:
    """Append the release lag of every release record (Kafka time − C(w)) as it arrives."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    try:
        while time.monotonic() < until:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                for rec in records:
                    doc = json.loads(rec.value)
                    close = doc["window"]["end_epoch"] + _LATENESS_S
                    lags.append(rec.timestamp / 1000 - close)
                    released[0] += 1
    finally:
        await consumer.stop()


async def _sample(
    proc: subprocess.Popen, port: int, every: float, until: float, lags: list[float], out: _Series
) -> None:
    """Every `every` s: RSS, mean lag of the releases since the last sample, mean ledger call (ms)."""
    t0 = time.monotonic()
    last_sum, last_count = await asyncio.to_thread(_ledger_totals, port)
    seen = 0
    while time.monotonic() < until and proc.poll() is None:
        await asyncio.sleep(every)
        t = time.monotonic() - t0
        out.rss_mb.append((t, _rss_mb(proc.pid)))
        new = lags[seen:]
        seen = len(lags)
        if new:
            out.lag_s.append((t, sum(new) / len(new)))
        try:
            s, c = await asyncio.to_thread(_ledger_totals, port)
        except OSError:
            continue
        if c > last_count:
            out.ledger_ms.append((t, (s - last_sum) / (c - last_count) * 1000))
        last_sum, last_count = s, c


def _fit(name: str, unit: str, points: list[tuple[float, float]], warmup: float) -> dict[str, Any]:
    kept = [(t, y) for t, y in points if t >= warmup and math.isfinite(y)]
    per_s, mean = slope(kept)
    per_h = per_s * 3600
    pct = per_h / mean * 100 if mean and math.isfinite(per_h) else math.nan
    return {
        f"{name}_mean_{unit}": round(mean, 4),
        f"{name}_slope_{unit}_per_h": round(per_h, 4),
        f"{name}_slope_pct_of_mean_per_h": round(pct, 2),
        f"{name}_samples": len(kept),
    }


def _measure(bootstrap: str, redis_url: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from dpstream.topology.loader import load_topology
    from dpstream.workers.localstack import free_port
    from dpstream.workers.runtime.topics import ensure_topics

    prefix = f"soak-{uuid.uuid4().hex[:8]}"
    path = workdir / "soak.yaml"
    start = int(time.time()) // _WINDOW_S * _WINDOW_S + _WINDOW_S
    path.write_text(_TOPOLOGY.format(prefix=prefix, window=_WINDOW_S, lateness=_LATENESS_S, start=start))
    topology = load_topology(path)
    ensure_topics(bootstrap, topology)
    port = free_port()
    log_path = workdir / "worker.log"
    argv = [sys.executable, "-m", "dpstream.workers.cli", "worker", str(path), "--bootstrap", bootstrap]
    argv += ["--redis", redis_url, "--worker-id", "soak", "--web-port", str(port), "--loglevel", "INFO"]
    argv += ["--curator-metrics"]  # the ledger call durations it reads are curator-only
    proc = subprocess.Popen(argv, stdout=log_path.open("wb"), stderr=subprocess.STDOUT)
    series = _Series()
    sent, released = [0], [0]
    lags: list[float] = []
    try:
        wait_ready(proc, log_path, 180, "bench soak")
        duration = args.minutes * 60

        async def main() -> None:
            until = time.monotonic() + duration
            await asyncio.gather(
                _produce(bootstrap, topology.sources["clicks"].topic, args.rate, until, sent),
                _follow(bootstrap, topology.sinks.releases, until + 2 * _WINDOW_S, lags, released),
                _sample(proc, port, args.every, until, lags, series),
            )

        asyncio.run(main())
        alive = proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    warmup = args.warmup if args.warmup is not None else 0.1 * duration
    result: dict[str, Any] = {
        "minutes": args.minutes,
        "rate_per_s": args.rate,
        "events_sent": sent[0],
        "releases": released[0],
        "worker_alive_at_end": alive,
        "warmup_s": warmup,
    }
    (workdir / "series.json").write_text(
        json.dumps({"rss_mb": series.rss_mb, "lag_s": series.lag_s, "ledger_ms": series.ledger_ms})
    )
    rss_values = [y for _t, y in series.rss_mb]
    if rss_values:
        result["rss_first_last_max_mb"] = [round(rss_values[0], 1), round(rss_values[-1], 1), round(max(rss_values), 1)]
    result |= _fit("rss", "mb", series.rss_mb, warmup)
    result |= _fit("release_lag", "s", series.lag_s, warmup)
    result |= _fit("ledger_call", "ms", series.ledger_ms, warmup)
    ordered = sorted(lags)
    result["release_lag_p99_s"] = round(ordered[int(0.99 * (len(ordered) - 1))], 3) if ordered else None
    drift = abs(result["rss_slope_pct_of_mean_per_h"])
    result["rss_flat_within_5pct_per_h"] = bool(alive and math.isfinite(drift) and drift <= _RSS_LIMIT_PCT_PER_H)
    return result


def run(args: argparse.Namespace) -> int:
    """Run the soak and print the figures; exit 1 unless RSS stayed flat within 5 % per hour."""
    from dpstream.topology.errors import ConfigError

    for name in ("minutes", "rate", "every"):
        value = getattr(args, name)
        if not math.isfinite(value) or value <= 0:
            raise ConfigError(f"--{name} {value:g}: give a number > 0")
    workdir = Path(tempfile.mkdtemp(prefix="dpstream-bench-soak-"))
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
    result["workdir"] = str(workdir)
    result["series"] = str(workdir / "series.json")
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        width = max(len(k) for k in result)
        for key, value in result.items():
            print(f"{key:<{width}}  {value}")
    return 0 if result["rss_flat_within_5pct_per_h"] else 1
