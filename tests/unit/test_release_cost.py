"""The release path's caches and fast paths answer exactly what the plain functions do, the cached
and pooled noise still proves its privacy map within the charge, and the pooled vector noise has
the distribution OpenDP's measurement has (speed itself is measured by `dpstream bench release`)."""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
from datetime import UTC, datetime
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpstream.topology import accounting as acc
from dpstream.topology.errors import InternalError
from dpstream.topology.loader import load_topology_text
from dpstream.topology.model import Accounting, Aggregate, Contribution, Mechanism, Metric, Window
from dpstream.topology.periods import period_id, periods_touched
from dpstream.topology.schedule import Schedule
from dpstream.workers.ledger import base as ledger_base
from dpstream.workers.ledger import open_ledger
from dpstream.workers.ledger.allocation import Snapshot, _adaptive_units, _chargeable
from dpstream.workers.ledger.config import ScopeConfig
from dpstream.workers.ledger.state import ScopeState, _zadd, zcount_from
from dpstream.workers.ledger.testing import one_scope_topology
from dpstream.workers.ledger.units import chargeable_float, cost_to_units
from dpstream.workers.noise import build_release_mechanism, discrete
from dpstream.workers.noise import measurements as meas_mod
from dpstream.workers.noise.measurements import (
    COST_RTOL,
    IntegerNoise,
    NoisePool,
    check_within_charge,
    integer_noise,
)
from dpstream.workers.release import ReleaseOutcome, Releaser
from dpstream.workers.release.record import canonical_bytes, iso_utc, record_bytes
from dpstream.workers.release.releaser import _later_periods
from tests.unit._record_oracle import oracle_bytes

W = Window(60, 60)


def metric(**kw: object) -> Metric:
    base: dict[str, object] = dict(
        name="m", source="s", budget="b", weight=1.0, window=W, aggregate=Aggregate.COUNT, mechanism=Mechanism.GAUSSIAN
    )
    base.update(kw)
    return Metric(**base)  # type: ignore[arg-type]


costs = st.floats(min_value=1e-9, max_value=10.0, allow_nan=False, allow_infinity=False)
deltas = st.floats(min_value=1e-15, max_value=0.5, allow_nan=False, allow_infinity=False)


# ---- conversions and ledger memos: the cached answer is the uncached one ------------------------


@settings(max_examples=60, deadline=None)
@given(rho=st.floats(min_value=0.0, max_value=50.0, allow_nan=False), delta=deltas)
def test_cached_epsilon_from_rho_equals_the_uncached_search(rho: float, delta: float) -> None:
    """epsilon_from_rho (memoised) returns bit for bit what the golden-section search returns, first call or not."""
    uncached = acc.epsilon_from_rho.__wrapped__(rho, delta)
    assert acc.epsilon_from_rho(rho, delta) == uncached
    assert acc.epsilon_from_rho(rho, delta) == uncached  # the memoised answer


@pytest.mark.parametrize("epsilon,delta", [(1.0, 1e-6), (0.5, 1e-9), (3.0, 1e-5)])
def test_cached_rho_cap_equals_the_uncached_bisection(epsilon: float, delta: float) -> None:
    """rho_cap (memoised, bisecting over the uncached conversion) equals the plain bisection over epsilon_from_rho."""
    lo, hi = 0.0, epsilon
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if acc.epsilon_from_rho.__wrapped__(mid, delta) <= epsilon:
            lo = mid
        else:
            hi = mid
    assert acc.rho_cap(epsilon, delta) == lo == acc.rho_cap.__wrapped__(epsilon, delta)


def test_conversion_errors_are_not_cached() -> None:
    """A refused argument raises on every call (lru_cache keeps no exception)."""
    for _ in range(2):
        with pytest.raises(ValueError):
            acc.epsilon_from_rho(-1.0, 1e-6)


@settings(max_examples=200, deadline=None)
@given(
    units=st.integers(min_value=0, max_value=2**53 - 1),
    cost=costs,
    ts=st.integers(min_value=0, max_value=4_000_000_000),
    period_s=st.sampled_from([60, 3600, 86_400, 7 * 86_400]),
)
def test_ledger_memos_equal_the_functions(units: int, cost: float, ts: int, period_s: int) -> None:
    """The ledger's memoised chargeable_float, cost_to_units and period_id answer what the functions do."""
    assert _chargeable(units) == chargeable_float(units)
    assert ledger_base._cost_units(cost) == cost_to_units(cost)
    assert ledger_base._period_id(period_s, ts) == period_id(period_s, ts)


# ---- pricing: the ledger's grant is the rule on exact numbers ------------------------------------

_WINDOWS = [(60, 60), (300, 60), (3600, 3600), (7200, 3600), (86_400, 86_400)]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=st.lists(
        st.tuples(st.sampled_from([0.1, 0.25, 1.0, 1.5, 3.0, 7.0, 0.333]), st.sampled_from(_WINDOWS)),
        min_size=1,
        max_size=4,
    ),
    which=st.integers(min_value=0, max_value=3),
    pool_left=st.integers(min_value=0, max_value=10**15),
    at=st.integers(min_value=0, max_value=86_399),
    charged=st.lists(st.integers(min_value=0, max_value=2000), min_size=4, max_size=4),
    start_at=st.one_of(st.none(), st.integers(min_value=-3600, max_value=86_400)),
)
def test_integer_allowance_equals_the_exact_rule(
    specs: list[tuple[float, tuple[int, int]]],
    which: int,
    pool_left: int,
    at: int,
    charged: list[int],
    start_at: int | None,
) -> None:
    """The ledger's grant is floor(L × (w_m/N_m) / Σ_j w_j·n_j/N_j) on exact Fractions (decimal weights,
    n_j the windows left from S less those charged, the priced one at least 1), written out here."""
    metrics = tuple((f"m{i}", w, size, every, False) for i, (w, (size, every)) in enumerate(specs))
    topo = one_scope_topology(metrics=metrics)
    cfg = ScopeConfig.from_budget(topo.budgets["s"], list(topo.metrics.values()))
    name = metrics[which % len(metrics)][0]
    pstart = 1_796_083_200 - 1_796_083_200 % 86_400
    window_end = pstart + at + 1
    start = None if start_at is None else pstart + start_at
    counts = {m[0]: c for m, c in zip(metrics, charged[: len(metrics)], strict=True)}
    snap = Snapshot(cfg.cap_units, cfg.reserve_units, cfg.warn_units, 0, 0, None, counts)
    total = Fraction(0)
    rate = Fraction(0)
    for m_name, w, size, every, _ in metrics:
        n = Schedule(size, every, start).left(pstart, 86_400, window_end) - counts[m_name]
        if m_name == name:
            n = max(n, 1)
            rate = Fraction(repr(w)) / (86_400 // every)
        if n > 0:
            total += Fraction(repr(w)) / (86_400 // every) * n
    expected = math.floor(pool_left * rate / total)
    assert _adaptive_units(cfg, snap, name, pstart, window_end, pool_left, start) == expected


# ---- the in-process ledger's ZCOUNT and the window-period shortcuts ------------------------------


@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 100)), max_size=60),
    queries=st.lists(st.integers(-5, 105), min_size=1, max_size=10),
)
def test_sorted_ends_count_like_a_scan(ops: list[tuple[int, int]], queries: list[int]) -> None:
    """ZADD (a member's score replaced) and ZCOUNT low +inf by bisection count what a scan of the members counts."""
    s = ScopeState()
    for member, score in ops:
        _zadd(s, ("p", "m"), f"r{member}", score)
    members = s.ends.get(("p", "m"), {})
    for low in queries:
        assert zcount_from(s, ("p", "m"), low) == sum(1 for end in members.values() if end >= low)


@settings(max_examples=300, deadline=None)
@given(
    start=st.integers(0, 4_000_000_000),
    length=st.integers(-10, 3 * 86_400),
    period_s=st.sampled_from([60, 3600, 86_400]),
)
def test_later_periods_shortcut_equals_periods_touched(start: int, length: int, period_s: int) -> None:
    """The releaser's later periods of a window are periods_touched's, errors included."""
    end = start + length
    try:
        expected = tuple((period_id(period_s, p), p) for p in periods_touched(period_s, start, end)[1:])
    except InternalError:
        with pytest.raises(InternalError):
            _later_periods(period_s, start, end)
        return
    assert _later_periods(period_s, start, end) == expected


@settings(max_examples=300, deadline=None)
@given(ts=st.one_of(st.integers(-(10**10), 260_000_000_000), st.floats(0, 253_402_300_799, allow_nan=False)))
def test_iso_utc_equals_datetime(ts: float) -> None:
    """The record's times are the strings datetime formats, or the same error."""
    try:
        expected = datetime.fromtimestamp(int(ts), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, OSError, ValueError) as exc:
        with pytest.raises(type(exc)):
            iso_utc(ts)
        return
    assert iso_utc(ts) == expected


def test_canonical_bytes_are_json_dumps_bytes() -> None:
    """The shared encoder writes the canonical form json.dumps(sort_keys, compact, no NaN, UTF-8) writes."""
    record = {"b": [1.5e-05, -0.0, 1e16, "é"], "a": {"z": None, "y": True}, "ratio_after": None}
    assert (
        canonical_bytes(record)
        == json.dumps(record, sort_keys=True, separators=(",", ":"), allow_nan=False, ensure_ascii=False).encode()
    )
    with pytest.raises(ValueError):
        canonical_bytes({"x": float("nan")})


_RECORD_YAML = """
version: 1
sources:
  s: {topic: t, privacy_unit: user_id, timestamp: ts}
  ev: {topic: t2, privacy_unit: event, timestamp: ts}
budgets:
  z: {epsilon: 1.0, delta: 1.0e-6, accounting: zcdp, period: 1d}
  p: {epsilon: 2.0, delta: 1.0e-6, accounting: pure, period: 1d, reserve: 0.0}
metrics:
  hist: {source: s, budget: z, weight: 1, window: {tumbling: 1m}, aggregate: count, group_by: page,
         keys: [a, "é", c], mechanism: gaussian, postprocess: {round: true, clamp_zero: true}}
  pages: {source: s, budget: z, weight: 1, window: {tumbling: 1m}, aggregate: count, group_by: page,
          contribution: {max_keys: 2, max_per_key: 1}, mechanism: gaussian}
  avg: {source: s, budget: z, weight: 1, window: {tumbling: 1m}, aggregate: mean, value: x, bounds: [0, 10],
        mechanism: gaussian}
  top: {source: s, budget: z, weight: 1, window: {tumbling: 1m}, aggregate: top_k, k: 2, group_by: page,
        keys: [a, b, c], mechanism: exponential}
  evsum: {source: ev, budget: p, weight: 1, window: {hopping: 2m, every: 1m}, aggregate: sum, value: x,
          bounds: [-5, 10], mechanism: laplace}
sinks: {releases: r, dead_letter: d}
"""

_TRUE = {
    "hist": {"a": 3, "é": 0, "c": 7},
    "pages": {"x": 10_000, "y": 2},
    "avg": {"": (Fraction(55, 2), 9)},
    "top": {"a": 1, "b": 900, "c": 40},
    "evsum": {"": 12.25},
}


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(sorted(_TRUE)),
    cost=st.floats(min_value=1e-4, max_value=5.0),
    start=st.integers(0, 4_000_000_000),
    built=st.floats(0, 4e9, allow_nan=False),
)
def test_record_bytes_are_the_canonical_bytes_of_the_record(name: str, cost: float, start: int, built: float) -> None:
    """record_bytes (fixed fields' text kept per cost) is the test oracle's bytes, byte for byte, for
    every kind of metric, event-level sources, non-ASCII keys, overriding noise fields, any time and cost."""
    topo = load_topology_text(_RECORD_YAML)
    m = topo.metrics[name]
    budget = topo.budgets[m.budget]
    mech = build_release_mechanism(m, budget.accounting, cost, delta=1e-9 if m.keys is None else 0.0)
    fields = mech.release(_TRUE[name]).to_record_fields()
    fields["metric"] = "overwrite-attempt"  # a protected field: never taken from the mechanism
    args = dict(
        release_id="ab" * 32,
        topology_version=topo.topology_version,
        metric=m,
        source=topo.sources[m.source],
        budget=budget,
        period_id=period_id(budget.period_s, start),
        window_start=start,
        window_end=start + 60,
        cost=cost,
        noise_fields=fields,
        built_at=built,
        ledger="0f" * 16,
        conversion_delta=budget.delta,
    )
    for _ in range(2):  # first build, then from the kept text
        assert record_bytes(**args) == oracle_bytes(**args)  # type: ignore[arg-type]


# ---- privacy maps: a cached measurement is within the charge ---------------------------------------

_NOISES = [
    (Mechanism.GAUSSIAN, Accounting.ZCDP),
    (Mechanism.LAPLACE, Accounting.ZCDP),
    (Mechanism.LAPLACE, Accounting.PURE),
]


def _charged_map(noise: IntegerNoise, accounting: Accounting) -> float:
    if noise.mechanism is Mechanism.GAUSSIAN:
        return float(noise.meas.map(noise.d_in))
    eps = noise.meas.map(int(noise.d_in))
    return float(eps if accounting is Accounting.PURE else acc.pure_to_rho(eps))


@settings(max_examples=80, deadline=None)
@given(cost=costs, kind=st.sampled_from(_NOISES), l1=st.integers(1, 40), keys=st.integers(1, 6))
def test_cached_noise_map_is_within_the_charge(
    cost: float, kind: tuple[Mechanism, Accounting], l1: int, keys: int
) -> None:
    """integer_noise at cost c (built once, then cached) maps to <= c and to c within 1e-9; its pool draws from it."""
    mechanism, accounting = kind
    l2 = math.sqrt(keys) * l1
    first = integer_noise(mechanism, accounting, cost, l1, l2)
    again = integer_noise(mechanism, accounting, cost, l1, l2)
    assert again is first
    mapped = _charged_map(first, accounting)
    assert mapped <= cost and math.isclose(mapped, cost, rel_tol=COST_RTOL)
    assert first.pool is not None and first.pool._meas is first.meas


@settings(max_examples=40, deadline=None)
@given(
    cost=st.floats(min_value=1e-4, max_value=5.0),
    accounting=st.sampled_from([Accounting.ZCDP, Accounting.PURE]),
    max_keys=st.integers(1, 4),
    linf=st.integers(1, 3),
)
def test_selection_and_top_k_maps_are_within_the_charge(
    cost: float, accounting: Accounting, max_keys: int, linf: int
) -> None:
    """Thresholding (data-derived keys) and noisy top-k are built at maps within their charge."""
    mech = Mechanism.GAUSSIAN if accounting is Accounting.ZCDP else Mechanism.LAPLACE
    grouped = metric(group_by="page", mechanism=mech, contribution=Contribution(max_keys, linf))
    selecting = build_release_mechanism(grouped, accounting, cost, delta=1e-8)
    noise = selecting._noise  # type: ignore[attr-defined]
    mapped = _charged_map(noise, accounting)
    assert mapped <= cost and math.isclose(mapped, cost, rel_tol=COST_RTOL)
    thr = selecting._threshold  # type: ignore[attr-defined]
    d_in = (max_keys, noise.d_in, float(linf))
    thr_cost, thr_delta = thr.meas.map(d_in)
    thr_charged = thr_cost if mech is Mechanism.GAUSSIAN or accounting is Accounting.PURE else acc.pure_to_rho(thr_cost)
    assert thr_charged <= cost and thr_delta <= 1e-8
    top = build_release_mechanism(
        metric(
            aggregate=Aggregate.TOP_K,
            mechanism=Mechanism.EXPONENTIAL,
            k=2,
            group_by="r",
            keys=("a", "b", "c"),
            contribution=Contribution(1, linf),
        ),
        accounting,
        cost,
    )
    assert top._top.meas.map(linf) <= cost  # type: ignore[attr-defined]


def test_scale_is_nudged_up_when_the_rounded_map_lands_above_the_charge() -> None:
    """Where OpenDP's rounded-up map at the exact calibration exceeds c, the scale moves up a few ulps to fit."""
    rng = random.Random(5)
    for _ in range(200):
        cost = 10 ** rng.uniform(-8, 0)
        calibrated = acc.gaussian_sigma_for_rho(1.0, cost)
        if meas_mod._measurement(Mechanism.GAUSSIAN, calibrated)[0].map(1.0) > cost:
            break
    else:  # pragma: no cover - about half of all costs land above
        pytest.fail("no cost found whose exact calibration maps above it")
    noise = integer_noise(Mechanism.GAUSSIAN, Accounting.ZCDP, cost, 1, 1.0)
    assert calibrated < noise.scale <= calibrated * (1 + 64 * 2**-52)
    assert noise.meas.map(1.0) <= cost


def test_check_within_charge_refuses_a_map_above_or_off_the_charge() -> None:
    """A map one part in 1e12 above the charge is refused, as is one 1e-6 below it; equal passes."""
    check_within_charge("x", 0.5, 0.5)
    with pytest.raises(InternalError, match="above"):
        check_within_charge("x", 0.5 * (1 + 1e-12), 0.5)
    with pytest.raises(InternalError, match="privacy map"):
        check_within_charge("x", 0.5 * (1 - 1e-6), 0.5)


@pytest.mark.parametrize("nkeys", [1, 40])
def test_a_release_at_cost_c_uses_a_measurement_mapping_within_c(nkeys: int) -> None:
    """Via the releaser and the in-process ledger: each record's cost c and σ are a measurement's whose map is <= c."""
    keys = "" if nkeys == 1 else "    group_by: page\n    keys: [" + ", ".join(f"k{i}" for i in range(nkeys)) + "]\n"
    topo = load_topology_text(
        "version: 1\nsources:\n  s: {topic: t, privacy_unit: user_id, timestamp: ts}\n"
        "budgets:\n  b: {epsilon: 1.0, delta: 1.0e-6, accounting: zcdp, period: 1d}\n"
        "metrics:\n  m:\n    source: s\n    budget: b\n    weight: 1\n    window: {tumbling: 1h}\n"
        f"    aggregate: count\n{keys}    contribution: {{max_keys: 1, max_per_key: 1}}\n    mechanism: gaussian\n"
        "sinks: {releases: r, dead_letter: d}\n"
    )
    m = topo.metrics["m"]
    t0 = 1_796_083_200 - 1_796_083_200 % 86_400
    sent: list[bytes] = []

    async def publish(value: bytes, key: bytes) -> None:
        sent.append(value)

    async def go() -> None:
        ledger = await open_ledger("memory", topo)
        rel = Releaser(topo, ledger)
        for i in range(6):
            res = await rel.release(m, (t0 + 3600 * i, t0 + 3600 * (i + 1)), {}, publish)
            assert res.outcome is ReleaseOutcome.PUBLISHED

    asyncio.run(go())
    for raw in sent:
        rec = json.loads(raw)
        cost = rec["cost"]["rho"]
        noise = build_release_mechanism(m, Accounting.ZCDP, cost)._noise  # type: ignore[attr-defined]
        assert noise.meas.map(noise.d_in) <= cost
        assert rec["noise"]["scale"] == noise.scale
        assert len(rec["values"]) == nkeys


# ---- the pool: every sample once, OpenDP's saturation, OpenDP's distribution ------------------------


class _Counter:
    """A stand-in measurement: returns its input plus 1, 2, 3, ... (distinct, in order), and records calls."""

    def __init__(self) -> None:
        self.next = 1
        self.calls: list[int] = []

    def __call__(self, values: object) -> list[int]:
        vals = [int(v) for v in values]  # type: ignore[attr-defined]
        assert not any(vals), "the pool draws noise on zeros"
        self.calls.append(len(vals))
        out = list(range(self.next, self.next + len(vals)))
        self.next += len(vals)
        return out


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.integers(1, 700), min_size=1, max_size=30))
def test_pool_hands_out_every_sample_exactly_once(sizes: list[int]) -> None:
    """Samples come out in draw order with none repeated or skipped; a first use draws only what it needs."""
    fake = _Counter()
    pool = NoisePool(fake)
    taken: list[int] = []
    for n in sizes:
        got = pool.take(n)
        assert len(got) == n
        taken.extend(got)
    assert taken == list(range(1, len(taken) + 1))
    assert fake.calls[0] == sizes[0]
    assert pool.available == fake.next - 1 - len(taken)


def test_a_forked_pool_never_reuses_its_parents_samples() -> None:
    """After a real fork the samples drawn ahead by the parent are dropped in the child, not handed out again."""
    fake = _Counter()
    pool = NoisePool(fake)
    pool.take(1)
    pool.take(1)  # draws 1 + 1 extra: one sample left over
    assert pool.available == 1
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what it is handed, and leave without running pytest's teardown
        try:
            os.write(write_end, json.dumps(pool.take(1)).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        got_in_child = json.loads(pipe.read())
    os.waitpid(pid, 0)
    assert got_in_child == [4]  # sample 3, drawn ahead before the fork, is never handed out in the child
    assert pool.take(1) == [3]  # the parent still hands it out, once


def test_pooled_draw_saturates_to_i64_and_refuses_inputs_outside_it() -> None:
    """x + z is saturated to the i64 range as OpenDP's integer noise is; an input outside i64 is refused."""
    fake = _Counter()
    noise = IntegerNoise(Mechanism.GAUSSIAN, 1.0, 1.0, 1.0, 1.0, 2, fake, NoisePool(fake))
    assert noise.draw([2**63 - 2, 0, -(2**63)]) == [2**63 - 1, 2, -(2**63) + 3]
    with pytest.raises(InternalError, match="i64"):
        noise.draw([2**63])
    with pytest.raises(InternalError, match="integers"):
        noise.draw([1.0])  # type: ignore[list-item]
    assert noise.draw([]) == []


def _exact_cdf(mechanism: Mechanism, scale: float, k: np.ndarray) -> np.ndarray:
    """P(X <= k) of OpenDP's discrete Gaussian / Laplace with this scale (symmetric around 0)."""
    if mechanism is Mechanism.GAUSSIAN:
        _, p_abs = discrete._gaussian_pmf(scale)
        within = np.cumsum(p_abs)  # P(|X| <= h), h = 0, 1, ...

        def cover(h: np.ndarray) -> np.ndarray:
            return np.where(h < 0, 0.0, within[np.clip(h, 0, len(within) - 1)])
    else:

        def cover(h: np.ndarray) -> np.ndarray:
            return np.array([discrete.laplace_coverage(scale, int(x)) if x >= 0 else 0.0 for x in h])

    return np.where(k >= 0, (1.0 + cover(k)) / 2.0, (1.0 - cover(-k - 1)) / 2.0)


def _ks_to_exact(samples: list[int], mechanism: Mechanism, scale: float) -> float:
    """sup_k |F_n(k) − F(k)| over the integers (attained between the sample's extremes)."""
    x = np.sort(np.asarray(samples, dtype=np.int64))
    k = np.arange(x[0] - 1, x[-1] + 1)
    empirical = np.searchsorted(x, k, side="right") / len(x)
    return float(np.max(np.abs(empirical - _exact_cdf(mechanism, scale, k))))


@pytest.mark.statistical
@pytest.mark.parametrize(
    "mechanism,accounting,cost",
    [(Mechanism.GAUSSIAN, Accounting.ZCDP, 1 / 32), (Mechanism.LAPLACE, Accounting.PURE, 0.25)],
)
def test_pooled_vector_noise_has_the_measurements_distribution(
    mechanism: Mechanism, accounting: Accounting, cost: float
) -> None:
    """Noise of 1,000 releases of 20 declared keys (pooled, one vector per release) and 20,000 direct OpenDP
    calls on the same values each lie within the DKW bound of the exact discrete law (σ≈4 / b=4): the
    pooled noise is distributed as OpenDP's measurement applied to the values, as it was before pooling.

    Massart's DKW: P(sup|F_n − F| > e) <= 2 exp(−2 n e²); with n = 20,000 and e = 0.0207 that is 2.1e-8
    per sample, four samples in this test's two cases: false failure < 1e-7 (the noise is OpenDP's
    CSPRNG, unseedable, never retried)."""
    keys = tuple(f"k{i}" for i in range(20))
    m = metric(group_by="page", keys=keys, mechanism=mechanism, contribution=Contribution(1, 1))
    mech = build_release_mechanism(m, accounting, cost)
    noise: IntegerNoise = mech._noise  # type: ignore[attr-defined]
    truth = {k: 17 * i for i, k in enumerate(keys)}
    pooled: list[int] = []
    for _ in range(1000):
        values = mech.release(truth).values
        pooled.extend(int(values[k]) - truth[k] for k in keys)
    n = len(pooled)
    direct = [int(v) - 17 for v in noise.meas([17] * n)]
    bound = math.sqrt(math.log(2 / 2.1e-8) / (2 * n))
    assert _ks_to_exact(pooled, mechanism, noise.scale) <= bound
    assert _ks_to_exact(direct, mechanism, noise.scale) <= bound
    # the 20 keys of a release get 20 samples, not one shared one (all equal: P < 0.1^19)
    assert len(set(pooled[:20])) > 1


@given(
    version=st.text(min_size=1, max_size=20),
    metric=st.text(min_size=1, max_size=20),
    start=st.integers(-(2**40), 2**40),
    length=st.integers(1, 10**7),
)
@settings(max_examples=200, deadline=None)
def test_release_id_is_the_sha256_of_its_fields(version: str, metric: str, start: int, length: int) -> None:
    """The cached-prefix hash names a release exactly as DESIGN §4 says: sha256 of `version|metric|start|end`."""
    import hashlib

    from dpstream.workers.release.ids import release_id

    want = hashlib.sha256(f"{version}|{metric}|{start}|{start + length}".encode()).hexdigest()
    assert release_id(version, metric, start, start + length) == want
    assert release_id(version, metric, start, start + length) == want  # the cached prefix is not consumed
