"""The one place the runtime calls the Kafka-free pipeline core (workers.pipeline, workers.release).

The runtime only moves bytes between Kafka and the core: records in, dead letters and window
partials out, a safe offset to commit. Keeping the calls here keeps the runtime thin wiring.
"""

from __future__ import annotations

__all__ = ["PartitionCore", "ProcessorOutput", "new_partition_core"]

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from topology.model import Source, Topology


@dataclass(frozen=True)
class ProcessorOutput:
    """What one batch (or one idle advance) of a partition produced, ready to send."""

    dead_letters: list[bytes] = field(default_factory=list)
    """Dead-letter topic values (JSON: reason, source, topic, partition, offset, raw_b64)."""
    partials: list[tuple[str, bytes]] = field(default_factory=list)
    """(metric, WindowPartial bytes) for windows final on this partition, keyed by metric on the topic."""


class PartitionCore(Protocol):
    """The per-source-partition processor of the core, as the runtime uses it."""

    def process(self, records: Sequence[Any]) -> ProcessorOutput:
        """Feed one fetched batch (aiokafka ConsumerRecords of this partition, in offset order)."""

    def advance_idle(self, now: float) -> ProcessorOutput:
        """Advance the watermark by wall clock when the partition has been idle past idle_timeout."""

    def safe_offset(self) -> int | None:
        """The offset to commit (next to read); never past the first event of a window not yet emitted."""


def new_partition_core(topology: Topology, source: Source, topic: str, partition: int) -> PartitionCore:
    """A fresh processor for one source partition (state rebuilt by replay from the committed offset)."""
    from workers.runtime._core_adapter import make_partition_core

    return make_partition_core(topology, source, topic, partition)
