"""`WindowPartial`: one source partition's final aggregate of one metric window, as JSON bytes.

Every partition sends one partial per scheduled window, empty or not. Partials go to the internal
partials topic keyed by metric; the release side merges the partials of every source partition
(`workers.pipeline.merger`). They hold true (un-noised) aggregates and
never leave the deployment.
"""

from __future__ import annotations

__all__ = ["WindowPartial"]

import json
from dataclasses import dataclass
from typing import Any

from dpstream.topology.errors import InternalError


@dataclass(frozen=True)
class WindowPartial:
    """The final partial of (metric, window) on one source partition; `values` as in the accumulator."""

    metric: str
    start: int
    end: int
    source: str
    topic: str
    partition: int
    values: dict[str, Any]
    partitions: int = 1
    """How many partitions the source topic had when this partition's worker started (the merger
    refuses partials whose count differs from the one it expects: units would be split)."""

    @property
    def key(self) -> bytes:
        """Kafka key on the partials topic: the metric, so one release owner sees all its partials."""
        return self.metric.encode()

    def to_bytes(self) -> bytes:
        """Compact JSON (floats round-trip exactly)."""
        doc = {
            "metric": self.metric,
            "start": self.start,
            "end": self.end,
            "source": self.source,
            "topic": self.topic,
            "partition": self.partition,
            "values": self.values,
            "partitions": self.partitions,
        }
        return json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> WindowPartial:
        """Inverse of `to_bytes`; a malformed partial is a bug (only dpstream writes the topic)."""
        try:
            doc = json.loads(raw)
            return cls(
                metric=str(doc["metric"]),
                start=int(doc["start"]),
                end=int(doc["end"]),
                source=str(doc["source"]),
                topic=str(doc["topic"]),
                partition=int(doc["partition"]),
                values=dict(doc["values"]),
                partitions=int(doc.get("partitions", 1)),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise InternalError(f"malformed window partial on the partials topic: {exc}") from exc
