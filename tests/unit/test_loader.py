"""Tests of topology.loader (plus its YAML position and env-substitution helpers)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from _topology_strategies import valid_topologies
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpstream.topology.dumper import dump_topology, format_start
from dpstream.topology.errors import ConfigError
from dpstream.topology.loader import (
    START_MAX_S,
    START_MIN_S,
    load_topology,
    load_topology_text,
    load_with_warnings,
    read_topology,
)
from dpstream.topology.model import Accounting, Aggregate, Mechanism, Topology, WindowKind
from dpstream.topology.substitution import SubstitutionError, substitute_env
from dpstream.topology.validation import TopologyError
from dpstream.topology.yaml_positions import LocatedError, Map, compose_located

EXAMPLES = Path(__file__).resolve().parents[2] / "topology" / "examples"

BASE = """\
version: 1
sources:
  clicks: {topic: web.clicks, privacy_unit: user_id}
budgets:
  daily: {epsilon: 1.0, delta: 1.0e-6, period: 1d}
metrics:
  m1: {source: clicks, budget: daily, window: {tumbling: 1m}, aggregate: count, mechanism: gaussian}
sinks: {releases: out.releases, dead_letter: out.dlq}
"""


@pytest.mark.parametrize("name", ["seed-example.yaml", "seed-adaptive.yaml", "web-analytics.yaml"])
def test_reference_examples_load(name: str) -> None:
    """Each reference topology loads without errors and keeps its file path."""
    topology = load_topology(EXAMPLES / name, env={})
    assert topology.metrics and topology.budgets and topology.sources
    assert topology.path == str(EXAMPLES / name)


def test_web_analytics_fields() -> None:
    """web-analytics.yaml loads into the expected typed values (Enums, durations, windows, keys)."""
    t = load_topology(EXAMPLES / "web-analytics.yaml", env={})
    budget = t.budgets["web-daily"]
    assert (budget.epsilon, budget.delta, budget.accounting, budget.period_s) == (1.0, 1e-6, Accounting.ZCDP, 86400)
    assert budget.on_warning.stretch == 1.5 and budget.on_warning.thin == 1
    assert t.sources["clicks"].allowed_lateness_s == 10 and t.sources["clicks"].idle_timeout_s == 30
    views = t.metrics["page_views"]
    assert views.keys == ("home", "search", "product", "cart", "checkout")
    assert (views.contribution.max_keys, views.contribution.max_per_key) == (3, 5)
    active = t.metrics["active_users_5m"]
    assert active.window.kind is WindowKind.HOPPING and (active.window.size_s, active.window.every_s) == (300, 60)
    assert t.metrics["basket_value"].bounds.upper == 200
    top = t.metrics["top_referrers"]
    assert (top.aggregate, top.mechanism, top.k) == (Aggregate.TOP_K, Mechanism.EXPONENTIAL, 5)
    assert list(t.metrics) == ["page_views", "active_users_5m", "basket_value", "session_seconds", "top_referrers"]
    assert t.kafka.bootstrap == "localhost:9092" and t.redis.url == "redis://localhost:6379/0"


def test_pure_scope_keeps_delta_for_partition_selection() -> None:
    """seed-example's pure scope keeps δ=1e-6: its top-5 over data-derived merchants selects keys with it."""
    t, warnings = load_with_warnings(EXAMPLES / "seed-example.yaml", env={})
    assert t.budgets["risk-features"].delta == 1e-6
    assert not any("delta" in w.message for w in warnings)


def test_defaults() -> None:
    """Omitted optional fields take the documented defaults."""
    t = load_topology_text(BASE)
    b, m, s = t.budgets["daily"], t.metrics["m1"], t.sources["clicks"]
    assert (b.accounting, b.reserve, b.warn_at) == (Accounting.ZCDP, 0.2, 0.8)
    assert (m.weight, m.contribution.max_keys, m.contribution.max_per_key) == (1.0, 1, 1)
    assert (s.allowed_lateness_s, s.idle_timeout_s, s.keyed_by_unit, s.timestamp) == (0, 30, False, None)
    assert s.max_future_s == 3600
    assert (
        load_topology_text(BASE.replace("privacy_unit: user_id}", "privacy_unit: user_id, max_future: 5m}"))
        .sources["clicks"]
        .max_future_s
        == 300
    )
    assert t.sinks.partials_topic == "out.releases.partials"


def test_env_substitution_default_and_override() -> None:
    """`${VAR:-default}` uses the default when unset or empty and the variable when set."""
    text = BASE.replace("web.clicks", '"${TOPIC:-web.clicks}"')
    assert load_topology_text(text, env={}).sources["clicks"].topic == "web.clicks"
    assert load_topology_text(text, env={"TOPIC": ""}).sources["clicks"].topic == "web.clicks"
    assert load_topology_text(text, env={"TOPIC": "prod.clicks"}).sources["clicks"].topic == "prod.clicks"


def test_env_substitution_gives_numbers_to_number_fields() -> None:
    """A substituted scalar is re-typed: ε from the environment is a number, block or quoted-flow style."""
    block = BASE.replace(
        "{epsilon: 1.0, delta: 1.0e-6, period: 1d}", "\n    epsilon: ${EPS:-1.0}\n    delta: 1.0e-6\n    period: 1d"
    )
    assert load_topology_text(block, env={"EPS": "0.5"}).budgets["daily"].epsilon == 0.5
    assert load_topology_text(block, env={}).budgets["daily"].epsilon == 1.0
    quoted = BASE.replace("epsilon: 1.0", 'epsilon: "${EPS:-1.0}"')
    assert load_topology_text(quoted, env={"EPS": "0.25"}).budgets["daily"].epsilon == 0.25
    with pytest.raises(ConfigError, match=r"epsilon 'x': must be a number"):
        load_topology_text(quoted, env={"EPS": "x"})


def test_unquoted_reference_in_flow_style_explains_the_quoting() -> None:
    """`{topic: ${T}}` is invalid YAML; the message says to quote the reference."""
    with pytest.raises(ConfigError, match=r"^<string>:3: invalid YAML: .*quote a \$\{\.\.\.\} reference"):
        load_topology_text(BASE.replace("web.clicks", "${T:-x}"), env={})


def test_env_missing_variable_is_a_located_error() -> None:
    """`${VAR}` without default and VAR unset is a ConfigError naming the line and the fix."""
    text = BASE.replace("web.clicks", '"${NOPE_TOPIC}"')
    with pytest.raises(ConfigError, match=r"^<string>:3: environment variable 'NOPE_TOPIC' is not set: export"):
        load_topology_text(text, env={})


def test_substitute_env_forms() -> None:
    """substitute_env handles plain, defaulted, escaped and literal dollars."""
    env = {"A": "x", "EMPTY": ""}
    assert substitute_env("${A}-${B:-y}-$${A}-$5", env) == "x-y-${A}-$5"
    assert substitute_env("${EMPTY}", env) == ""
    assert substitute_env("${EMPTY:-d}", env) == "d"
    for bad in ("${}", "${1A}", "${A-x}", "${A", "${A:?x}"):
        with pytest.raises(SubstitutionError):
            substitute_env(bad, env)


def test_scientific_notation_without_dot_is_a_number() -> None:
    """`delta: 1e-6` (a string in YAML 1.1) is read as the number it looks like."""
    assert load_topology_text(BASE.replace("1.0e-6", "1e-6")).budgets["daily"].delta == 1e-6


def test_an_epsilon_past_float_range_arithmetic_is_one_line() -> None:
    """`epsilon: 1e200` is refused at load (the fuzz test found ε²/2 overflowing in the accounting)."""
    with pytest.raises(ConfigError, match=r"budget 'daily': epsilon '1.0e200': must be at most 1e\+06"):
        load_topology_text(BASE.replace("epsilon: 1.0,", "epsilon: 1.0e200,"))
    assert load_topology_text(BASE.replace("epsilon: 1.0,", "epsilon: 1.0e6,")).budgets["daily"].epsilon == 1e6


def test_bool_is_not_a_number() -> None:
    """`weight: true` is refused: booleans are not numbers."""
    text = BASE.replace("budget: daily,", "budget: daily, weight: true,")
    with pytest.raises(ConfigError, match=r"metric 'm1': weight true: must be a number"):
        load_topology_text(text)


def test_duplicate_mapping_key_rejected() -> None:
    """A key written twice is an error at the second occurrence (PyYAML would silently keep the last)."""
    with pytest.raises(LocatedError, match=r"duplicate key 'a' \(first written on line 1\)") as info:
        compose_located("a: 1\nb: 2\na: 3\n", {})
    assert info.value.line == 3


def test_merge_keys_are_honoured() -> None:
    """`<<: *defaults` merges a mapping; explicit keys win."""
    root = compose_located("d: &d {x: 1, y: 2}\ne:\n  <<: *d\n  y: 3\n", {})
    assert isinstance(root, Map)
    e = root.get("e")
    assert isinstance(e, Map)
    assert {k: e.get(k).value for k in e.keys()} == {"y": 3, "x": 1}  # noqa: SIM118 - Map is not a dict: keys() is its API


def test_all_problems_listed_first_in_file_order() -> None:
    """TopologyError's message is the earliest problem; `problems` lists every one, in file order."""
    text = BASE.replace("epsilon: 1.0", "epsilon: -1").replace("aggregate: count", "aggregate: nope")
    with pytest.raises(TopologyError) as info:
        load_topology_text(text, path="t.yaml")
    assert str(info.value).startswith("t.yaml:5: budget 'daily': epsilon -1")
    assert len(info.value.problems) == 2 and info.value.problems[1].startswith(
        "t.yaml:7: metric 'm1': aggregate 'nope'"
    )


def test_misspelt_required_field_reports_only_the_typo() -> None:
    """A misspelt required key gives 'did you mean', not also 'missing field'."""
    with pytest.raises(TopologyError) as info:
        load_topology_text(BASE.replace("mechanism:", "mechansim:"))
    assert info.value.problems == ("<string>:7: metric 'm1': unknown field 'mechansim'; did you mean 'mechanism'?",)


def test_broken_budget_does_not_cascade_into_unknown_budget() -> None:
    """A metric naming a budget that failed to load is not also reported as 'no such budget'."""
    with pytest.raises(TopologyError) as info:
        load_topology_text(BASE.replace("epsilon: 1.0", "epsilon: 0"))
    assert len(info.value.problems) == 1


def test_missing_file_directory_and_binary(tmp_path: Path) -> None:
    """Unreadable paths are one-line ConfigErrors, not tracebacks."""
    with pytest.raises(ConfigError, match="no such file"):
        load_topology(tmp_path / "absent.yaml")
    with pytest.raises(ConfigError, match="is a directory"):
        load_topology(tmp_path)
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00version: 1")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_topology(binary)


def test_read_topology_source_map_lines() -> None:
    """The source map records where entities and fields were written (1-based)."""
    _, source_map = read_topology(BASE, "t.yaml", {})
    assert source_map.line("metric", "m1") == 7
    assert source_map.line("budget", "daily", "epsilon") == 5
    assert source_map.where("source", "clicks", "nonexistent") == "t.yaml:3"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_topologies())
def test_random_valid_topologies_round_trip(topology: Topology) -> None:
    """dump → load gives back an equal Topology with the same topology_version."""
    loaded = load_topology_text(dump_topology(topology), path=topology.path, env={})
    assert loaded == topology
    assert loaded.topology_version == topology.topology_version


def test_alias_cycles_and_deep_nesting_are_config_errors() -> None:
    """Self-referencing aliases and absurd nesting give a ConfigError, never a RecursionError."""
    with pytest.raises(ConfigError, match=r"^<string>:1: an alias refers to the mapping or list that contains it"):
        load_topology_text("a: &a [*a]\n")
    with pytest.raises(ConfigError, match=r"^<string>:1: invalid YAML: nested too deeply"):
        load_topology_text("a: " + "[" * 5000 + "]" * 5000 + "\n")


START_2026_12_01 = 1_796_083_200
"""2026-12-01T00:00:00Z in epoch seconds."""


def _with_start(value: str) -> str:
    return BASE.replace("version: 1\n", f"version: 1\nstart: {value}\n", 1)


def test_start_is_optional() -> None:
    """Without `start:` the topology has schedule_start None (the ledger records the first start instead)."""
    assert load_topology_text(BASE).schedule_start is None
    assert load_topology_text(_with_start("~")).schedule_start is None


@pytest.mark.parametrize(
    "value",
    [
        "2026-12-01T00:00:00Z",
        '"2026-12-01T00:00:00Z"',
        "2026-12-01T00:00:00+00:00",
        "2026-12-01T00:00Z",
        "2026-12-01 00:00:00Z",
        "2026-12-01t00:00:00z",
        "1796083200",
        "${START:-2026-12-01T00:00:00Z}",
        '"${START:-1796083200}"',
    ],
)
def test_start_iso_and_epoch_forms_give_the_same_schedule_start(value: str) -> None:
    """ISO-8601 with Z or +00:00 (plain or quoted) and integer epoch seconds all load to the same schedule_start."""
    topology = load_topology_text(_with_start(value), env={})
    assert topology.schedule_start == START_2026_12_01
    assert isinstance(topology.schedule_start, int) and not isinstance(topology.schedule_start, bool)


def test_start_from_the_environment() -> None:
    """`start: ${START}` takes either form from the environment."""
    text = _with_start("${START}")
    assert load_topology_text(text, env={"START": "2026-12-01T00:00:00Z"}).schedule_start == START_2026_12_01
    assert load_topology_text(text, env={"START": "1796083200"}).schedule_start == START_2026_12_01
    assert load_topology_text(_with_start("${START:-}"), env={}).schedule_start is None


def test_start_changes_the_topology_version() -> None:
    """The public start is privacy content: a different start is a different topology_version."""
    without = load_topology_text(BASE).topology_version
    at = load_topology_text(_with_start("2026-12-01T00:00:00Z")).topology_version
    later = load_topology_text(_with_start("2026-12-02T00:00:00Z")).topology_version
    assert len({without, at, later}) == 3


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("2026-12-01T00:00:00", r"no UTC offset .*e\.g\. start: 2026-12-01T00:00:00Z"),
        ('"2026-12-01T00:00:00"', r"no UTC offset"),
        ("2026-12-01T01:00:00+01:00", r"offset \+01:00 is not UTC; .*e\.g\. start: 2026-12-01T00:00:00Z"),
        ("2026-11-30T19:00:00-05:00", r"offset -05:00 is not UTC; .*e\.g\. start: 2026-12-01T00:00:00Z"),
        ("1999-12-31T23:59:59Z", r"time before 2000-01-01T00:00:00Z \(a typo\?\)"),
        ("946684799", r"epoch seconds before 2000-01-01"),
        ("-1", r"epoch seconds before 2000-01-01"),
        ("2026-12-01T00:00:00.5Z", r"fractional second; start is whole seconds, e\.g\. start: 2026-12-01T00:00:00Z"),
        ("2026-12-01T00:00:00.000Z", r"fractional second"),
        ("1796083200.5", r"must be whole epoch seconds \(an integer\); e\.g\. start: 1796083200"),
        ("1796083200.0", r"must be whole epoch seconds"),
        ("1796083200000", r"after 2100-01-01T00:00:00Z .*in seconds that is start: 1796083200"),
        ("2100-01-01T00:00:00Z", r"time after 2100-01-01T00:00:00Z"),
        ("2026-12-01", r"a date without a time of day; .*e\.g\. start: 2026-12-01T00:00:00Z"),
        ("12:30:00", r"a time of day without a date"),
        ('"1796083200"', r"a quoted number is text; write epoch seconds unquoted"),
        ('"2026-02-30T00:00:00Z"', r"not a valid date and time"),
        ('"next monday"', r"not an ISO-8601 UTC time or epoch seconds"),
        ('"0001-01-01T00:00:00+01:00"', r"offset \+01:00 is not UTC; write the same instant in UTC$"),
        ("true", r"must be a UTC time"),
        ("[2026]", r"must be a UTC time"),
    ],
)
def test_bad_start_is_a_one_line_error_naming_start(value: str, fragment: str) -> None:
    """Every bad `start:` is one located line: `FILE:LINE: start <value>: <problem>; <fix>`."""
    with pytest.raises(TopologyError) as info:
        load_topology_text(_with_start(value), path="t.yaml", env={})
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("t.yaml:2: start "), message
    assert re.search(fragment, message), message
    assert info.value.problems == (message,)


def test_start_round_trips_through_the_dumper() -> None:
    """The dumper writes start as ISO-8601 UTC with Z, which loads back to the same schedule_start and version."""
    topology = load_topology_text(_with_start("1796083200"))
    text = dump_topology(topology)
    assert "start: '2026-12-01T00:00:00Z'" in text
    again = load_topology_text(text)
    assert again == topology and again.topology_version == topology.topology_version
    assert "start" not in dump_topology(load_topology_text(BASE))
    assert format_start(START_MIN_S) == "2000-01-01T00:00:00Z"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_topologies(), st.integers(START_MIN_S, START_MAX_S - 1))
def test_random_starts_round_trip(topology: Topology, schedule_start: int) -> None:
    """Any start in range survives dump → load unchanged, with the same topology_version."""
    topology = dataclasses.replace(topology, schedule_start=schedule_start)
    loaded = load_topology_text(dump_topology(topology), path=topology.path, env={})
    assert loaded == topology and loaded.schedule_start == schedule_start
    assert loaded.topology_version == topology.topology_version


def _source_with(fields: str) -> str:
    return BASE.replace(
        "{topic: web.clicks, privacy_unit: user_id}", "{topic: web.clicks, privacy_unit: user_id, " + fields + "}"
    )


def test_partitioner_of_a_keyed_source_is_read_and_defaults_to_murmur2() -> None:
    """keyed_by_unit sources name how producers partition by key: murmur2 (default) or crc32."""
    from dpstream.topology.model import Partitioner

    assert load_topology_text(_source_with("keyed_by_unit: true")).sources["clicks"].partitioner is Partitioner.MURMUR2
    crc = load_topology_text(_source_with("keyed_by_unit: true, partitioner: crc32")).sources["clicks"]
    assert crc.partitioner is Partitioner.CRC32
    assert "partitioner: crc32" in dump_topology(
        load_topology_text(_source_with("keyed_by_unit: true, partitioner: crc32"))
    )


def test_a_bad_partitioner_is_one_line_naming_the_field_with_a_did_you_mean() -> None:
    """An unknown value gets a did-you-mean and the valid list; on a repartitioned source the field is refused."""
    with pytest.raises(
        ConfigError,
        match=r"^<string>:3: source 'clicks': partitioner 'murmur': unknown partitioner; "
        r"did you mean 'murmur2'\? \(valid: murmur2, crc32\)$",
    ):
        load_topology_text(_source_with("keyed_by_unit: true, partitioner: murmur"))
    with pytest.raises(
        ConfigError, match=r"source 'clicks': partitioner 'crc32': is only read with keyed_by_unit: true"
    ):
        load_topology_text(_source_with("partitioner: crc32"))
