"""Which audience may see each metric: the one table that classes every metric name served on `/metrics`.

Two classes (the README's metrics table names the class of each metric, and a test holds it to this table):

- **data-independent**: a function of the topology, the clock, operator actions taken on public
  information and the releases as of their publish time P(w) (budget and breaker state, the plan,
  the schedule, the noise σ of a published record), or of the process's own health (build, ledger
  reachable). Safe for a wide dashboard audience.
- **curator-only**: everything else: events and dead letters by outcome, events a metric skipped
  by reason, capped and clamped counts, release outcomes, retries, parks and sweeps, latency and
  lag, windows pending, parked windows, ledger call durations and errors. Exact whole-source or
  whole-stream figures: served only where the operator asks (a worker's `--curator-metrics`), for a
  restricted Prometheus. `dpstream exporter` never serves them.

A name missing from the table is curator-only (fail closed) and a test fails on it. Names are as
exposed:
counters with their `_total`, histograms without their `_bucket`/`_sum`/`_count` suffixes.
"""

from __future__ import annotations

__all__ = ["MetricClass", "METRIC_CLASSES", "ClassFilter", "metric_class", "exposed_name"]

from collections.abc import Iterator, Mapping
from enum import Enum
from types import MappingProxyType

from prometheus_client.core import Metric
from prometheus_client.registry import Collector


class MetricClass(Enum):
    """The audience a metric may be served to."""

    DATA_INDEPENDENT = "data-independent"
    """Derived from public information only (topology, clock, public operator actions, published releases)."""
    CURATOR_ONLY = "curator-only"
    """Depends on the data or the processing of it: a restricted Prometheus only, on request."""


_D = MetricClass.DATA_INDEPENDENT
_C = MetricClass.CURATOR_ONLY

METRIC_CLASSES: Mapping[str, MetricClass] = MappingProxyType(
    {
        # process and topology
        "dpstream_build_info": _D,
        "dpstream_metric_privacy_info": _D,
        "dpstream_ledger_up": _D,
        # budget state read from the ledger, and the plan
        "dpstream_budget_cap": _D,
        "dpstream_budget_spent": _D,
        "dpstream_budget_spent_ratio": _D,
        "dpstream_budget_warn_ratio": _D,
        "dpstream_budget_planned_ratio": _D,
        "dpstream_budget_spent_total": _D,
        "dpstream_budget_planned_spend_rate": _D,
        "dpstream_budget_epsilon_spent": _D,
        "dpstream_budget_period_end_timestamp_seconds": _D,
        "dpstream_budget_period_seconds": _D,
        "dpstream_budget_reserve_ratio": _D,
        "dpstream_budget_projected_ratio": _D,
        "dpstream_budget_state": _D,
        "dpstream_breaker_open": _D,
        # the published record's own noise figure
        "dpstream_release_noise_stddev": _D,
        # the feed: the releases topic's records, deduped (workers.feed; `dpstream exporter` serves them)
        "dpstream_release_value": _D,
        "dpstream_release_ci_half_width": _D,
        "dpstream_release_window_end_timestamp_seconds": _D,
        "dpstream_release_ratio_after": _D,
        "dpstream_release_conflicts_total": _D,
        # the release side's processing
        "dpstream_releases_total": _C,
        "dpstream_release_retries_total": _C,
        "dpstream_release_parks_total": _C,
        "dpstream_release_publish_misses_total": _C,
        "dpstream_release_clamped_total": _C,
        "dpstream_releases_parked": _C,
        "dpstream_releases_swept_total": _C,
        "dpstream_release_latency_seconds": _C,
        "dpstream_release_lag_seconds": _C,
        "dpstream_windows_pending": _C,
        "dpstream_ledger_request_duration_seconds": _C,
        "dpstream_ledger_errors_total": _C,
        # the ingest side
        "dpstream_events_total": _C,
        "dpstream_dead_letters_total": _C,
        "dpstream_events_skipped_total": _C,
        "dpstream_windows_capped_total": _C,
        "dpstream_period_capped_total": _C,
        # the ingest's worker-broker clock skew (window closes are held past its bound)
        "dpstream_clock_skew_seconds": _C,
        "dpstream_clock_skew_uncertainty_seconds": _C,
        "dpstream_clock_skew_bound_seconds": _C,
        "dpstream_clock_skew_closes_held": _C,
        "dpstream_clock_skew_publishes_held": _C,
    }
)
"""Every metric name a dpstream process serves, with its class (one entry per name)."""


def exposed_name(family: Metric) -> str:
    """The name a family is exposed and documented under (a counter's with its `_total`)."""
    return family.name + "_total" if family.type == "counter" else family.name


def metric_class(name: str) -> MetricClass:
    """The class of an exposed metric name; an unlisted name is curator-only (never widened by mistake)."""
    return METRIC_CLASSES.get(name, MetricClass.CURATOR_ONLY)


class ClassFilter(Collector):
    """Serves the families of `inner` whose class is data-independent, and the curator-only ones too
    only when `curator` is set."""

    def __init__(self, inner: Collector, *, curator: bool) -> None:
        self.inner = inner
        self.curator = curator

    def collect(self) -> Iterator[Metric]:
        for family in self.inner.collect():
            if self.curator or metric_class(exposed_name(family)) is MetricClass.DATA_INDEPENDENT:
                yield family
