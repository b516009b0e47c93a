"""The schedule start S is recorded with each scope, so every reader projects a first period from one S.

In-process ledger, pinned clock: status with S given (what `budget status --topology` and the release
side know), status without it (`budget status --scope X`), and the budget gauges agree.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from dpstream.topology.errors import ConfigError
from dpstream.topology.loader import load_topology_text
from dpstream.topology.model import Topology
from dpstream.topology.periods import period_id
from dpstream.workers.ledger import Ledger, Outcome, ReleaseRequest, open_ledger
from dpstream.workers.ledger.testing import ManualClock
from dpstream.workers.runtime.schedule import schedule_start_of
from dpstream.workers.telemetry.budget import BudgetReader

_YAML = """
version: 1
sources:
  s: {topic: t, privacy_unit: user_id, timestamp: ts}
budgets:
  b: {epsilon: 1.0, accounting: pure, period: 1d}
metrics:
  pages:
    source: s
    budget: b
    window: {tumbling: 1h}
    aggregate: count
    mechanism: laplace
sinks: {releases: r, dead_letter: d}
"""
DAY = 86_400
HOUR = 3600
P0 = (1_796_000_000 // DAY) * DAY
S = P0 + 6 * HOUR  # the first worker started at 06:00
NOW = P0 + 12 * HOUR + 1800  # read at 12:30, in the deployment's first period


async def _charged(topology_yaml: str = _YAML) -> tuple[Topology, Ledger]:
    """A ledger whose worker recorded S (at 06:00) and charged one window; read at 12:30."""
    topology = load_topology_text(topology_yaml)
    ledger = await open_ledger("memory", topology, clock=ManualClock(NOW))
    assert await schedule_start_of(topology, ledger, now=S) == (topology.schedule_start or S)
    req = ReleaseRequest("r0", "b", period_id(DAY, P0), "pages", S, S + HOUR, 0.01, b"{}")
    assert (await ledger.charge(req)).outcome is Outcome.CHARGED
    return topology, ledger


def test_status_projects_a_first_period_from_the_scope_s_with_or_without_it_given() -> None:
    """status("b") (no S given, as without --topology) projects from S like status("b", S): the ratio
    times (end − S) / (now − S), not times a day / (now − period start)."""

    async def body() -> tuple[float, float, int | None]:
        _, ledger = await _charged()
        given = await ledger.status("b", S)
        plain = await ledger.status("b")
        return given.projected_ratio, plain.projected_ratio, getattr(plain, "schedule_start", None)

    given, plain, start = asyncio.run(body())
    assert plain == given == pytest.approx(0.01 * (P0 + DAY - S) / (NOW - S), rel=1e-9)
    assert plain > 0.01 * DAY / (NOW - P0)  # from the period start it would project less
    assert start == S


def test_the_gauges_project_what_status_projects_with_and_without_a_topology() -> None:
    """The budget gauges' projected ratio (with the topology, and without one) is status's."""

    async def body() -> tuple[float, float, float]:
        topology, ledger = await _charged()
        clock = ManualClock(NOW)
        status = await ledger.status("b")
        with_topology = (await BudgetReader(topology, clock=clock).read(ledger))[0]
        without = (await BudgetReader(None, clock=clock).read(ledger))[0]
        return status.projected_ratio, with_topology.projected_ratio, without.projected_ratio

    status, with_topology, without = asyncio.run(body())
    assert with_topology == without == status == pytest.approx(0.01 * (P0 + DAY - S) / (NOW - S), rel=1e-9)


def test_a_scope_keeps_the_first_s_recorded_with_it() -> None:
    """A later topology version (S2 at 09:00, the same period) records its own per-version S but leaves
    the scope's: no spend of the scope precedes the first S, so the projection does not jump at a deploy."""

    async def body() -> tuple[int, int | None, float, float]:
        _, ledger = await _charged()
        before = (await ledger.status("b")).projected_ratio
        s2 = await ledger.version_schedule_start("v2", S + 3 * HOUR)
        after = (await ledger.status("b")).projected_ratio
        return s2, await ledger.recorded_schedule_start("b"), before, after

    s2, scope_s, before, after = asyncio.run(body())
    assert s2 == S + 3 * HOUR and scope_s == S and after == before


def test_a_declared_start_is_recorded_with_the_scope() -> None:
    """`start:` in the topology is S too: recorded with the scope, so a reader without it projects from it."""
    declared = P0 + 4 * HOUR
    yaml = _YAML.replace("version: 1\n", f"version: 1\nstart: {declared}\n", 1)

    async def body() -> tuple[int | None, int | None]:
        topology, ledger = await _charged(yaml)
        assert topology.schedule_start == declared
        return await ledger.recorded_schedule_start("b"), (await ledger.status("b")).schedule_start

    assert asyncio.run(body()) == (declared, declared)


def test_an_unregistered_scope_gets_no_s() -> None:
    """A scope not registered yet is skipped (its worker records S after registering it): recording
    S creates no scope."""

    async def body() -> None:
        topology = load_topology_text(_YAML)
        reader = await open_ledger("memory", None, clock=ManualClock(NOW))
        await reader.record_schedule_start(S, ["b"])
        with pytest.raises(ConfigError, match="not registered"):
            await reader.status("b")
        other = replace(topology, schedule_start=None)
        ledger = await open_ledger("memory", other, clock=ManualClock(NOW))
        assert await ledger.recorded_schedule_start("b") is None  # registered, no worker recorded S yet
        assert (await ledger.status("b")).schedule_start is None

    asyncio.run(body())
