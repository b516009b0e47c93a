"""A release costs what it costs in the public order, whichever order the period's releases are charged in.

Costs and `ratio_after` are published, so an order that depended on processing (a retried window, one
metric's partials late behind another's, a worker catching up on a backlog, another worker ahead)
would turn timing, which a heavy unit can move, into public bytes. Each example charges every window
of a few hours in a random order, one by one, and compares each record's priced fields with those of
the run in order (window end, P(w), metric), under each warning policy, with a metric under
`max_windows`, hopping windows, two sources of different lateness and a running total (whose steps
build on one another, so they keep their own order among the others).
"""

from __future__ import annotations

import asyncio
import json
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from dpstream.topology.loader import load_topology_text
from dpstream.workers.ledger import open_ledger
from dpstream.workers.ledger.testing import ManualClock
from dpstream.workers.release import ReleaseOutcome, Releaser

YAML = """
version: 1
sources:
  s: {{topic: t, privacy_unit: user_id, timestamp: ts}}
  late: {{topic: u, privacy_unit: user_id, timestamp: ts, allowed_lateness: 10m}}
budgets:
  b:
    epsilon: 1.0
    delta: 1.0e-6
    period: 1d
    reserve: 0.2
    warn_at: {warn_at}
    {policy}
metrics:
  alpha: {{source: s, budget: b, weight: 1, window: {{tumbling: 1h}}, aggregate: count, mechanism: gaussian}}
  beta: {{source: late, budget: b, weight: 3, window: {{tumbling: 1h}}, aggregate: count, mechanism: gaussian}}
  gamma:
    source: s
    budget: b
    weight: 2
    window: {{tumbling: 30m}}
    aggregate: count_units
    contribution: {{max_windows: 3}}
    mechanism: gaussian
  delta: {{source: s, budget: b, weight: 1, window: {{hopping: 1h, every: 30m}}, aggregate: count, mechanism: gaussian}}
  total:
    source: s
    budget: b
    weight: 2
    window: {{tumbling: 30m}}
    aggregate: count
    contribution: {{max_per_key: 2, max_per_period: 40}}
    release: running_total
    mechanism: gaussian
sinks: {{releases: r, dead_letter: d}}
"""

DAY0 = 1_796_000_400 - 1_796_000_400 % 86_400
_HOURS = 3


def windows_of(topo, start: int) -> list[tuple[str, tuple[int, int]]]:
    """Every window of the schedule from `start` that ends within `_HOURS` hours, in the public order."""
    out = []
    for name, m in topo.metrics.items():
        size, every = m.window.size_s, m.window.every_s
        out += [(name, (s, s + size)) for s in range(start, start + _HOURS * 3600 - size + 1, every)]
    return sorted(out, key=lambda w: (w[1][1], topo.publish_time(topo.metrics[w[0]], w[1][1]), w[0]))


def priced(
    topo, start: int, windows: list[tuple[str, tuple[int, int]]], where: str = "memory"
) -> dict[tuple[str, int], tuple]:
    """Charge `windows` one by one in the list's order from a fresh ledger at `where` whose schedule starts
    at `start`: (metric, window start) → (outcome, and for a published release its cost, ratio_after, noise scale)."""

    async def go() -> dict[tuple[str, int], tuple]:
        ledger = await open_ledger(where, topo, clock=ManualClock(start + _HOURS * 3600 + 3600))
        ledger.use_schedule_start(start)
        releaser = Releaser(topo, ledger)

        async def publish(value: bytes, key: bytes) -> None:
            return None

        out: dict[tuple[str, int], tuple] = {}
        try:
            for name, window in windows:
                result = await releaser.release(name, window, {"": 1}, publish)
                if result.outcome is not ReleaseOutcome.PUBLISHED:
                    out[(name, window[0])] = (result.outcome.value,)
                    continue
                rec = json.loads(result.payload)
                out[(name, window[0])] = ("published", rec["cost"], rec["budget"]["ratio_after"], rec["noise"]["scale"])
        finally:
            await ledger.close()
        return out

    return asyncio.run(go())


@settings(max_examples=40, deadline=None)
@given(
    policy=st.sampled_from(["on_warning: {stretch: 1.5}", "on_warning: {thin: 2}", ""]),
    warn_at=st.sampled_from([0.01, 0.05, 0.8]),
    start_hour=st.integers(0, 20),
    order=st.randoms(use_true_random=False),
)
def test_every_release_costs_what_it_costs_in_order_whatever_order_charges_ran(policy, warn_at, start_hour, order):
    topo = load_topology_text(YAML.format(policy=policy, warn_at=warn_at))
    start = DAY0 + start_hour * 3600
    in_order = windows_of(topo, start)
    expected = priced(topo, start, in_order)
    assert any(v[0] == "published" for v in expected.values())
    assert priced(topo, start, shuffled(in_order, order)) == expected


def shuffled(in_order: list[tuple[str, tuple[int, int]]], order: random.Random) -> list[tuple[str, tuple[int, int]]]:
    """`in_order` shuffled, but for a running total's steps, which build on one another: they keep their
    order among themselves (`release.running`)."""
    out = list(in_order)
    order.shuffle(out)
    steps = iter(w for w in in_order if w[0] == "total")
    return [next(steps) if w[0] == "total" else w for w in out]
