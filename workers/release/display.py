"""A release record as one readable row: metric, window (UTC), budget ratio after, noisy value ± 95 % CI.

One home for the row the demo prints and the worker logs (`release_line`). Everything comes from the
public record (its noisy values, CI and `budget.ratio_after`); nothing here sees a true value (the
demo adds its truth beside the row itself, `workers.demo.feed`).
"""

from __future__ import annotations

__all__ = [
    "candidate",
    "grouped_cells",
    "half_width",
    "is_grouped",
    "is_quantile",
    "number",
    "quantile_cell",
    "release_cell",
    "release_head",
    "release_line",
]

import math
from datetime import UTC, datetime
from typing import Any

_METRIC_W = 16
_WINDOW_W = 17
_RATIO_W = 7


def _hms(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%H:%M:%S")


def _window(window: dict[str, Any]) -> str:
    return f"{_hms(window['start_epoch'])}–{_hms(window['end_epoch'])}"


def _decimals(half: float | None) -> int:
    """Digits worth showing next to a ± of this size: none for ±10 and more, else 1 or 2."""
    if half is None or not math.isfinite(half) or half >= 10:
        return 0
    return 1 if half >= 1 else 2


def number(value: float | None, half: float | None = None) -> str:
    """A value with the precision its CI deserves (thousands separated); '–' for none."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:,.{_decimals(half)}f}"


def half_width(record: dict[str, Any], key: str) -> float | None:
    """The 95 % CI half-width of `key`'s value (one number for all keys, or a per-key dict)."""
    half = (record.get("ci") or {}).get("half_width")
    return half.get(key) if isinstance(half, dict) else half


def release_head(record: dict[str, Any], *, labelled: bool = False) -> str:
    """The row's fixed columns: metric, window, budget ratio after; `labelled` (a log line, no column
    heads above it) says UTC after the window and 'budget' before the ratio."""
    ratio = (record.get("budget") or {}).get("ratio_after")
    ratio_text = f"{100 * ratio:5.2f} %" if isinstance(ratio, (int, float)) else "-"
    window = _window(record["window"]) + (" UTC" if labelled else "")
    budget = "budget " if labelled else ""
    width = _WINDOW_W + (4 if labelled else 0)
    return f"{record['metric']:<{_METRIC_W}} {window:<{width}} {budget}{ratio_text:>{_RATIO_W}}  "


def is_quantile(record: dict[str, Any]) -> bool:
    """Whether the record releases quantiles (values per level 'p50', ...; a rank error, no value CI)."""
    return record.get("aggregate") == "quantile"


def candidate(value: float | None) -> str:
    """A released grid candidate as written: whole numbers without decimals, others to 6 digits."""
    if value is None or not math.isfinite(value):
        return "–"
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.6g}"


def quantile_cell(record: dict[str, Any]) -> str:
    """'p50 812  p90 2,300  (rank ±154, 95 %)': each level's candidate, then the error statement in ranks
    (one figure when every level has the same, as at one scale)."""
    values: dict[str, float] = record.get("values") or {}
    ci = record.get("ci") or {}
    errors: dict[str, float] = ci.get("rank_error") or {}
    cells = "  ".join(f"{level} {candidate(v)}" for level, v in values.items())
    shown = sorted({f"{r:,.0f}" for r in errors.values()})
    level = ci.get("level")
    share = f", {100 * level:g} %" if isinstance(level, (int, float)) else ""
    return cells + (f"  (rank ±{'/'.join(shown)}{share})" if shown else "")


def release_cell(record: dict[str, Any]) -> str:
    """The noisy part of a top-k, quantile or ungrouped record: 'top: a, b', 'p50 v  p90 v  (rank ±r)'
    or 'value ±half' (' s' for a mean)."""
    keys = record.get("keys")
    if keys is not None:  # top-k: a ranking, no CI
        return "top: " + (", ".join(keys) if keys else "(no key passed selection)")
    if is_quantile(record):
        return quantile_cell(record)
    values: dict[str, float] = record.get("values") or {}
    v, h = values.get(""), half_width(record, "")
    unit = " s" if record.get("aggregate") == "mean" else ""
    return f"{number(v, h)} ±{number(h, h)}{unit}"


def grouped_cells(record: dict[str, Any]) -> tuple[str, list[str]]:
    """A grouped record's '±half' (of its first key) and one 'key value' cell per key."""
    values: dict[str, float] = record.get("values") or {}
    h0 = half_width(record, next(iter(values)))
    return f"±{number(h0, h0)}", [f"{key} {number(v, half_width(record, key))}" for key, v in values.items()]


def is_grouped(record: dict[str, Any]) -> bool:
    """Whether the record's values are per key (not top-k, not quantile levels, not the ungrouped '' alone)."""
    return record.get("keys") is None and not is_quantile(record) and list(record.get("values") or {}) not in ([], [""])


def release_line(record: dict[str, Any], note: str = "", *, hide_keys: bool = False) -> str | None:
    """The record as one log line (no truth, UTC and 'budget' labelled), or None for a charge-only marker.
    `hide_keys`, for a curator-side line of a metric whose keys come from the data: how many keys the
    record released, not which: a curator-side surface (a log line, a metric, an error) never carries a
    data-derived key, released or not."""
    if record.get("charge_only"):
        return None
    tail = f"   [{note}]" if note else ""
    head = release_head(record, labelled=True)
    if hide_keys and (record.get("keys") is not None or is_grouped(record)):
        n = len(record.get("keys") or record.get("values") or ())
        return head + f"{n} key{'' if n == 1 else 's'} released (named on the releases topic only)" + tail
    if not is_grouped(record):
        return head + release_cell(record) + tail
    pm, cells = grouped_cells(record)
    return head + f"{pm:<8} " + "  ".join(cells) + tail
