"""A budget ledger from Python: in-process or Redis, and where a scope's budget stands.

`open_ledger` opens the same ledger `dpstream replay` and `dpstream budget status` use
(`dpstream.workers.ledger.open_ledger`) behind a sync handle: its calls run on an event loop of
its own (`_sync`), so they work in scripts and notebooks alike.
"""

from __future__ import annotations

__all__ = ["BudgetStatus", "Ledger", "open_ledger"]

import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from dpstream.topology.errors import ConfigError

from ._costs import Cost, cost_in
from ._sync import EventLoopThread

if TYPE_CHECKING:
    from dpstream.topology.accounting import EpsilonEquivalent
    from dpstream.topology.model import Topology
    from dpstream.workers.ledger import Ledger as CoreLedger
    from dpstream.workers.ledger import ScopeStatus
    from dpstream.workers.ledger.types import BreakerInfo

MEMORY = "memory"
"""`open_ledger`'s name of the in-process ledger (it lives as long as the handle)."""


def utc_seconds(value: int | datetime, name: str) -> int:
    """Epoch seconds of a public time given as whole epoch seconds or a timezone-aware datetime."""
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise ConfigError(f"{name} {value.isoformat()}: no time zone; give e.g. datetime(2026, 11, 30, tzinfo=UTC)")
        if value.microsecond:
            raise ConfigError(f"{name} {value.isoformat()}: not a whole second; drop the microseconds")
        return int(value.timestamp())
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} {value!r}: not a time; give epoch seconds (int) or a datetime with tzinfo=UTC")
    return value


@dataclass(frozen=True)
class BudgetStatus:
    """Where a scope's budget stands in its current period (`dpstream budget status`), costs typed.

    `cap`, `spent`, `reserve_left`, `pool_left` and `projected_spend` are `Rho` in a zcdp scope and
    `Epsilon` in a pure one; `epsilon_equiv` is the spend's (ε, δ). `to_json()` is the scope's
    object in `dpstream budget status --json`.
    """

    scope: str
    accounting: str
    state: Literal["normal", "warning", "open"]
    """`warning`: ratio ≥ warn_at (noise stretched or releases thinned); `open`: the breaker, nothing is released."""
    period_id: str
    period_start: datetime
    period_end: datetime
    cap: Cost
    spent: Cost
    ratio: float
    """spent / cap."""
    warn_at: float
    epsilon_equiv: EpsilonEquivalent
    reserve_left: Cost
    pool_left: Cost
    projected_spend: Cost
    """The period's spend at its end, at the current rate."""
    charged: int
    refused: int
    breaker: BreakerInfo | None
    details: ScopeStatus = field(repr=False)

    @classmethod
    def of(cls, status: ScopeStatus) -> BudgetStatus:
        """The typed view of a ledger's `ScopeStatus` (what `await ledger.status(scope)` returns)."""
        from dpstream.topology.accounting import EpsilonEquivalent

        def cost(value: float) -> Cost:
            return cost_in(status.accounting, value)

        return cls(
            scope=status.scope,
            accounting=status.accounting,
            state=status.state.value,
            period_id=status.period_id,
            period_start=datetime.fromtimestamp(status.period_start, tz=UTC),
            period_end=datetime.fromtimestamp(status.period_end, tz=UTC),
            cap=cost(status.cap),
            spent=cost(status.spent),
            ratio=status.ratio,
            warn_at=status.warn_at,
            epsilon_equiv=EpsilonEquivalent(status.epsilon_equiv, status.delta),
            reserve_left=cost(status.reserve_left),
            pool_left=cost(status.pool_left),
            projected_spend=cost(status.projected_spend),
            charged=status.charged,
            refused=status.refused,
            breaker=status.breaker,
            details=status,
        )

    def to_json(self) -> dict[str, Any]:
        """The scope's object as `dpstream budget status --json` prints it (`ledger.reporting.status_json`)."""
        from dpstream.workers.ledger.reporting import status_json

        return status_json(self.details)


class Ledger:
    """A budget ledger (from `open_ledger`): pass it to `replay`, ask it for `status(scope)`; `close()` it.

    Use it as a context manager (`with dpstream.open_ledger(...) as ledger:`) to close it on exit.
    `core` is the async ledger underneath (for `replay_async` and the ledger's full interface), bound
    to this handle's own event loop.
    """

    def __init__(self, core: CoreLedger, loop: EventLoopThread, where: str, topology: Topology | None) -> None:
        self.core = core
        self.where = where
        self.topology = topology
        self._loop = loop

    @property
    def ledger_id(self) -> str | None:
        """The Redis namespace's id that every release record names; None for the in-process ledger."""
        return self.core.ledger_id

    def status(self, scope: str) -> BudgetStatus:
        """Where `scope` stands in its current period (the ledger's clock), as `dpstream budget status`."""
        return BudgetStatus.of(self._loop.run(self.core.status(scope)))

    def scopes(self) -> list[str]:
        """The budget scopes registered in this ledger."""
        return list(self._loop.run(self.core.scopes()))

    def run(self, coro: Any) -> Any:
        """Run a coroutine of `core` on this handle's loop and return its result."""
        return self._loop.run(coro)

    def close(self) -> None:
        """Close the ledger's connections and stop its loop (idempotent)."""
        if not self._loop.closed:
            try:
                self._loop.run(self.core.close())
            finally:
                self._loop.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<dpstream.Ledger {self.where}>"


def open_ledger(
    where: str = MEMORY,
    topology: Topology | None = None,
    *,
    actor: str | None = None,
    now: int | datetime | None = None,
    allow_volatile: bool = False,
) -> Ledger:
    """Open a budget ledger: `"memory"` (in-process, gone when closed) or a Redis URL (`redis://host:6379/0`).

    With a `topology`, its scopes are registered (a Redis ledger is written to, as a worker does)
    and the ledger can price releases for `replay`; without one, it serves `status` only and
    changes nothing. `actor` names you in the ledger's audit trail (default `python:$USER`).
    `now` (in-process only) fixes the ledger's clock at a public time inside a replayed period, so
    that `status` reports that period (a day's end, the next midnight, is already the next day)
    and no replayed window is older than the ledger's idempotency horizon (35 days); the default
    is the wall clock, as in `dpstream replay`. A Redis that is not durable (AOF `appendfsync always`) is refused unless
    `allow_volatile`.
    """
    from dpstream.workers.ledger import open_ledger as open_core

    if now is not None and where != MEMORY:
        raise ConfigError(f"open_ledger({where!r}, now=...): now= fixes the in-process ledger's clock only; drop it")
    fixed = None if now is None else utc_seconds(now, "now")
    who = actor or f"python:{os.environ.get('USER') or 'user'}"
    loop = EventLoopThread()
    try:
        if fixed is None:
            core = loop.run(open_core(where, topology, allow_volatile=allow_volatile, actor=who))
        else:
            core = loop.run(open_core(where, topology, actor=who, clock=lambda: float(fixed)))
    except BaseException:
        loop.close()
        raise
    return Ledger(core, loop, where, topology)
