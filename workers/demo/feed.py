"""The demo's screen: release rows (noisy value ± 95 % CI beside the demo-only truth), budget lines, summary.

Everything printed about a release comes from its public record (values, CI, budget ratio); the truth
comes from `truth.TruthBook`, which only a demo has, and is labelled as such on every row.
"""

from __future__ import annotations

__all__ = [
    "TRUTH_LABEL",
    "ReleaseTally",
    "format_budget",
    "format_release",
    "header_lines",
    "number",
]

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from dpstream.workers.release.display import (
    candidate,
    grouped_cells,
    half_width,
    is_grouped,
    is_quantile,
    number,
    release_cell,
    release_head,
)

TRUTH_LABEL = "(truth shown only in the demo)"

_METRIC_W = 16
_WINDOW_W = 17
_RATIO_W = 7
"""Column widths of the heads; the rows' own widths live in `workers.release.display`."""


def header_lines() -> list[str]:
    """The column heads of the release table, with what 'truth' is."""
    return [
        "releases as the worker publishes them: noisy value ± 95 % CI; budget = the scope's spent ratio after it",
        f"truth = the demo's own aggregate of the events it sent, bounded as the worker bounds them {TRUTH_LABEL}",
        f"{'metric':<{_METRIC_W}} {'window (UTC)':<{_WINDOW_W}} {'budget':>{_RATIO_W}}  noisy ± 95 % CI   truth",
    ]


def format_release(record: dict[str, Any], truth: dict[str, float] | None = None, note: str = "") -> list[str]:
    """Rows of one release record: one for an ungrouped metric, two (noisy, then truth) for a grouped one.
    The noisy part is `workers.release.display`'s (the worker logs the same row, without the truth)."""
    if record.get("charge_only"):
        return []
    head = release_head(record)
    tail = _running_note(record) + (f"   [{note}]" if note else "")
    if record.get("keys") is not None:  # top-k: a ranking, no CI
        keys = record["keys"]
        line = release_cell(record)
        if truth:
            ranked = sorted(truth.items(), key=lambda kv: -kv[1])[: len(keys) or 1]
            line += "   truth: " + ", ".join(k for k, _ in ranked)
        return [head + line + tail]
    if is_quantile(record):  # levels and their rank error; the truth is the noiseless candidate per level
        levels = "  ".join(f"{k} {candidate((truth or {}).get(k))}" for k in record.get("values") or {})
        return [head + release_cell(record) + f"   truth {levels}" + tail]
    if not is_grouped(record):
        h = half_width(record, "")
        unit = " s" if record.get("aggregate") == "mean" else ""
        t = (truth or {}).get("")
        return [head + release_cell(record) + f"   truth {number(t, h)}{unit}" + tail]
    pm, noisy_cells = grouped_cells(record)
    cells = []
    for key, noisy in zip(record["values"], noisy_cells, strict=True):
        true = f"{key} {number((truth or {}).get(key), half_width(record, key))}"
        width = max(len(noisy), len(true))
        cells.append((noisy.ljust(width), true.ljust(width)))
    first = head + f"{pm:<8} " + "  ".join(n for n, _ in cells) + tail
    second = " " * len(head) + f"{'truth':<8} " + "  ".join(t for _, t in cells)
    return [first, second.rstrip()]


def _running_note(record: dict[str, Any]) -> str:
    """A running total's step: '   total since 12:00:00, step 3/360' (its value and truth are totals so far)."""
    running = record.get("running_total")
    if not running:
        return ""
    since = datetime.fromtimestamp(running["first_start"], tz=UTC).strftime("%H:%M:%S")
    return f"   total since {since}, step {running['step']}/{running['steps']}"


def format_budget(status: dict[str, Any]) -> str:
    """One budget line from `budget status --json`'s per-scope object (read from the ledger)."""
    currency = "ρ" if status["accounting"] == "zcdp" else "ε"
    left = status["period"]["seconds_left"]
    return (
        f"budget {status['scope']} (ledger): {status['state']}, spent {100 * status['ratio']:.2f} % of the cap "
        f"({currency} {status['spent']:.3g} of {status['cap']:.3g}, ε-equivalent {status['epsilon_equiv']:.3f}), "
        f"releases charged {status['releases']['charged']}, refused {status['releases']['refused']}; "
        f"period {status['period']['id']}, {left // 60} min {left % 60:02d} s left"
    )


@dataclass
class ReleaseTally:
    """What the demo showed: releases per metric, and how the noisy values sat around the truth."""

    per_metric: dict[str, int] = field(default_factory=dict)
    covered: int = 0
    """Values whose truth lies within their 95 % CI."""
    compared: int = 0
    relative_ci: dict[str, list[float]] = field(default_factory=dict)
    """Per metric: CI half-width / |truth| of every value shown with a truth."""

    def add(self, record: dict[str, Any], truth: dict[str, float] | None) -> None:
        """Count one release record and compare its values with the truth (charge-only markers are skipped)."""
        if record.get("charge_only"):
            return
        name = record["metric"]
        self.per_metric[name] = self.per_metric.get(name, 0) + 1
        for key, value in (record.get("values") or {}).items():
            h, t = half_width(record, key), (truth or {}).get(key)
            if h is None or t is None or math.isnan(t):
                continue
            self.compared += 1
            self.covered += abs(value - t) <= h
            if t:
                self.relative_ci.setdefault(name, []).append(h / abs(t))

    @property
    def total(self) -> int:
        """Releases shown."""
        return sum(self.per_metric.values())
