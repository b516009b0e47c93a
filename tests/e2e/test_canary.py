"""Canary through a real worker and exporter with keyed unit hashing on (DESIGN §1 "Trust boundary").

A deployment whose source is not keyed by its unit (so the repartition hop runs) and hashes unit ids
(`privacy_unit_hash: hmac-sha256`) gets a few hundred events of 24 units and a canary: a unique unit id,
a unique data-derived key (`canary-key-<uuid>`, one unit's only: partition selection keeps it out of
the releases but with probability below the selection δ), a unique raw value (987654.321) and a window
whose true sum is a unique number (988888.821: the canary's two amounts, nobody else's), plus two bad
canary events (one the hop dead-letters, one the ingest does). Then:

- no raw unit id (canary or not) is in any topic but the source topic and the dead-letter payload: the
  by-unit hop topic, the partials topic, the release agent's changelog, the releases topic;
- the dead-letter topic's keys, headers and fields other than the raw payload hold no canary string;
- the releases topic, the ledger (every Redis key and value), the worker's and the exporter's logs
  (INFO), /metrics and /health hold no canary string: unit id, key, raw value, true sum (decimal or in
  integer grid units), nor any other raw unit id;
- bounding is unchanged by hashing: the worker's merged partials equal, window by window, the same
  events through the ingest hot path in-process without hashing (same append times, same per-unit order).
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from dpstream.topology.loader import load_topology, load_topology_text
from dpstream.topology.schedule import Schedule
from dpstream.workers.localstack import free_port
from dpstream.workers.pipeline.fixed_point import to_units, value_exponent
from dpstream.workers.pipeline.partition import PartitionPipeline
from dpstream.workers.pipeline.unit_ids import UNIT_HMAC_KEY_ENV
from dpstream.workers.runtime.topics import ensure_topics, topic_names
from tests.e2e.harness import poll, releases

pytestmark = pytest.mark.e2e

WINDOW = 2
WINDOWS = 4
UNITS = 24
SECRET = "canary-test-secret-" + uuid.uuid4().hex
HASH_LINE = "    privacy_unit_hash: hmac-sha256\n"

TOPOLOGY = """\
version: 1
start: {start}
sources:
  clicks:
    topic: {prefix}.clicks
    privacy_unit: user_id
    timestamp: ts
    allowed_lateness: 1s
{hash_line}budgets:
  b: {{epsilon: 1.0, delta: 1.0e-6, accounting: zcdp, period: 1d}}
metrics:
  views:
    source: clicks
    budget: b
    window: {{tumbling: 2s}}
    aggregate: count
    group_by: page
    keys: [home, cart]
    contribution: {{max_keys: 2, max_per_key: 3}}
    mechanism: gaussian
  refs:                      # keys from the data: partition selection
    source: clicks
    budget: b
    window: {{tumbling: 2s}}
    aggregate: count
    group_by: ref
    contribution: {{max_keys: 1, max_per_key: 1}}
    mechanism: gaussian
  spend:
    source: clicks
    budget: b
    window: {{tumbling: 2s}}
    aggregate: sum
    value: basket_eur
    bounds: [0, 1000000]
    contribution: {{max_per_key: 2}}
    mechanism: gaussian
  users:
    source: clicks
    budget: b
    window: {{tumbling: 2s}}
    aggregate: count_units
    mechanism: gaussian
sinks:
  releases: {prefix}.releases
  dead_letter: {prefix}.dlq
"""


@dataclass(frozen=True)
class Sent:
    """A produced record: where it landed and its broker append time."""

    partition: int
    offset: int
    key: bytes
    value: bytes
    timestamp: int


def _get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=15) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
    except OSError:
        return 0, b""


def _start(argv: list[str], log: Path, port: int, env: dict[str, str]) -> subprocess.Popen:
    """A `dpstream` subprocess (log at INFO), once its /health answers."""
    out = open(log, "ab")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        [sys.executable, "-m", "dpstream.workers.cli", *argv, "--loglevel", "INFO"],
        stdout=out,
        stderr=subprocess.STDOUT,
        env=env,
    )
    up = poll(lambda: proc.poll() is not None or _get(port, "/health")[0] == 200, timeout_s=90)
    assert up and proc.poll() is None, log.read_text(errors="replace")[-3000:]
    return proc


def _send(bootstrap: str, topic: str, events: list[tuple[bytes, bytes]]) -> list[Sent]:
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=5, max_in_flight_requests_per_connection=1
    )
    futures = [producer.send(topic, key=k, value=v) for k, v in events]
    producer.flush()
    producer.close()
    out = []
    for (k, v), f in zip(events, futures, strict=True):
        meta = f.get(timeout=60)
        out.append(Sent(meta.partition, meta.offset, k, v, meta.timestamp))
    return out


def _records(bootstrap: str, topic: str) -> list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]]:
    """Every record of `topic` up to its end offsets now: (key, value, headers)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        if not tps:
            return []
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        out: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]] = []
        deadline = time.monotonic() + 60
        while any(consumer.position(tp) < ends[tp] for tp in tps) and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                for m in batch:
                    if m.offset < ends[TopicPartition(m.topic, m.partition)]:
                        out.append((m.key, m.value, list(m.headers or [])))
        assert all(consumer.position(tp) >= ends[tp] for tp in tps), f"{topic}: not read to its end"
        return out
    finally:
        consumer.close()


def _all_topics(bootstrap: str) -> set[str]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        return set(consumer.topics())
    finally:
        consumer.close()


def _ledger_dump(url: str) -> bytes:
    """Every key of the ledger's Redis database with its value, whatever its type, as one blob."""
    client = redis.Redis.from_url(url)
    parts: list[bytes] = []
    for key in client.scan_iter(count=1000):
        kind = client.type(key).decode()
        parts.append(key)
        if kind == "string":
            parts.append(client.get(key) or b"")
        elif kind == "hash":
            parts += [b for kv in client.hgetall(key).items() for b in kv]
        elif kind == "list":
            parts += client.lrange(key, 0, -1)
        elif kind == "set":
            parts += list(client.smembers(key))
        elif kind == "zset":
            parts += [
                str(x).encode() if not isinstance(x, bytes) else x
                for pair in client.zrange(key, 0, -1, withscores=True)
                for x in pair
            ]
        elif kind == "stream":
            for entry_id, fields in client.xrange(key):
                parts.append(entry_id)
                parts += [b for kv in fields.items() for b in kv]
        else:
            raise AssertionError(f"ledger key of unexpected type {kind}")
    client.close()
    return b"\n".join(parts)


def _merge(partials: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    """(metric, window start) → merged true aggregate, each (metric, window, partition) once."""
    merged: dict[tuple[str, int], dict[str, Any]] = collections.defaultdict(dict)
    seen = set()
    for p in partials:
        if (p["metric"], p["start"], p["partition"]) in seen:
            continue
        seen.add((p["metric"], p["start"], p["partition"]))
        into = merged[(p["metric"], p["start"])]
        for key, v in p["values"].items():
            if isinstance(v, list):
                cur = into.setdefault(key, [0, 0])
                cur[0] += v[0]
                cur[1] += v[1]
            else:
                into[key] = into.get(key, 0) + v
    return merged


def test_canary_and_raw_unit_ids_appear_nowhere_they_must_not(
    tmp_path: Path, kafka_broker: Any, fresh_redis: Any
) -> None:
    """No raw unit id past the source (hashing on); no canary string in any public or operator-facing output."""
    tag = uuid.uuid4().hex
    canary_unit, canary_key = f"canary-unit-{tag}", f"canary-key-{tag}"
    raw_value, other_value = 987654.321, 1234.5
    units = [f"plain-{tag[:12]}-{i:02d}" for i in range(UNITS)]
    bootstrap = kafka_broker.bootstrap
    start = int(time.time()) // WINDOW * WINDOW
    prefix = f"canary-{tag[:10]}"
    folder = tmp_path / prefix
    folder.mkdir()
    path = folder / "topology.yaml"
    path.write_text(TOPOLOGY.format(start=start, prefix=prefix, hash_line=HASH_LINE))
    topology = load_topology(path)
    plain_topology = load_topology_text(TOPOLOGY.format(start=start, prefix=prefix, hash_line=""))
    ensure_topics(bootstrap, topology)
    source_topic = topology.sources["clicks"].topic
    env = {**os.environ, UNIT_HMAC_KEY_ENV: SECRET}
    procs: list[subprocess.Popen] = []
    try:
        worker_port, exporter_port = free_port(), free_port()
        worker_log, exporter_log = folder / "worker.log", folder / "exporter.log"
        common = ["--redis", fresh_redis.url]
        procs.append(
            _start(
                [
                    "worker",
                    str(path),
                    "--bootstrap",
                    bootstrap,
                    *common,
                    "--worker-id",
                    "w",
                    "--web-port",
                    str(worker_port),
                    "--curator-metrics",  # every series a worker can serve is checked for the canary
                ],
                worker_log,
                worker_port,
                env,
            )
        )
        procs.append(
            _start(
                ["exporter", "--topology", str(path), *common, "--port", str(exporter_port)],
                exporter_log,
                exporter_port,
                env,
            )
        )

        # events: units over WINDOWS windows from T0; the canary's amounts are the only ones in window T0 + 2·WINDOW
        t0 = (int(time.time()) // WINDOW + 2) * WINDOW
        canary_window = t0 + 2 * WINDOW
        events = _plain_events(t0, units, canary_window)
        events += _canary_events(canary_window, canary_unit, canary_key, (raw_value, other_value))
        bad_value = {"user_id": canary_unit, "ts": canary_window + 0.6, "ref": canary_key, "basket_eur": str(raw_value)}
        events.append((canary_unit.encode(), json.dumps(bad_value).encode()))  # the ingest dead-letters it
        events.append(
            (canary_unit.encode(), json.dumps({**bad_value, "basket_eur": raw_value}).encode()[:-1])
        )  # the hop
        sent = _send(bootstrap, source_topic, events)
        last = t0 + (WINDOWS - 1) * WINDOW

        def all_released() -> bool:
            got = {(r["metric"], r["window"]["start_epoch"]) for r in releases(bootstrap, topology.sinks.releases)}
            return all((m, last) in got for m in topology.metrics)

        assert poll(all_released, timeout_s=180, every_s=2), worker_log.read_text(errors="replace")[-3000:]
        time.sleep(1.0)  # let the logs flush what the last releases wrote

        # bounding is unchanged by hashing: the live partials equal a run without hashing, window by window
        partials = [v for _k, v, _h in _records(bootstrap, topology.sinks.partials_topic) if v]
        live = _merge([json.loads(v) for v in partials if v.startswith(b"{")])
        core = PartitionPipeline(plain_topology, "clicks", 0, schedule_start=start, topic=source_topic)
        order = sorted(sent, key=lambda s: (s.partition, s.offset))
        out = core.process_batch([_Rec(i, s.key, s.value, s.timestamp) for i, s in enumerate(order)])
        clean = _merge([json.loads(p.to_bytes()) for p in out.partials + core.close_through(last + WINDOW + 1)])
        windows = {
            (m.name, s)
            for m in topology.metrics.values()
            for s in range(Schedule.of(m, start).first_window(), last + 1, WINDOW)
        }
        assert windows <= set(live) and windows <= set(clean)
        mismatched = [(w, live[w], clean[w]) for w in sorted(windows) if live[w] != clean[w]]
        assert not mismatched, (mismatched, worker_log.read_text(errors="replace")[-6000:])
        bounds = topology.metrics["spend"].bounds
        assert bounds is not None
        spend_exp = value_exponent(bounds)
        true_sum_units = to_units(raw_value, spend_exp) + to_units(other_value, spend_exp)
        assert live[("spend", canary_window)][""] == true_sum_units  # the distinctive true sum was aggregated
        assert live[("refs", canary_window)].get(canary_key) == 1  # and the canary key counted

        # what must never show: raw unit ids past the source; canary strings in public or operator outputs
        raw_ids = [canary_unit, *units]
        canary = [canary_unit, canary_key, tag]
        numbers = [re.compile(rf"(?<![\d.]){re.escape(n)}") for n in ("987654.32", "988888.82")] + [
            re.compile(rf"(?<![\d.]){true_sum_units}(?![\d.])")
        ]
        """The raw value and the true sum (decimal prefixes, the grid integer whole) as numbers of their own,
        not digit runs inside others (a ledger timestamp in ms may hold any 9 digits)."""

        # the patterns find the true sum where it may be: in the partials (curator-side true aggregates)
        assert numbers[-1].search(b"\n".join(partials).decode())

        def clean_of(blob: bytes | str, strings: list[str], where: str, values: bool = True) -> None:
            _assert_clean(blob, strings, where, numbers if values else [])

        topics = {t for t in _all_topics(bootstrap) if not t.startswith("__")}
        dlq, rel = topology.sinks.dead_letter, topology.sinks.releases
        assert {dlq, rel, topology.sinks.partials_topic} <= topics
        assert set(topic_names(topology).all) <= topics  # the by-unit hop topic among them
        letters = sum(
            _topic_letters_clean(bootstrap, topic, dlq, rel, raw_ids, canary, clean_of)
            for topic in sorted(topics - {source_topic})
        )
        assert letters == 2, letters

        clean_of(_ledger_dump(fresh_redis.url), raw_ids + canary, "the ledger")
        for name, port in (("worker", worker_port), ("exporter", exporter_port)):
            for route in ("/metrics", "/health"):
                status, body = _get(port, route)
                assert status == 200, (name, route, body[:200])
                clean_of(body, raw_ids + canary, f"{name} {route}")
        for log in (worker_log, exporter_log):
            clean_of(log.read_bytes(), raw_ids + canary + [SECRET], log.name)
        # both dead letters are counted, the hop's too
        samples = {
            (s.name, s.labels.get("reason")): s.value
            for fam in text_string_to_metric_families(_get(worker_port, "/metrics")[1].decode())
            for s in fam.samples
            if s.name == "dpstream_dead_letters_total" and s.labels.get("source") == "clicks"
        }
        assert samples[("dpstream_dead_letters_total", "not_json")] == 1, samples
        assert samples[("dpstream_dead_letters_total", "bad_value")] == 1, samples
        assert procs[0].poll() is None and "Traceback" not in worker_log.read_text(errors="replace")
    finally:
        _stop(procs)


def _plain_events(t0: int, units: list[str], canary_window: int) -> list[tuple[bytes, bytes]]:
    """Three events per unit and window over WINDOWS windows from `t0`; no amounts in the canary's window."""
    events: list[tuple[bytes, bytes]] = []
    for w in range(WINDOWS):
        ws = t0 + w * WINDOW
        for i, unit in enumerate(units):
            for j in range(3):
                doc: dict[str, Any] = {
                    "user_id": unit,
                    "ts": ws + 0.1 + 0.3 * j,
                    "page": ("home", "cart")[(i + j) % 2],
                }
                doc["ref"] = f"r{(i + w) % 3}"
                if ws != canary_window:
                    doc["basket_eur"] = 10 + i + j
                events.append((unit.encode(), json.dumps(doc).encode()))
    return events


def _canary_events(
    canary_window: int, canary_unit: str, canary_key: str, amounts: tuple[float, ...]
) -> list[tuple[bytes, bytes]]:
    """The canary unit's events: one per amount, in its window, under the canary key."""
    events: list[tuple[bytes, bytes]] = []
    for amount in amounts:
        doc = {
            "user_id": canary_unit,
            "ts": canary_window + 0.5,
            "page": "home",
            "ref": canary_key,
            "basket_eur": amount,
        }
        events.append((canary_unit.encode(), json.dumps(doc).encode()))
    return events


def _assert_clean(blob: bytes | str, strings: list[str], where: str, numbers: list[re.Pattern[str]]) -> None:
    """None of `strings` in `blob`, and no match of `numbers`."""
    text = blob.decode("utf-8", "replace") if isinstance(blob, bytes) else blob
    for s in strings:
        assert s not in text, f"{s!r} in {where}"
    for pattern in numbers:
        assert not pattern.search(text), f"{pattern.pattern} in {where}"


def _topic_letters_clean(
    bootstrap: str,
    topic: str,
    dlq: str,
    rel: str,
    raw_ids: list[str],
    canary: list[str],
    clean_of: Callable[..., None],
) -> int:
    """Every record of `topic` checked (keys and headers: no raw id or canary string; dead letters: none
    outside the raw payload; releases: none; internal topics: no raw id); the number of dead letters."""
    letters = 0
    for key, value, headers in _records(bootstrap, topic):
        where = f"topic {topic}"
        clean_of(key or b"", raw_ids + canary, f"a key of {where}")
        for name, hv in headers:
            clean_of(name.encode() + b"=" + hv, raw_ids + canary, f"a header of {where}")
        if topic == dlq:  # only the raw payload may hold the event
            letter = json.loads(value or b"{}")
            letter.pop("raw_b64", None)
            letters += 1
            clean_of(json.dumps(letter), raw_ids + canary, f"a dead letter's metadata in {where}")
        elif topic == rel:
            clean_of(value or b"", raw_ids + canary, where)
        else:  # internal topics (hop, partials, changelogs) hold true aggregates and keys, never raw ids
            clean_of(value or b"", raw_ids, where, values=False)
    return letters


def _stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM every process still running, then wait for each (killed after 20 s)."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass(frozen=True)
class _Rec:
    """A sent record as `PartitionPipeline` reads it (renumbered: one in-process partition)."""

    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int | None
