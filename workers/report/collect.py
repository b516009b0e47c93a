"""Read one budget period of one scope from the ledger: its charges with their stored release
records, refusals, breaker and state changes, grants and the period's terms.

Only what the ledger holds is read (the audit stream and the stored record bytes, i.e. what was
published): no raw event, true aggregate or unit id is ever touched.
"""

from __future__ import annotations

__all__ = ["Charge", "Event", "PeriodData", "collect_period", "schedule_start_read"]

import json
from dataclasses import dataclass, field
from typing import Any

from dpstream.topology.errors import ConfigError
from dpstream.topology.model import Topology
from dpstream.topology.periods import period_id as make_period_id
from dpstream.topology.periods import period_start
from dpstream.workers.ledger import Ledger
from dpstream.workers.ledger.types import AuditKind
from dpstream.workers.ledger.units import UNITS_PER_CURRENCY, share_of_units


@dataclass(frozen=True)
class Charge:
    """One charged release: the audit entry's figures and the stored record (None if past retention)."""

    release_id: str
    metric: str
    at_ms: int
    cost_units: int
    """What the period paid for it (under `max_windows`, what it raised the m largest charges by)."""
    delta_units: int
    spent_units_after: int
    record: dict[str, Any] | None
    release_cost_units: int | None = None
    """The release's own cost when the period paid another amount (`max_windows`); None: `cost_units`."""

    @property
    def cost(self) -> float:
        """The charge in the scope's currency (ρ or ε), as the ledger holds it."""
        return self.cost_units / UNITS_PER_CURRENCY

    @property
    def release_cost(self) -> float:
        """The release's own cost (its noise's), which a period under `max_windows` or a running total's
        later steps may pay less of (or nothing): `cost` otherwise."""
        units = self.cost_units if self.release_cost_units is None else self.release_cost_units
        return units / UNITS_PER_CURRENCY


@dataclass(frozen=True)
class Event:
    """A non-charge audit entry of the period: refusal, breaker, state change, grant."""

    kind: str
    at_ms: int
    metric: str
    reason: str
    state: str
    spent_units: int
    after_charges: int = 0
    """How many of the period's charges precede it in the audit stream (places it on the schedule's clock)."""


@dataclass
class PeriodData:
    """Everything the report reads about one period of one scope."""

    scope: str
    period_id: str
    period_start: int
    period_s: int
    accounting: str
    epsilon: float
    delta: float
    cap_units: int
    reserve_units: int
    warn_units: int
    spent_units: int
    delta_spent_units: int
    topology: Topology
    charges: list[Charge] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    schedule_start: int | None = None
    """The schedule start S (the public schedule): no window starting before it is released. None: unknown
    (no worker recorded one), every window of the period counts."""

    @property
    def first_release_start(self) -> int | None:
        """S when it lies after the period start (the deployment's first period), else None."""
        s = self.schedule_start
        return s if s is not None and s > self.period_start else None


async def collect_period(ledger: Ledger, topology: Topology, scope: str, period: str | None = None) -> PeriodData:
    """The period `period` (default: the newest period block) of `scope`, read from `ledger`."""
    if scope not in topology.budgets:
        known = ", ".join(sorted(topology.budgets))
        raise ConfigError(f"--scope {scope!r}: not a budget scope of {topology.path or 'the topology'}; one of {known}")
    budget = topology.budgets[scope]
    blocks = await ledger.history(scope, 100_000)  # every period block still held
    if not blocks:
        raise ConfigError(f"--scope {scope}: the ledger holds no period of this scope yet: nothing to report")
    if period is None:
        block = blocks[0]
    else:
        found = [b for b in blocks if b.period_id == period]
        if not found:
            have = ", ".join(b.period_id for b in blocks[:5])
            raise ConfigError(f"--period {period!r}: no such period of {scope} in the ledger (newest: {have})")
        block = found[0]
    pid = block.period_id
    data = PeriodData(
        scope=scope,
        period_id=pid,
        period_start=block.start,
        period_s=budget.period_s,
        accounting=budget.accounting.value,
        epsilon=budget.epsilon,
        delta=budget.delta,
        cap_units=block.cap_units,
        reserve_units=block.reserve_units,
        warn_units=share_of_units(block.cap_units, budget.warn_at),
        spent_units=block.spent_units,
        delta_spent_units=block.delta_spent_units,
        topology=topology,
        schedule_start=await schedule_start_read(ledger, topology),
    )
    if make_period_id(budget.period_s, period_start(budget.period_s, block.start)) != pid:
        raise ConfigError(
            f"--scope {scope}: the topology's period length does not match the ledger's; give its topology"
        )
    # Entries of a period are written once its windows close, so never before it starts (an hour of
    # margin for clock skew): reading from there skips the earlier periods' entries.
    for entry in await ledger.audit(scope, (block.start - 3600) * 1000):
        f = entry.fields
        if f.get("period") != pid:
            continue
        if entry.kind is AuditKind.CHARGE:
            rid = f["release_id"]
            raw = await ledger.stored_payload(scope, rid)
            data.charges.append(
                Charge(
                    release_id=rid,
                    metric=f.get("metric", ""),
                    at_ms=entry.at_ms,
                    cost_units=int(f["cost"]),
                    delta_units=int(f.get("delta") or 0),
                    spent_units_after=int(f.get("spent") or 0),
                    record=_decode(raw),
                    release_cost_units=int(f["release_cost"]) if "release_cost" in f else None,
                )
            )
        else:
            data.events.append(
                Event(
                    kind=entry.kind.value,
                    at_ms=entry.at_ms,
                    metric=f.get("metric", ""),
                    reason=f.get("reason", ""),
                    state=f.get("state", ""),
                    spent_units=int(f.get("spent") or 0),
                    after_charges=len(data.charges),
                )
            )
    return data


async def schedule_start_read(ledger: Ledger, topology: Topology) -> int | None:
    """S as the workers use it: the topology's `start:`, else the ledger's own, else the start recorded
    for this topology version. Read only: a report never records one (that would fix S at the report)."""
    if topology.schedule_start is not None:
        return int(topology.schedule_start)
    if ledger.schedule_start is not None:
        return int(ledger.schedule_start)
    recorded = await ledger.recorded_version_schedule_start(topology.topology_version)
    return int(recorded) if recorded is not None else None


def _decode(raw: bytes | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return {"_undecodable": True}
    return doc if isinstance(doc, dict) else {"_undecodable": True}
