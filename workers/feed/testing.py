"""Helpers for tests of the feed: a release record of the canonical shape, and producing records to
a releases topic stamped with their P(w) as the release agent does. Not used by the worker."""

from __future__ import annotations

__all__ = ["produce_releases", "release_record"]

from typing import Any

from dpstream.workers.release.record import canonical_bytes, iso_utc


def release_record(
    metric: str,
    window_start: int,
    size_s: int,
    values: dict[str, float],
    *,
    half_width: Any = 1.5,
    ratio_after: float = 0.25,
    scope: str = "b",
    publish_delay_s: int = 5,
) -> dict[str, Any]:
    """A release record with the fields the feed reads (values, CI, window, budget, published_at)."""
    end = window_start + size_s
    return {
        "release_id": f"{metric}:{window_start}",
        "metric": metric,
        "aggregate": "count",
        "values": values,
        "ci": {"level": 0.95, "half_width": half_width},
        "noise": {"stddev": 1.0},
        "window": {
            "start": iso_utc(window_start),
            "end": iso_utc(end),
            "start_epoch": window_start,
            "end_epoch": end,
            "kind": "tumbling",
        },
        "budget": {"scope": scope, "period": "p", "ratio_after": ratio_after},
        "published_at": iso_utc(end + publish_delay_s),
    }


async def produce_releases(bootstrap: str, topic: str, records: list[dict[str, Any] | bytes]) -> None:
    """Send each record (a dict as its canonical bytes, or bytes as they are), keyed by release_id and
    stamped with its P(w), in order, to partition 0 then round the topic's partitions."""
    from aiokafka import AIOKafkaProducer

    from dpstream.workers.feed.dedupe import parse_record
    from dpstream.workers.feed.latest import published_epoch

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        partitions = sorted(await producer.partitions_for(topic))
        for i, item in enumerate(records):
            payload = canonical_bytes(item) if isinstance(item, dict) else item
            record = parse_record(payload) or {}
            at = published_epoch(record)
            key = str(record.get("release_id", "")).encode()
            await producer.send_and_wait(
                topic,
                payload,
                key=key,
                partition=partitions[i % len(partitions)],
                timestamp_ms=None if at is None else at * 1000,
            )
    finally:
        await producer.stop()
