"""The README's release-record table names every field of real records (built by `dpstream.replay`)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dpstream
from dpstream.topology.loader import load_topology_text

ROOT = Path(__file__).resolve().parents[2]

_EVENT_LEVEL = """
version: 1
sources:
  s: {topic: t, privacy_unit: event, timestamp: ts}
budgets:
  b: {epsilon: 1.0, accounting: pure, period: 1d}
metrics:
  views:
    source: s
    budget: b
    window: {tumbling: 1h}
    aggregate: count
    mechanism: laplace
    postprocess: {round: true, clamp_zero: true}
sinks: {releases: r, dead_letter: d}
"""
"""A pure, event-level scope: `cost.epsilon`, `privacy_note`, post-processed values."""

_RUNNING = """
version: 1
sources:
  s: {topic: t, privacy_unit: user_id, timestamp: ts}
budgets:
  b: {epsilon: 1.0, delta: 1.0e-6, accounting: zcdp, period: 1d}
metrics:
  so_far:
    source: s
    budget: b
    window: {tumbling: 1h}
    aggregate: count
    release: running_total
    contribution: {max_per_period: 10}
    mechanism: gaussian
sinks: {releases: r, dead_letter: d}
"""
"""A running total: `running_total.*`, `contribution.max_per_period`, its matrix event and `event.lump`."""


def _section() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index("**Release record**")
    end = min((i for i in (text.find("\n## ", start), text.find("\n**`", start)) if i > 0), default=len(text))
    return text[start:end]


def _named(section: str) -> set[str]:
    """Field names in the table's first column; `.sub` after `a.b` means `a.sub`."""
    names: set[str] = set()
    for row in re.findall(r"^\| (.+?) \|", section, flags=re.M):
        parent = ""
        for name in re.findall(r"`([^`]+)`", row):
            if name.startswith(".") and parent:
                name = parent + name
            parent = name.rpartition(".")[0]
            names.add(name)
    return names


def _records() -> list[dict[str, Any]]:
    """One record of every metric of the web-analytics example (all aggregates, top-k, selection),
    and one of an event-level pure scope."""
    start, end = datetime(2026, 11, 30, tzinfo=UTC), datetime(2026, 11, 30, 1, tzinfo=UTC)
    web = dpstream.validate(str(ROOT / "topology/examples/web-analytics.yaml")).topology
    events = [
        {"user_id": f"u{i % 50}", "ts": 1764460800 + 6 * i, "page": "home", "basket_eur": 20.0, "session_s": 300}
        for i in range(600)
    ]
    records: dict[str, dict[str, Any]] = {}
    with dpstream.open_ledger("memory", web, now=end) as ledger:
        for release in dpstream.replay(web, events, start=start, end=end, ledger=ledger):
            records.setdefault(release.metric, release.record)
    assert len(records) == len(web.metrics)
    event_level = load_topology_text(_EVENT_LEVEL)
    with dpstream.open_ledger("memory", event_level, now=end) as ledger:
        replay = dpstream.replay(
            event_level, [{"ts": 1764460800 + i} for i in range(10)], start=start, end=end, ledger=ledger
        )
        records["views"] = next(iter(replay)).record
    running = load_topology_text(_RUNNING)
    with dpstream.open_ledger("memory", running, now=end) as ledger:
        replay = dpstream.replay(
            running, [{"user_id": "u1", "ts": 1764460800 + i} for i in range(10)], start=start, end=end, ledger=ledger
        )
        records["so_far"] = next(iter(replay)).record
    return list(records.values())


def _fields(record: dict[str, Any]) -> set[str]:
    """Top-level keys and the keys of their objects (not `values`' keys: those are the data's)."""
    out = set(record)
    for key, value in record.items():
        if isinstance(value, dict) and key != "values":
            out |= {f"{key}.{sub}" for sub in value}
    return out


def test_the_readme_table_names_every_field_of_a_real_record() -> None:
    """Every key (and sub-key) of the records of every aggregate is a row of the table; a mean's
    per-part noise (`noise.sum`, `noise.count`) is named as `noise.sum.*` / `noise.count.*`."""
    section = _section()
    named = _named(section)
    missing = set()
    for record in _records():
        for path in _fields(record):
            parent, _, sub = path.partition(".")
            if parent == "noise" and isinstance(record["noise"].get(sub), dict):
                if f"`{path}.*`" not in section:
                    missing.add(path + ".*")
            elif path not in named and not any(name.startswith(path + ".") for name in named):
                missing.add(path)  # an object field is named by its sub-fields
    assert not missing, f"README's release record table lacks: {sorted(missing)}"
