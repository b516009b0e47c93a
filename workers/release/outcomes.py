"""Release outcomes and their counters (read by the Prometheus layer; no values, no keys)."""

from __future__ import annotations

__all__ = ["ReleaseOutcome", "ReleaseResult", "ReleaseCounts", "refusal_outcome"]

from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple


class ReleaseOutcome(Enum):
    """What happened to one window's release (the `outcome` label of `dpstream_releases_total`)."""

    PUBLISHED = "published"
    """Charged now and published."""
    DUPLICATE = "duplicate"
    """Known release_id: the stored bytes were (re)published, nothing charged, fresh noise discarded."""
    REFUSED_BUDGET = "refused_budget"
    """Not published for want of budget: the cap, the pool outside the reserve or the selection δ
    cannot hold it, or `on_warning: thin` skips it; the ledger refused and audited it atomically."""
    REFUSED_BREAKER = "refused_breaker"
    """Not published: the scope's breaker is open (automatically at exhaustion, or by an operator)."""
    LEDGER_UNAVAILABLE = "ledger_unavailable"
    """The ledger could not be reached (fail closed): nothing published; the window is retried."""
    FAILED = "failed"
    """Any other error (publish, a bug): nothing published unless charged; the window is retried."""
    EXPIRED = "expired"
    """Not published, never to be: the window is older than the ledger's idempotency horizon (its
    release record may be gone), so it is neither noised nor charged again; not retried."""

    # Members are singletons compared by identity, so the identity hash agrees with `==`; Enum's own
    # `__hash__` (hash of the name) is a Python call, paid twice per counted release.
    __hash__ = object.__hash__


def refusal_outcome(reason: str) -> ReleaseOutcome:
    """The outcome of a refused charge, from the ledger's reason (breaker refusals name the breaker)."""
    return ReleaseOutcome.REFUSED_BREAKER if reason.startswith("breaker open") else ReleaseOutcome.REFUSED_BUDGET


class ReleaseResult(NamedTuple):
    """One release attempt: outcome, id, reason (refused ones) and the bytes published."""

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
    """Running totals by outcome (errors included), reasons of refused ones, and sweeper republishes.

    Mutable on purpose: updated per release, read on scrape.
    """

    by_outcome: Counter[ReleaseOutcome] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)
    swept: int = 0
    clamped: Counter[str] = field(default_factory=Counter)
    """metric → keys whose true value was clamped to the fixed-point grid's range before noise, over the
    releases charged here (an un-noised fact about the data: curator-only, never in a record)."""

    def add(self, result: ReleaseResult) -> None:
        """Count one result."""
        self.by_outcome[result.outcome] += 1
        if result.reason:
            self.reasons[result.reason] += 1

    def error(self, outcome: ReleaseOutcome) -> None:
        """Count one attempt that raised (`LEDGER_UNAVAILABLE` or `FAILED`)."""
        self.by_outcome[outcome] += 1

    @property
    def failed(self) -> int:
        """Attempts that raised, whatever the cause (they are retried)."""
        return self.by_outcome[ReleaseOutcome.FAILED] + self.by_outcome[ReleaseOutcome.LEDGER_UNAVAILABLE]

    def snapshot(self) -> dict[str, int]:
        """Flat copy: outcome → count (every outcome present), plus `swept`."""
        out = {o.value: self.by_outcome.get(o, 0) for o in ReleaseOutcome}
        out["swept"] = self.swept
        return out
