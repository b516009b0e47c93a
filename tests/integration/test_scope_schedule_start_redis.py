"""The schedule start S recorded with each scope, on a real Redis (and the contract on both backends).

`budget status --scope s` without `--topology` used to project a first period from the period start
while `--topology` (and the budget gauges) projected from S: 40x apart. Pinned clocks throughout.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from dpstream.topology.errors import ConfigError
from dpstream.topology.periods import period_id, period_start
from dpstream.workers.cli import main
from dpstream.workers.commands import budget as budget_command
from dpstream.workers.ledger import ReleaseRequest, open_ledger
from dpstream.workers.ledger.keys import ScopeKeys
from dpstream.workers.ledger.testing import ManualClock, one_scope_topology
from dpstream.workers.runtime.schedule import schedule_start_of
from dpstream.workers.telemetry.budget import BudgetReader

DAY = 86_400
HOUR = 3600
_TOPOLOGY = """\
version: 1
sources:
  src: {topic: t, privacy_unit: user_id, timestamp: ts}
budgets:
  s: {epsilon: 1.0, accounting: pure, period: 1d}
metrics:
  m: {source: src, budget: s, window: {tumbling: 1h}, aggregate: count, mechanism: laplace}
sinks: {releases: r, dead_letter: d}
"""
_TIMES_OF_DAY = [(0, 30), (6, 0), (11, 59), (12, 1), (23, 59)]


@pytest.fixture
def where(request: pytest.FixtureRequest) -> str:
    """'memory' or the fresh session Redis (parametrized indirectly)."""
    if request.param == "memory":
        return "memory"
    return request.getfixturevalue("fresh_redis").url


def _status_json(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["budget", "status", "--json", *args]) == 0
    (s,) = json.loads(capsys.readouterr().out)["scopes"]
    return s


@pytest.mark.parametrize(("hour", "minute"), _TIMES_OF_DAY, ids=[f"{h:02d}:{m:02d}" for h, m in _TIMES_OF_DAY])
def test_status_with_and_without_the_topology_and_the_gauges_project_alike(
    fresh_redis: Any,
    tmp_path: Any,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    hour: int,
    minute: int,
) -> None:
    """A worker resolved S halfway into the first period and charged once: `budget status --scope s` (no
    topology), the same with `--topology` and the budget gauges all project ratio x (end - S) / (now - S)."""
    from dpstream.topology.loader import load_topology

    path = tmp_path / "topology.yaml"
    path.write_text(_TOPOLOGY)
    topo = load_topology(str(path))
    now = datetime(2026, 3, 10, hour, minute, tzinfo=UTC).timestamp()
    monkeypatch.setattr(budget_command, "clock", lambda: now)
    pstart = period_start(DAY, now)
    start = pstart + int(now - pstart) // 2

    async def worker() -> None:
        ledger = await open_ledger(fresh_redis.url, topo, clock=lambda: now)
        try:
            assert await schedule_start_of(topo, ledger, now=start) == start
            req = ReleaseRequest("r0", "s", period_id(DAY, now), "m", pstart, pstart + HOUR, 0.01, b"{}")
            await ledger.charge(req)
        finally:
            await ledger.close()

    async def gauges() -> list[float]:
        reader = await open_ledger(fresh_redis.url, None, clock=lambda: now)
        try:
            out = []
            for topology in (topo, None):
                (figures,) = await BudgetReader(topology, clock=lambda: now).read(reader)
                out.append(figures.projected_ratio)
            return out
        finally:
            await reader.close()

    asyncio.run(worker())
    without = _status_json(["--scope", "s", "--redis", fresh_redis.url], capsys)
    with_topology = _status_json(["--topology", str(path), "--redis", fresh_redis.url], capsys)
    exporter, exporter_plain = asyncio.run(gauges())
    expected = 0.01 * (pstart + DAY - start) / (now - start)
    assert without["projected"]["ratio"] == pytest.approx(expected, rel=1e-9)
    assert with_topology["projected"]["ratio"] == without["projected"]["ratio"]
    assert exporter == exporter_plain == without["projected"]["ratio"]


def test_the_scope_s_survives_re_registration_and_a_later_version(fresh_redis: Any) -> None:
    """A changed config (a larger cap, registered again) keeps the scope's S; a later topology version
    records its own per-version S (first start wins, as before) and leaves the scope's as it was."""
    p0 = (1_796_000_000 // DAY) * DAY
    s1, s2 = p0 + 6 * HOUR, p0 + 9 * HOUR
    clock = ManualClock(p0 + 12 * HOUR)
    v1 = one_scope_topology()
    v2 = one_scope_topology(epsilon=2.0)
    assert v1.topology_version != v2.topology_version

    async def body() -> tuple[int | None, int | None, int | None, int | None]:
        a = await open_ledger(fresh_redis.url, v1, clock=clock)
        try:
            assert await schedule_start_of(v1, a, now=s1) == s1
        finally:
            await a.close()
        b = await open_ledger(fresh_redis.url, v2, clock=clock)  # registers the larger cap
        try:
            assert await schedule_start_of(v2, b, now=s2) == s2
            return (
                await b.recorded_schedule_start("s"),
                (await b.status("s")).schedule_start,
                await b.recorded_version_schedule_start(v1.topology_version),
                await b.recorded_version_schedule_start(v2.topology_version),
            )
        finally:
            await b.close()

    assert asyncio.run(body()) == (s1, s1, s1, s2)
    with fresh_redis.client() as client:
        assert client.hget(ScopeKeys("s").config, "schedule_start") == str(s1).encode()
        assert client.hget(ScopeKeys("s").config, "cap") is not None


@pytest.mark.parametrize("where", ["memory", "redis"], indirect=True)
def test_contract_a_scope_keeps_its_first_s_and_an_unregistered_one_gets_none(where: str) -> None:
    """Both backends: the first S recorded with a scope stays (version_schedule_start of any version, or
    record_schedule_start); recording S for a scope not registered writes nothing; a bad S is refused."""
    topo = one_scope_topology()
    clock = ManualClock(1_796_000_000)

    async def body() -> list[int | None]:
        ledger = await open_ledger(where, topo, clock=clock)
        try:
            seen = [await ledger.recorded_schedule_start("s")]
            assert await ledger.version_schedule_start("v1", 1_000) == 1_000
            seen.append(await ledger.recorded_schedule_start("s"))
            assert await ledger.version_schedule_start("v2", 2_000) == 2_000
            await ledger.record_schedule_start(3_000)
            seen.append(await ledger.recorded_schedule_start("s"))
            await ledger.record_schedule_start(4_000, ["unregistered"])
            with pytest.raises(ConfigError, match="not registered"):
                await ledger.status("unregistered")
            with pytest.raises(Exception, match="whole epoch seconds"):
                await ledger.record_schedule_start(-1)
            seen.append((await ledger.status("s", 5_000)).schedule_start)  # an explicit S still wins
            return seen
        finally:
            await ledger.close()

    assert asyncio.run(body()) == [None, 1_000, 1_000, 5_000]


def test_a_worker_recording_before_registration_leaves_the_scope_to_its_release_side(fresh_redis: Any) -> None:
    """The ingest resolves S on a ledger opened without the topology, maybe before any worker registered
    the scope: nothing is written then; the release side, which registers first, records the same S."""
    from dpstream.workers.runtime.schedule import resolve_schedule_start

    topo = replace(one_scope_topology(), schedule_start=None)
    clock = ManualClock(1_796_000_000)

    async def body() -> tuple[int, list[str], int | None]:
        s = await resolve_schedule_start(topo, fresh_redis.url, now=1_795_990_000)
        reader = await open_ledger(fresh_redis.url, None, clock=clock)
        try:
            registered = await reader.scopes()
        finally:
            await reader.close()
        worker = await open_ledger(fresh_redis.url, topo, clock=clock)
        try:
            assert await schedule_start_of(topo, worker, now=1_796_000_000) == s  # the first start wins
            return s, registered, await worker.recorded_schedule_start("s")
        finally:
            await worker.close()

    s, registered, scope_s = asyncio.run(body())
    assert s == 1_795_990_000 and registered == [] and scope_s == s
