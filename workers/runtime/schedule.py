"""The schedule start S: where every metric's public release schedule begins (see dpstream.topology, rule 2).

S is the topology's `start:` when it declares one; otherwise the first start of this topology
version, recorded once in the ledger (the first worker to ask sets it; every later worker, restart
or rebalance reads the same value). Both are public: neither depends on any event. The ingest uses
S to decide which windows exist; the release side gives it to its ledger, which prices the first
period from S (see dpstream.workers.ledger), so every process of one deployment prices alike.
Either S is also recorded with each of the topology's registered scopes (the first S a scope gets
stays), so readers without the topology (`budget status --scope`) project its first period alike.
"""

from __future__ import annotations

__all__ = ["resolve_schedule_start", "schedule_start_of"]

import time

from dpstream.topology.model import Topology
from dpstream.workers.ledger.base import Ledger


async def schedule_start_of(topology: Topology, ledger: Ledger, now: float | None = None) -> int:
    """S in epoch seconds from an open ledger: `start:` of the topology, else the ledger's record
    for this version (recorded now, set-if-absent, when no process recorded one yet). Recorded with
    the topology's registered scopes too (`Ledger.record_schedule_start`)."""
    scopes = sorted(topology.budgets)
    declared = getattr(topology, "schedule_start", None)
    if declared is not None:
        await ledger.record_schedule_start(int(declared), scopes)
        return int(declared)
    proposed = int(time.time() if now is None else now)
    return int(await ledger.version_schedule_start(topology.topology_version, proposed, scopes))


async def resolve_schedule_start(topology: Topology, redis_url: str, now: float | None = None) -> int:
    """S in epoch seconds: `start:` of the topology, else the ledger's record for this version."""
    declared = getattr(topology, "schedule_start", None)
    if declared is not None:
        return int(declared)
    from dpstream.workers.ledger import open_ledger

    ledger = await open_ledger(redis_url, None)
    try:
        return await schedule_start_of(topology, ledger, now)
    finally:
        await ledger.close()
