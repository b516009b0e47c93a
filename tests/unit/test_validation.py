"""Tests of the topology rules: every mistake is one ConfigError line with FILE:LINE, subject, field, value, fix."""

from __future__ import annotations

import pytest

from dpstream.topology.errors import ConfigError
from dpstream.topology.loader import load_topology_text

BASE = """\
version: 1
sources:
  clicks:
    topic: web.clicks
    privacy_unit: user_id
budgets:
  daily:
    epsilon: 1.0
    delta: 1.0e-6
    accounting: zcdp
    period: 1d
metrics:
  m:
    source: clicks
    budget: daily
    weight: 1
    window: {tumbling: 1m}
    aggregate: count
    mechanism: gaussian
sinks:
  releases: out.releases
  dead_letter: out.dlq
"""


def _load(**replacements: str) -> None:
    """Load BASE with `old=new` text replacements (keys use __ for spaces around ':')."""
    text = BASE
    for old, new in replacements.items():
        assert old.replace("__", ": ") in text, old
        text = text.replace(old.replace("__", ": "), new, 1)
    load_topology_text(text, path="t.yaml", env={})


def _metric(*lines: str, aggregate: str = "count", mechanism: str = "gaussian") -> str:
    extra = "".join(f"    {line}\n" for line in lines)
    return f"aggregate: {aggregate}\n    mechanism: {mechanism}\n{extra}".rstrip("\n")


def _raises(pattern: str, **replacements: str) -> None:
    with pytest.raises(ConfigError, match=pattern) as info:
        _load(**replacements)
    message = str(info.value)
    assert "\n" not in message and message.startswith("t.yaml:")


METRIC_SPOT = "aggregate: count\n    mechanism: gaussian"


def test_base_is_valid() -> None:
    """The fixture itself loads, so every failure below is caused by its one change."""
    _load()


def test_message_shape_matches_style_example() -> None:
    """Reversed bounds give exactly the STYLE.md message, prefixed by FILE:LINE."""
    with pytest.raises(ConfigError) as info:
        load_topology_text(
            BASE.replace("  m:", "  basket_value:").replace(
                METRIC_SPOT, _metric("value: v", "bounds: [200, 0]", aggregate="sum")
            ),
            path="t.yaml",
        )
    assert str(info.value).startswith(
        "t.yaml:21: metric 'basket_value': bounds [200, 0]: lower bound must be below upper bound"
    )


@pytest.mark.parametrize(
    ("old", "new", "pattern"),
    [
        ("epsilon: 1.0", "epsilon: 0", r"t.yaml:8: budget 'daily': epsilon 0: must be > 0"),
        ("epsilon: 1.0", "epsilon: .nan", r"epsilon .nan: must be a finite number"),
        ("epsilon: 1.0", "epsilon: false", r"epsilon false: must be a number"),
        ("delta: 1.0e-6", "delta: 1.5", r"delta 1.5: must be in \(0, 1\)"),
        ("delta: 1.0e-6", "delta: -1.0e-6", r"delta -1.0e-6: must be in \(0, 1\)"),
        ("delta: 1.0e-6", "delta: 0.0", r"delta 0.0: zcdp accounting needs 0 < delta < 1"),
        ("    delta: 1.0e-6\n", "", r"t.yaml:7: budget 'daily': missing field 'delta'"),
        ("accounting: zcdp", "accounting: renyi", r"accounting 'renyi': unknown accounting; valid: zcdp, pure"),
        ("period: 1d", "period: 1 day", r"period '1 day': not a duration"),
        ("period: 1d", "period: 0s", r"period '0s': not a duration"),
        ("period: 1d", "period: 1d\n    reserve: 1", r"reserve 1: must be in \[0, 1\)"),
        ("period: 1d", "period: 1d\n    warn_at: 0.0", r"warn_at 0.0: must be in \(0, 1\]"),
        ("period: 1d", "period: 1d\n    on_warning: {stretch: 0.5}", r"on_warning.stretch 0.5: must be > 1"),
        ("period: 1d", "period: 1d\n    on_warning: {thin: 1}", r"on_warning.thin 1: must be at least 2"),
        ("period: 1d", "period: 1d\n    on_warning: {stretch: 2, thin: 2}", r"give exactly one of stretch or thin"),
        (
            "period: 1d",
            "period: 1d\n    on_warning: {strech: 2}",
            r"on_warning: unknown field 'strech'; did you mean 'stretch'\?",
        ),
        ("period: 1d", "period: 1d\n    expected_units: 0", r"expected_units 0: must be at least 1"),
        ("weight: 1", "weight: 0", r"t.yaml:16: metric 'm': weight 0: must be > 0"),
        ("weight: 1", "weight: -0.5", r"weight -0.5: must be > 0"),
        ("weight: 1", "weight: heavy", r"weight 'heavy': must be a number"),
        ("source: clicks", "source: click", r"metric 'm': source 'click': no such source; did you mean 'clicks'\?"),
        ("budget: daily", "budget: weekly", r"metric 'm': budget 'weekly': no such budget; valid: daily"),
        (
            "{tumbling: 1m}",
            "{tumbling: 7m}",
            r"window \{tumbling: 7m\}: size 7m does not divide budget 'daily' period 1d",
        ),
        ("{tumbling: 1m}", "{hopping: 6m, every: 4m}", r"every must divide the hopping size"),
        ("{tumbling: 1m}", "{hopping: 1m, every: 5m}", r"every must not exceed the hopping size"),
        ("{tumbling: 1m}", "{sliding: 1m}", r"window: unknown field 'sliding'"),
        (
            "aggregate: count",
            "aggregate: average",
            r"aggregate 'average': unknown aggregate; .*valid: count, count_units, sum, mean, top_k",
        ),
        (
            "mechanism: gaussian",
            "mechanism: laplaсe",
            r"mechanism 'laplaсe': unknown mechanism; did you mean 'laplace'\?",
        ),
        ("accounting: zcdp", "accounting: pure", r"mechanism 'gaussian': budget 'daily' uses pure accounting"),
        (
            "mechanism: gaussian",
            "mechanism: exponential",
            r"mechanism 'exponential': the exponential mechanism selects top-k keys only",
        ),
        ("version: 1", "version: 2", r"t.yaml:1: version 2: unsupported"),
        ("version: 1", "version: '1'", r"version '1': unsupported"),
        ("privacy_unit: user_id", "privacy_unit: 42", r"privacy_unit 42: must be a string; quote it"),
        ("topic: web.clicks", "topic: ''", r"source 'clicks': topic is empty"),
        ("    topic: web.clicks\n", "", r"t.yaml:3: source 'clicks': missing field 'topic'"),
        ("privacy_unit: user_id", "privacy_unit: user_id\n    idle_timeout: 0s", r"idle_timeout '0s': not a duration"),
        (
            "privacy_unit: user_id",
            "privacy_unit: user_id\n    keyed_by_unit: maybe",
            r"keyed_by_unit 'maybe': must be true or false",
        ),
        ("dead_letter: out.dlq", "dead_letter: out.releases", r"dead_letter 'out.releases': must differ from releases"),
        ("releases: out.releases", "releases: web.clicks", r"feedback loop"),
        ("  m:", "  m m:", r"metric 'm m': bad name"),
        ("metrics:\n", "metrics:\n  m0: {}\n", r"metric 'm0': missing field 'source'"),
    ],
)
def test_field_rules(old: str, new: str, pattern: str) -> None:
    """Each bad field value is one ConfigError line naming file:line, the entity, the field and the value."""
    text = BASE.replace(old, new, 1)
    assert text != BASE
    with pytest.raises(ConfigError, match=pattern) as info:
        load_topology_text(text, path="t.yaml", env={})
    assert "\n" not in str(info.value) and str(info.value).startswith("t.yaml:")


@pytest.mark.parametrize(
    ("lines", "aggregate", "mechanism", "pattern"),
    [
        (["value: v"], "sum", "gaussian", r"t.yaml:13: metric 'm': missing field 'bounds'; aggregate sum needs"),
        (["bounds: [0, 1]"], "mean", "gaussian", r"missing field 'value'; aggregate mean needs"),
        (["value: v", "bounds: [1, 0]"], "sum", "gaussian", r"bounds \[1, 0\]: lower bound must be below upper bound"),
        (["value: v", "bounds: [0, .inf]"], "sum", "gaussian", r"bounds\[1\] .inf: must be a finite number"),
        (["value: v", "bounds: [0, 1, 2]"], "sum", "gaussian", r"bounds \[0, 1, 2\]: must be \[lower, upper\]"),
        (["value: v", "bounds: [0, 1]", "denominator: 0"], "mean", "gaussian", r"denominator 0: must be > 0"),
        (["value: v"], "count", "gaussian", r"value 'v': aggregate count does not use value"),
        (["bounds: [0, 1]"], "count_units", "gaussian", r"bounds \[0, 1\]: aggregate count_units does not use bounds"),
        (["denominator: 5"], "count", "gaussian", r"denominator 5: only a mean has a denominator"),
        (["group_by: page"], "top_k", "exponential", r"missing field 'k'; top_k needs"),
        (["k: 3"], "top_k", "exponential", r"missing field 'group_by'; top_k needs"),
        (["k: 0", "group_by: p"], "top_k", "exponential", r"k 0: must be at least 1"),
        (["k: true", "group_by: p"], "top_k", "exponential", r"k true: must be a whole number"),
        (
            ["k: 3", "group_by: p"],
            "top_k",
            "gaussian",
            r"mechanism 'gaussian': top_k chooses its keys with the exponential mechanism",
        ),
        (["k: 3", "group_by: p", "keys: [a, b]"], "top_k", "exponential", r"k 3: exceeds the 2 declared keys"),
        (["k: 3"], "count", "gaussian", r"k 3: only top_k uses k"),
        (["keys: [a]"], "count", "gaussian", r"keys \[a\]: keys are values of group_by"),
        (["group_by: p", "keys: [a, b, a]"], "count", "gaussian", r"keys: duplicate key 'a'"),
        (["group_by: p", "keys: []"], "count", "gaussian", r"keys \[\]: must be a non-empty list"),
        (["group_by: p", "keys: [a, 3]"], "count", "gaussian", r"keys\[\] 3: must be a string"),
        (["contribution: {max_keys: 0}"], "count", "gaussian", r"contribution.max_keys 0: must be at least 1"),
        (["contribution: {max_per_key: -1}"], "count", "gaussian", r"contribution.max_per_key -1: must be at least 1"),
        (["contribution: {max_keys: 2}"], "count", "gaussian", r"max_keys bounds distinct group_by keys"),
        (
            ["contribution: {max_key: 2}"],
            "count",
            "gaussian",
            r"contribution: unknown field 'max_key'; did you mean 'max_keys'\?",
        ),
        (
            ["postprocess: {round: yes please}"],
            "count",
            "gaussian",
            r"postprocess.round 'yes please': must be true or false",
        ),
        (["may_use_reserve: 1"], "count", "gaussian", r"may_use_reserve 1: must be true or false"),
        (["wieght: 2"], "count", "gaussian", r"metric 'm': unknown field 'wieght'; did you mean 'weight'\?"),
    ],
)
def test_metric_combination_rules(lines: list[str], aggregate: str, mechanism: str, pattern: str) -> None:
    """Rules between a metric's fields (aggregate, mechanism, value, bounds, k, keys, contribution)."""
    text = BASE.replace(METRIC_SPOT, _metric(*lines, aggregate=aggregate, mechanism=mechanism))
    with pytest.raises(ConfigError, match=pattern) as info:
        load_topology_text(text, path="t.yaml", env={})
    assert "\n" not in str(info.value) and str(info.value).startswith("t.yaml:")


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("", r"^t.yaml:1: empty topology"),
        ("- 1\n- 2\n", r"^t.yaml:1: topology \[1, 2\]: must be a mapping"),
        (
            BASE.replace("sources:\n", "sources: [a]\nx:\n"),
            r"t.yaml:2: sources \[a\]: must be a mapping of source names",
        ),
        ("version: 1\n  bad: indent\n", r"^t.yaml:2: invalid YAML"),
        ("a: !!python/object:os.system x\n", r"^t.yaml:1: cannot read"),
        ("version: 1\nversion: 1\n", r"^t.yaml:2: duplicate key 'version'"),
    ],
)
def test_document_level_errors(text: str, pattern: str) -> None:
    """Whole-document mistakes (empty, not a mapping, bad YAML, unsafe tags, duplicates) are located too."""
    with pytest.raises(ConfigError, match=pattern):
        load_topology_text(text, path="t.yaml", env={})


def test_pure_scope_accepts_laplace_and_exponential() -> None:
    """A pure scope with laplace counts and an exponential top-k is valid; δ is optional there."""
    text = (
        BASE.replace("    delta: 1.0e-6\n", "")
        .replace("accounting: zcdp", "accounting: pure")
        .replace("mechanism: gaussian", "mechanism: laplace")
    )
    topology = load_topology_text(text, env={})
    assert topology.budgets["daily"].delta == 0.0


CAPPED = "aggregate: count\n    mechanism: gaussian\n    contribution: {max_windows: 60}"


def test_max_windows_loads_on_a_tumbling_window() -> None:
    """contribution.max_windows is read as a positive whole number on a tumbling window."""
    topology = load_topology_text(BASE.replace(METRIC_SPOT, CAPPED), path="t.yaml", env={})
    assert topology.metrics["m"].contribution.max_windows == 60


@pytest.mark.parametrize(
    ("old", "new", "pattern"),
    [
        ("max_windows: 60", "max_windows: 0", r"^t\.yaml:20: metric 'm': contribution\.max_windows 0: must be at"),
        ("max_windows: 60", "max_windows: 2.5", r"contribution\.max_windows 2\.5: must be a whole number"),
        ("max_windows: 60", "max_window: 60", r"max_window.*max_windows"),
    ],
)
def test_max_windows_field_errors(old: str, new: str, pattern: str) -> None:
    """A bad max_windows value is one line naming the field, the value and the fix."""
    with pytest.raises(ConfigError, match=pattern) as info:
        load_topology_text(BASE.replace(METRIC_SPOT, CAPPED.replace(old, new)), path="t.yaml", env={})
    assert "\n" not in str(info.value)


def test_max_windows_refused_on_straddling_windows() -> None:
    """A hopping window has windows across the period boundary: max_windows is refused with the fix."""
    text = BASE.replace(METRIC_SPOT, CAPPED).replace("{tumbling: 1m}", "{hopping: 5m, every: 1m}")
    with pytest.raises(ConfigError) as info:
        load_topology_text(text, path="t.yaml", env={})
    assert str(info.value) == (
        "t.yaml:20: metric 'm': contribution.max_windows 60: window {hopping: 5m, every: 1m} has windows "
        "straddling the 1d period boundary of budget 'daily', so one period's events would move which windows "
        "count in the next; use a tumbling window whose size divides the period, or remove max_windows"
    )


def test_max_windows_refused_on_event_level_source() -> None:
    """An event-level source has no unit to count windows of: max_windows is refused."""
    text = BASE.replace(METRIC_SPOT, CAPPED).replace("privacy_unit: user_id", "privacy_unit: event")
    with pytest.raises(ConfigError, match=r"^t\.yaml:20: .*max_windows 60: source 'clicks' is event-level.*remove"):
        load_topology_text(text, path="t.yaml", env={})


RUNNING = (
    "aggregate: count\n    mechanism: gaussian\n    release: running_total\n    contribution: {max_per_period: 10}"
)


def test_running_total_loads_with_its_bound() -> None:
    """release: running_total with contribution.max_per_period L loads; it is priced as one lump."""
    topology = load_topology_text(BASE.replace(METRIC_SPOT, RUNNING), path="t.yaml", env={})
    metric = topology.metrics["m"]
    assert metric.running_total and metric.contribution.max_per_period == 10
    assert metric.paid_windows == 1 and metric.charged_per_period(86_400) == 1


@pytest.mark.parametrize(
    ("old", "new", "pattern"),
    [
        ("aggregate: count", "aggregate: count_units", r"^t\.yaml:\d+: metric 'm': release .*count or sum"),
        ("mechanism: gaussian", "mechanism: laplace", r"metric 'm': mechanism .*one Gaussian matrix mechanism"),
        ("{tumbling: 1m}", "{hopping: 5m, every: 1m}", r"metric 'm': window .*tumbling step"),
        ("contribution: {max_per_period: 10}", "contribution: {max_keys: 1}", r"missing field 'contribution\.max_per_"),
        ("max_per_period: 10", "max_per_period: 10, max_windows: 3", r"not max_windows; remove max_windows"),
        ("max_per_period: 10", "max_per_period: 0", r"contribution\.max_per_period 0: must be at"),
        ("release: running_total", "release: running", r"release 'running': unknown release"),
        (
            "release: running_total\n",
            "group_by: page\n    release: running_total\n",
            r"group_by 'page': a running total .*declare them",
        ),
    ],
)
def test_running_total_rules(old: str, new: str, pattern: str) -> None:
    """Each misuse of a running total is one line naming the field and the fix."""
    text = BASE.replace(METRIC_SPOT, RUNNING.replace(old, new, 1) if old in RUNNING else RUNNING).replace(
        "{tumbling: 1m}", new if old == "{tumbling: 1m}" else "{tumbling: 1m}"
    )
    with pytest.raises(ConfigError, match=pattern) as info:
        load_topology_text(text, path="t.yaml", env={})
    assert "\n" not in str(info.value) and str(info.value).startswith("t.yaml:")


def test_running_total_refused_in_a_pure_scope() -> None:
    """Pure scopes have no Gaussian (an event-level source is allowed: each event is its own unit, its
    value clamped to [-L, L] by the pipeline)."""
    pure = BASE.replace(METRIC_SPOT, RUNNING).replace("accounting: zcdp", "accounting: pure")
    with pytest.raises(ConfigError, match=r"mechanism 'gaussian': budget 'daily' uses pure accounting"):
        load_topology_text(pure, path="t.yaml", env={})


def test_max_per_period_without_a_running_total_is_refused() -> None:
    """max_per_period bounds only a running total: on a windowed metric it is refused with the fix."""
    text = BASE.replace(METRIC_SPOT, "aggregate: count\n    mechanism: gaussian\n    contribution: {max_per_period: 5}")
    with pytest.raises(ConfigError, match=r"max_per_period bounds .*add release: running_total or remove it"):
        load_topology_text(text, path="t.yaml", env={})
