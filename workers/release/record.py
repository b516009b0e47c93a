"""The release record (fields: README's release-record table) and its one builder, `record_bytes`.

The record is built once, before `charge`; the ledger stores it (filling `budget.ratio_after`)
and every publication of the release — first, duplicate or sweeper — sends those stored bytes.
So a redrawn payload for a known release_id is never seen by anyone.

`published_at` is the release's public time P(w) = C(w) + publish_delay (`Topology.publish_time`),
not the time the record was built: processing time depends on the data and must not show in the
record. The release agent reads it back from the stored bytes (`publish_time_of`) to hold the
record until P(w) and to stamp the Kafka record's timestamp with it.
"""

from __future__ import annotations

__all__ = [
    "RATIO_PLACEHOLDER",
    "canonical_bytes",
    "cost_fields",
    "iso_utc",
    "publish_time_of",
    "charged_cost_of",
    "record_bytes",
    "true_values_for",
]

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from json.encoder import encode_basestring
from typing import Any

from dpstream.topology.accounting import epsilon_equivalent
from dpstream.topology.errors import InternalError
from dpstream.topology.model import Accounting, Aggregate, Budget, Metric, Source
from dpstream.workers.frozen import FrozenFields
from dpstream.workers.ledger.types import RATIO_TOKEN
from dpstream.workers.pipeline.fixed_point import from_units, value_exponent
from dpstream.workers.pipeline.quantile_cells import cell_count

RATIO_PLACEHOLDER = RATIO_TOKEN
"""The ledger's placeholder (`ledger.types.RATIO_TOKEN`, one constant): exactly what a record's
bytes hold for `budget.ratio_after` before the ledger's charge fills it."""

_RATIO_TEXT = RATIO_TOKEN.decode()
"""`budget.ratio_after` as `record_bytes` writes it: the ledger's token itself."""

_PROTECTED = frozenset(
    {"release_id", "topology_version", "ledger", "metric", "window", "privacy_unit", "event_level", "cost", "budget"}
)


_FAST_ISO_UNTIL = 253_402_300_800
"""0001-01-01 .. 9999-12-31 is what datetime formats; the fast path covers 1970 .. 9999 (POSIX
time has no leap seconds, so a day is 86,400 s and only the date part needs the calendar)."""


@lru_cache(maxsize=1024)
def _iso_day(day: int) -> str:
    return datetime.fromtimestamp(day * 86_400, tz=UTC).strftime("%Y-%m-%d")


@lru_cache(maxsize=4096)
def _iso_minute(minute: int) -> str:
    """`2026-11-30T13:20:` for minutes since the epoch (a window's times and its build time share a few)."""
    day, rest = divmod(minute, 1_440)
    return f"{_iso_day(day)}T{rest // 60:02d}:{rest % 60:02d}:"


_ISO_SECONDS = tuple(f"{second:02d}Z" for second in range(60))


def iso_utc(ts: float) -> str:
    """`2026-11-30T13:20:00Z` (seconds precision, UTC)."""
    t = int(ts)
    if 0 <= t < _FAST_ISO_UNTIL:
        minute, second = divmod(t, 60)
        return _iso_minute(minute) + _ISO_SECONDS[second]
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


_PUBLISHED_AT = b'"published_at":"'


def publish_time_of(payload: bytes) -> int | None:
    """P(w) in epoch seconds from a record's canonical bytes (its `published_at`), or None when the
    bytes hold no such field in the canonical form (not a release record of this module)."""
    i = payload.rfind(_PUBLISHED_AT)
    if i < 0:
        return None
    i += len(_PUBLISHED_AT)
    text = payload[i : i + 20]
    if len(text) != 20 or not text.endswith(b"Z"):
        return None
    try:
        moment = datetime.strptime(text.decode(), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except (UnicodeDecodeError, ValueError):
        return None
    return int(moment.timestamp())


def charged_cost_of(payload: bytes) -> float:
    """The cost (ρ or ε) a stored release record was charged at, from its `cost` field."""
    cost = json.loads(payload)["cost"]
    return float(cost["rho"] if "rho" in cost else cost["epsilon"])


_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
"""One encoder with the canonical options, built once (what `json.dumps` would build per call)."""


def _encode(value: Any) -> str:
    """The canonical JSON text of `value`."""
    return _ENCODER.encode(value)


def canonical_bytes(record: dict[str, Any]) -> bytes:
    """Sorted keys, no spaces, no NaN: one record has one byte form."""
    return _encode(record).encode()


def cost_fields(budget: Budget, cost: float, conversion_delta: float) -> dict[str, float]:
    """`cost` of the record: ρ (zCDP, with its ε at `conversion_delta`, the δ the scope's cap was
    converted at: `topology.selection.conversion_delta`) or ε (pure)."""
    zcdp = budget.accounting is Accounting.ZCDP
    equiv = epsilon_equivalent(zcdp, cost, conversion_delta)
    if zcdp:
        return {"rho": cost, "epsilon_equiv": equiv.epsilon, "delta": equiv.delta}
    return {"epsilon": cost, "epsilon_equiv": equiv.epsilon, "delta": equiv.delta}


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
    if metric.aggregate is Aggregate.QUANTILE:
        return {"": _quantile_cells(metric, merged.get(""))}
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


def _quantile_cells(metric: Metric, cells: Any) -> tuple[int, ...]:
    """A quantile window's counts per grid cell (2m + 1 of them; all zero for an empty window)."""
    size = cell_count(metric.candidates or ())
    if cells is None:
        return (0,) * size
    out = tuple(int(c) for c in cells)
    if len(out) != size:
        raise InternalError(f"metric {metric.name!r}: {len(out)} quantile cells, the grid has {size}")
    return out


def _fixed_values(
    topology_version: str,
    metric: Metric,
    source: Source,
    budget: Budget,
    cost: float,
    ledger: str | None,
    conversion_delta: float,
) -> dict[str, Any]:
    """The record fields that the topology, the ledger, the metric and the cost fix. `ledger` is the
    id of the ledger the release is charged to (None: the in-process one, charged to no ledger)."""
    fixed: dict[str, Any] = {
        "topology_version": topology_version,
        "ledger": ledger,
        "metric": metric.name,
        "aggregate": metric.aggregate.value,
        "privacy_unit": source.privacy_unit,
        "event_level": source.event_level,
        "cost": cost_fields(budget, cost, conversion_delta),
        "bounds": [metric.bounds.lower, metric.bounds.upper] if metric.bounds is not None else None,
        "contribution": _contribution(metric),
        "postprocess": {"round": metric.postprocess.round, "clamp_zero": metric.postprocess.clamp_zero},
    }
    if metric.quantiles is not None:
        fixed["quantiles"] = list(metric.quantiles)
    if source.event_level:
        fixed["privacy_note"] = "event-level DP: protects single events, not people (weaker)"
    return fixed


def _contribution(metric: Metric) -> dict[str, int]:
    """The record's `contribution`: the per-window bounds, and a running total's `max_per_period`."""
    c = metric.contribution
    out = {"max_keys": c.max_keys, "max_per_key": c.max_per_key}
    if c.max_per_period is not None:
        out["max_per_period"] = c.max_per_period
    return out


_MEMO_MAX_ITEMS = 8
_MEMO_SCALARS = (str, float, int, bool, type(None))


@dataclass(frozen=True, slots=True)
class _Memo:
    """A small flat dict's text, recognised by the identity of its keys and values: a mechanism
    hands the same (immutable) objects to every release in its `noise`, `ci` and `postprocess`
    fields, so their text is encoded once per cost. Holds the objects, so their ids stay theirs."""

    ids: tuple[int, ...]
    held: tuple[Any, ...]
    text: str


_NO_MEMO = _Memo((), (), "")
"""A cell's mark once its field changed between releases (as `values` does): not tried again."""


def _memo_text(cell: list[_Memo | None], value: dict[Any, Any]) -> str:
    """`_encode(value)`, from the cell when it holds the same objects; fills an empty cell. A
    mechanism's `FrozenFields` (read-only, one object per cost) is known by its own identity."""
    memo = cell[0]
    if type(value) is FrozenFields:
        if memo is not None and memo.held and memo.held[0] is value:
            return memo.text
        text = _encode(value)
        cell[0] = _Memo((), (value,), text)  # holds it, so no other object takes its id while cached
        return text
    if memo is _NO_MEMO or len(value) > _MEMO_MAX_ITEMS:
        return _encode(value)
    ids = (*map(id, value), *map(id, value.values()))
    if memo is not None:
        if memo.ids == ids:
            return memo.text
        cell[0] = _NO_MEMO
        return _encode(value)
    text = _encode(value)
    if all(type(k) is str for k in value) and all(type(v) in _MEMO_SCALARS for v in value.values()):
        cell[0] = _Memo(ids, (*value, *value.values()), text)
    return text


@dataclass(slots=True)
class _Layout:
    """The canonical text of a record with one set of noise-field names, as a template: the fixed
    fields' text pre-joined in sorted key order between the slots of the fields that change."""

    parts: list[str]
    """Constant text and empty slots, in output order (copied per release, slots filled, joined)."""
    release_id: int
    window: int
    budget: int
    published_at: int
    noise: tuple[tuple[int, list[_Memo | None]], ...]
    """The slot of each noise field, in `noise_fields` order (-1 for a protected name: dropped), with
    the field's memo cell."""


@dataclass(slots=True)
class _Fixed:
    """What a (topology version, metric, source, budget, cost) fixes: its fields' JSON text, and
    the layouts built from it per tuple of noise-field names. Holds the (immutable) objects so
    their ids name them while cached."""

    metric: Metric
    source: Source
    budget: Budget
    texts: dict[str, str]
    kind: str
    """The JSON text of `window.kind`."""
    scope: str
    """The JSON text of `budget.scope`."""
    layouts: dict[tuple[str, ...], _Layout] = field(default_factory=dict)


_FIXED: dict[tuple[str, str | None, float, int, int, int, type, float], _Fixed] = {}
"""Per (topology version, ledger, conversion δ, metric, source, budget, cost type, cost). The metric,
source and budget are keyed by id(), checked by identity on a hit (hashing the frozen dataclasses
costs more than the texts they key): it is the one such cache, kept because `dpstream bench release`
measured the 1-key release at 1.05–1.07 of a bare OpenDP call with it and 1.48–1.54 without (overhead
18–31 µs against 73–88 µs, 2026-12-07)."""

_WINDOW_FIELDS = ("release_id", "window", "budget", "published_at")


def _new_fixed(
    topology_version: str,
    metric: Metric,
    source: Source,
    budget: Budget,
    cost: float,
    ledger: str | None,
    conversion_delta: float,
) -> _Fixed:
    fixed = _fixed_values(topology_version, metric, source, budget, cost, ledger, conversion_delta)
    return _Fixed(
        metric,
        source,
        budget,
        {name: _encode(value) for name, value in fixed.items()},
        _encode(metric.window.kind.value),
        _encode(budget.name),
    )


def _fixed_for(
    topology_version: str,
    metric: Metric,
    source: Source,
    budget: Budget,
    cost: float,
    ledger: str | None,
    conversion_delta: float,
) -> _Fixed:
    if not cost:  # 0.0 and -0.0 are equal keys with different text: not worth a cache entry
        return _new_fixed(topology_version, metric, source, budget, cost, ledger, conversion_delta)
    key = (topology_version, ledger, conversion_delta, id(metric), id(source), id(budget), type(cost), cost)
    hit = _FIXED.get(key)
    if hit is not None and hit.metric is metric and hit.source is source and hit.budget is budget:
        return hit
    built = _new_fixed(topology_version, metric, source, budget, cost, ledger, conversion_delta)
    if len(_FIXED) >= 1024:
        _FIXED.clear()
    _FIXED[key] = built
    return built


@lru_cache(maxsize=256)
def _key_text(name: str) -> str:
    return encode_basestring(name) + ":"


def _layout(fixed: _Fixed, names: tuple[str, ...]) -> _Layout:
    """The template for these noise-field names (a name that is not a str fails to sort or to
    encode here: TypeError, as `canonical_bytes` refuses it)."""
    texts: dict[str, str | None] = dict(fixed.texts)
    for name in _WINDOW_FIELDS:
        texts[name] = None
    for name in names:
        if name not in _PROTECTED:
            texts[name] = None  # a noise field replaces a fixed one of the same name
    parts: list[str] = []
    slots: dict[str, int] = {}
    const = "{"
    for i, name in enumerate(sorted(texts)):
        const += ("," if i else "") + _key_text(name)
        text = texts[name]
        if text is None:
            parts.append(const)
            slots[name] = len(parts)
            parts.append("")
            const = ""
        else:
            const += text
    parts.append(const + "}")
    return _Layout(
        parts,
        slots["release_id"],
        slots["window"],
        slots["budget"],
        slots["published_at"],
        tuple((-1 if name in _PROTECTED else slots[name], [None]) for name in names),
    )


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
    ledger: str | None,
    conversion_delta: float,
) -> bytes:
    """The record's canonical bytes (`canonical_bytes` of its fields: sorted keys, no spaces, no NaN):
    the fields the topology, the metric and the cost fix, the window's, and the mechanism's
    `noise_fields` (a protected name among them is dropped, any other replaces a fixed field).

    Why a template: a template per cost and set of noise-field names holds the fixed fields' text
    pre-joined in sorted key order, and only the release's own fields are encoded into its slots
    (measured, `bench release` interleaved on a loaded 2-core box, records with their `event`:
    1-key ratio 1.07-1.11 with the template against 1.27-1.32 encoding the whole record per
    release, i.e. ~16 % less CPU per release; stream 1.00-1.07 against 1.22-1.28; 1,000 keys: no
    difference). Bad input raises:
    NaN or infinity ValueError, a time datetime cannot print, a noise-field name not a str."""
    fixed = _fixed_for(topology_version, metric, source, budget, cost, ledger, conversion_delta)
    names = tuple(noise_fields)
    layout = fixed.layouts.get(names)
    if layout is None:
        if len(fixed.layouts) >= 64:
            fixed.layouts.clear()
        layout = fixed.layouts[names] = _layout(fixed, names)
    parts = layout.parts.copy()
    # ISO times are digits, '-', ':', 'T' and 'Z': their JSON text is the string in quotes
    start = iso_utc(window_start)
    end = iso_utc(window_end)
    parts[layout.window] = (
        f'{{"end":"{end}","end_epoch":{int(window_end)},"kind":{fixed.kind},'
        f'"start":"{start}","start_epoch":{int(window_start)}}}'
    )
    parts[layout.budget] = f'{{"period":{_text(period_id)},{_RATIO_TEXT},"scope":{fixed.scope}}}'
    parts[layout.published_at] = f'"{iso_utc(built_at)}"'
    parts[layout.release_id] = _text(release_id)
    for (slot, cell), value in zip(layout.noise, noise_fields.values(), strict=True):
        if slot < 0:
            continue
        kind = type(value)
        if kind is dict or kind is FrozenFields:
            parts[slot] = _memo_text(cell, value)
        elif kind is str:
            parts[slot] = encode_basestring(value)
        else:
            parts[slot] = _encode(value)
    return "".join(parts).encode()


def _text(value: Any) -> str:
    """`_encode(value)`, a str without the general encoder."""
    return encode_basestring(value) if type(value) is str else _encode(value)
