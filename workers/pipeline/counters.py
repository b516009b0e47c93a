"""Event outcome counters of one source partition, read by the Prometheus layer (no raw values)."""

from __future__ import annotations

__all__ = ["EventCounts"]

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class EventCounts:
    """Running totals (mutable on purpose: updated once per batch, read on scrape).

    `capped` and `clamped` count contributions dropped by L0/L∞ caps (once a window closes, the
    same total whatever order its events came in: a contribution a later, earlier-ordered one
    displaced counts when it goes) and values clamped to bounds; `late` counts events that missed
    at least one already-final window.
    """

    accepted: int = 0
    late: int = 0
    capped: int = 0
    clamped: int = 0
    skipped: int = 0
    invalid: Counter[str] = field(default_factory=Counter)

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
        return out
