"""The live view of a demo: one line per release (noisy values ± CI, never a true value) and budget lines."""

from __future__ import annotations

__all__ = ["format_release", "format_budget", "ReleaseTally"]

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

_MAX_KEYS_SHOWN = 5


def _hhmm(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%H:%M")


def _number(value: float) -> str:
    """Integers (noisy counts) as integers; other numbers with 2 decimals below 100."""
    if isinstance(value, int) or abs(value) >= 100 or float(value).is_integer():
        return f"{value:,.0f}"
    return f"{value:,.2f}"


def _values(record: dict[str, Any]) -> str:
    keys = record.get("keys")
    if keys is not None:
        return "top: " + ", ".join(keys) if keys else "top: (no key passed selection)"
    values: dict[str, float] = record.get("values") or {}
    half = (record.get("ci") or {}).get("half_width")
    shown = list(values.items())[:_MAX_KEYS_SHOWN]
    parts = []
    for key, value in shown:
        h = half.get(key) if isinstance(half, dict) else half
        label = f"{key}=" if key else ""
        parts.append(f"{label}{_number(value)}" + (f" ±{_number(h)}" if h is not None else ""))
    more = len(values) - len(shown)
    return "  ".join(parts) + (f"  (+{more} keys)" if more > 0 else "") if parts else "(no key passed selection)"


def format_release(payload: bytes) -> str:
    """One table row for a release record: metric, window, noisy values ± 95 % CI, budget after it."""
    record = json.loads(payload)
    if record.get("charge_only"):
        return ""
    window = record["window"]
    budget = record.get("budget") or {}
    ratio = budget.get("ratio_after")
    ratio_text = f"{100 * ratio:5.2f} %" if isinstance(ratio, (int, float)) else "   -   "
    return (
        f"{record['metric']:<18} {_hhmm(window['start_epoch'])}–{_hhmm(window['end_epoch'])}  "
        f"{ratio_text}  {_values(record)}"
    )


def format_budget(status: dict[str, Any]) -> str:
    """One budget line from `budget status --json`'s per-scope object."""
    return (
        f"budget {status['scope']}: {status['state']}, spent {100 * status['ratio']:.2f} % of the cap "
        f"(ε ≈ {status['epsilon_equiv']:.3f}), granted {status['releases']['granted']}, "
        f"refused {status['releases']['refused']}"
    )


@dataclass
class ReleaseTally:
    """What the demo showed: releases per metric (for the closing summary)."""

    per_metric: dict[str, int] = field(default_factory=dict)

    def add(self, payload: bytes) -> None:
        """Count one release record (charge-only markers are not releases)."""
        record = json.loads(payload)
        if not record.get("charge_only"):
            self.per_metric[record["metric"]] = self.per_metric.get(record["metric"], 0) + 1

    @property
    def total(self) -> int:
        """Releases shown."""
        return sum(self.per_metric.values())
