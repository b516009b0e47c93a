"""Info gauges of one process, from its topology alone (data-independent, served by workers and the exporter).

    dpstream_build_info{version,topology_version}                       1
    dpstream_metric_privacy_info{metric,scope,source,privacy_unit,guarantee}  1 per metric of the topology

`guarantee` is `topology.model.guarantee_label`: `event-level (weaker)` for a metric whose source has
`privacy_unit: event` (event-level DP protects single events, not people), `unit-level` otherwise, so
a dashboard or a rule can label or join event-level figures (`* on (metric) group_left(guarantee) …`).
"""

from __future__ import annotations

__all__ = ["TopologyInfo", "build_version"]

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dpstream.topology.model import EVENT_LEVEL_LABEL, UNIT_LEVEL_LABEL, Topology, guarantee_label


def build_version() -> str:
    """The installed dpstream version ("unknown" when not installed as a distribution)."""
    try:
        from importlib.metadata import version

        return version("dpstream")
    except Exception:  # metadata missing in an uninstalled checkout
        return "unknown"


class TopologyInfo(Collector):
    """`dpstream_build_info` and `dpstream_metric_privacy_info` of one topology (fixed at start)."""

    def __init__(self, topology: Topology) -> None:
        self._build = [build_version(), topology.topology_version]
        self._metrics = []
        for name, m in sorted(topology.metrics.items()):
            source = topology.sources[m.source]
            self._metrics.append([name, m.budget, m.source, source.privacy_unit, guarantee_label(source.event_level)])

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
            f"('{EVENT_LEVEL_LABEL}' for privacy_unit: event, else '{UNIT_LEVEL_LABEL}'); always 1.",
            labels=["metric", "scope", "source", "privacy_unit", "guarantee"],
        )
        for labels in self._metrics:
            privacy.add_metric(labels, 1.0)
        yield privacy
