"""The release record (DESIGN §6) and its canonical bytes.

The record is built once, before `reserve`; the ledger stores it (filling `budget.ratio_after`)
and every publication of the release — first, duplicate or sweeper — sends those stored bytes.
So `published_at` is the time the record was built, and a redrawn payload for a known
release_id is never seen by anyone.
"""

from __future__ import annotations

__all__ = [
    "RATIO_PLACEHOLDER",
    "build_record",
    "canonical_bytes",
    "cost_fields",
    "iso_utc",
    "record_bytes",
    "true_values_for",
]

import json
from datetime import UTC, datetime
from functools import lru_cache
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]  # json's own C encoder
from typing import Any

from dpstream.topology.accounting import epsilon_from_rho
from dpstream.topology.model import Accounting, Aggregate, Budget, Metric, Source
from dpstream.workers.ledger.types import RATIO_TOKEN
from dpstream.workers.pipeline.fixed_point import from_units, value_exponent

RATIO_PLACEHOLDER = RATIO_TOKEN
"""The ledger's placeholder (`ledger.types.RATIO_TOKEN`, one constant): exactly what canonical bytes
contain for `budget.ratio_after` before the ledger's charge fills it."""

_PROTECTED = frozenset(
    {"release_id", "topology_version", "metric", "window", "privacy_unit", "event_level", "cost", "budget"}
)


_FAST_ISO_UNTIL = 253_402_300_800
"""0001-01-01 .. 9999-12-31 is what datetime formats; the fast path covers 1970 .. 9999 (POSIX
time has no leap seconds, so a day is 86,400 s and only the date part needs the calendar)."""


@lru_cache(maxsize=1024)
def _iso_day(day: int) -> str:
    return datetime.fromtimestamp(day * 86_400, tz=UTC).strftime("%Y-%m-%d")


def iso_utc(ts: float) -> str:
    """`2026-11-30T13:20:00Z` (seconds precision, UTC)."""
    t = int(ts)
    if 0 <= t < _FAST_ISO_UNTIL:
        day, rest = divmod(t, 86_400)
        hour, rest = divmod(rest, 3_600)
        minute, second = divmod(rest, 60)
        return f"{_iso_day(day)}T{hour:02d}:{minute:02d}:{second:02d}Z"
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
"""One encoder with the canonical options, built once (what `json.dumps` would build per call)."""

_C_ENCODE = (
    None
    if c_make_encoder is None
    else c_make_encoder(None, _ENCODER.default, encode_basestring, None, ":", ",", True, False, False)
)
"""The C encoder `json.dumps` makes with those options on every call (same arguments: markers=None
only skips the check for circular structures, which a record built here cannot have)."""


def _encode(value: Any) -> str:
    """The canonical JSON text of `value` (what `_ENCODER.encode` returns)."""
    if _C_ENCODE is None:  # pragma: no cover - CPython always has the C encoder
        return _ENCODER.encode(value)
    return "".join(_C_ENCODE(value, 0))


def canonical_bytes(record: dict[str, Any]) -> bytes:
    """Sorted keys, no spaces, no NaN: one record has one byte form."""
    return _encode(record).encode()


def cost_fields(budget: Budget, cost: float) -> dict[str, float]:
    """`cost` of the record: ρ (zCDP, with its ε at the scope's δ) or ε (pure)."""
    if budget.accounting is Accounting.ZCDP:
        return {"rho": cost, "epsilon_equiv": epsilon_from_rho(cost, budget.delta), "delta": budget.delta}
    return {"epsilon": cost, "epsilon_equiv": cost, "delta": 0.0}


def _zero(metric: Metric) -> Any:
    if metric.aggregate in (Aggregate.COUNT, Aggregate.COUNT_UNITS, Aggregate.TOP_K):
        return 0
    if metric.aggregate is Aggregate.MEAN and metric.denominator is None:
        return (0.0, 0)
    return 0.0


def true_values_for(metric: Metric, merged: dict[str, Any]) -> dict[str, Any]:
    """The mechanism's input from merged partial values: declared keys zero-filled, means as tuples,
    integer grid-unit sums as exact `Fraction`s (see `workers.pipeline.fixed_point`).

    Ungrouped metrics use the key ''; data-derived keys pass as observed (partition selection
    in the mechanism decides which may appear).
    """
    zero = _zero(metric)
    exponent = value_exponent(metric.bounds) if metric.value is not None and metric.bounds is not None else None
    if metric.group_by is None:
        keys: Any = ("",)
    elif metric.keys is not None:
        keys = metric.keys
    else:
        keys = sorted(merged)
    out: dict[str, Any] = {}
    for k in keys:
        v = merged.get(k)
        if v is None:
            out[k] = zero
        elif exponent is None:
            out[k] = tuple(v) if isinstance(v, (list, tuple)) else v
        elif isinstance(v, (list, tuple)):  # [grid-unit sum, count] → (exact sum, count)
            out[k] = (from_units(int(v[0]), exponent), int(v[1]))
        else:
            out[k] = from_units(int(v), exponent)
    return out


def build_record(
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
) -> dict[str, Any]:
    """The DESIGN §6 record; `noise_fields` is the mechanism's `to_record_fields()` (values, noise, ci…)."""
    record: dict[str, Any] = {
        **_fixed_values(topology_version, metric, source, budget, cost),
        **_window_values(release_id, metric, budget, period_id, window_start, window_end, built_at),
    }
    for name, value in noise_fields.items():
        if name not in _PROTECTED:
            record[name] = value
    return record


def _fixed_values(topology_version: str, metric: Metric, source: Source, budget: Budget, cost: float) -> dict[str, Any]:
    """The record fields that the topology, the metric and the cost fix."""
    fixed: dict[str, Any] = {
        "topology_version": topology_version,
        "metric": metric.name,
        "aggregate": metric.aggregate.value,
        "privacy_unit": source.privacy_unit,
        "event_level": source.event_level,
        "cost": cost_fields(budget, cost),
        "bounds": [metric.bounds.lower, metric.bounds.upper] if metric.bounds is not None else None,
        "contribution": {"max_keys": metric.contribution.max_keys, "max_per_key": metric.contribution.max_per_key},
        "postprocess": {"round": metric.postprocess.round, "clamp_zero": metric.postprocess.clamp_zero},
    }
    if source.event_level:
        fixed["privacy_note"] = "event-level DP: protects single events, not people (weaker)"
    return fixed


def _window_values(
    release_id: str, metric: Metric, budget: Budget, period_id: str, window_start: int, window_end: int, built_at: float
) -> dict[str, Any]:
    """The record fields that change with every release (besides the mechanism's)."""
    return {
        "release_id": release_id,
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


_FIXED: dict[tuple[str, int, int, int, type, float], tuple[Metric, Source, Budget, dict[str, str]]] = {}
"""Per (topology version, metric, source, budget, cost): the JSON text of the record fields those
fix, holding the (immutable) objects so their ids name them while cached."""


def _fixed_fields(topology_version: str, metric: Metric, source: Source, budget: Budget, cost: float) -> dict[str, str]:
    key = (topology_version, id(metric), id(source), id(budget), type(cost), cost)
    hit = _FIXED.get(key)
    if hit is not None and hit[0] is metric and hit[1] is source and hit[2] is budget:
        return hit[3]
    fixed = _fixed_values(topology_version, metric, source, budget, cost)
    texts = {name: _encode(value) for name, value in fixed.items()}
    if len(_FIXED) >= 1024:
        _FIXED.clear()
    _FIXED[key] = (metric, source, budget, texts)
    return texts


@lru_cache(maxsize=256)
def _key_text(name: str) -> str:
    return encode_basestring(name) + ":"


def record_bytes(
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
) -> bytes:
    """`canonical_bytes(build_record(...))` with the same arguments, byte for byte, without
    re-encoding per release the fields that the topology, the metric and the cost fix (text
    kept per cost; the top level joined in sorted key order as the canonical encoder does)."""
    parts = dict(_fixed_fields(topology_version, metric, source, budget, cost))
    for name, value in _window_values(
        release_id, metric, budget, period_id, window_start, window_end, built_at
    ).items():
        parts[name] = _encode(value)
    for name, value in noise_fields.items():
        if name not in _PROTECTED:
            parts[name] = _encode(value)
    return ("{" + ",".join([_key_text(name) + parts[name] for name in sorted(parts)]) + "}").encode()
