"""Tests of topology.allocation: the one pricing rule (static plan and adaptive re-division), windows left, warning."""

import math
from fractions import Fraction

import pytest

from dpstream.topology.allocation import (
    MetricDemand,
    adaptive_release_cost,
    planned_release_costs,
    release_rates,
    release_share,
    thinned_out,
    warning_cost_factor,
    windows_left,
)
from dpstream.topology.errors import InternalError
from dpstream.topology.model import Accounting, WarningPolicy, Window

DAY = 86_400

# a small zCDP-like scope: (weight, window) per metric
_SCOPE = {"views": (3.0, Window(600, 600)), "active": (2.0, Window(1800, 600)), "basket": (1.0, Window(3600, 3600))}
_POOL = 0.0194847762876307


def _releases(scope, period_s):
    """All releases of a period as (window end, metric), in the order a worker would see them."""
    out = []
    for name, (_, window) in scope.items():
        for i in range(window.releases_per_period(period_s)):
            out.append((i * window.every_s + window.size_s, name))
    return sorted(out, key=lambda r: (r[0], list(scope).index(r[1])))


def _run(scope, pool, period_s, skip=frozenset()):
    """Price every release adaptively; return [(metric, allowance)] (skipped releases are allowed nothing)."""
    per_period = {n: w.releases_per_period(period_s) for n, (_, w) in scope.items()}
    done = {n: 0 for n in scope}
    spent, log = 0.0, []
    for index, (_, name) in enumerate(_releases(scope, period_s)):
        demands = {n: MetricDemand(scope[n][0], per_period[n], per_period[n] - done[n]) for n in scope}
        done[name] += 1
        if index in skip:
            log.append((name, 0.0))
            continue
        cost = adaptive_release_cost(pool - spent, name, demands)
        spent += cost
        log.append((name, cost))
    return log


def _static(scope, pool, period_s):
    demands = {n: MetricDemand(w, N, N) for n, (w, win) in scope.items() for N in [win.releases_per_period(period_s)]}
    return planned_release_costs(pool, demands)


def test_static_cost_is_pool_times_weight_share_over_releases():
    """pool × (w/Σw) / N, and the whole period's planned releases add up to the pool."""
    static = _static(_SCOPE, _POOL, DAY)
    assert static["views"] == pytest.approx(_POOL * 0.5 / 144)
    total = math.fsum(static[n] * w.releases_per_period(DAY) for n, (_, w) in _SCOPE.items())
    assert total == pytest.approx(_POOL, rel=1e-12)


def test_adaptive_equals_static_on_plan():
    """When every release happens, each adaptive allowance equals the static plan and the period ends at the pool."""
    static = _static(_SCOPE, _POOL, DAY)
    log = _run(_SCOPE, _POOL, DAY)
    for name, cost in log:
        assert cost == pytest.approx(static[name], rel=1e-9)
    assert math.fsum(c for _, c in log) == pytest.approx(_POOL, rel=1e-9)


def test_skipped_release_share_goes_to_the_rest():
    """A skipped release leaves its share to later ones: later allowances rise and the pool is still used up."""
    static = _static(_SCOPE, _POOL, DAY)
    skip = {10, 11, 12}
    log = _run(_SCOPE, _POOL, DAY, skip=skip)
    assert math.fsum(c for _, c in log) == pytest.approx(_POOL, rel=1e-9)
    for index, (name, cost) in enumerate(log):
        if index < min(skip):
            assert cost == pytest.approx(static[name], rel=1e-9)
        elif index > max(skip):
            assert cost > static[name]


def test_overspend_is_absorbed_by_all_later_releases():
    """If less is left than planned, every later grant shrinks by the same factor and never exceeds what is left."""
    demands = {"a": MetricDemand(1.0, 10, 5), "b": MetricDemand(1.0, 20, 10)}
    planned_left = 0.5  # half of a pool of 1 is planned to remain
    on_plan = adaptive_release_cost(planned_left, "a", demands)
    short = adaptive_release_cost(planned_left * 0.8, "a", demands)
    assert short == pytest.approx(on_plan * 0.8)
    assert adaptive_release_cost(1e-9, "b", {"b": MetricDemand(1.0, 20, 1)}) == pytest.approx(1e-9)


def test_seed_002_sequence_is_064_048_032_016():
    """The worked budget example: pool 1.6 over weights 4:3:2:1, one release each, gives 0.64, 0.48, 0.32,
    0.16 and keeps the reserve."""
    scope = {
        n: (w, Window(DAY, DAY)) for n, w in (("diagnosis", 4.0), ("income", 3.0), ("postcode", 2.0), ("tier", 1.0))
    }
    log = _run(scope, 1.6, DAY)
    assert [c for _, c in log] == pytest.approx([0.64, 0.48, 0.32, 0.16])
    assert math.fsum(c for _, c in log) == pytest.approx(1.6)  # 0.4 reserve untouched: ratio 0.8


def test_nothing_left_allows_nothing_and_no_release_left_is_a_bug():
    """An exhausted pool allows 0; pricing a metric with no release left is an internal error."""
    demands = {"a": MetricDemand(1.0, 4, 1)}
    assert adaptive_release_cost(0.0, "a", demands) == 0.0
    assert adaptive_release_cost(-1.0, "a", demands) == 0.0
    with pytest.raises(InternalError):
        adaptive_release_cost(1.0, "a", {"a": MetricDemand(1.0, 4, 0)})


def test_windows_left_counts_the_current_and_later_windows_of_the_period():
    """At the first window's end all N windows are left; at the last one 1; hopping windows start inside the period."""
    tumbling = Window(60, 60)
    assert windows_left(tumbling, 0, DAY, 60) == 1440
    assert windows_left(tumbling, 0, DAY, DAY) == 1
    hopping = Window(300, 60)
    assert windows_left(hopping, 0, DAY, 300) == 1440
    assert windows_left(hopping, 0, DAY, DAY + 240) == 1  # the last window starts at 23:59, ends 00:04
    assert windows_left(hopping, 0, DAY, DAY + 300) == 0


def test_windows_left_skips_windows_that_start_before_the_deployment_start():
    """Windows starting before S are never released, so none is still to come; S at or before the period
    start counts every window, as without S."""
    s = 6 * 3600 + 1800  # 06:30
    daily, hourly, sliding = Window(DAY, DAY), Window(3600, 3600), Window(7200, 3600)
    assert windows_left(daily, 0, DAY, 8 * 3600) == 1  # the day's only window, priced as still to come
    assert windows_left(daily, 0, DAY, 8 * 3600, schedule_start=s) == 0  # it starts before S: never released
    assert windows_left(hourly, 0, DAY, 8 * 3600, schedule_start=s) == 17  # 07:00 … 23:00
    assert windows_left(sliding, 0, DAY, 8 * 3600) == 18  # 06:00 … 23:00
    assert windows_left(sliding, 0, DAY, 8 * 3600, schedule_start=s) == 17  # 07:00 … 23:00
    assert windows_left(sliding, 0, DAY, 7 * 3600, schedule_start=7 * 3600) == 17  # a window starting at S counts
    for end in (3600, 8 * 3600, DAY, DAY + 3600):
        for window in (daily, hourly, sliding):
            want = windows_left(window, 0, DAY, end)
            assert windows_left(window, 0, DAY, end, schedule_start=0) == want
            assert windows_left(window, 0, DAY, end, schedule_start=-5 * 3600) == want
            assert windows_left(window, DAY, DAY, DAY + end, schedule_start=s) == windows_left(
                window, DAY, DAY, DAY + end
            )


def test_warning_cost_factor_and_thinning():
    """Stretching σ by s divides ρ by s² (zCDP) or ε by s (pure); thin n keeps every n-th window."""
    policy = WarningPolicy(stretch=1.5, thin=2)
    assert warning_cost_factor(policy, Accounting.ZCDP) == pytest.approx(1 / 2.25)
    assert warning_cost_factor(policy, Accounting.PURE) == pytest.approx(1 / 1.5)
    window = Window(60, 60)
    kept = [s for s in range(0, 600, 60) if not thinned_out(policy, s, window)]
    assert kept == [0, 120, 240, 360, 480]


def test_the_share_is_exact_and_scale_free():
    """The rates are w/N over one denominator; the share is c_m / Σ c_j·n_j exactly, whatever the common scale."""
    demands = {"a": MetricDemand(0.25, 24, 10), "b": MetricDemand(3.0, 144, 1), "c": MetricDemand(1.0, 1, 0)}
    rates = release_rates(demands)
    assert all(isinstance(k, int) for k in rates.values())
    left = {n: d.left for n, d in demands.items()}
    want = (Fraction(1, 4) / 24) / (Fraction(1, 4) / 24 * 10 + Fraction(3, 144) * 1)  # c has none left: no share
    assert release_share("a", rates, left) == want
    assert release_share("a", {n: 7 * k for n, k in rates.items()}, left) == want
    assert release_share("a", rates, {n: 0 for n in left}) == 0


def test_a_metric_without_a_release_per_period_is_a_bug():
    """N = 0 has no rate: pricing it is an internal error, not a division by zero."""
    with pytest.raises(InternalError):
        release_rates({"a": MetricDemand(1.0, 0, 0)})
