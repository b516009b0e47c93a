"""Release mechanisms: costs checked against OpenDP's maps, record fields, keys, post-processing."""

from __future__ import annotations

import json
import math
from typing import Any

import opendp.prelude as dp
import pytest

from dpstream.topology import accounting as acc
from dpstream.topology.calibration import calibrate
from dpstream.topology.errors import InternalError
from dpstream.topology.model import Accounting, Aggregate, Bounds, Contribution, Mechanism, Metric, PostProcess, Window
from dpstream.workers.noise import build_release_mechanism
from dpstream.workers.noise.measurements import check_cost, integer_noise, top_k

W = Window(60, 60)


def metric(**kw: Any) -> Metric:
    base: dict[str, Any] = dict(
        name="m", source="s", budget="b", weight=1.0, window=W, aggregate=Aggregate.COUNT, mechanism=Mechanism.GAUSSIAN
    )
    base.update(kw)
    return Metric(**base)


def test_check_cost_refuses_mismatch() -> None:
    """A privacy map off by more than 1e-9 relative is refused before any release."""
    check_cost("x", 0.5 * (1 + 1e-12), 0.5)
    with pytest.raises(InternalError, match="privacy map"):
        check_cost("x", 0.5 * (1 + 1e-6), 0.5)


@pytest.mark.parametrize(
    "mechanism,accounting",
    [(Mechanism.GAUSSIAN, Accounting.ZCDP), (Mechanism.LAPLACE, Accounting.ZCDP), (Mechanism.LAPLACE, Accounting.PURE)],
)
def test_integer_noise_map_equals_charge(mechanism: Mechanism, accounting: Accounting) -> None:
    """The OpenDP measurement at the declared sensitivity costs exactly what is charged."""
    noise = integer_noise(mechanism, accounting, 0.03, 6, math.sqrt(3) * 2)
    mapped = noise.meas.map(noise.d_in if mechanism is Mechanism.GAUSSIAN else int(noise.d_in))
    charged = mapped if accounting is Accounting.PURE or mechanism is Mechanism.GAUSSIAN else acc.pure_to_rho(mapped)
    assert charged == pytest.approx(0.03, rel=1e-9)


def test_top_k_scale_matches_calibration() -> None:
    """Noisy top-k uses topology.calibration's scale, and its map gives the charged ρ."""
    m = metric(
        aggregate=Aggregate.TOP_K,
        mechanism=Mechanism.EXPONENTIAL,
        k=3,
        group_by="r",
        keys=("a", "b", "c", "d"),
        contribution=Contribution(1, 2),
    )
    (component,) = calibrate(m, Accounting.ZCDP, 0.02)
    tk = top_k(Accounting.ZCDP, 0.02, 3, 2)
    assert tk.scale == pytest.approx(component.scale, rel=1e-12)
    assert tk.meas.map(2) == pytest.approx(0.02, rel=1e-9)


def test_histogram_is_one_vector_release_with_public_keys() -> None:
    """Declared keys are all released (zero-filled), σ from L2 = √L0·L∞ as the plan computes."""
    m = metric(group_by="page", keys=("a", "b", "c"), contribution=Contribution(3, 5))
    mech = build_release_mechanism(m, Accounting.ZCDP, 0.05)
    out = mech.release({"a": 10})
    assert set(out.values) == {"a", "b", "c"}
    (component,) = calibrate(m, Accounting.ZCDP, 0.05)
    assert out.noise["scale"] == pytest.approx(component.scale, rel=1e-12)
    assert out.mechanism == "discrete_gaussian"
    assert out.ci["level"] == 0.95 and out.ci["half_width"] > 0


def test_fixed_point_sum_charge_and_scale() -> None:
    """A real sum is noised on a power-of-two grid at a scale ≥ the plan's, costing exactly the charge."""
    m = metric(aggregate=Aggregate.SUM, value="v", bounds=Bounds(0, 200), contribution=Contribution(1, 2))
    mech = build_release_mechanism(m, Accounting.ZCDP, 0.05)
    out = mech.release({"": 12345.5})
    (component,) = calibrate(m, Accounting.ZCDP, 0.05)
    assert component.scale <= out.noise["scale"] <= component.scale * (1 + 2**-9)
    step = out.noise["grid_step"]
    assert math.frexp(step)[0] == 0.5
    assert (out.values[""] / step).is_integer()
    assert out.mechanism == "discrete_gaussian_fixed_point"


def test_public_denominator_mean_takes_the_sum() -> None:
    """A mean over a public n takes the clamped raw sum and releases it divided by n."""
    m = metric(aggregate=Aggregate.MEAN, value="v", bounds=Bounds(0, 10), denominator=1000.0)
    mech = build_release_mechanism(m, Accounting.ZCDP, 10.0)  # σ ≈ 0.002 in mean units
    assert mech.release({"": 5000.0}).values[""] == pytest.approx(5.0, abs=0.05)


def test_ratio_mean_fields_and_bounds() -> None:
    """A mean without denominator reports both noisy parts, stays within the bounds, flags it."""
    m = metric(aggregate=Aggregate.MEAN, value="v", bounds=Bounds(0, 3600))
    out = build_release_mechanism(m, Accounting.ZCDP, 0.05).release({"": (360000.0, 100)})
    assert set(out.noise) == {"sum", "count"}
    assert 0 <= out.values[""] <= 3600
    assert out.ci["approximate"] is True and out.ci["half_width"][""] > 0
    assert out.postprocess["clamp_bounds"] is True


def test_postprocess_round_and_clamp_are_applied_and_flagged() -> None:
    """Rounding and clamping at 0 are applied after noise and flagged in the record."""
    m = metric(
        aggregate=Aggregate.SUM, value="v", bounds=Bounds(-1, 1), postprocess=PostProcess(round=True, clamp_zero=True)
    )
    out = build_release_mechanism(m, Accounting.ZCDP, 0.001).release({"": -500.0})
    assert out.values[""] >= 0 and float(out.values[""]).is_integer()
    assert out.postprocess == {"round": True, "clamp_zero": True}


def test_partition_selection_delta_within_grant() -> None:
    """Data-derived keys pass thresholding whose OpenDP δ is at most the δ granted."""
    m = metric(group_by="page", contribution=Contribution(2, 3))
    mech = build_release_mechanism(m, Accounting.ZCDP, 0.05, delta=1e-8)
    info = mech.partition_selection
    assert info is not None and 0 < info["delta"] <= 1e-8
    out = mech.release({"big": 10_000, "tiny": 1})
    assert "big" in out.values and "tiny" not in out.values
    assert out.partition_selection == info


def test_partition_selection_needs_delta() -> None:
    """Data-derived keys without a granted δ fail closed."""
    with pytest.raises(InternalError, match="δ"):
        build_release_mechanism(metric(group_by="page", contribution=Contribution(1, 1)), Accounting.ZCDP, 0.05)


@pytest.mark.parametrize(
    "accounting,name", [(Accounting.ZCDP, "noisy_top_k_gumbel"), (Accounting.PURE, "noisy_top_k_permute_and_flip")]
)
def test_top_k_returns_declared_keys_in_order(accounting: Accounting, name: str) -> None:
    """Top-k returns k declared keys, best first, and no values."""
    keys = ("a", "b", "c", "d")
    m = metric(aggregate=Aggregate.TOP_K, mechanism=Mechanism.EXPONENTIAL, k=2, group_by="r", keys=keys)
    out = build_release_mechanism(m, accounting, 50.0).release({"a": 1, "b": 10_000, "c": 5_000})
    assert out.keys == ("b", "c") and out.values == {} and out.mechanism == name


def test_top_k_data_keys_select_candidates_first() -> None:
    """Top-k over data-derived keys spends a share on thresholding candidates (with δ)."""
    m = metric(aggregate=Aggregate.TOP_K, mechanism=Mechanism.EXPONENTIAL, k=1, group_by="r")
    mech = build_release_mechanism(m, Accounting.ZCDP, 50.0, delta=1e-9)
    assert mech.partition_selection is not None and mech.partition_selection["cost_share"] == 0.5
    assert mech.release({"x": 100_000, "y": 2}).keys == ("x",)


def test_record_fields_are_json() -> None:
    """to_record_fields() gives DESIGN §6's values / mechanism / noise / ci and the privacy event as plain
    JSON (the event's parts are a read-only tuple, shared by every release at the cost: JSON's list)."""
    m = metric(group_by="page", keys=("a", "b"), contribution=Contribution(2, 1))
    fields = build_release_mechanism(m, Accounting.ZCDP, 0.1).release({"a": 3, "b": 4}).to_record_fields()
    assert {"values", "mechanism", "noise", "ci", "event"} <= set(fields)
    event = fields.pop("event")
    assert json.loads(json.dumps(fields)) == fields
    assert json.loads(json.dumps(event)) == dict(event, parts=[dict(p) for p in event["parts"]])


def test_mechanisms_are_cached_per_metric_and_cost() -> None:
    """The same (metric, cost) reuses one built mechanism; another cost builds another."""
    m = metric()
    assert build_release_mechanism(m, Accounting.ZCDP, 0.01) is build_release_mechanism(m, Accounting.ZCDP, 0.01)
    assert build_release_mechanism(m, Accounting.ZCDP, 0.02) is not build_release_mechanism(m, Accounting.ZCDP, 0.01)


def test_non_integer_count_is_a_bug() -> None:
    """A fractional count reaching the integer mechanism is refused."""
    with pytest.raises(InternalError, match="not an integer"):
        build_release_mechanism(metric(), Accounting.ZCDP, 0.01).release({"": 2.5})


def test_only_contrib_feature_is_enabled() -> None:
    """dpstream.workers.noise enables OpenDP's `contrib` and nothing else (no floating-point, no honest-but-curious)."""
    import ast
    import pathlib

    import dpstream.workers.noise as pkg

    enabled = set()
    for path in pathlib.Path(pkg.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "enable_features":
                enabled |= {a.value for a in node.args if isinstance(a, ast.Constant)}
    assert enabled == {"contrib"}
    assert dp is not None
