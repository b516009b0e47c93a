"""A deliberately simple release-record builder, for tests only: the record as a plain dict, field by
field, which `canonical_bytes` then encodes. `record_bytes` (the shipped builder, a template per cost)
must write exactly these bytes."""

from __future__ import annotations

from typing import Any

from dpstream.topology.model import Budget, Metric, Source
from dpstream.workers.release.record import canonical_bytes, cost_fields, iso_utc

PROTECTED = frozenset(
    {"release_id", "topology_version", "ledger", "metric", "window", "privacy_unit", "event_level", "cost", "budget"}
)
"""Fields a mechanism's noise fields may not replace."""


def oracle_record(
    *,
    release_id: str,
    topology_version: str,
    metric: Metric,
    source: Source,
    budget: Budget,
    period_id: str,
    window_start: int,
    window_end: int,
    cost: float,
    noise_fields: dict[str, Any],
    built_at: float,
    ledger: str | None,
    conversion_delta: float,
) -> dict[str, Any]:
    """The record `record_bytes` writes for these arguments, as a dict."""
    record: dict[str, Any] = {
        "release_id": release_id,
        "topology_version": topology_version,
        "ledger": ledger,
        "metric": metric.name,
        "aggregate": metric.aggregate.value,
        "privacy_unit": source.privacy_unit,
        "event_level": source.event_level,
        "cost": cost_fields(budget, cost, conversion_delta),
        "bounds": [metric.bounds.lower, metric.bounds.upper] if metric.bounds is not None else None,
        "contribution": {
            "max_keys": metric.contribution.max_keys,
            "max_per_key": metric.contribution.max_per_key,
            **(
                {}
                if metric.contribution.max_per_period is None
                else {"max_per_period": metric.contribution.max_per_period}
            ),
        },
        "postprocess": {"round": metric.postprocess.round, "clamp_zero": metric.postprocess.clamp_zero},
        "window": {
            "start": iso_utc(window_start),
            "end": iso_utc(window_end),
            "start_epoch": int(window_start),
            "end_epoch": int(window_end),
            "kind": metric.window.kind.value,
        },
        "budget": {"scope": budget.name, "period": period_id, "ratio_after": None},
        "published_at": iso_utc(built_at),
    }
    if metric.quantiles is not None:
        record["quantiles"] = list(metric.quantiles)
    if source.event_level:
        record["privacy_note"] = "event-level DP: protects single events, not people (weaker)"
    for name, value in noise_fields.items():
        if name not in PROTECTED:
            record[name] = value
    return record


def oracle_bytes(**args: Any) -> bytes:
    """`canonical_bytes(oracle_record(...))`."""
    return canonical_bytes(oracle_record(**args))
