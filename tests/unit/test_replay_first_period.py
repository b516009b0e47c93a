"""A deployment that starts inside a period spends that period's pool on the windows it releases: the whole
first period from S = 06:30, released window by window through the Releaser and the in-process ledger, ends
where a whole period does, with no release taking the shares of windows that were never released."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict

from dpstream.topology.loader import load_topology_text
from dpstream.topology.periods import period_id
from dpstream.workers.ledger import AuditKind, open_ledger
from dpstream.workers.ledger.config import scope_configs
from dpstream.workers.ledger.testing import ManualClock
from dpstream.workers.runtime.replay import replay_lines

DAY = 86_400
HOUR = 3_600
P0 = (1_796_000_000 // DAY) * DAY  # a UTC day boundary

_YAML = """
version: 1
sources:
  s: {topic: t, privacy_unit: user_id, timestamp: ts, allowed_lateness: 30s}
budgets:
  b: {epsilon: 1.0, delta: 1.0e-6, accounting: zcdp, period: 1d, reserve: 0.2, warn_at: 0.8}
metrics:
  hourly: {source: s, budget: b, weight: 1, window: {tumbling: 1h}, aggregate: count, mechanism: gaussian}
  daily: {source: s, budget: b, weight: 3, window: {tumbling: 1d}, aggregate: count, mechanism: gaussian}
  sliding: {source: s, budget: b, weight: 2, window: {hopping: 2h, every: 1h}, aggregate: count, mechanism: gaussian}
sinks: {releases: r, dead_letter: d}
"""


async def _first_period(start: int) -> tuple[int, int, dict[str, list[int]], int]:
    """Release every window of the schedule from `start` to past the first period's end (no events: empty
    windows are released too). Returns (units charged to the first period by windows that ended by its end,
    all units charged to it, its charges per metric in close order, the pool)."""
    topo = load_topology_text(_YAML)
    ledger = await open_ledger("memory", topo, clock=ManualClock(start), schedule_start=start)

    async def publish(value: bytes, key: bytes) -> None:
        return None

    summary = await replay_lines(topo, [], ledger, publish, start=start, end=P0 + DAY + 2 * HOUR)
    assert summary.releases.snapshot()["published"] == len(summary.results), summary.releases.reasons
    first = period_id(DAY, P0)
    cost = {
        e.fields["release_id"]: int(e.fields["cost"])
        for e in await ledger.audit("b")
        if e.kind is AuditKind.CHARGE and e.fields["period"] == first
    }
    by_end, per_metric = 0, defaultdict(list)
    for r in summary.results:
        if r.release_id in cost:
            per_metric[r.metric].append(cost[r.release_id])
            by_end += cost[r.release_id] if r.window_end <= P0 + DAY else 0
            assert json.loads(r.payload)["budget"]["period"] == first
    cfg = scope_configs(topo)["b"]
    return by_end, sum(cost.values()), dict(per_metric), cfg.cap_units - cfg.reserve_units


def test_a_first_period_from_mid_period_spends_its_pool_evenly() -> None:
    """From S = 06:30 the daily window (started at 00:00) is never released; hourly and sliding release 17
    windows each. They spend the whole pool at an even per-release cost (the adaptive allowance on plan), so at
    the period's end the spend is the pool less the one sliding window still open, as in a whole period."""
    full_end, full_total, full_costs, pool = asyncio.run(_first_period(P0))
    mid_end, mid_total, mid_costs, _ = asyncio.run(_first_period(P0 + 6 * HOUR + 1800))
    assert set(mid_costs) == {"hourly", "sliding"} and all(len(c) == 17 for c in mid_costs.values())
    for costs in (full_costs, mid_costs):
        for series in costs.values():  # on plan every release of a metric gets the same grant (to the unit
            assert max(series) - min(series) <= len(series)  # that flooring leaves to later releases)
    # the whole pool is spent in both (flooring leaves at most a unit per release unspent)
    assert pool - 60 <= full_total <= pool and pool - 60 <= mid_total <= pool
    # at the period's end only the sliding window [23:00, 01:00) is still to be charged
    assert full_total - full_end == full_costs["sliding"][-1]
    assert mid_total - mid_end == mid_costs["sliding"][-1]
    assert mid_costs["sliding"][-1] <= 2 * min(mid_costs["sliding"])  # not the shares of unreleased windows
    assert full_end - mid_end <= mid_costs["sliding"][-1]


def test_status_projects_a_first_period_from_the_deployment_start() -> None:
    """Two hours after S = 06:00 the scope's spend is projected at its rate since S over the 18 hours S left
    of the period (×9), not at its rate since midnight over the day (×3, which reads a deployment on plan as
    spending a third of its pool); S comes from the ledger or from the caller."""

    async def run() -> tuple[float, ...]:
        topo = load_topology_text(_YAML)
        start = P0 + 6 * HOUR
        clock = ManualClock(start)
        ledger = await open_ledger("memory", topo, clock=clock, schedule_start=start)
        plain = await open_ledger("memory", topo, clock=clock)

        async def publish(value: bytes, key: bytes) -> None:
            return None

        for led in (ledger, plain):
            await replay_lines(topo, [], led, publish, start=start, end=start + 2 * HOUR)
        clock.now = start + 2 * HOUR
        s, p, given = await ledger.status("b"), await plain.status("b"), await plain.status("b", start)
        return s.ratio, s.projected_ratio, p.ratio, p.projected_ratio, given.projected_ratio

    ratio, projected, plain_ratio, plain_projected, given = asyncio.run(run())
    assert ratio > 0 and plain_ratio > 0
    assert abs(projected - 9 * ratio) <= 1e-9 * projected
    assert abs(given - 9 * plain_ratio) <= 1e-9 * given
    assert abs(plain_projected - 3 * plain_ratio) <= 1e-9 * plain_projected
