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
