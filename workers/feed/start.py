"""Where reading the releases topic starts: a metric's first window of its current budget period.

`dpstream tail` shows, by default, each metric's releases from the first window of its scope's
current period (so a user sees today's feed at once); the exporter reads one period further back,
so that just after a period starts the previous release is still the latest. The window grid is the
topology's public schedule (`topology.schedule.Schedule`, S applied), never recomputed here.
"""

from __future__ import annotations

__all__ = ["feed_starts", "period_first_window", "seek_time"]

from collections.abc import Iterable, Mapping

from dpstream.topology.model import Metric, Topology
from dpstream.topology.periods import period_start
from dpstream.topology.schedule import Schedule


def period_first_window(topology: Topology, metric: Metric, now: float, periods_back: int = 0) -> int:
    """The start of `metric`'s first scheduled window in its scope's period holding `now`
    (`periods_back` periods earlier), not before the schedule start S."""
    period_s = topology.budgets[metric.budget].period_s
    since = period_start(period_s, now) - periods_back * period_s
    return next(Schedule.of(metric, topology.schedule_start).starts(since=since))


def feed_starts(
    topology: Topology, names: Iterable[str], now: float, *, since: int | None = None, periods_back: int = 0
) -> dict[str, int]:
    """metric → the first window start to show: `since` for every metric when given, else the first
    window of its current period (`periods_back` periods earlier)."""
    metrics = [topology.metrics[n] for n in names]
    if since is not None:
        return {m.name: int(since) for m in metrics}
    return {m.name: period_first_window(topology, m, now, periods_back) for m in metrics}


def seek_time(starts: Mapping[str, int]) -> int:
    """The topic time to read from: the earliest first window start (a record's timestamp is its
    P(w), after its window's end, so no record of a window shown is before it)."""
    return min(starts.values(), default=0)
