"""The canonical order of one close time with a running total and a `max_windows` metric in it: a release
that comes after them is priced with what the ledger really charges them (a running total's later step and
a charge past the m paid raise the period's spend by nothing), whatever order the charges ran in.

Before this was so, a later step priced as if it paid another lump: the records that followed it in the
order carried a `budget.ratio_after` far above the ledger's spend, and drew noise priced from a pool that
phantom lump had emptied (the demo's page_views: σ 205 against a plan of 112, 40 minutes into the hour)."""

from __future__ import annotations

import asyncio
import itertools
import json

import pytest

from dpstream.topology.loader import load_topology_text
from dpstream.workers.ledger import open_ledger
from dpstream.workers.ledger.testing import ManualClock
from dpstream.workers.release import ReleaseOutcome, Releaser

# alpha (a running total) and beta (max_windows: 2) come before gamma in the canonical (P(w), metric)
# order of every close; the schedule starts 18 hours into the day, so the running total's lump is most
# of what is left of the day's pool (a phantom second lump would empty it)
_YAML = """
version: 1
sources:
  s: {topic: t, privacy_unit: user_id, timestamp: ts}
budgets:
  b: {epsilon: 1.0, delta: 1.0e-6, accounting: zcdp, period: 1d, reserve: 0.2}
metrics:
  alpha:
    source: s
    budget: b
    weight: 3
    window: {tumbling: 1h}
    aggregate: count
    group_by: channel
    keys: [web, app]
    mechanism: gaussian
    release: running_total
    contribution: {max_per_period: 5}
  beta:
    source: s
    budget: b
    weight: 1
    window: {tumbling: 1h}
    aggregate: count_units
    mechanism: gaussian
    contribution: {max_windows: 2}
  gamma:
    source: s
    budget: b
    weight: 1
    window: {tumbling: 1h}
    aggregate: count
    mechanism: gaussian
sinks: {releases: r, dead_letter: d}
"""

DAY, HOUR = 86_400, 3_600
P0 = 1_796_083_200  # a UTC day boundary
START = P0 + 18 * HOUR
CLOSES = 4
TRUTH = {"alpha": {"web": 7, "app": 2}, "beta": {"": 40}, "gamma": {"": 90}}


@pytest.fixture(scope="module")
def topo():
    return load_topology_text(_YAML)


def _run(topo, order: tuple[str, ...]) -> tuple[dict[tuple[str, int], dict], list[float], float]:
    """Four hourly closes from the schedule start, each close's releases charged in `order`:
    ((metric, close) → record, the ledger's spend / cap after each close, the cap)."""

    async def go() -> tuple[dict[tuple[str, int], dict], list[float], float]:
        ledger = await open_ledger("memory", topo, clock=ManualClock(START + CLOSES * HOUR + 1))
        ledger.use_schedule_start(START)
        releaser = Releaser(topo, ledger)
        records: dict[tuple[str, int], dict] = {}
        ratios: list[float] = []

        async def publish(value: bytes, key: bytes) -> None:
            return None

        for close in range(CLOSES):
            window = (START + close * HOUR, START + (close + 1) * HOUR)
            for name in order:
                result = await releaser.release(name, window, TRUTH[name], publish)
                assert result.outcome is ReleaseOutcome.PUBLISHED, result
                records[(name, close)] = json.loads(result.payload)
            status = await ledger.status("b")
            ratios.append(status.spent_units / status.cap_units)
        return records, ratios, status.cap

    return asyncio.run(go())


def _priced(records: dict[tuple[str, int], dict]) -> dict[tuple[str, int], tuple[float, float, float]]:
    return {k: (r["cost"]["rho"], r["budget"]["ratio_after"], r["noise"]["scale"]) for k, r in sorted(records.items())}


def test_a_close_after_a_running_total_and_a_capped_metric_is_priced_by_what_they_pay(topo):
    """In every close, the last record of the canonical order states the ledger's spend after the close
    (a phantom lump put it ~0.4 above); gamma's cost stays on its share of what the ledger really has
    left; every order of the three charges gives the same prices."""
    records, ratios, cap = _run(topo, ("alpha", "beta", "gamma"))
    for close, ratio in enumerate(ratios):
        stated = max(records[(name, close)]["budget"]["ratio_after"] for name in TRUTH)
        assert records[("gamma", close)]["budget"]["ratio_after"] == stated
        assert stated == pytest.approx(ratio, abs=2e-6), (close, stated, ratio)
    # once the lump and beta's two windows are paid, a close adds gamma's charge to the spend and nothing else
    for close in (2, 3):
        gamma = records[("gamma", close)]["cost"]["rho"]
        assert (ratios[close] - ratios[close - 1]) * cap == pytest.approx(gamma, rel=1e-6)
    for order in itertools.permutations(TRUTH):
        if order != ("alpha", "beta", "gamma"):
            assert _priced(_run(topo, order)[0]) == _priced(records), order
