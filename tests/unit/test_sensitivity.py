"""Tests of topology.sensitivity: L1/L2/L∞ of every aggregate from the declared contribution bounds."""

import math

import pytest

from dpstream.topology.errors import InternalError
from dpstream.topology.model import Aggregate, Bounds, Contribution, Mechanism, Metric, Window
from dpstream.topology.sensitivity import release_sensitivities


def _metric(
    aggregate: Aggregate,
    *,
    keys=2,
    per_key=3,
    group_by=None,
    bounds=None,
    denominator=None,
    k=None,
    window=Window(60, 60),
) -> Metric:
    return Metric(
        name="m",
        source="s",
        budget="b",
        weight=1.0,
        window=window,
        aggregate=aggregate,
        mechanism=Mechanism.EXPONENTIAL if aggregate is Aggregate.TOP_K else Mechanism.GAUSSIAN,
        contribution=Contribution(max_keys=keys, max_per_key=per_key),
        value="v",
        bounds=bounds,
        denominator=denominator,
        group_by=group_by,
        k=k,
    )


def _only(metric: Metric):
    (sens,) = release_sensitivities(metric)
    return sens


def test_ungrouped_count_is_max_per_key_and_ignores_max_keys():
    """Without group_by a unit adds at most max_per_key events to the single count."""
    s = _only(_metric(Aggregate.COUNT, keys=4, per_key=3))
    assert (s.component, s.l1, s.l2, s.linf) == ("value", 3.0, 3.0, 3.0)


def test_grouped_count_spreads_over_max_keys():
    """Grouped: max_keys coordinates each move by max_per_key: L1 = k·c, L2 = √k·c, L∞ = c."""
    s = _only(_metric(Aggregate.COUNT, keys=4, per_key=3, group_by="page"))
    assert s.l1 == 12.0 and s.l2 == pytest.approx(6.0) and s.linf == 3.0


def test_count_units_counts_a_unit_once_per_key():
    """count_units moves each touched key by 1 whatever max_per_key is."""
    assert (_only(_metric(Aggregate.COUNT_UNITS, keys=5, per_key=7)).l1) == 1.0
    grouped = _only(_metric(Aggregate.COUNT_UNITS, keys=5, per_key=7, group_by="page"))
    assert grouped.l1 == 5.0 and grouped.l2 == pytest.approx(math.sqrt(5)) and grouped.linf == 1.0


def test_sum_uses_largest_clamped_magnitude():
    """A sum moves by max_per_key × max(|lower|, |upper|) per key."""
    s = _only(_metric(Aggregate.SUM, per_key=2, bounds=Bounds(-50.0, 20.0)))
    assert s.l1 == s.l2 == s.linf == 100.0
    grouped = _only(_metric(Aggregate.SUM, keys=4, per_key=1, bounds=Bounds(0.0, 200.0), group_by="shop"))
    assert grouped.l1 == 800.0 and grouped.l2 == pytest.approx(400.0) and grouped.linf == 200.0


def test_seed_example_sum_sensitivity_is_c():
    """The worked example's bounded sum: one contribution in [0, 100] gives Δ = 100."""
    assert _only(_metric(Aggregate.SUM, per_key=1, bounds=Bounds(0.0, 100.0))).l1 == 100.0


def test_mean_with_public_denominator_is_the_sum_over_n():
    """A mean over a public n is a scaled sum: Δ = max_per_key × magnitude / n (the worked example's mean: 0.01)."""
    s = _only(_metric(Aggregate.MEAN, per_key=1, bounds=Bounds(0.0, 100.0), denominator=10_000))
    assert s.l1 == pytest.approx(0.01) and s.component == "value"


def test_mean_without_denominator_is_a_centred_sum_and_a_count():
    """A noisy mean releases a centred sum (c·(U − L)/2) and a count (c), each its own component."""
    total, count = release_sensitivities(_metric(Aggregate.MEAN, per_key=2, bounds=Bounds(10.0, 30.0)))
    assert (total.component, total.l1, total.l2) == ("sum", 20.0, 20.0)
    assert (count.component, count.l1) == ("count", 2.0)


def test_grouped_mean_without_denominator_scales_both_parts_by_keys():
    """Grouped noisy mean: both parts spread over max_keys coordinates."""
    total, count = release_sensitivities(
        _metric(Aggregate.MEAN, keys=4, per_key=1, bounds=Bounds(0.0, 3600.0), group_by="page")
    )
    assert total.l1 == 4 * 1800.0 and total.l2 == pytest.approx(2 * 1800.0) and total.linf == 1800.0
    assert count.l1 == 4.0 and count.l2 == pytest.approx(2.0)


def test_top_k_score_linf_is_max_per_key():
    """Top-k scores move by at most max_per_key each, over at most max_keys keys."""
    s = _only(_metric(Aggregate.TOP_K, keys=3, per_key=2, group_by="ref", k=5))
    assert s.linf == 2.0 and s.l1 == 6.0


def test_hopping_window_does_not_inflate_per_release_sensitivity():
    """Overlap is accounted by composing releases, so one hopping release has the tumbling sensitivity."""
    tumbling = _only(_metric(Aggregate.COUNT, window=Window(300, 300)))
    hopping = _only(_metric(Aggregate.COUNT, window=Window(300, 60)))
    assert tumbling == hopping


def test_sum_without_bounds_is_a_bug():
    """A sum that reached sensitivity without bounds slipped past validation: InternalError."""
    with pytest.raises(InternalError, match="without bounds"):
        release_sensitivities(_metric(Aggregate.SUM))
