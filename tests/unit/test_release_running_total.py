"""A running total through the release protocol, on the in-process ledger with real OpenDP noise:
each step publishes the period's total so far (C y)_t, the period pays one lump with its first step,
a restarted releaser continues the same noise from the ledger, and a refused first step stops the
period."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from dpstream.topology.loader import load_topology_text
from dpstream.topology.periods import period_id
from dpstream.topology.running_total import coefficient_norm
from dpstream.workers.ledger import open_ledger
from dpstream.workers.ledger.testing import ManualClock
from dpstream.workers.ledger.units import cost_to_units
from dpstream.workers.noise import prefix_sum
from dpstream.workers.release import ReleaseOutcome, Releaser
from dpstream.workers.release.running import decode_state

_YAML = """
version: 1
sources:
  s: {topic: t, privacy_unit: user_id}
budgets:
  b: {epsilon: 1.0, delta: 1.0e-6, accounting: zcdp, period: 1d, reserve: 0.2}
metrics:
  so_far:
    source: s
    budget: b
    window: {tumbling: 1h}
    aggregate: count
    group_by: channel
    keys: [web, app]
    mechanism: gaussian
    release: running_total
    contribution: {max_per_period: 5}
    postprocess: {round: false, clamp_zero: false}
sinks: {releases: r, dead_letter: d}
"""

DAY, HOUR = 86_400, 3_600
P0 = 1_796_083_200  # a UTC day boundary
INCREMENTS = [{"web": 10 * (t + 1), "app": 3 * t} for t in range(24)]


def _run(coro):
    return asyncio.run(coro)


class _Sink:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    async def __call__(self, value: bytes, key: bytes) -> None:
        self.sent.append(value)


@pytest.fixture(scope="module")
def topo():
    return load_topology_text(_YAML)


def _prefix(t: int) -> dict[str, float]:
    return {k: float(sum(inc[k] for inc in INCREMENTS[: t + 1])) for k in ("web", "app")}


def test_each_step_publishes_the_total_so_far_with_one_lump(topo):
    """24 hourly steps: the spend is the first step's cost (later steps add nothing), every total is
    within 7 of its std of the true prefix (false-failure < 1e-10 per value), the CI grows as
    σ‖c_<t‖₂, and the published totals are C·y of the stored y's exactly."""

    async def go():
        ledger = await open_ledger("memory", topo, clock=ManualClock(P0 + DAY - 1))
        rel, sink = Releaser(topo, ledger), _Sink()
        for t in range(24):
            s = P0 + t * HOUR
            res = await rel.release("so_far", (s, s + HOUR), INCREMENTS[t], sink)
            assert res.outcome is ReleaseOutcome.PUBLISHED, res
        status = await ledger.status("b")
        steps = await ledger.running_steps("b", "so_far", period_id(DAY, P0))
        return sink.sent, status, steps

    sent, status, steps = _run(go())
    records = [json.loads(v) for v in sent]
    lump = records[0]["cost"]["rho"]
    assert status.spent_units == cost_to_units(lump)
    assert all(r["cost"]["rho"] == lump and r["event"]["lump"] == lump for r in records)
    sigma = records[0]["noise"]["scale"]
    ys = np.array([decode_state(steps[P0 + t * HOUR], 2)[1] for t in range(24)])
    for t, r in enumerate(records):
        std = sigma * coefficient_norm(t + 1)
        assert r["noise"]["stddev"] == pytest.approx(std, rel=1e-12)
        assert r["ci"]["half_width"] == pytest.approx(prefix_sum.Z95 * std, rel=1e-12)
        assert r["running_total"]["step"] == t + 1
        truth = _prefix(t)
        for k in ("web", "app"):
            assert abs(r["values"][k] - truth[k]) <= 7 * std
        expected = prefix_sum.coefficients(t + 1)[::-1] @ ys[: t + 1]
        assert [r["values"]["web"], r["values"]["app"]] == pytest.approx(list(expected), rel=0, abs=1e-9)


def test_a_restarted_releaser_continues_the_same_noise(topo):
    """A new Releaser on the same ledger (a restart) republishes known steps with their stored bytes and
    continues the period from the stored y's: its totals are C·y over the first releaser's y's too."""

    async def go():
        ledger = await open_ledger("memory", topo, clock=ManualClock(P0 + DAY - 1))
        first, sink = Releaser(topo, ledger), _Sink()
        for t in range(5):
            s = P0 + t * HOUR
            await first.release("so_far", (s, s + HOUR), INCREMENTS[t], sink)
        again = Releaser(topo, ledger)
        dup = await again.release("so_far", (P0 + 4 * HOUR, P0 + 5 * HOUR), INCREMENTS[4], sink)
        assert dup.outcome is ReleaseOutcome.DUPLICATE and dup.payload == sink.sent[4]
        for t in range(5, 8):
            s = P0 + t * HOUR
            res = await again.release("so_far", (s, s + HOUR), INCREMENTS[t], sink)
            assert res.outcome is ReleaseOutcome.PUBLISHED
        status = await ledger.status("b")
        return sink.sent, await ledger.running_steps("b", "so_far", period_id(DAY, P0)), status

    sent, steps, status = _run(go())
    records = [json.loads(v) for v in sent]
    ys = np.array([decode_state(steps[P0 + t * HOUR], 2)[1] for t in range(8)])
    last = records[-1]
    expected = prefix_sum.coefficients(8)[::-1] @ ys
    assert [last["values"]["web"], last["values"]["app"]] == pytest.approx(list(expected), rel=0, abs=1e-9)
    assert status.spent_units == cost_to_units(records[0]["cost"]["rho"])


def test_a_refused_first_step_stops_the_period(topo):
    """With the breaker open at the first step, it is refused; closed again, the later steps of the
    period are refused too (no lump), and nothing is published or spent."""

    async def go():
        ledger = await open_ledger("memory", topo, clock=ManualClock(P0 + DAY - 1))
        rel, sink = Releaser(topo, ledger), _Sink()
        await ledger.open_breaker("b", "maintenance", actor="op")
        res = await rel.release("so_far", (P0, P0 + HOUR), INCREMENTS[0], sink)
        assert res.outcome is ReleaseOutcome.REFUSED_BREAKER
        await ledger.close_breaker("b", "done", actor="op")
        later = [await rel.release("so_far", (P0 + t * HOUR, P0 + (t + 1) * HOUR), INCREMENTS[t], sink) for t in (1, 2)]
        return later, sink.sent, await ledger.status("b")

    later, sent, status = _run(go())
    assert [r.outcome for r in later] == [ReleaseOutcome.REFUSED_BUDGET] * 2
    assert all("running total" in r.reason for r in later)
    assert sent == [] and status.spent_units == 0


def test_a_releaser_reads_back_the_steps_another_one_released(topo):
    """Releaser A holds steps 1-3 in memory; B (a takeover) releases step 4; A's step 5 must read the
    ledger again: its total is C·y over every stored y, B's included."""

    async def go():
        ledger = await open_ledger("memory", topo, clock=ManualClock(P0 + DAY - 1))
        a, b, sink = Releaser(topo, ledger), Releaser(topo, ledger), _Sink()
        for t, rel in ((0, a), (1, a), (2, a), (3, b), (4, a)):
            s = P0 + t * HOUR
            res = await rel.release("so_far", (s, s + HOUR), INCREMENTS[t], sink)
            assert res.outcome is ReleaseOutcome.PUBLISHED
        return sink.sent, await ledger.running_steps("b", "so_far", period_id(DAY, P0))

    sent, steps = _run(go())
    ys = np.array([decode_state(steps[P0 + t * HOUR], 2)[1] for t in range(5)])
    last = json.loads(sent[-1])
    expected = prefix_sum.coefficients(5)[::-1] @ ys
    assert [last["values"]["web"], last["values"]["app"]] == pytest.approx(list(expected), rel=0, abs=1e-9)
