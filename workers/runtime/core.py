"""The one place the runtime turns the Kafka-free pipeline core's output into bytes to send.

The runtime only moves bytes between Kafka and the core (`workers.pipeline.PartitionPipeline`):
records in, dead letters and window partials out, a safe offset and its metadata to commit.
"""

from __future__ import annotations

__all__ = ["ProcessorOutput", "to_output"]

from dataclasses import dataclass, field

from dpstream.workers.pipeline.partition import BatchOutput


@dataclass(frozen=True)
class ProcessorOutput:
    """What one batch (or one close) of a partition produced, ready to send."""

    dead_letters: list[bytes] = field(default_factory=list)
    """Dead-letter topic values (JSON: reason, source, topic, partition, offset, raw_b64)."""
    partials: list[tuple[str, bytes]] = field(default_factory=list)
    """(metric, WindowPartial bytes) for windows closed on this partition, keyed by metric on the topic."""
    counted: list[bytes] = field(default_factory=list)
    """Period-state deltas (`max_windows`, `max_per_period`) of the windows closed (`runtime.window_counts`)."""


def to_output(batch: BatchOutput) -> ProcessorOutput:
    """Serialise a batch's dead letters, partials and count deltas."""
    return ProcessorOutput(
        dead_letters=[d.to_bytes() for d in batch.dead_letters],
        partials=[(p.metric, p.to_bytes()) for p in batch.partials],
        counted=[d.to_bytes() for d in batch.counted],
    )
