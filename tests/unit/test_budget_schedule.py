"""Budget schedules by time of day (`schedule:`, issue #21 §3): the field, its checks, the shaped rule."""

from __future__ import annotations

import dataclasses

import pytest

from dpstream.topology.dumper import dump_topology, topology_document
from dpstream.topology.errors import ConfigError
from dpstream.topology.loader import load_text_with_warnings, load_topology_text
from dpstream.topology.model import NAMED_SHAPES

BASE = """\
version: 1
sources:
  clicks: {{topic: web.clicks, privacy_unit: user_id}}
budgets:
  daily: {{epsilon: 1.0, delta: 1.0e-6, period: {period}{budget_extra}}}
metrics:
  views:
    source: clicks
    budget: daily
    window: {{tumbling: {window}}}
    aggregate: count
    mechanism: gaussian
{metric_extra}
  other:
    source: clicks
    budget: daily
    weight: 3
    window: {{tumbling: 15m}}
    aggregate: count
    mechanism: gaussian
sinks: {{releases: out, dead_letter: dl}}
"""


def _text(metric_extra: str = "", budget_extra: str = "", period: str = "1d", window: str = "1h") -> str:
    return BASE.format(metric_extra=metric_extra, budget_extra=budget_extra, period=period, window=window)


def _load(**kw: str):
    return load_topology_text(_text(**kw), path="t.yaml", env={})


def test_named_hours_and_list_forms_read_the_same_weights():
    named = _load(metric_extra="    schedule: business_hours").metrics["views"].schedule
    hours = _load(metric_extra='    schedule: {hours: {"08-18": 2}}').metrics["views"].schedule
    listed = _load(metric_extra=f"    schedule: {list(NAMED_SHAPES['business_hours'])}").metrics["views"].schedule
    assert named is not None and hours is not None and listed is not None
    assert named.hours == hours.hours == listed.hours
    assert named.name == "business_hours" and hours.name is None
    assert named.weight_at(8 * 3600) == 2.0 and named.weight_at(18 * 3600) == 1.0
    assert named.weight_at(86_400 * 3 + 9 * 3600 + 59) == 2.0


def test_single_hours_and_unlisted_hours():
    shape = _load(metric_extra='    schedule: {hours: {"22": 0.5, "08-10": 1.5}}').metrics["views"].schedule
    assert shape is not None
    assert shape.hours[22] == 0.5 and shape.hours[8] == shape.hours[9] == 1.5
    assert shape.hours[10] == shape.hours[0] == shape.hours[23] == 1.0


def test_a_flat_schedule_is_no_schedule_and_keeps_the_version():
    plain = _load()
    for flat in ("flat", "[" + ", ".join(["2"] * 24) + "]", '{hours: {"00-24": 3}}'):
        t = _load(metric_extra=f"    schedule: {flat}")
        assert t.metrics["views"].schedule is None
        assert t.topology_version == plain.topology_version


def test_a_schedule_changes_the_version():
    assert _load(metric_extra="    schedule: business_hours").topology_version != _load().topology_version
    assert _load(budget_extra=", schedule: business_hours").topology_version != _load().topology_version


def test_a_budget_schedule_is_its_metrics_default_and_a_metric_overrides_it():
    t = _load(budget_extra=", schedule: business_hours", metric_extra="    schedule: flat")
    assert t.budgets["daily"].schedule is not None
    assert t.metrics["views"].schedule is None
    assert t.metrics["other"].schedule == t.budgets["daily"].schedule


@pytest.mark.parametrize(
    "kw",
    [
        {"metric_extra": "    schedule: business_hours"},
        {
            "budget_extra": ", schedule: evening_peak",
            "metric_extra": '    schedule: {hours: {"08-20": 2.5, "03": 0.25}}',
        },
        {"budget_extra": ", schedule: business_hours", "metric_extra": "    schedule: flat"},
        {"metric_extra": "    schedule: [" + ", ".join(str(0.5 + i / 10) for i in range(24)) + "]"},
    ],
)
def test_dump_round_trips(kw: dict[str, str]):
    t = _load(**kw)
    back = load_topology_text(dump_topology(t), path="t.yaml", env={})
    assert dataclasses.replace(back, path="") == dataclasses.replace(t, path="")
    assert back.topology_version == t.topology_version


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (
            {"metric_extra": "    schedule: busines_hours"},
            "t.yaml:13: metric 'views': schedule 'busines_hours': unknown",
        ),
        ({"metric_extra": "    schedule: [1, 2]"}, "schedule: a list needs 24 weights"),
        ({"metric_extra": '    schedule: {hours: {"08-20": 0}}'}, "schedule.hours.08-20 0: a weight must be > 0"),
        ({"metric_extra": '    schedule: {hours: {"08-20": -1}}'}, "a weight must be > 0"),
        ({"metric_extra": '    schedule: {hours: {"08-20": .inf}}'}, "must be a finite number"),
        ({"metric_extra": '    schedule: {hours: {"20-08": 2}}'}, "not an hour range; write 'HH-HH'"),
        ({"metric_extra": '    schedule: {hours: {"08-20": 2, "12": 3}}'}, "hour 12 is listed twice"),
        ({"metric_extra": "    schedule: {hourz: {}}"}, "unknown field 'hourz'"),
        ({"metric_extra": "    schedule: business_hours", "period": "12h"}, "give the budget period: 1d"),
        ({"budget_extra": ", schedule: business_hours", "period": "12h"}, "the period must be whole days"),
        ({"metric_extra": "    schedule: business_hours", "window": "7m", "period": "7d"}, "step must divide a day"),
    ],
)
def test_bad_schedules_are_one_line_errors(kw: dict[str, str], message: str):
    with pytest.raises(ConfigError) as err:
        _load(**kw)
    text = str(err.value)
    assert "\n" not in text and text.startswith("t.yaml:")
    assert message in text


def _warnings(text: str) -> list[str]:
    return [str(w) for w in load_text_with_warnings(text, path="t.yaml", env={})[1]]


def test_lint_warns_when_max_windows_pays_only_up_weighted_windows():
    capped = "    contribution: {max_windows: 4}\n"
    # business_hours: 10 of 24 hourly windows weigh 2: the 4 paid are all up-weighted
    warned = _warnings(_text(metric_extra=capped + "    schedule: business_hours"))
    assert any("schedule up-weights 10 windows per period" in w and "max_windows 4" in w for w in warned)
    # 3 up-weighted hours < 4: the shape does raise what the paid windows get
    fine = _warnings(_text(metric_extra=capped + '    schedule: {hours: {"18-21": 2}}'))
    assert not any("up-weights" in w for w in fine)
    assert not any("up-weights" in w for w in _warnings(_text(metric_extra="    schedule: business_hours")))


def test_schema_accepts_the_schedule_forms():
    from tests.unit.test_schema import SCHEMA, _errors

    for extra in ("    schedule: business_hours", '    schedule: {hours: {"08-20": 2}}'):
        t = _load(metric_extra=extra, budget_extra=", schedule: evening_peak")
        assert _errors(topology_document(t), SCHEMA) == []


# --- the shaped rule: window counts, plan and ledger ---------------------------------------------

import asyncio  # noqa: E402
import random  # noqa: E402
from fractions import Fraction  # noqa: E402

from dpstream.topology.allocation import (  # noqa: E402
    hour_weights,
    release_rates,
    release_share,
    weighted_windows,
)
from dpstream.topology.model import HourlyShape  # noqa: E402
from dpstream.topology.plan import build_plan  # noqa: E402
from dpstream.topology.schedule import Schedule  # noqa: E402
from dpstream.workers.ledger import open_ledger  # noqa: E402
from dpstream.workers.ledger.config import scope_configs  # noqa: E402
from dpstream.workers.ledger.testing import ManualClock, charge_on_plan, one_scope_topology  # noqa: E402

DAY = 86_400
P0 = (1_796_000_000 // DAY) * DAY
PEAK = HourlyShape(NAMED_SHAPES["business_hours"], "business_hours")  # 08-18 UTC weigh 2, the rest 1


def test_starts_by_hour_counts_each_window_by_the_hour_it_starts_in():
    rng = random.Random(7)
    for _ in range(500):
        every = rng.choice([60, 300, 900, 1800, 3600, 5400, 7200, 86_400])
        start = rng.choice([None, rng.randrange(0, 10**6)])
        grid = Schedule(every * rng.choice([1, 2]), every, start)
        lo = rng.randrange(0, 10**6)
        hi = lo + rng.randrange(-100, 3 * DAY)
        brute = [0] * 24
        first = max(lo, start if start is not None else lo)
        for s in range(-(-first // every) * every, hi, every):
            brute[(s % DAY) // 3600] += 1
        assert grid.starts_by_hour(lo, hi) == tuple(brute)
        assert sum(brute) == grid.starts_in(lo, hi)


def test_hour_weights_are_exact_integers_and_flat_is_none():
    assert hour_weights(None) is None
    assert hour_weights(HourlyShape((2.5,) * 24)) is None
    assert hour_weights(HourlyShape((0.1,) * 23 + (0.3,))) == (1,) * 23 + (3,)
    assert hour_weights(PEAK) == tuple(2 if 8 <= h < 18 else 1 for h in range(24))


def test_weighted_windows_keeps_the_heaviest_paid_ones():
    counts = [1] * 24
    weights = [2 if 8 <= h < 18 else 1 for h in range(24)]
    assert weighted_windows(counts, weights) == 34
    assert weighted_windows(counts, weights, 4) == 8
    assert weighted_windows(counts, weights, 12) == 22
    assert weighted_windows(counts, None, 4) == 4 and weighted_windows(counts, None) == 24


def test_flat_rule_is_todays_integers():
    """h ≡ 1: the weighted counts are the counts, the same rates and shares as without a schedule."""
    from dpstream.topology.allocation import MetricDemand

    demands = {"a": MetricDemand(3.0, 24, 24), "b": MetricDemand(Fraction(1), 96, 96)}
    rates = release_rates(demands)
    assert release_share("a", rates, {"a": 24, "b": 96}, 1) == release_share("a", rates, {"a": 24, "b": 96})


def _shaped_topology(**kw):
    return one_scope_topology(
        metrics=(("a", 3.0, 3600, 3600, False), ("b", 1.0, 900, 900, False)), schedules={"a": PEAK}, **kw
    )


def test_plan_prices_peak_windows_twice_off_peak_and_spends_the_pool():
    scope = build_plan(_shaped_topology()).scope("s")
    a = next(m for m in scope.metrics if m.name == "a")
    assert [(g.hours, g.weight, g.releases_per_period) for g in a.segments] == [
        ("00-08", 1.0, 8),
        ("08-18", 2.0, 10),
        ("18-24", 1.0, 6),
    ]
    off, peak = a.segments[0].per_release_cost, a.segments[1].per_release_cost
    assert peak == pytest.approx(2 * off, rel=1e-15)
    assert off == pytest.approx(scope.pool * 0.75 / 34, rel=1e-12)  # w share 3/4 over W = 14 + 2·10
    assert a.per_period_cost == pytest.approx(scope.pool * 0.75, rel=1e-12)
    assert scope.planned_total == pytest.approx(scope.pool, rel=1e-12)
    # σ per segment: pure ε, Laplace b = Δ/ε: the peak's noise is half the off-peak's
    assert a.segments[1].components[0].stddev == pytest.approx(a.segments[0].components[0].stddev / 2)
    from dpstream.topology.plan import plan_to_json
    from dpstream.topology.plan_render import render_plan

    doc = plan_to_json(build_plan(_shaped_topology()))
    shaped = [m for s in doc["scopes"] for m in s["metrics"] if "schedule" in m]
    assert [m["name"] for m in shaped] == ["a"] and shaped[0]["schedule"]["name"] == "business_hours"
    assert "08-18 weight 2: 10 rel/period" in render_plan(build_plan(_shaped_topology()))


def _run_period(topo, charge_from: int = P0) -> tuple[dict[tuple[str, int], int], int, int]:
    """Quote and charge every window of the period from `charge_from` in close order; (costs, spent, pool)."""

    async def body():
        ledger = await open_ledger("memory", topo, clock=ManualClock(P0))
        cfg = scope_configs(topo)["s"]
        costs = await charge_on_plan(ledger, topo, "s", P0, charge_from)
        hist = await ledger.history("s")
        return costs, hist[0].spent_units, cfg.cap_units - cfg.reserve_units

    return asyncio.run(body())


def test_ledger_quotes_on_plan_follow_the_shape_and_spend_exactly_the_pool():
    costs, spent, pool = _run_period(_shaped_topology())
    assert spent == pool
    a = {start: c for (m, start), c in costs.items() if m == "a"}
    unit = pool * 3 // 4 // 34
    for start, c in a.items():
        h = 2 if 8 <= (start - P0) // 3600 < 18 else 1
        assert abs(c - h * unit) <= 200, (start, c, h * unit)  # flooring leaves ≤ 1 unit per release to the rest
    assert abs(a[P0 + 9 * 3600] - 2 * a[P0 + 7 * 3600]) <= 200
    b = [c for (m, _), c in costs.items() if m == "b"]
    assert max(b) - min(b) <= 200 and abs(b[0] - pool // 4 // 96) <= 1


def test_ledger_first_quote_equals_the_plans_segment_cost():
    topo = _shaped_topology()
    cfg = scope_configs(topo)["s"]
    pool = cfg.cap_units - cfg.reserve_units
    costs, _, _ = _run_period(topo)
    first = costs[("a", P0)]
    assert first == pool * 3 // (4 * 34)
    seg = build_plan(topo).scope("s").metrics[0].segments[0]
    assert abs(first / 1e12 - seg.per_release_cost) < 1e-11


def test_flat_scopes_keep_their_digest_and_a_shape_changes_it():
    flat = one_scope_topology(metrics=(("a", 3.0, 3600, 3600, False), ("b", 1.0, 900, 900, True)), max_windows={"b": 5})
    assert scope_configs(flat)["s"].digest == "75624a2cca045640"  # the digest before schedules existed
    assert scope_configs(one_scope_topology())["s"].digest == "38141bb37df61d1b"
    assert (
        scope_configs(_shaped_topology())["s"].digest
        != scope_configs(one_scope_topology(metrics=(("a", 3.0, 3600, 3600, False), ("b", 1.0, 900, 900, False))))[
            "s"
        ].digest
    )


def test_a_shaped_first_period_from_s_spends_the_pool():
    start = P0 + 10 * 3600
    costs, spent, pool = _run_period(_shaped_topology(), charge_from=start)
    assert spent == pool
    a = {s: c for (m, s), c in costs.items() if m == "a"}
    assert abs(a[start] - 2 * a[P0 + 20 * 3600]) <= 200


def test_planned_spent_follows_the_shape_and_reaches_the_pool():
    from dpstream.workers.telemetry.budget import planned_spent

    topo = one_scope_topology(metrics=(("a", 1.0, 3600, 3600, False),), schedules={"a": PEAK})
    scope = build_plan(topo).scope("s")
    at = [planned_spent(scope, P0, P0 + DAY, P0 + h * 3600) for h in (0, 8, 18, 24)]
    assert at[0] == 0.0
    assert at[1] == pytest.approx(scope.pool * 8 / 34)  # 8 off-peak hours of weight 1
    assert at[2] == pytest.approx(scope.pool * 28 / 34)  # then 10 peak hours of weight 2
    assert at[3] == pytest.approx(scope.pool)


def test_planned_spend_rate_follows_the_shape_and_integrates_to_planned_spent():
    """Rate at each instant = cost on plan of the window ending next over `every`: twice as high in the
    peak hours; summed over each window it is `planned_spent` at that window's end (with the flat
    15-minute metric beside it spread evenly), and over the day the pool."""
    from dpstream.workers.telemetry.budget import planned_spend_rate, planned_spent

    scope = build_plan(_shaped_topology()).scope("s")
    end = P0 + DAY
    rates = [planned_spend_rate(scope, P0, end, now=P0 + h * 3600 + 1800) for h in range(24)]
    flat = scope.pool / 4 / DAY  # b: weight 1 of 4, even
    peak, off = rates[9] - flat, rates[7] - flat
    assert peak == pytest.approx(2 * off, rel=1e-12) and off == pytest.approx(scope.pool * 0.75 / 34 / 3600)
    integral = 0.0
    for h, rate in enumerate(rates):
        integral += rate * 3600
        assert integral == pytest.approx(planned_spent(scope, P0, end, P0 + (h + 1) * 3600), rel=1e-9), h
    assert integral == pytest.approx(scope.pool, rel=1e-12)
    assert planned_spend_rate(scope, P0, end, now=end + 10) == pytest.approx(flat, rel=1e-12)  # a's windows are over
