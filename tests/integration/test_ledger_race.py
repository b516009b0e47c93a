"""Concurrency against real Redis: a race to exhaustion never overspends; one release_id is charged once."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from dpstream.topology.periods import period_id
from dpstream.workers.ledger import AuditKind, Outcome, ReleaseRequest, open_ledger
from dpstream.workers.ledger.testing import one_scope_topology

DAY = 86_400
P0 = (1_796_000_000 // DAY) * DAY
COST = 0.0003  # 1/COST is not whole: the last grant leaves a remainder nothing fits into
TOPO = dict(epsilon=1.0, reserve=0.0, warn_at=0.9)

_PROCESS = r"""
import asyncio, json, sys
from dpstream.topology.periods import period_id
from dpstream.workers.ledger import Outcome, ReleaseRequest, open_ledger
from dpstream.workers.ledger.testing import one_scope_topology

async def main(url, prefix, clients):
    ledger = await open_ledger(url, one_scope_topology(epsilon=1.0, reserve=0.0, warn_at=0.9))
    granted = []
    print("ready", flush=True)
    sys.stdin.readline()  # wait for "go": all racers start together
    async def client(c):
        i = 0
        while True:
            rid = f"{prefix}-{c}-{i}"
            r = await ledger.charge(ReleaseRequest(rid, "s", period_id(86400, P0), "m", P0, P0 + 86400, 0.0003, b"{}"))
            if r.outcome is not Outcome.CHARGED:
                return
            granted.append(r.cost_units)
            i += 1
    await asyncio.gather(*(client(c) for c in range(clients)))
    await ledger.close()
    print(json.dumps(granted))

P0 = int(sys.argv[3])
asyncio.run(main(sys.argv[1], sys.argv[2], 8))
"""


async def _clients(url: str, n: int, go: Callable[[], None] = lambda: None) -> list[int]:
    ledger = await open_ledger(url, one_scope_topology(**TOPO))
    granted: list[int] = []
    go()  # the other racers start once this ledger is open, so all of them race from the start

    async def client(c: int) -> None:
        i = 0
        while True:
            r = await ledger.charge(
                ReleaseRequest(f"local-{c}-{i}", "s", period_id(DAY, P0), "m", P0, P0 + DAY, COST, b"{}")
            )
            if r.outcome is not Outcome.CHARGED:
                return
            granted.append(r.cost_units)
            i += 1

    await asyncio.gather(*(client(c) for c in range(n)))
    await ledger.close()
    return granted


def test_64_clients_and_4_processes_never_overspend(fresh_redis: Any) -> None:
    """Racing until refused: spent ≤ cap exactly and equals both the charges made and the audit's charges."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _PROCESS, fresh_redis.url, f"proc{k}", str(P0)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for k in range(4)
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"

    def go() -> None:
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()

    local = asyncio.run(_clients(fresh_redis.url, 64, go))
    remote: list[int] = []
    for p in procs:
        out, _ = p.communicate(timeout=300)  # the rest of stdout: the JSON list
        assert p.returncode == 0
        remote += json.loads(out)

    async def check() -> None:
        ledger = await open_ledger(fresh_redis.url, one_scope_topology(**TOPO))
        hist = await ledger.history("s")
        charges = [int(e.fields["cost"]) for e in await ledger.audit("s") if e.kind is AuditKind.CHARGE]
        await ledger.close()
        spent = hist[0].spent_units
        assert spent <= hist[0].cap_units
        assert spent == sum(local) + sum(remote) == sum(charges)
        assert hist[0].cap_units - spent < 300_000_000_001  # exhausted: the next charge could not fit
        assert len(local) > 0 and len(remote) > 0

    asyncio.run(check())


def test_same_release_id_1000_times_concurrently_is_charged_once(fresh_redis: Any) -> None:
    """1,000 concurrent charges of one release_id (each with fresh noise) → one charge, identical bytes returned."""

    async def body() -> None:
        ledger = await open_ledger(fresh_redis.url, one_scope_topology())
        pid = period_id(DAY, P0)
        results = await asyncio.gather(
            *(
                ledger.charge(
                    ReleaseRequest("same", "s", pid, "m", P0, P0 + DAY, 0.01, b'{"noise":%d,"ratio_after":null}' % i)
                )
                for i in range(1000)
            )
        )
        outcomes = [r.outcome for r in results]
        assert outcomes.count(Outcome.CHARGED) == 1 and outcomes.count(Outcome.DUPLICATE) == 999
        assert len({r.payload for r in results}) == 1
        hist = await ledger.history("s")
        assert hist[0].charged == 1 and hist[0].spent_units == 10_000_000_001
        await ledger.close()

    asyncio.run(body())
