"""A small labelled histogram kept in process and exposed through a custom Collector.

prometheus_client's own `Histogram` would do, but it registers into a registry at creation and adds
`_created` series; these histograms are owned by the object that observes (the release side, the
ledger timing proxy), live as long as it does, and are rendered by the worker collector alongside
the figures it reads at scrape time. Observations are a bisect and two additions (no lock: the
observer and the scrape run on the same event loop).
"""

from __future__ import annotations

__all__ = ["LabelledHistogram", "LATENCY_BUCKETS", "LEDGER_BUCKETS"]

import bisect
import math
from collections.abc import Iterable, Sequence

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.utils import floatToGoString

LATENCY_BUCKETS: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    900.0,
)
"""Close → publish, seconds: a healthy release takes tens of ms; a stuck one minutes."""

LEDGER_BUCKETS: tuple[float, ...] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
"""One ledger round trip, seconds: sub-millisecond on a local Redis, the client's 5 s timeout at worst."""


class LabelledHistogram:
    """Cumulative bucket counts and a sum per value of one label; every declared label value is
    present from the start (zero series), so dashboards and rules see the series before the first event."""

    def __init__(self, label: str, values: Iterable[str], buckets: Sequence[float]) -> None:
        if list(buckets) != sorted(buckets) or not buckets:
            raise ValueError("histogram buckets must be a non-empty increasing sequence")
        self.label = label
        self.bounds = tuple(float(b) for b in buckets)
        self._counts: dict[str, list[int]] = {}
        self._sums: dict[str, float] = {}
        for value in values:
            self._series(value)

    def _series(self, value: str) -> list[int]:
        counts = self._counts.get(value)
        if counts is None:
            counts = self._counts[value] = [0] * (len(self.bounds) + 1)
            self._sums[value] = 0.0
        return counts

    def observe(self, value: str, amount: float) -> None:
        """Count one observation of `amount` (seconds) for label value `value`."""
        if not math.isfinite(amount):
            return
        counts = self._series(value)
        counts[bisect.bisect_left(self.bounds, amount)] += 1
        self._sums[value] += amount

    def count(self, value: str) -> int:
        """Observations so far of one label value."""
        return sum(self._counts.get(value, ()))

    def family(self, name: str, documentation: str) -> HistogramMetricFamily:
        """The metric family: cumulative `le` buckets, +Inf, sum and count per label value."""
        fam = HistogramMetricFamily(name, documentation, labels=[self.label])
        for value in sorted(self._counts):
            counts = self._counts[value]
            running = 0
            buckets: list[tuple[str, float]] = []
            for bound, n in zip(self.bounds, counts[:-1], strict=True):
                running += n
                buckets.append((floatToGoString(bound), running))
            buckets.append(("+Inf", running + counts[-1]))
            fam.add_metric([value], buckets, self._sums[value])
        return fam
