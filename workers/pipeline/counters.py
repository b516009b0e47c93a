"""Event outcome counters of one source partition, read by the Prometheus layer (no raw values)."""

from __future__ import annotations

__all__ = ["EventCounts", "SKIP_REASONS", "MISSING_GROUP_FIELD", "UNDECLARED_KEY", "MISSING_VALUE_FIELD"]

from collections import Counter
from dataclasses import dataclass, field

SKIP_REASONS = ("missing_group_field", "undeclared_key", "missing_value_field")
"""Why a valid (accepted) event is left out of one metric: it has no `group_by` field, its key is not
one of the metric's declared `keys` (case counts: `de` is not `DE`), or it has no `value` field. A value
or key that is present but unusable is no skip: the parser dead-letters the whole event (`bad_value`,
`bad_key`). The index of a reason here is its slot in `MetricAccumulator.skips`."""

MISSING_GROUP_FIELD, UNDECLARED_KEY, MISSING_VALUE_FIELD = range(len(SKIP_REASONS))


@dataclass
class EventCounts:
    """Running totals (mutable on purpose: updated once per batch, read on scrape).

    `capped` and `clamped` count contributions dropped by L0/L∞ caps (once a window closes, the
    same total whatever order its events came in: a contribution a later, earlier-ordered one
    displaced counts when it goes) and values clamped to bounds; `late` counts events that missed
    at least one already-final window. `skipped` counts (metric, event) pairs an accepted event was
    left out of a metric for (see `SKIP_REASONS`); `skips` splits it per (metric, reason).
    """

    accepted: int = 0
    late: int = 0
    capped: int = 0
    clamped: int = 0
    skipped: int = 0
    invalid: Counter[str] = field(default_factory=Counter)
    skips: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(metric, skip reason) → events that metric skipped; sums to `skipped`."""
    capped_windows: Counter[str] = field(default_factory=Counter)
    """metric → (unit, window) pairs `contribution.max_windows` dropped: the unit had already counted in
    max_windows windows of the period, so its contributions to that window were left out (a count only,
    curator-side: never which unit)."""
    capped_period: Counter[str] = field(default_factory=Counter)
    """metric → (unit, window, key) contributions a running total's `contribution.max_per_period` cut, in
    part or whole: the unit had used (nearly) all of its bound this period (a count only, curator-side)."""

    def skips_by_metric(self) -> dict[str, dict[str, int]]:
        """metric → {skip reason: events} for the metrics that skipped any (reasons in `SKIP_REASONS`
        order, zeros left out), metrics in the order they were counted."""
        out: dict[str, dict[str, int]] = {}
        for (metric, reason), n in self.skips.items():
            if n:
                out.setdefault(metric, {})[reason] = n
        order = {r: i for i, r in enumerate(SKIP_REASONS)}
        return {m: dict(sorted(rs.items(), key=lambda kv: order.get(kv[0], len(order)))) for m, rs in out.items()}

    def snapshot(self) -> dict[str, int]:
        """Flat copy: outcome → count, invalid split as `invalid:<reason>`."""
        out = {
            "accepted": self.accepted,
            "late": self.late,
            "capped": self.capped,
            "clamped": self.clamped,
            "skipped": self.skipped,
        }
        out.update({f"invalid:{r}": n for r, n in sorted(self.invalid.items())})
        out.update({f"capped_windows:{m}": n for m, n in sorted(self.capped_windows.items())})
        out.update({f"capped_period:{m}": n for m, n in sorted(self.capped_period.items())})
        return out
