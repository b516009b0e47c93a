"""Release outcomes and their counters (read by the Prometheus layer; no values, no keys)."""

from __future__ import annotations

__all__ = ["ReleaseOutcome", "ReleaseResult", "ReleaseCounts"]

from collections import Counter
from dataclasses import dataclass, field
from enum import Enum


class ReleaseOutcome(Enum):
    """What happened to one window's release."""

    PUBLISHED = "published"
    """Charged now and published."""
    DUPLICATE = "duplicate"
    """Known release_id: the stored bytes were (re)published, nothing charged, fresh noise discarded."""
    SUPPRESSED = "suppressed"
    """Thinned by `on_warning`, or refused as quoted (budget exhausted, breaker open): the ledger's
    atomic reserve refused it at its planned cost and recorded the refusal with its reason."""
    DENIED = "denied"
    """The atomic reserve refused (the budget ran out between quote and reserve)."""


@dataclass(frozen=True)
class ReleaseResult:
    """One release attempt: outcome, id, reason (suppressed / denied) and the bytes published."""

    outcome: ReleaseOutcome
    release_id: str
    metric: str
    window_start: int
    window_end: int
    reason: str = ""
    payload: bytes = b""
    """The stored record that was published (empty when nothing was)."""


@dataclass
class ReleaseCounts:
    """Running totals by outcome, reasons of suppressed/denied ones, and failures (ledger/publish errors).

    Mutable on purpose: updated per release, read on scrape.
    """

    by_outcome: Counter[ReleaseOutcome] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)
    failed: int = 0
    swept: int = 0

    def add(self, result: ReleaseResult) -> None:
        """Count one result."""
        self.by_outcome[result.outcome] += 1
        if result.reason:
            self.reasons[result.reason] += 1

    def snapshot(self) -> dict[str, int]:
        """Flat copy: outcome → count (every outcome present), plus `failed` and `swept`."""
        out = {o.value: self.by_outcome.get(o, 0) for o in ReleaseOutcome}
        out["failed"] = self.failed
        out["swept"] = self.swept
        return out
