"""Each metric's latest release by window end, as the exporter serves it (only once P(w) has passed).

Only the keys of a metric's latest release are served: DP-selected keys change from window to
window, so keeping every key ever released would grow without bound. A metric whose released key
set has no bound (keys that come from the data through partition selection, with no declared `keys`
and no top-k `k`) is refused with a one-line reason. Ungrouped metrics carry the key '' (the
record's own representation: `values: {"": v}`).

The record's `budget.ratio_after` is the scope's spend ratio after this release's charge. A record is
on the topic at or after its public time P(w) (the release agent holds it until then and stamps the
Kafka timestamp with it); on top of that a record read early (a skewed clock) is held here until its
`published_at` has passed, so nothing of it, the ratio included, is shown before P(w): the public
ledger-derived series count only charges whose P(w) has passed.
"""

from __future__ import annotations

__all__ = ["LatestReleases", "key_bound_refusal", "published_epoch"]

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from dpstream.topology.model import Aggregate, Metric, Topology


def key_bound_refusal(metric: Metric) -> str | None:
    """None when `metric`'s released key set is bounded (ungrouped, declared keys, or top-k with a
    k), else the one-line reason it is not served as feed series."""
    if metric.group_by is None or metric.keys is not None:
        return None
    if metric.aggregate is Aggregate.TOP_K and metric.k:
        return None
    return (
        f"metric {metric.name}: not served as feed series: its keys come from the data (group_by "
        f"{metric.group_by}, no declared keys, not top-k), so their number has no bound; declare `keys:` "
        "or use `aggregate: top_k` with `k`"
    )


def published_epoch(record: Mapping[str, Any]) -> int | None:
    """P(w) of a record, from its `published_at` (None when missing or not the canonical form)."""
    text = record.get("published_at")
    if not isinstance(text, str):
        return None
    try:
        return int(datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp())
    except ValueError:
        return None


def _window_end(record: Mapping[str, Any]) -> int | None:
    end = (record.get("window") or {}).get("end_epoch")
    return end if isinstance(end, int) and not isinstance(end, bool) else None


class LatestReleases:
    """metric → its latest release by window end among the records added (deduped first), showing a
    record only once `now` ≥ its P(w)."""

    def __init__(self, topology: Topology) -> None:
        self.refused: dict[str, str] = {}
        for metric in topology.metrics.values():
            reason = key_bound_refusal(metric)
            if reason is not None:
                self.refused[metric.name] = reason
        self.served = tuple(sorted(set(topology.metrics) - set(self.refused)))
        self._latest: dict[str, dict[str, Any]] = {}
        self._held: dict[str, list[tuple[int, dict[str, Any]]]] = {}

    def add(self, record: dict[str, Any]) -> None:
        """Take one deduped release (the first record of its release_id); records of refused or
        unknown metrics, charge-only markers and records without a window end or P(w) are left out."""
        metric = record.get("metric")
        if metric not in self.served or record.get("charge_only") or _window_end(record) is None:
            return
        at = published_epoch(record)
        if at is None:
            return
        self._held.setdefault(str(metric), []).append((at, record))

    def latest(self, now: float) -> dict[str, dict[str, Any]]:
        """metric → its latest release by window end whose P(w) ≤ now."""
        for metric, held in self._held.items():
            ready = [record for at, record in held if at <= now]
            if not ready:
                continue
            held[:] = [(at, record) for at, record in held if at > now]
            for record in ready:
                current = self._latest.get(metric)
                if current is None or (_window_end(record) or 0) >= (_window_end(current) or 0):
                    self._latest[metric] = record
        return dict(self._latest)
