"""Neighbouring streams through `dpstream replay` for a quantile metric (the pattern of test_neighbours.py).

D is an ordinary stream; D′ is D plus every event of one adversarial unit (values far outside the
bounds, bursts past max_per_key, odd timestamps, missing fields, interleaved at random positions).
Both run through `replay_lines` over the same public range and partition count, with a mechanism
factory that builds the production mechanism and records what each quantile release is fed: the
window's counts per grid cell. Then:

1. the release_ids are the same (the schedule is public);
2. in every window the two cell vectors differ by at most d_in = max_per_key values (L1 of their
   difference: the symmetric distance OpenDP's privacy map is evaluated at), and not at all in a
   window none of the adversary's event times falls in;
3. what a record says besides its values (cost, noise scale, the rank-error statement) is the same
   on both sides: none of it depends on the data;
4. each record's charged cost is the sum of OpenDP's privacy maps of its levels at d_in, and the
   ledger holds one charge per release.

When the adversary reuses D's heavy unit id ("7"), D′ is compared with D without that unit (D′ is
that stream plus one unit). Noise is the production CSPRNG noise (never seeded); only D is seeded.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpstream.topology.loader import load_topology_text
from dpstream.topology.model import Accounting, Metric, Topology
from dpstream.workers.commands.replay import replay_lines
from dpstream.workers.ledger import open_ledger
from dpstream.workers.noise import build_release_mechanism
from dpstream.workers.noise.mechanisms import ReleaseMechanism
from dpstream.workers.noise.quantiles import QuantileRelease
from dpstream.workers.noise.release import NoisyRelease
from tests.privacy import _neighbours as nb

TOPOLOGY_YAML = """
version: 1
sources:
  clicks: {topic: t.clicks, privacy_unit: user_id, timestamp: ts, allowed_lateness: 5s}
budgets:
  huge: {epsilon: 8000.0, delta: 1.0e-6, accounting: zcdp, period: 1h}
metrics:
  spend_pct:
    source: clicks
    budget: huge
    window: {tumbling: 10m}
    aggregate: quantile
    value: amount
    bounds: [-5, 20]
    bins: 25
    quantiles: [0.5, 0.9, 0.99]
    contribution: {max_per_key: 2}
    mechanism: exponential
  views:
    source: clicks
    budget: huge
    window: {tumbling: 5m}
    aggregate: count
    contribution: {max_per_key: 5}
    mechanism: gaussian
sinks: {releases: r, dead_letter: d}
"""

START = nb.T0
END = nb.T0 + nb.HOUR
WINDOW_S = 600
D_IN = 2
PARTITIONS = (1, 3)
MAX_EXAMPLES = 8


@cache
def topology() -> Topology:
    return load_topology_text(TOPOLOGY_YAML)


class _Recording(ReleaseMechanism):
    """The production mechanism, recording each quantile release's input (cells) in call order."""

    def __init__(self, inner: ReleaseMechanism, fed: list[tuple[int, ...]]) -> None:
        self.inner, self.fed = inner, fed
        self.metric, self.cost, self.delta = inner.metric, inner.cost, inner.delta

    def release(self, true_values: Mapping[str, Any]) -> NoisyRelease:
        self.fed.append(tuple(true_values[""]))
        return self.inner.release(true_values)


@dataclass
class Run:
    records: dict[str, dict]
    fed: list[tuple[int, ...]] = field(default_factory=list)
    charges: int = 0


def _replay(lines: Sequence[bytes], partitions: int) -> Run:
    topo = topology()
    fed: list[tuple[int, ...]] = []

    def factory(metric: Metric, accounting: Accounting, cost: float, *, delta: float = 0.0) -> ReleaseMechanism:
        mech = build_release_mechanism(metric, accounting, cost, delta=delta)
        return _Recording(mech, fed) if isinstance(mech, QuantileRelease) else mech

    async def go() -> Run:
        clock = nb.Clock(nb.after_every_publish_time(topo, END))
        ledger = await open_ledger("memory", topo, clock=clock)
        published: dict[str, bytes] = {}

        async def publish(value: bytes, key: bytes) -> None:
            assert key.decode() not in published, "a release_id was published twice"
            published[key.decode()] = value

        summary = await replay_lines(
            topo, lines, ledger, publish, start=START, end=END, partitions=partitions, mechanism_factory=factory
        )
        records = {rid: json.loads(v) for rid, v in published.items()}
        counts = summary.releases.snapshot()
        assert counts["published"] == len(records), counts  # every release charged (once) and published
        assert sum(counts.values()) == counts["published"], counts  # nothing refused, failed or re-sent
        return Run(records, fed, counts["published"])

    return asyncio.run(go())


@cache
def _base(seed: int, partitions: int, drop_unit: str | None = None) -> Run:
    events = nb.ordinary_stream(seed, START, END)
    if drop_unit is not None:
        events = nb.without_unit(events, drop_unit)
    return _replay(nb.to_lines(events), partitions)


def _quantile_records(run: Run) -> list[dict]:
    """The quantile metric's records in publish order (the order its mechanism was fed)."""
    out = [r for r in run.records.values() if r["metric"] == "spend_pct"]
    assert len(out) == len(run.fed), "one mechanism call per published quantile release"
    return out


# -- the adversary ------------------------------------------------------------------------------
_ODD_TS = st.sampled_from([0, 1, START - 1, START, START + WINDOW_S - 0.001, START + WINDOW_S, END - 1, END, 4e9])
_AMOUNT = st.one_of(
    st.sampled_from([-1e12, -5, -4.999, 0, 7.5, 19.999, 20, 20.001, 1e12]),
    st.floats(-100, 100, allow_nan=False),
    st.integers(-(10**6), 10**6),
)


@st.composite
def adversary(draw: st.DrawFn) -> tuple[str, list[tuple[int, Any]]]:
    unit = draw(st.sampled_from(["adv", "7"]))
    events: list[tuple[int, Any]] = []
    for _ in range(draw(st.integers(1, 6))):
        ts = draw(st.one_of(_ODD_TS, st.floats(START, END - 1)))
        burst = draw(st.integers(1, 8))  # past max_per_key: bounding must cut it
        for j in range(burst):
            event: dict[str, Any] = {"user_id": 7 if unit == "7" and draw(st.booleans()) else unit, "ts": ts + j}
            if draw(st.integers(0, 9)):
                event["amount"] = draw(_AMOUNT)
            event["page"] = "home"
            events.append((draw(st.integers(0, 400)), event))
    return unit, events


def _times(events: Sequence[tuple[int, Any]]) -> list[float]:
    return [float(e["ts"]) for _, e in events if isinstance(e, dict)]


def _check(base: Run, neighbour: Run, adversary_times: list[float]) -> None:
    assert set(base.records) == set(neighbour.records), "the release schedule moved"
    a, b = _quantile_records(base), _quantile_records(neighbour)
    assert len(a) == len(b) == (END - START) // WINDOW_S
    for ra, rb, ca, cb in zip(a, b, base.fed, neighbour.fed, strict=True):
        assert ra["release_id"] == rb["release_id"]
        w0, w1 = ra["window"]["start_epoch"], ra["window"]["end_epoch"]
        moved = sum(abs(x - y) for x, y in zip(ca, cb, strict=True))
        assert moved <= D_IN, f"window {w0}: cells moved by {moved} values > d_in {D_IN}"
        if not any(w0 <= t < w1 for t in adversary_times):
            assert ca == cb, f"window {w0}: no adversary event time in it, yet its cells changed"
        for name in ("cost", "noise", "ci", "postprocess", "quantiles", "bounds", "contribution"):
            assert ra[name] == rb[name], name
        values = list(rb["values"].values())
        assert list(rb["values"]) == ["p50", "p90", "p99"] and values == sorted(values)


@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(adv=adversary(), partitions=st.sampled_from(PARTITIONS), seed=st.sampled_from((1, 2)))
def test_one_adversarial_unit_moves_each_window_by_at_most_d_in_values(
    adv: tuple[str, list[tuple[int, Any]]], partitions: int, seed: int
) -> None:
    unit, extra = adv
    events = nb.ordinary_stream(seed, START, END)
    if unit == "7":
        events = nb.without_unit(events, "7")  # D′ = (D without unit 7) + every event of unit 7
        base = _base(seed, partitions, "7")
        extra = [
            *extra,
            *((i * 7, e) for i, e in enumerate(nb.ordinary_stream(seed, START, END)) if e["user_id"] == "7"),
        ]
    else:
        base = _base(seed, partitions)
    neighbour = _replay(nb.to_lines(nb.interleave(events, extra)), partitions)
    _check(base, neighbour, _times(extra))


def test_each_release_is_charged_once_at_the_sum_of_its_levels_privacy_maps() -> None:
    run = _base(1, 1)
    records = _quantile_records(run)
    assert records
    metric = topology().metrics["spend_pct"]
    for record in records:
        rho = record["cost"]["rho"]
        mech = build_release_mechanism(metric, Accounting.ZCDP, rho)
        assert isinstance(mech, QuantileRelease)
        mapped = math.fsum(q.meas.map(D_IN) for q in mech.levels)
        assert math.isclose(mapped, rho, rel_tol=1e-9) and mapped <= rho * (1 + 1e-12)
    assert len({r["release_id"] for r in records}) == len(records) == len(run.fed)
    assert run.charges == len(run.records)  # one charge per release, the quantile's included
