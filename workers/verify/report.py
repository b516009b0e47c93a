"""What `dpstream verify` found: violations (one line each), counts, and the text and JSON forms.

Text (stdout): one `VIOLATION <kind>: <what>` line per violation, then (when the topology has
event-level metrics) the line `event-level (weaker): <metrics> protect single events, …`, then one
summary line `verify: ok|N violation(s): <counts>`. JSON (`--json`, `verify_version: 2`): one object

    {"verify_version": 2, "ok": false, "topology_version": "…",
     "guarantee": "unit-level|event-level (weaker)", "event_level_metrics": ["…"],
     "schedule": {"start": S, "start_iso": "…", "source": "topology|ledger|none", "checked_until": T, "grace_s": 60},
     "counts": {"releases": 7, "release_ids": 5, "duplicates_identical": 2, "windows_checked": 12,
                "windows_released": 10, "windows_refused": 2, "dead_letters": 3, "dead_letter_reasons": {…}, …},
     "violations": [{"kind": "two_payloads", "message": "…", "release_id": "…"}, …]}

Kinds are stable names (added to, never renamed without bumping `VERIFY_VERSION`): `KINDS`.
Nothing here carries a raw event, a unit id or a true aggregate: only release ids, metric names,
windows, scope names and ledger units.
"""

from __future__ import annotations

__all__ = ["KINDS", "VERIFY_VERSION", "Violation", "VerifyReport", "render_text", "render_json"]

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from dpstream.topology.model import event_level_note, guarantee_label

VERIFY_VERSION = 2
"""2: the kind `no_schedule_start` (v1: `no_deployment_start`), a `spend_mismatch`'s
`stored_charges` (v1: `stored_granted`), and a `charge_state`'s ledger state reads `charged` where
the ledger stores `reserved`."""

KINDS = {
    "two_payloads": "a release_id was published with two different payloads",
    "malformed_release": "a record on the releases topic is not a release record",
    "release_key": "a release record's Kafka key is not its release_id",
    "wrong_release_id": "a release of this topology version whose release_id is not derived from its metric and window",
    "unscheduled_release": "a release of this topology version for a window that is not on the public schedule",
    "uncharged": "a published release_id has no charge in the ledger",
    "charge_state": "a published release_id's ledger record is neither charged nor published",
    "payload_mismatch": "the published bytes differ from the payload the ledger stored with the charge",
    "spend_mismatch": "a period's spend (or charge count) differs from the audit stream's charges",
    "over_cap": "a period's spend is above its cap",
    "delta_over_cap": "a period's selection δ spent is above its cap",
    "scope_not_registered": "a budget scope of the topology is not registered in the ledger",
    "no_schedule_start": "neither the topology nor the ledger records the schedule start S",
    "missing_window": "a scheduled window is neither published nor recorded as refused with a reason",
    "bad_dead_letter": "a dead-letter record is malformed or has a reason outside the fixed list",
    "value_mismatch": "a released value differs from the compared run's release of the same window",
    "compare_empty": "--compare-to found no window in common",
    "ledger_not_durable": "the ledger's Redis is not AOF with appendfsync always",
    "published_during_outage": "a release was published while the ledger was unreachable (--outage) and "
    "was not charged before the outage began",
    "other_ledger": "a release of this topology version on the releases topic was charged to another ledger "
    "(another ledger id, or null: charged to no ledger)",
}
"""Every violation kind, with what it means."""


@dataclass(frozen=True)
class Violation:
    """One broken invariant: a stable `kind`, a one-line `message`, and JSON-able details."""

    kind: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown violation kind {self.kind!r}")
        if "\n" in self.message:
            object.__setattr__(self, "message", self.message.replace("\n", " "))

    def line(self) -> str:
        """`VIOLATION <kind>: <message>`."""
        return f"VIOLATION {self.kind}: {self.message}"


@dataclass
class VerifyReport:
    """Everything one verify run found."""

    topology_version: str
    violations: list[Violation] = field(default_factory=list)
    counts: dict[str, Any] = field(default_factory=dict)
    schedule: dict[str, Any] = field(default_factory=dict)
    event_level_metrics: list[str] = field(default_factory=list)
    """Metrics of the topology whose source has `privacy_unit: event` (labelled weaker in both forms)."""

    @property
    def ok(self) -> bool:
        """True when no invariant is broken."""
        return not self.violations

    def add(self, violations: list[Violation]) -> None:
        """Append violations (in the order the checks found them)."""
        self.violations.extend(violations)


def iso(ts: float) -> str:
    """UTC ISO-8601 to the second with a Z."""
    return datetime.fromtimestamp(int(ts), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _summary(report: VerifyReport) -> str:
    c = report.counts
    parts = [
        f"{c.get('releases', 0)} release records ({c.get('release_ids', 0)} release_ids, "
        f"{c.get('duplicates_identical', 0)} duplicates byte-identical)",
        f"{c.get('windows_checked', 0)} windows checked ({c.get('windows_released', 0)} released, "
        f"{c.get('windows_refused', 0)} refused)",
        f"{c.get('dead_letters', 0)} dead letters",
        f"{c.get('periods_checked', 0)} budget periods reconciled",
    ]
    if "compared_windows" in c:
        parts.append(f"{c['compared_windows']} windows compared")
    head = "ok" if report.ok else f"{len(report.violations)} violation(s)"
    return f"verify: {head}: " + ", ".join(parts)


def render_text(report: VerifyReport) -> str:
    """One line per violation, then the summary line."""
    lines = [v.line() for v in report.violations]
    if report.event_level_metrics:
        lines.append(event_level_note(report.event_level_metrics))
    lines.append(_summary(report))
    return "\n".join(lines)


def render_json(report: VerifyReport) -> str:
    """The `--json` document (see the module docstring)."""
    doc = {
        "verify_version": VERIFY_VERSION,
        "ok": report.ok,
        "topology_version": report.topology_version,
        "guarantee": guarantee_label(bool(report.event_level_metrics)),
        "event_level_metrics": report.event_level_metrics,
        "schedule": report.schedule,
        "counts": report.counts,
        "violations": [{"kind": v.kind, "message": v.message, **v.details} for v in report.violations],
    }
    return json.dumps(doc, indent=2, sort_keys=False)
