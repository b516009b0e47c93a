"""Read-only readers of a live deployment: a topic up to its end offsets, and the ledger's release records.

Nothing here writes: the topic is read without a consumer group (no offsets committed), and the
ledger is read with plain `HMGET` / `GET` on the keys `dpstream.workers.ledger.keys` names (the
ledger's scripts stay its only writers). `Ledger.version_schedule_start` is not used because it records
a start when none exists; `read_version_schedule_start` only reads.
"""

from __future__ import annotations

__all__ = [
    "TopicRecord",
    "LedgerRelease",
    "read_topic",
    "read_releases",
    "read_version_schedule_start",
    "RELEASE_STATES",
]

import asyncio
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from dpstream.topology.errors import ConfigError
from dpstream.workers.ledger.errors import LedgerUnavailable
from dpstream.workers.ledger.keys import ScopeKeys, version_schedule_start_key
from dpstream.workers.runtime.admin import client_options
from dpstream.workers.runtime.kafka_security import KafkaSecurity
from dpstream.workers.runtime.topics import partition_count

RELEASE_STATES = ("charged", "published")
"""The states of a release record (charged: not yet committed after publishing; then published)."""

_STORED_STATES = {"reserved": "charged"}
"""Stored state tokens read under their name here: the charge scripts store a charged release's
state as `reserved` (kept, so every existing ledger reads the same); `_state` maps it on read."""

_FETCH_BYTES = 64 * 1024 * 1024
_CHUNK = 500


@dataclass(frozen=True)
class TopicRecord:
    """One record of a topic, as read."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int

    @property
    def where(self) -> str:
        """`partition P offset O`."""
        return f"partition {self.partition} offset {self.offset}"


@dataclass(frozen=True)
class LedgerRelease:
    """A release record of the ledger (`dpstream:{scope}:release:<id>`), as stored."""

    scope: str
    release_id: str
    state: str
    payload: bytes | None
    metric: str
    window_start: int | None
    window_end: int | None
    charged_at_ms: int | None = None
    """When the charge was made (the worker's clock, ms), as the charge script stored it."""


async def read_topic(
    bootstrap: str,
    topic: str,
    timeout_s: float = 120.0,
    security: KafkaSecurity | None = None,
    since_ms: int | None = None,
) -> list[TopicRecord]:
    """Every record of `topic` from the beginning up to its end offsets as of the call (a snapshot,
    so a busy topic ends too), in partition then offset order. No consumer group, nothing committed.
    With `since_ms`, each partition is read from the broker's time index at `since_ms` instead: every
    record before that offset has a timestamp earlier than `since_ms` (later ones may be too).

    A missing topic is a ConfigError; an unreachable broker a ConfigError naming it.
    """
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.errors import KafkaError

    options = client_options(security)  # TLS/SASL as the workers' (None: the DPSTREAM_KAFKA_* environment)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=_FETCH_BYTES,
        fetch_max_bytes=_FETCH_BYTES,
        request_timeout_ms=30_000,
        **options,
    )
    try:
        try:
            await consumer.start()
            partitions = await partition_count(bootstrap, topic, security)
        except (KafkaError, OSError) as exc:
            protocol = options.get("security_protocol", "PLAINTEXT")
            raise ConfigError(
                f"Kafka at {bootstrap} over {protocol}: cannot read ({type(exc).__name__}); check the address "
                "(--bootstrap, else $DPSTREAM_KAFKA, else the topology's kafka.bootstrap), that the broker runs, "
                f"and that {protocol} is its listener's protocol (DPSTREAM_KAFKA_SECURITY_PROTOCOL and the "
                "DPSTREAM_KAFKA_SASL_*/SSL_* variables, or the topology's kafka.security_protocol)"
            ) from None
        if partitions == 0:
            raise ConfigError(
                f"topic {topic!r} does not exist on {bootstrap}: check the topology's sinks "
                "(or --compare-to) and --bootstrap"
            )
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        await consumer.seek_to_beginning(*tps)
        if since_ms is not None:
            found = await consumer.offsets_for_times({tp: since_ms for tp in tps})
            for tp in tps:
                at = found.get(tp)
                consumer.seek(tp, at.offset if at is not None else ends[tp])  # None: no record that late
        out: dict[int, list[TopicRecord]] = {tp.partition: [] for tp in tps}
        deadline = time.monotonic() + timeout_s
        todo = {tp for tp in tps if await consumer.position(tp) < ends[tp]}
        while todo:
            if time.monotonic() > deadline:
                missing = ", ".join(str(tp.partition) for tp in sorted(todo, key=lambda t: t.partition))
                raise ConfigError(
                    f"topic {topic!r}: partitions {missing} not read to their end within "
                    f"{timeout_s:.0f} s; is the broker healthy?"
                )
            batches = await consumer.getmany(*todo, timeout_ms=500)
            for tp, records in batches.items():
                for r in records:
                    if r.offset < ends[tp]:
                        out[tp.partition].append(
                            TopicRecord(tp.partition, r.offset, r.key, r.value, int(r.timestamp or 0))
                        )
            for tp in list(todo):
                if await consumer.position(tp) >= ends[tp]:
                    todo.discard(tp)
        return [rec for p in sorted(out) for rec in out[p]]
    finally:
        await consumer.stop()


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _int_or_none(value: Any) -> int | None:
    try:
        return int(_s(value))
    except (TypeError, ValueError):
        return None


def _state(stored: str) -> str:
    """A release record's state as verify names it (`reserved` as stored reads `charged`)."""
    return _STORED_STATES.get(stored, stored)


async def read_releases(client: Any, wanted: Iterable[tuple[str, str]]) -> dict[tuple[str, str], LedgerRelease]:
    """The ledger's release records for (scope, release_id) pairs; absent ones are left out.

    `client` is a redis.asyncio client; pipelined in chunks, reads only.
    """
    from redis.exceptions import RedisError

    pairs = list(dict.fromkeys(wanted))
    found: dict[tuple[str, str], LedgerRelease] = {}
    for i in range(0, len(pairs), _CHUNK):
        chunk = pairs[i : i + _CHUNK]
        pipe = client.pipeline(transaction=False)
        for scope, rid in chunk:
            pipe.hmget(
                ScopeKeys(scope).release(rid), "state", "payload", "metric", "window_start", "window_end", "reserved_at"
            )  # `reserved_at`: the stored name of the charge time
        try:
            rows: Sequence[Sequence[Any]] = await pipe.execute()
        except (RedisError, OSError) as exc:
            raise LedgerUnavailable(f"ledger Redis unavailable while reading release records: {exc}") from exc
        for (scope, rid), row in zip(chunk, rows, strict=True):
            state, payload, metric, ws, we, charged_at = row
            if state is None and payload is None:
                continue
            found[(scope, rid)] = LedgerRelease(
                scope,
                rid,
                _state(_s(state)) if state is not None else "",
                bytes(payload) if payload is not None else None,
                _s(metric) if metric is not None else "",
                _int_or_none(ws),
                _int_or_none(we),
                _int_or_none(charged_at),
            )
        await asyncio.sleep(0)
    return found


async def read_version_schedule_start(client: Any, topology_version: str) -> int | None:
    """The start S the ledger recorded for this topology version (None if no worker recorded one).

    Read only: unlike `Ledger.version_schedule_start`, nothing is set when it is absent.
    """
    from redis.exceptions import RedisError

    try:
        raw = await client.get(version_schedule_start_key(topology_version))
    except (RedisError, OSError) as exc:
        raise LedgerUnavailable(f"ledger Redis unavailable while reading the schedule start: {exc}") from exc
    return _int_or_none(raw) if raw is not None else None
