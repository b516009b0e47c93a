"""The ledger's reports in their documented JSON shapes, for the CLI, the demo and anyone reading a ledger.

`status_json` is one scope's `ScopeStatus` as `dpstream budget status --json` prints it (the
README quotes this shape):

    {"status_version": 2,                                                # 2: `releases.charged` is `releases.charged`
     "scope": "web-daily", "accounting": "zcdp", "state": "normal",     # normal | warning | open
     "period": {"id": "2026-11-30", "start": "2026-11-30T00:00:00Z", "end": "2026-12-01T00:00:00Z",
                "seconds_left": 38400},
     "cap": 0.024356, "spent": 0.0071, "ratio": 0.2915,                 # in the scope's currency (ρ or ε)
     "epsilon_equiv": 0.49, "delta": 9e-07, "warn_at": 0.8,             # ε of the spend at δ, the δ the cap was
                                                                        # converted at (zCDP: 0.9 of the scope's δ
                                                                        # when a metric selects keys), or ε itself
     "delta_spent": 0.0, "delta_cap": 1e-07,                            # partition-selection δ of the period
     "releases": {"charged": 812, "refused": 0},
     "reserve_left": 0.004871, "pool_left": 0.012414,
     "projected": {"spend": 0.0112, "ratio": 0.46},                     # at the current rate, at period end
     "breaker": null,                                                   # or {"manual", "reason", "actor", "at"}
     "units": {"cap": 24356000000, "spent": 7100000000}}                # exact integers (1e-12)

`parked_json` is one parked window as `dpstream budget parked --json` lists it (and `budget status
--json` adds `"parked": N` per scope):

    {"release_id": "3e84…", "scope": "web-daily", "metric": "page_views",
     "window": {"start": "2026-11-30T10:00:00Z", "end": "2026-11-30T11:00:00Z"},
     "attempts": 8, "error": "MessageSizeTooLargeError", "parked_at": "2026-11-30T11:04:10Z",
     "state": "parked",                                                 # or "retry": the worker retries it
     "retry": null}                                                     # or {"actor", "reason"}
"""

from __future__ import annotations

__all__ = ["STATUS_VERSION", "iso", "parked_json", "status_json"]

from datetime import UTC, datetime
from typing import Any

from dpstream.workers.ledger.types import ParkedRelease, ScopeStatus

STATUS_VERSION = 2
"""The version of `status_json`'s shape. 2: the count of charged releases is `releases.charged`
(v1: `releases.granted`); "grant" now means only an operator's grant of reserve."""


def iso(ts: float) -> str:
    """UTC ISO-8601 with a Z, to the second: `iso(0) == "1970-01-01T00:00:00Z"`."""
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_json(s: ScopeStatus) -> dict[str, Any]:
    """One scope's status as the documented JSON object (see the module docstring)."""
    return {
        "status_version": STATUS_VERSION,
        "scope": s.scope,
        "accounting": s.accounting,
        "state": s.state.value,
        "period": {
            "id": s.period_id,
            "start": iso(s.period_start),
            "end": iso(s.period_end),
            "seconds_left": s.seconds_to_period_end,
        },
        "cap": s.cap,
        "spent": s.spent,
        "ratio": s.ratio,
        "epsilon_equiv": s.epsilon_equiv,
        "delta": s.delta,
        "delta_spent": s.delta_spent,
        "delta_cap": s.delta_cap,  # partition-selection δ of the period
        "warn_at": s.warn_at,
        "releases": {"charged": s.charged, "refused": s.refused},
        "reserve_left": s.reserve_left,
        "pool_left": s.pool_left,
        "projected": {"spend": s.projected_spend, "ratio": s.projected_ratio},
        "breaker": None
        if s.breaker is None
        else {
            "manual": s.breaker.manual,
            "reason": s.breaker.reason,
            "actor": s.breaker.actor,
            "at": iso(s.breaker.at_ms / 1000),
        },
        "units": {"cap": s.cap_units, "spent": s.spent_units},
    }


def parked_json(p: ParkedRelease) -> dict[str, Any]:
    """One parked window in `budget parked --json`'s shape (schedule facts and an error class only)."""
    return {
        "release_id": p.release_id,
        "scope": p.scope,
        "metric": p.metric,
        "window": {"start": iso(p.window_start), "end": iso(p.window_end)},
        "attempts": p.attempts,
        "error": p.error,
        "parked_at": iso(p.parked_at_ms / 1000),
        "state": p.state,
        "retry": {"actor": p.retry_actor, "reason": p.retry_reason} if p.state == "retry" else None,
    }
