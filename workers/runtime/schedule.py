"""The deployment start S: where every metric's public release schedule begins (see dpstream.topology, rule 2).

S is the topology's `start:` when it declares one; otherwise the first start of this topology
version, recorded once in the ledger (the first worker to ask sets it; every later worker, restart
or rebalance reads the same value). Both are public: neither depends on any event. The ingest uses
S to decide which windows exist; the release side gives it to its ledger, which prices the first
period from S (see dpstream.workers.ledger), so every process of one deployment prices alike.
"""

from __future__ import annotations

__all__ = ["resolve_schedule_start", "schedule_start_of"]

import time

from dpstream.topology.model import Topology
from dpstream.workers.ledger.base import Ledger


async def schedule_start_of(topology: Topology, ledger: Ledger, now: float | None = None) -> int:
    """S in epoch seconds from an open ledger: `start:` of the topology, else the ledger's record
    for this version (recorded now, set-if-absent, when no process recorded one yet)."""
    declared = getattr(topology, "start_s", None)
    if declared is not None:
        return int(declared)
    return int(await ledger.deployment_start(topology.topology_version, int(time.time() if now is None else now)))


async def resolve_schedule_start(topology: Topology, redis_url: str, now: float | None = None) -> int:
    """S in epoch seconds: `start:` of the topology, else the ledger's record for this version."""
    declared = getattr(topology, "start_s", None)
    if declared is not None:
        return int(declared)
    from dpstream.workers.ledger import open_ledger

    ledger = await open_ledger(redis_url, None)
    try:
        return await schedule_start_of(topology, ledger, now)
    finally:
        await ledger.close()
