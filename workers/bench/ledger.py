"""`dpstream bench ledger`: charges/s and latency of the ledger next to a plain INCRBY, same client, same run.

Both phases use one client built by `workers.ledger.redis_backend.connect` (same pool, timeouts)
with N concurrent asyncio tasks, `--seconds` per operation, measured in two alternating halves.
Without `--redis` a throwaway durable Redis (AOF, appendfsync always) is started in a temporary
directory and stopped afterwards.
Target: charge/INCRBY throughput ratio ≥ 0.5 at 16 clients (the atomic script costs at most twice a bare INCRBY).
Each phase also prints what one op costs: this process's CPU (the client, and for a charge the ledger's
Python) and Redis's time (INFO commandstats: INCRBY's own, a charge's apply script), so a ratio that
moves can be told apart from the machine.
"""

from __future__ import annotations

__all__ = ["register", "run_bench", "BenchResult"]

import argparse
import asyncio
import itertools
import json
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from redis.exceptions import RedisError

from dpstream.topology.model import Topology
from dpstream.topology.periods import period_id, period_start
from dpstream.workers.ledger import ReleaseRequest, open_ledger
from dpstream.workers.ledger.redis_backend import connect
from dpstream.workers.ledger.testing import one_scope_topology

_PAYLOAD = (
    b'{"release_id":"%s","metric":"bench","window":{"start":0,"end":60},"values":{"all":1234.5},'
    b'"mechanism":"gaussian","noise":{"scale":172.1,"stddev":172.1},"cost":{"rho":1e-9},'
    b'"budget":{"scope":"bench","period":"p","ratio_after":null},"published_at":"2026-11-30T00:00:00Z"}'
)


@dataclass(frozen=True)
class Phase:
    """One measured phase."""

    ops: int
    seconds: float
    per_second: float
    p50_ms: float
    p99_ms: float
    client_cpu_us: float = float("nan")
    """This process's CPU µs per op (the client, and for a charge the ledger's Python too)."""
    server_us: float | None = None
    """Redis's µs per op in INFO commandstats: INCRBY's own, or a charge's apply script (None: not told)."""


@dataclass(frozen=True)
class BenchResult:
    """Both phases and the throughput ratio charge / INCRBY."""

    clients: int
    seconds: float
    incrby: Phase
    charge: Phase
    ratio: float
    redis: str


def _bench_topology() -> Topology:
    """One pure scope with a large cap and one metric, so the run never exhausts it."""
    return one_scope_topology("bench", epsilon=1000.0, metrics=(("bench", 1.0, 60, 60, False),))


async def _phase(clients: int, seconds: float, op: Callable[[int, int], Awaitable[object]]) -> Phase:
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def worker(w: int) -> None:
        i = 0
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            await op(w, i)
            latencies.append(time.perf_counter() - t0)
            i += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(clients)))
    elapsed = time.perf_counter() - start
    latencies.sort()
    n = len(latencies)
    return Phase(n, elapsed, n / elapsed, latencies[n // 2] * 1e3, latencies[min(n - 1, int(n * 0.99))] * 1e3)


async def _server_usec(client: Any, command: str) -> tuple[int, int]:
    """(calls, µs) of `command` so far in the server's INFO commandstats ((0, 0): it does not say)."""
    try:
        row = (await client.info("commandstats")).get(f"cmdstat_{command}", {})
    except RedisError:  # an ACL without INFO: the server figure is left out
        return 0, 0
    return int(row.get("calls", 0)), int(row.get("usec", 0))


async def _costed(
    clients: int, seconds: float, op: Callable[[int, int], Awaitable[object]], client: Any, command: str
) -> Phase:
    """`_phase`, with the client's CPU and the server's time per op (`command`'s, from INFO commandstats)."""
    calls, usec = await _server_usec(client, command)
    cpu = time.process_time()
    phase = await _phase(clients, seconds, op)
    cpu = time.process_time() - cpu
    calls_after, usec_after = await _server_usec(client, command)
    server = (usec_after - usec) / phase.ops if calls_after > calls and phase.ops else None
    return replace(phase, client_cpu_us=cpu / max(1, phase.ops) * 1e6, server_us=server)


def _merge(phases: list[Phase]) -> Phase:
    """Throughput over all halves; latency percentiles as the worse half's (conservative); costs per op
    over all halves."""
    ops = sum(p.ops for p in phases)
    secs = sum(p.seconds for p in phases)
    told = [(p.server_us, p.ops) for p in phases if p.server_us is not None]
    return Phase(
        ops,
        secs,
        ops / secs,
        max(p.p50_ms for p in phases),
        max(p.p99_ms for p in phases),
        sum(p.client_cpu_us * p.ops for p in phases) / max(1, ops),
        sum(us * n for us, n in told) / max(1, ops) if len(told) == len(phases) else None,
    )


async def run_bench(url: str, clients: int, seconds: float, allow_volatile: bool = False) -> BenchResult:
    """Measure INCRBY, then charge, on the Redis at `url`."""
    client = connect(url, max_connections=max(clients, 1))
    ledger = await open_ledger(
        url, _bench_topology(), actor="bench", max_connections=max(clients, 1), allow_volatile=allow_volatile
    )
    run = uuid.uuid4().hex[:8]
    fresh = itertools.count()  # release ids unique across the halves: every charge is a new release
    counter = f"dpstream:bench:{run}:incrby"
    now = time.time()
    pstart = period_start(86_400, now)
    pid = period_id(86_400, now)

    async def incr(w: int, i: int) -> object:
        return await client.incrby(counter, 1000)

    async def charge(w: int, i: int) -> object:
        rid = f"{run}-{next(fresh)}"
        return await ledger.charge(
            ReleaseRequest(
                rid, "bench", pid, "bench", pstart, pstart + 60, 1e-9, _PAYLOAD % rid.encode(), actor="bench"
            )
        )

    try:
        await _phase(clients, min(0.5, seconds), incr)  # warm up connections
        # alternate halves (INCRBY, charge, INCRBY, charge) so load drift on the host hits both alike
        incs, ress = [], []
        for _ in range(2):
            incs.append(await _costed(clients, seconds / 2, incr, client, "incrby"))
            ress.append(await _costed(clients, seconds / 2, charge, client, "evalsha"))
        inc, res = _merge(incs), _merge(ress)
        await client.delete(counter)
    finally:
        await client.aclose()  # type: ignore[attr-defined]  # types-redis 4.6 predates aclose (redis >= 5.0.1)
        await ledger.close()
    return BenchResult(clients, seconds, inc, res, res.per_second / inc.per_second, url)


def _main(args: argparse.Namespace) -> int:
    if args.redis:
        result = asyncio.run(run_bench(args.redis, args.clients, args.seconds, args.allow_volatile))
    else:
        from dpstream.workers.localstack import RedisHandle, free_port

        with tempfile.TemporaryDirectory(prefix="dpstream-bench-") as tmp:
            handle = RedisHandle(free_port(), Path(tmp))
            handle.start()
            try:
                result = asyncio.run(run_bench(handle.url, args.clients, args.seconds))
            finally:
                handle.stop()
    if args.json:
        print(json.dumps(asdict(result), indent=2))
    else:
        print(f"ledger bench: {result.clients} clients, {result.seconds:g} s per phase, {result.redis}")
        for name, p in (("INCRBY", result.incrby), ("charge", result.charge)):
            print(
                f"  {name:<8} {p.per_second:10.0f} ops/s   "
                f"p50 {p.p50_ms:7.3f} ms   p99 {p.p99_ms:7.3f} ms   ({p.ops} ops)   "
                f"client CPU {p.client_cpu_us:6.1f} µs/op   "
                + ("Redis n/a" if p.server_us is None else f"Redis {p.server_us:5.1f} µs/op")
            )
        print(f"  ratio charge/INCRBY = {result.ratio:.3f}  (acceptance: >= 0.5 at 16 clients)")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `bench ledger`."""
    p = subparsers.add_parser("ledger", help="ledger charges/s and latency vs plain INCRBY")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--redis", metavar="URL", help="use this Redis instead of a throwaway one")
    p.add_argument("--allow-volatile", action="store_true", help="accept a --redis without AOF fsync always")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_main)
