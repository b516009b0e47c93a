"""Tests of topology.loader (plus its YAML position and env-substitution helpers)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from _topology_strategies import valid_topologies
from topology.dumper import dump_topology
from topology.errors import ConfigError
from topology.loader import load_topology, load_topology_text, load_with_warnings, read_topology
from topology.model import Accounting, Aggregate, Mechanism, WindowKind
from topology.substitution import SubstitutionError, substitute_env
from topology.validation import TopologyError
from topology.yaml_positions import LocatedError, Map, compose_located

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
    assert load_topology_text(BASE.replace("privacy_unit: user_id}", "privacy_unit: user_id, max_future: 5m}")
                              ).sources["clicks"].max_future_s == 300
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
    assert {k: e.get(k).value for k in e.keys()} == {"y": 3, "x": 1}


def test_all_problems_listed_first_in_file_order() -> None:
    """TopologyError's message is the earliest problem; `problems` lists every one, in file order."""
    text = BASE.replace("epsilon: 1.0", "epsilon: -1").replace("aggregate: count", "aggregate: nope")
    with pytest.raises(TopologyError) as info:
        load_topology_text(text, path="t.yaml")
    assert str(info.value).startswith("t.yaml:5: budget 'daily': epsilon -1")
    assert len(info.value.problems) == 2 and info.value.problems[1].startswith("t.yaml:7: metric 'm1': aggregate 'nope'")


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
def test_random_valid_topologies_round_trip(topology) -> None:  # type: ignore[no-untyped-def]
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
