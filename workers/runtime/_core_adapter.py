"""Adapters from the core's classes to the runtime's calls (the only module naming core internals)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from topology.model import Source, Topology
from workers.pipeline.partition import BatchOutput, PartitionPipeline
from workers.runtime.core import ProcessorOutput


def _out(batch: BatchOutput) -> ProcessorOutput:
    return ProcessorOutput(
        dead_letters=[d.to_bytes() for d in batch.dead_letters],
        partials=[(p.metric, p.to_bytes()) for p in batch.partials],
    )


class _PipelineCore:
    """PartitionPipeline behind the runtime's PartitionCore protocol."""

    def __init__(self, pipeline: PartitionPipeline) -> None:
        self._pipeline = pipeline

    def process(self, records: Sequence[Any]) -> ProcessorOutput:
        return _out(self._pipeline.process_batch(records, now=time.time()))

    def advance_idle(self, now: float) -> ProcessorOutput:
        return _out(self._pipeline.advance_idle(now))

    def safe_offset(self) -> int | None:
        return self._pipeline.safe_offset()

    @property
    def pipeline(self) -> PartitionPipeline:
        return self._pipeline


def make_partition_core(topology: Topology, source: Source, topic: str, partition: int) -> _PipelineCore:
    return _PipelineCore(PartitionPipeline(topology, source.name, partition, topic=topic, started_at=time.time()))


