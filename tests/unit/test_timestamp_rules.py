"""Tests of the timestamp-type rule of a topology's topics (workers/runtime/topics.py) and of the
source field that opts in to producer record times (`arrival: create_time`, labelled weaker)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from dpstream.topology.dumper import dump_topology
from dpstream.topology.errors import ConfigError
from dpstream.topology.lint import lint_topology
from dpstream.topology.loader import load_text_with_warnings, load_topology, load_topology_text
from dpstream.topology.model import Arrival
from dpstream.topology.plan import build_plan, plan_to_json
from dpstream.topology.plan_render import render_plan
from dpstream.workers.runtime.topics import clock_probe_topic, timestamp_rules, topic_configs

pytestmark = pytest.mark.unit

EXAMPLE = Path(__file__).resolve().parents[2] / "topology" / "examples" / "web-analytics.yaml"


def _opted_in() -> str:
    text = EXAMPLE.read_text()
    return text.replace("    idle_timeout: 30s\n", "    idle_timeout: 30s\n    arrival: create_time\n", 1)


def test_sources_need_append_time_hops_and_releases_create_time() -> None:
    """A source topic must be LogAppendTime; its by-unit hop and the releases topic CreateTime; the clock
    probe LogAppendTime; and each is created so."""
    topology = load_topology(EXAMPLE)
    rules = timestamp_rules(topology)
    probe = clock_probe_topic(topology)
    assert {t: r.accepted for t, r in rules.items()} == {
        "web.clicks": ("LogAppendTime",),
        "web.clicks.by-unit": ("CreateTime",),
        "web.dp-releases": ("CreateTime",),
        probe: ("LogAppendTime",),
    }
    assert topic_configs(topology)["web.clicks.by-unit"] == {"message.timestamp.type": "CreateTime"}
    assert topic_configs(topology)["web.dp-releases"] == {"message.timestamp.type": "CreateTime"}
    assert topic_configs(topology)["web.clicks"] == {"message.timestamp.type": "LogAppendTime"}


def test_a_create_time_source_is_refused_in_one_line_naming_the_setting_and_both_fixes() -> None:
    """The refusal names the topic, the source, the setting, the kafka-configs fix and the opt-in."""
    rule = timestamp_rules(load_topology(EXAMPLE))["web.clicks"]
    assert rule.problem("LogAppendTime") is None
    message = rule.problem("CreateTime", "kafka:9092")
    assert message is not None and "\n" not in message
    assert message.startswith("topic 'web.clicks' (source 'clicks'): message.timestamp.type is CreateTime, so ")
    assert (
        "`kafka-configs --bootstrap-server kafka:9092 --alter --entity-type topics --entity-name web.clicks "
        "--add-config message.timestamp.type=LogAppendTime`" in message
    )
    assert "set `arrival: create_time` on source 'clicks' (weaker" in message
    assert rule.record_problem(0) == rule.problem("CreateTime")  # a consumed CreateTime record
    assert rule.record_problem(1) is None


def test_hop_and_releases_topics_refuse_log_append_time() -> None:
    """LogAppendTime on a by-unit or releases topic would replace the time the worker writes: refused."""
    rules = timestamp_rules(load_topology(EXAMPLE))
    hop = rules["web.clicks.by-unit"].problem("LogAppendTime") or ""
    assert "repartition hop of source 'clicks'" in hop and "message.timestamp.type=CreateTime" in hop
    releases = rules["web.dp-releases"].problem("LogAppendTime") or ""
    assert "publish-time stamp" in releases and "message.timestamp.type=CreateTime" in releases
    assert rules["web.dp-releases"].problem("CreateTime") is None


def test_arrival_create_time_accepts_both_types_and_is_labelled_weaker() -> None:
    """`arrival: create_time` is read, accepts a CreateTime source topic (LogAppendTime still created),
    and `validate` warns, the text plan labels the metrics, the JSON plan flags them."""
    topology, warnings = load_text_with_warnings(_opted_in(), "t.yaml", env={})
    assert topology.sources["clicks"].arrival is Arrival.CREATE_TIME
    rule = timestamp_rules(topology)["web.clicks"]
    assert rule.problem("CreateTime") is None and rule.problem("LogAppendTime") is None
    assert topic_configs(topology)["web.clicks"] == {"message.timestamp.type": "LogAppendTime"}
    assert any("arrival 'create_time'" in str(w) and "(weaker)" in str(w) for w in warnings)
    text = render_plan(build_plan(topology))
    assert "page_views [create-time arrival]" in text
    assert "CREATE-TIME ARRIVAL" in text
    doc = plan_to_json(build_plan(topology))
    assert all(m["create_time_arrival"] for s in doc["scopes"] for m in s["metrics"])
    plain = plan_to_json(build_plan(load_topology(EXAMPLE)))
    assert not any(m["create_time_arrival"] for s in plain["scopes"] for m in s["metrics"])
    assert not any("arrival" in str(w) for w in lint_topology(load_topology(EXAMPLE)))


def test_arrival_round_trips_and_only_a_non_default_changes_the_version() -> None:
    """The dumper writes `arrival` back only when set; the default leaves topology_version as it was."""
    plain = load_topology(EXAMPLE)
    opted = load_topology_text(_opted_in(), "t.yaml", env={})
    assert load_topology_text(dump_topology(opted), "t.yaml", env={}).sources["clicks"].arrival is Arrival.CREATE_TIME
    assert "arrival" not in dump_topology(plain)
    assert opted.topology_version != plain.topology_version
    explicit = replace(plain, sources={"clicks": replace(plain.sources["clicks"], arrival=Arrival.APPEND_TIME)})
    assert explicit.topology_version == plain.topology_version


def test_an_unknown_arrival_is_one_line_with_the_choices() -> None:
    """A misspelt arrival value is a ConfigError naming the field and the accepted values."""
    with pytest.raises(ConfigError, match=r"arrival.*append_time.*create_time"):
        load_topology_text(_opted_in().replace("arrival: create_time", "arrival: producer"), "t.yaml", env={})


def test_two_sources_on_one_topic_keep_the_strict_rule_unless_both_opt_in() -> None:
    """One source without the opt-in keeps its topic LogAppendTime-only."""
    topology = load_topology(EXAMPLE)
    clicks = topology.sources["clicks"]
    lax = replace(clicks, name="lax", arrival=Arrival.CREATE_TIME)
    mixed = replace(topology, sources={"clicks": clicks, "lax": lax})
    assert timestamp_rules(mixed)["web.clicks"].accepted == ("LogAppendTime",)
    both = replace(topology, sources={"clicks": replace(clicks, arrival=Arrival.CREATE_TIME), "lax": lax})
    assert timestamp_rules(both)["web.clicks"].accepted == ("LogAppendTime", "CreateTime")
