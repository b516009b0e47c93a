"""The Kafka-free pipeline core: parse, bound, window and partially aggregate events per partition,
then merge partials per metric window on the release side."""

from dpstream.workers.pipeline.accumulator import MetricAccumulator
from dpstream.workers.pipeline.counters import EventCounts
from dpstream.workers.pipeline.events import REASONS, DeadLetter, Event, EventParser
from dpstream.workers.pipeline.merger import MergedWindow, PartialMerger, merge_values
from dpstream.workers.pipeline.partials import WindowPartial
from dpstream.workers.pipeline.partition import BatchOutput, PartitionPipeline, RecordLike

__all__ = [
    "REASONS",
    "BatchOutput",
    "DeadLetter",
    "Event",
    "EventCounts",
    "EventParser",
    "MergedWindow",
    "MetricAccumulator",
    "PartialMerger",
    "PartitionPipeline",
    "RecordLike",
    "WindowPartial",
    "merge_values",
]
