"""The budget ledger: atomic, idempotent, adaptive, audited spend with a breaker.

    ledger = await open_ledger("redis://localhost:6379/0", topology)   # or "memory"
    q = await ledger.quote(metric, window_start, window_end)            # adaptive allowance, state
    r = await ledger.charge(ReleaseRequest(...))                       # CHARGED | DUPLICATE | REFUSED
    await ledger.commit(scope, release_id)                              # charged -> published
    start = await ledger.version_schedule_start(topology_version, int(time.time()))  # first start wins (also per scope)
    ledger.use_schedule_start(start)                                    # price from S
    ledger.ledger_id                                                    # this namespace's id (None: in-process)

Each Redis namespace has an id, created once by the first `open_ledger` (`ledger.identity`); every
release record names it (`ledger`), and the in-process ledger has none (`null`: charged to no ledger).

One interface, two backends (Redis for production, in-process for `replay` and tests), one
contract test suite.

A period's terms are fixed when it opens: its block copies cap, reserve, warn threshold,
accounting, selection-δ cap and period length at its first charge, refusal or grant, and every
check in that period uses them. `open_ledger` registers the topology's scopes and the newest registration wins for
future periods; while the current period's block exists, a registration that changes the
accounting or period length, or shrinks the cap, is refused with a one-line ConfigError. Every
charge carries the worker's config digest: a worker whose topology disagrees with the scope's
registered one is refused (counted and audited), never charged under the other topology's terms.

A release charges its ρ/ε and its partition-selection δ (`ReleaseRequest.delta`, integer units
of 1e-18 against each period's `delta_cap`) to its period and to every later period its window
touches (`ReleaseRequest.extra_periods`), in one atomic call: all or nothing.

Spend is stored as integers in fixed units, charges rounded up, so no float drift can hide an
overspend; all keys of one scope share a hash tag (Redis-Cluster safe). Every step is decided once,
in Python (`decision`: a charge; `steps`: registration, S, grants, the breaker, parking), as writes
on the scope's keys (`state.Op`); the in-process ledger applies them under its lock, Redis with
`lua/apply.lua`, which writes only if the scope's `seq` is still the one decided on and checks the
invariants (known release id, no overspend, fixed terms) itself, before its first write. A charge
is durable before anything is published (AOF `appendfsync always`, `WAIT` for a replica).
Allocation is adaptive: what is left,
cap − reserve − spent, is re-divided at every release over the releases still to come (from the
schedule start S), in proportion to each metric's planned remaining spend, as in the public order
of the period's releases whichever order they were charged in (`allocation.price_in_order`: a
quote says when the period's charges are out of that order, and is priced again with its
`Backlog`, read with `charged_ends`); the reserve is drawn
only by an audited operator action or a metric marked `may_use_reserve`. States: normal → warning
(ratio ≥ warn_at: the policy stretches noise or thins releases) → open (the next release cannot
fit, or an operator opened it). A new period is a new block, never a reset; it closes an
automatically opened breaker, while a manually opened one stays open until an operator closes it.
A release older than the idempotency horizon is refused as `expired`. A refund never happens.
"""

from __future__ import annotations

__all__ = [
    "open_ledger",
    "Ledger",
    "ReleaseRequest",
    "ChargeResult",
    "Outcome",
    "Quote",
    "State",
    "PendingRelease",
    "ScopeStatus",
    "PeriodSummary",
    "AuditEntry",
    "AuditKind",
    "BreakerInfo",
    "ReconcileReport",
    "LedgerUnavailable",
]

import time
from collections.abc import Callable
from typing import Any

from dpstream.topology.model import Topology
from dpstream.workers.ledger.base import DEFAULT_RETENTION_S, Ledger
from dpstream.workers.ledger.config import scope_configs
from dpstream.workers.ledger.errors import LedgerUnavailable
from dpstream.workers.ledger.types import (
    AuditEntry,
    AuditKind,
    BreakerInfo,
    ChargeResult,
    Outcome,
    PendingRelease,
    PeriodSummary,
    Quote,
    ReconcileReport,
    ReleaseRequest,
    ScopeStatus,
    State,
)

MEMORY = "memory"


async def open_ledger(
    where: str,
    topology: Topology | None = None,
    *,
    allow_volatile: bool = False,
    actor: str = "worker",
    clock: Callable[[], float] = time.time,
    retention_s: int = DEFAULT_RETENTION_S,
    max_connections: int = 128,
    schedule_start: int | None = None,
) -> Ledger:
    """Open the ledger at `where` ("memory" or a ledger URL: `ledger.connection`) and register its scopes.

    A Redis that is not durable (AOF with `appendfsync always`) is refused with a ConfigError
    unless `allow_volatile`; an unreachable one raises LedgerUnavailable. Without a topology
    the ledger serves the read and operator calls of the CLI only. `schedule_start` is the
    schedule start S the ledger prices with (`Ledger.use_schedule_start`); None counts every window
    of a period as still to come.
    """
    configs = scope_configs(topology) if topology is not None else {}
    options: dict[str, Any] = {"clock": clock, "retention_s": retention_s, "schedule_start": schedule_start}
    if where == MEMORY:
        from dpstream.workers.ledger.memory import MemoryLedger

        ledger: Ledger = MemoryLedger(configs, **options)
    else:
        from dpstream.workers.ledger.connection import LedgerAddress
        from dpstream.workers.ledger.redis_backend import RedisLedger, connect

        address = LedgerAddress.parse(where)
        redis_ledger = RedisLedger(connect(address, max_connections), address, configs, **options)
        try:
            await redis_ledger.check_durability(allow_volatile)  # the primary's and every replica's
            await redis_ledger.load_scripts()
        except BaseException:
            await redis_ledger.close()
            raise
        ledger = redis_ledger
    try:
        await ledger.register(actor)
        if topology is not None:  # a process that releases: it names its ledger in every record
            await ledger.resolve_ledger_id()
    except BaseException:
        await ledger.close()
        raise
    return ledger
