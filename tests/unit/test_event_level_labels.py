"""A scope or metric whose source has `privacy_unit: event` is labelled `event-level (weaker)` in the
report card (JSON, page and text) and in `dpstream verify` (text and JSON); unit-level ones are not."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from dpstream.topology.loader import load_topology_text
from dpstream.topology.model import EVENT_LEVEL_LABEL, UNIT_LEVEL_LABEL
from dpstream.topology.periods import period_id
from dpstream.workers.commands.budget_report import render_text as report_text
from dpstream.workers.ledger import open_ledger
from dpstream.workers.ledger.testing import ManualClock
from dpstream.workers.report.build import build_report
from dpstream.workers.report.collect import collect_period
from dpstream.workers.report.page import render_page
from dpstream.workers.runtime.replay import replay_lines
from dpstream.workers.verify.report import VerifyReport, render_json, render_text

HOUR = 3_600
P0 = (1_796_000_000 // HOUR) * HOUR

_YAML = """
version: 1
start: {start}
sources:
  people: {{topic: t1, privacy_unit: user_id, timestamp: ts}}
  clicks: {{topic: t2, privacy_unit: event, timestamp: ts}}
budgets:
  mixed: {{epsilon: 1.0, delta: 1.0e-6, period: 1h}}
  plain: {{epsilon: 1.0, delta: 1.0e-6, period: 1h}}
metrics:
  views: {{source: people, budget: mixed, weight: 1, window: {{tumbling: 10m}}, aggregate: count, mechanism: gaussian}}
  taps: {{source: clicks, budget: mixed, weight: 1, window: {{tumbling: 10m}}, aggregate: count, mechanism: gaussian}}
  users: {{source: people, budget: plain, weight: 1, window: {{tumbling: 10m}}, aggregate: count, mechanism: gaussian}}
sinks: {{releases: r, dead_letter: d}}
"""


async def _publish(value: bytes, key: bytes) -> None:
    return None


async def _reports() -> dict[str, dict[str, Any]]:
    """The report card of each scope after a replay of the period's first 20 minutes (no events)."""
    topo = load_topology_text(_YAML.format(start=P0))
    ledger = await open_ledger("memory", topo, clock=ManualClock(P0 + 1800), schedule_start=P0)
    for source in topo.sources:
        await replay_lines(topo, [], ledger, _publish, start=P0, end=P0 + 1200, source=source)
    out = {}
    for scope in ("mixed", "plain"):
        out[scope] = build_report(await collect_period(ledger, topo, scope, period_id(HOUR, P0)))
    return out


def test_the_report_card_labels_an_event_level_scope_weaker_in_json_page_and_text() -> None:
    """A scope with an event-level metric: `guarantee` is the event-level label and names the metric,
    and the page and the text say it; a scope of unit-level metrics only is `unit-level`, unlabelled."""
    reps = asyncio.run(_reports())
    mixed, plain = reps["mixed"], reps["plain"]
    assert (mixed["guarantee"], mixed["event_level_metrics"]) == (EVENT_LEVEL_LABEL, ["taps"])
    assert EVENT_LEVEL_LABEL == "event-level (weaker)"
    assert "event-level (weaker): taps protect single events" in render_page(mixed)
    assert "event-level (weaker): taps protect single events" in report_text(mixed)
    assert (plain["guarantee"], plain["event_level_metrics"]) == (UNIT_LEVEL_LABEL, [])
    assert EVENT_LEVEL_LABEL not in render_page(plain) and EVENT_LEVEL_LABEL not in report_text(plain)


def test_verify_labels_event_level_metrics_in_text_and_json() -> None:
    """`dpstream verify` prints the event-level line before its summary and says it in `--json`."""
    report = VerifyReport("v1", event_level_metrics=["taps"])
    lines = render_text(report).splitlines()
    assert lines[-2] == "event-level (weaker): taps protect single events, not people (privacy_unit: event)"
    assert lines[-1].startswith("verify: ok")
    doc = json.loads(render_json(report))
    assert (doc["guarantee"], doc["event_level_metrics"]) == ("event-level (weaker)", ["taps"])
    plain = VerifyReport("v1")
    assert EVENT_LEVEL_LABEL not in render_text(plain)
    assert json.loads(render_json(plain))["guarantee"] == "unit-level"


def test_plan_and_validate_say_the_one_event_level_label() -> None:
    """`dpstream plan` tags an event-level metric and `validate` warns with the same label text as status,
    the report card and verify (one home for the words)."""
    from dpstream.topology.lint import lint_topology
    from dpstream.topology.plan import build_plan
    from dpstream.topology.plan_render import render_plan

    topo = load_topology_text(_YAML.format(start=P0))
    text = render_plan(build_plan(topo))
    assert f"taps [{EVENT_LEVEL_LABEL}]" in text and f"views [{EVENT_LEVEL_LABEL}]" not in text
    warnings = [str(w) for w in lint_topology(topo)]
    assert any(f"privacy_unit 'event': {EVENT_LEVEL_LABEL}" in w for w in warnings)
