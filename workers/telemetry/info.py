"""Info gauges of one process, from its topology alone (data-independent, served by workers and the exporter).

    dpstream_build_info{version,topology_version}                       1
    dpstream_metric_privacy_info{metric,scope,source,privacy_unit,guarantee}  1 per metric of the topology

`guarantee` is `topology.model.EVENT_LEVEL_LABEL` for a metric whose source has `privacy_unit: event`
(event-level DP protects single events, not people) and `unit-level` otherwise, so a dashboard or a
rule can label or join event-level figures (`* on (metric) group_left(guarantee) …`).
"""

from __future__ import annotations

__all__ = ["TopologyInfo", "UNIT_LEVEL", "build_version", "guarantee_of"]

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dpstream.topology.model import EVENT_LEVEL_LABEL, Source, Topology

UNIT_LEVEL = "unit-level"
"""The `guarantee` of a metric that protects every event of one privacy unit (the default model)."""


def build_version() -> str:
    """The installed dpstream version ("unknown" when not installed as a distribution)."""
    try:
        from importlib.metadata import version

        return version("dpstream")
    except Exception:  # metadata missing in an uninstalled checkout
        return "unknown"


def guarantee_of(source: Source) -> str:
    """The `guarantee` label of a source's metrics: the event-level label, or `unit-level`."""
    return EVENT_LEVEL_LABEL if source.event_level else UNIT_LEVEL


class TopologyInfo(Collector):
    """`dpstream_build_info` and `dpstream_metric_privacy_info` of one topology (fixed at start)."""

    def __init__(self, topology: Topology) -> None:
        self._build = [build_version(), topology.topology_version]
        self._metrics = []
        for name, m in sorted(topology.metrics.items()):
            source = topology.sources[m.source]
            self._metrics.append([name, m.budget, m.source, source.privacy_unit, guarantee_of(source)])

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "dpstream_build_info",
            "dpstream version and the topology version this process runs (always 1).",
            labels=["version", "topology_version"],
        )
        info.add_metric(self._build, 1.0)
        yield info
        privacy = GaugeMetricFamily(
            "dpstream_metric_privacy_info",
            "Each metric's budget scope, source, privacy unit and guarantee "
            f"('{EVENT_LEVEL_LABEL}' for privacy_unit: event, else '{UNIT_LEVEL}'); always 1.",
            labels=["metric", "scope", "source", "privacy_unit", "guarantee"],
        )
        for labels in self._metrics:
            privacy.add_metric(labels, 1.0)
        yield privacy
