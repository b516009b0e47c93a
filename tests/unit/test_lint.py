"""Tests of topology.lint: warnings for legal but probably unintended topologies."""

from __future__ import annotations

from pathlib import Path

from dpstream.topology.lint import lint_topology
from dpstream.topology.loader import load_text_with_warnings, load_topology_text, load_with_warnings

EXAMPLES = Path(__file__).resolve().parents[2] / "topology" / "examples"

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
    period: 1d
metrics:
  a:
    source: clicks
    budget: daily
    window: {tumbling: 1m}
    aggregate: count
    mechanism: gaussian
sinks:
  releases: out.releases
  dead_letter: out.dlq
"""


def _messages(text: str) -> list[str]:
    _, warnings = load_text_with_warnings(text, path="t.yaml", env={})
    return [str(w) for w in warnings]


def test_clean_topology_has_no_warnings() -> None:
    """The default reserve/warn_at, a small δ, one mechanism and a person-level unit give no warnings."""
    assert _messages(BASE) == []


def test_reserve_below_one_minus_warn_at() -> None:
    """reserve < 1 − warn_at warns (the plan alone would trip the warning each period) with both fixes."""
    messages = _messages(BASE.replace("period: 1d", "period: 1d\n    reserve: 0.1"))
    assert messages == [
        "warning: t.yaml:11: budget 'daily': reserve 0.1 < 1 - warn_at (0.2): the plan alone spends past "
        "warn_at every period; raise reserve to 0.2 or warn_at to 0.9"
    ]


def test_reserve_equal_to_one_minus_warn_at_is_exact() -> None:
    """0.3 + 0.7 is compared as decimals, so it does not warn through float rounding."""
    assert _messages(BASE.replace("period: 1d", "period: 1d\n    reserve: 0.3\n    warn_at: 0.7")) == []


def test_large_delta_without_expected_units() -> None:
    """δ above 1e-5 warns when the budget does not declare expected_units."""
    messages = _messages(BASE.replace("1.0e-6", "1.0e-3"))
    assert len(messages) == 1 and "t.yaml:9: budget 'daily': delta 0.001 is large" in messages[0]


def test_delta_against_expected_units() -> None:
    """With expected_units N, δ must be ≥ 10× below 1/N: 1e-6 is fine for 1,000 units, not for 1,000,000."""
    few = BASE.replace("period: 1d", "period: 1d\n    expected_units: 1000")
    many = BASE.replace("period: 1d", "period: 1d\n    expected_units: 1000000")
    assert _messages(few) == []
    messages = _messages(many)
    assert len(messages) == 1 and "not far below 1/expected_units (1/1000000)" in messages[0]


def test_mixing_laplace_and_gaussian_in_zcdp() -> None:
    """A zcdp scope with both laplace and gaussian metrics warns, naming the laplace ones."""
    text = BASE.replace(
        "sinks:",
        "  b:\n    source: clicks\n    budget: daily\n    window: {tumbling: 1m}\n    aggregate: count\n"
        "    mechanism: laplace\nsinks:",
    )
    messages = _messages(text)
    assert len(messages) == 1 and "mixes laplace (b) and gaussian metrics under zcdp" in messages[0]


def test_event_level_unit_warns() -> None:
    """privacy_unit: event is legal but flagged as weaker."""
    messages = _messages(BASE.replace("privacy_unit: user_id", "privacy_unit: event"))
    assert messages == [
        "warning: t.yaml:5: source 'clicks': privacy_unit 'event': event-level (weaker): it protects single events, "
        "not people; name the field that identifies a person if there is one"
    ]


def test_hopping_window_straddles_period() -> None:
    """A hopping window warns that size/every − 1 windows per period are charged to two periods."""
    messages = _messages(BASE.replace("{tumbling: 1m}", "{hopping: 15m, every: 5m}"))
    assert len(messages) == 1 and "2 window(s) per period straddle the 1d period boundary" in messages[0]


def test_pure_scope_with_delta_warns_and_unused_entities() -> None:
    """A δ in a pure scope, an unread source and an unused budget are each pointed out."""
    text = (
        BASE.replace("period: 1d", "period: 1d\n    accounting: pure")
        .replace("mechanism: gaussian", "mechanism: laplace")
        .replace("budgets:\n", "budgets:\n  spare: {epsilon: 1, period: 1d, accounting: pure}\n")
        .replace("sources:\n", "sources:\n  idle: {topic: other, privacy_unit: user_id}\n")
    )
    messages = _messages(text)
    assert any("source 'idle': no metric reads it" in m for m in messages)
    assert any("budget 'spare': no metric draws on it" in m for m in messages)
    assert any("delta 1e-06: pure accounting uses δ only for partition selection" in m for m in messages)
    lines = [int(m.split(":")[2]) for m in messages]
    assert lines == sorted(lines)


def test_lint_without_source_map_names_the_file() -> None:
    """lint_topology works on a bare Topology (no lines): `where` is the topology's path."""
    topology = load_topology_text(BASE.replace("1.0e-6", "0.01"), path="x.yaml", env={})
    warnings = lint_topology(topology)
    assert [w.where for w in warnings] == ["x.yaml"]


def test_examples_warnings() -> None:
    """The examples warn exactly where expected: seed-example's zero reserve (its δ serves top-5's key
    selection), web-analytics' hopping window."""
    _, web = load_with_warnings(EXAMPLES / "web-analytics.yaml", env={})
    _, seed = load_with_warnings(EXAMPLES / "seed-example.yaml", env={})
    _, adaptive = load_with_warnings(EXAMPLES / "seed-adaptive.yaml", env={})
    assert [w.message.split(":")[0] for w in web] == ["metric 'active_users_5m'"]
    assert [w.message.split(":")[0] for w in seed] == ["budget 'risk-features'"] and adaptive == []
    assert "reserve 0 < 1 - warn_at" in seed[0].message


def test_max_windows_not_below_windows_per_period_warns() -> None:
    """A max_windows at or above the windows per period caps nothing: one warning naming both figures."""
    spot = "    mechanism: gaussian\n"
    capped = BASE.replace(spot, spot + "    contribution: {max_windows: 1440}\n")
    messages = _messages(capped)
    assert messages == [
        "warning: t.yaml:18: metric 'a': contribution.max_windows 1440: not below the 1440 windows per 1d period "
        "of budget 'daily', so it caps nothing and costs nothing less; lower it or remove it"
    ]
    assert _messages(capped.replace("1440", "60")) == []
