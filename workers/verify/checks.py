"""The checks of `dpstream verify`, as pure functions over what the readers returned (no Kafka, no Redis).

Each returns its violations (one line each, see `report.KINDS`) and adds its figures to a counts dict.
"""

from __future__ import annotations

__all__ = [
    "Published",
    "ScheduledWindow",
    "index_releases",
    "check_this_version",
    "check_charges",
    "check_budget",
    "scheduled_windows",
    "check_schedule",
    "check_dead_letters",
    "check_compare",
    "check_outages",
    "foreign_ledger_records",
    "check_ledger_binding",
]

import json
import math
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from dpstream.topology.model import Topology
from dpstream.topology.schedule import Schedule
from dpstream.workers.ledger.types import PeriodSummary, ReconcileReport
from dpstream.workers.pipeline.events import REASONS
from dpstream.workers.release.ids import release_id as make_release_id
from dpstream.workers.verify.report import Violation, iso
from dpstream.workers.verify.sources import RELEASE_STATES, LedgerRelease, TopicRecord


@dataclass
class Published:
    """One release_id as seen on the releases topic: its first record and every distinct payload."""

    release_id: str
    doc: dict[str, Any]
    """The first record, decoded."""
    first: TopicRecord
    payloads: dict[bytes, TopicRecord] = field(default_factory=dict)
    """Each distinct payload → the first record that carried it."""
    copies: int = 0
    stamps: list[int] = field(default_factory=list)
    """The Kafka timestamp (ms) of every copy, in topic order."""

    @property
    def metric(self) -> str:
        return str(self.doc.get("metric", "?"))

    @property
    def window(self) -> tuple[int, int] | None:
        w = self.doc.get("window")
        if isinstance(w, dict):
            s, e = w.get("start_epoch"), w.get("end_epoch")
            if type(s) is int and type(e) is int:
                return s, e
        return None

    @property
    def scope(self) -> str | None:
        b = self.doc.get("budget")
        s = b.get("scope") if isinstance(b, dict) else None
        return s if isinstance(s, str) and s else None

    @property
    def topology_version(self) -> str:
        return str(self.doc.get("topology_version", ""))

    def label(self) -> str:
        """`release_id 1a2b… (metric views, window [start, end))` for messages."""
        w = self.window
        where = f", window [{iso(w[0])}, {iso(w[1])})" if w else ""
        return f"release_id {self.release_id} (metric {self.metric}{where})"


def _differing_fields(a: bytes, b: bytes) -> str:
    try:
        da, db = json.loads(a), json.loads(b)
    except ValueError:
        return "not comparable as JSON"
    if not isinstance(da, dict) or not isinstance(db, dict):
        return "not comparable as JSON"
    names = sorted(k for k in set(da) | set(db) if da.get(k) != db.get(k))
    return ", ".join(names) if names else "byte form only (same JSON)"


def index_releases(
    records: Iterable[TopicRecord], counts: dict[str, Any]
) -> tuple[dict[str, Published], list[Violation]]:
    """Group the releases topic by release_id; name malformed records, key mismatches and every
    release_id that came with a second, different payload (byte comparison)."""
    out: dict[str, Published] = {}
    violations: list[Violation] = []
    n = dup = 0
    for rec in records:
        n += 1
        doc: Any = None
        if rec.value is not None:
            try:
                doc = json.loads(rec.value)
            except ValueError:
                doc = None
        rid = doc.get("release_id") if isinstance(doc, dict) else None
        if not isinstance(rid, str) or not rid:
            violations.append(
                Violation(
                    "malformed_release",
                    f"releases topic {rec.where}: not a release record (no JSON object with a release_id)",
                    {"partition": rec.partition, "offset": rec.offset},
                )
            )
            continue
        if rec.key != rid.encode():
            violations.append(
                Violation(
                    "release_key",
                    f"release_id {rid} at {rec.where}: the Kafka key is not the release_id (consumers dedupe by key)",
                    {"release_id": rid, "partition": rec.partition, "offset": rec.offset},
                )
            )
        pub = out.get(rid)
        assert rec.value is not None  # the release_id was decoded from it
        if pub is None:
            out[rid] = Published(rid, doc, rec, {rec.value: rec}, 1, [rec.timestamp])
            continue
        pub.copies += 1
        pub.stamps.append(rec.timestamp)
        if rec.value in pub.payloads:
            dup += 1
            continue
        first = pub.first
        pub.payloads[rec.value] = rec
        violations.append(
            Violation(
                "two_payloads",
                f"{pub.label()} published with two different payloads ({first.where} and {rec.where}; "
                f"they differ in: {_differing_fields(first.value or b'', rec.value or b'')})",
                {"release_id": rid, "first": [first.partition, first.offset], "other": [rec.partition, rec.offset]},
            )
        )
    counts["releases"] = n
    counts["release_ids"] = len(out)
    counts["duplicates_identical"] = dup
    return out, violations


def check_this_version(
    topology: Topology, published: Mapping[str, Published], schedule_start: int | None, counts: dict[str, Any]
) -> list[Violation]:
    """Releases of this topology version: the id is derived from metric and window, and the window
    is one of the public schedule's (on the metric's grid, not before S)."""
    version = topology.topology_version
    violations: list[Violation] = []
    mine = other = 0
    for pub in published.values():
        if pub.topology_version != version:
            other += 1
            continue
        mine += 1
        metric = topology.metrics.get(pub.metric)
        w = pub.window
        if metric is None or w is None:
            violations.append(
                Violation(
                    "unscheduled_release",
                    f"{pub.label()}: names no metric and window of this topology",
                    {"release_id": pub.release_id},
                )
            )
            continue
        if pub.release_id != make_release_id(version, metric.name, w[0], w[1]):
            violations.append(
                Violation(
                    "wrong_release_id",
                    f"{pub.label()}: the release_id is not sha256(topology_version, metric, window)",
                    {"release_id": pub.release_id},
                )
            )
        schedule = Schedule.of(metric, schedule_start)
        first = schedule.first_window() if schedule_start is not None else None
        if not schedule.on_grid(w[0], w[1]) or (first is not None and w[0] < first):
            why = "before the schedule start" if first is not None and w[0] < first else "off the window grid"
            violations.append(
                Violation(
                    "unscheduled_release",
                    f"{pub.label()}: not a window of the public schedule ({why})",
                    {"release_id": pub.release_id},
                )
            )
    counts["releases_this_version"] = mine
    counts["releases_other_versions"] = other
    return violations


def check_charges(
    published: Mapping[str, Published], found: Mapping[str, LedgerRelease | None], counts: dict[str, Any]
) -> list[Violation]:
    """Every published release_id has a charge (charged or published), and every published payload is
    the one the ledger stored with the charge (byte comparison)."""
    violations: list[Violation] = []
    charged = 0
    for rid, pub in published.items():
        rec = found.get(rid)
        if rec is None:
            violations.append(
                Violation(
                    "uncharged",
                    f"{pub.label()} is on the releases topic ({pub.first.where}) "
                    f"but the ledger has no charge for it (scope {pub.scope or '?'})",
                    {"release_id": rid},
                )
            )
            continue
        if rec.state not in RELEASE_STATES:
            violations.append(
                Violation(
                    "charge_state",
                    f"{pub.label()}: the ledger's record is in state "
                    f"{rec.state or '(none)'!r}, not charged or published",
                    {"release_id": rid, "state": rec.state},
                )
            )
            continue
        charged += 1
        for payload, where in pub.payloads.items():
            if payload != rec.payload:
                violations.append(
                    Violation(
                        "payload_mismatch",
                        f"{pub.label()}: the bytes published at "
                        f"{where.where} differ from the payload the ledger stored with its "
                        f"charge (scope {rec.scope})",
                        {"release_id": rid, "partition": where.partition, "offset": where.offset},
                    )
                )
    counts["release_ids_charged"] = charged
    return violations


def check_budget(report: ReconcileReport, blocks: Iterable[PeriodSummary], counts: dict[str, Any]) -> list[Violation]:
    """Per period of one scope: stored spend = the audit stream's charges, spend ≤ cap, selection δ ≤ its cap."""
    violations: list[Violation] = []
    scope = report.scope
    for p in report.periods:
        if not p.ok:
            violations.append(
                Violation(
                    "spend_mismatch",
                    f"scope {scope} period {p.period_id}: stored spend {p.stored_units} units in {p.stored_charges} "
                    f"charges, the audit stream's charges add up to {p.audited_units} units in {p.audited_charges}",
                    {
                        "scope": scope,
                        "period": p.period_id,
                        "stored_units": p.stored_units,
                        "audited_units": p.audited_units,
                        "stored_charges": p.stored_charges,
                        "audited_charges": p.audited_charges,
                    },
                )
            )
    n = 0
    for b in blocks:
        n += 1
        if b.spent_units > b.cap_units:
            violations.append(
                Violation(
                    "over_cap",
                    f"scope {scope} period {b.period_id}: spent {b.spent_units} units, above the cap of {b.cap_units}",
                    {"scope": scope, "period": b.period_id, "spent_units": b.spent_units, "cap_units": b.cap_units},
                )
            )
        if b.delta_spent_units > b.delta_cap_units:
            violations.append(
                Violation(
                    "delta_over_cap",
                    f"scope {scope} period {b.period_id}: selection δ spent "
                    f"{b.delta_spent_units} units (1e-18), above its cap of {b.delta_cap_units}",
                    {
                        "scope": scope,
                        "period": b.period_id,
                        "delta_spent_units": b.delta_spent_units,
                        "delta_cap_units": b.delta_cap_units,
                    },
                )
            )
    counts["periods_checked"] = counts.get("periods_checked", 0) + max(n, len(report.periods))
    return violations


@dataclass(frozen=True)
class ScheduledWindow:
    """One window of a metric's public schedule."""

    metric: str
    start: int
    end: int
    close: int
    """C(w) = end + the source's allowed_lateness."""
    release_id: str


def scheduled_windows(
    topology: Topology, schedule_start: int, until_s: float, since_s: int | None = None
) -> Iterator[ScheduledWindow]:
    """Every window of every metric from S (or `since_s`, if later) whose close time C(w) ≤ `until_s`."""
    version = topology.topology_version
    for metric in topology.metrics.values():
        lateness = int(topology.sources[metric.source].allowed_lateness_s)
        size = metric.window.size_s
        for s in Schedule.of(metric, schedule_start).starts(since_s):
            if s + size + lateness > until_s:
                break
            yield ScheduledWindow(
                metric.name, s, s + size, s + size + lateness, make_release_id(version, metric.name, s, s + size)
            )


def check_schedule(
    topology: Topology,
    windows: Iterable[ScheduledWindow],
    published: Mapping[str, Published],
    refusals: Mapping[str, str],
    ledger: Mapping[str, LedgerRelease | None],
    counts: dict[str, Any],
) -> list[Violation]:
    """Each scheduled window is published, or refused by the ledger with a reason (its audit entry)."""
    violations: list[Violation] = []
    checked = released = refused = 0
    for w in windows:
        checked += 1
        if w.release_id in published:
            released += 1
            continue
        if refusals.get(w.release_id):
            refused += 1
            continue
        rec = ledger.get(w.release_id)
        if rec is None:
            why = "no charge and no refusal in the ledger"
            budget = topology.budgets[topology.metrics[w.metric].budget]
            if budget.on_warning.thin > 1:
                why += f" (scope {budget.name} thins releases in warning: a thinned window leaves no ledger record)"
        elif rec.state == "charged":
            why = "charged but not on the releases topic"
        elif rec.state == "published":
            why = "the ledger says published, but it is not on the releases topic"
        else:
            why = f"ledger state {rec.state!r}"
        violations.append(
            Violation(
                "missing_window",
                f"metric {w.metric} window [{iso(w.start)}, {iso(w.end)}) (release_id {w.release_id}, closed "
                f"{iso(w.close)}) is neither published nor refused: {why}",
                {"metric": w.metric, "window_start": w.start, "window_end": w.end, "release_id": w.release_id},
            )
        )
    counts["windows_checked"] = checked
    counts["windows_released"] = released
    counts["windows_refused"] = refused
    counts["windows_missing"] = checked - released - refused
    return violations


def check_dead_letters(records: Iterable[TopicRecord], counts: dict[str, Any]) -> list[Violation]:
    """Every dead letter is a JSON object with a reason from the fixed list (`pipeline.events.REASONS`)."""
    violations: list[Violation] = []
    reasons: Counter[str] = Counter()
    n = 0
    for rec in records:
        n += 1
        doc: Any = None
        try:
            doc = json.loads(rec.value) if rec.value is not None else None
        except ValueError:
            doc = None
        reason = doc.get("reason") if isinstance(doc, dict) else None
        if reason not in REASONS:
            shown = reason if isinstance(reason, str) and len(reason) <= 40 and reason.isidentifier() else "?"
            violations.append(
                Violation(
                    "bad_dead_letter",
                    f"dead-letter topic {rec.where}: "
                    + (
                        "not a dead-letter record"
                        if doc is None or reason is None
                        else f"reason {shown!r} is not one of the fixed reasons"
                    ),
                    {"partition": rec.partition, "offset": rec.offset},
                )
            )
            continue
        reasons[reason] += 1
    counts["dead_letters"] = n
    counts["dead_letter_reasons"] = dict(sorted(reasons.items()))
    return violations


def _half_width(doc: Mapping[str, Any], key: str) -> float | None:
    ci = doc.get("ci")
    if not isinstance(ci, dict):
        return None
    hw = ci.get("half_width")
    if isinstance(hw, dict):
        hw = hw.get(key)
    return float(hw) if isinstance(hw, (int, float)) and not isinstance(hw, bool) else None


def _rounded(doc: Mapping[str, Any]) -> bool:
    pp = doc.get("postprocess")
    return bool(isinstance(pp, dict) and pp.get("round"))


def _value_problems(a: Mapping[str, Any], b: Mapping[str, Any], tolerance: float | None) -> list[str]:
    """What differs between two releases of one window: values beyond the tolerance, key sets, top-k keys
    (quantiles: their levels only, as their error is in ranks).

    Default tolerance per value: 3 × (sum of both records' 95 % CI half-widths), + 1 if rounded."""
    problems: list[str] = []
    if ("keys" in a or "keys" in b) and a.get("keys") != b.get("keys"):
        problems.append(f"keys {a.get('keys')} vs {b.get('keys')}")
    va, vb = a.get("values"), b.get("values")
    if not isinstance(va, dict) or not isinstance(vb, dict):
        return problems if va == vb else [*problems, "values not comparable"]
    if a.get("aggregate") == "quantile" or b.get("aggregate") == "quantile":
        # a quantile's error is in ranks: no value tolerance exists that does not depend on the data
        return problems if set(va) == set(vb) else [*problems, f"quantile levels {sorted(va)} vs {sorted(vb)}"]
    selected = "partition_selection" in a or "partition_selection" in b
    for key in sorted(set(va) | set(vb)):
        if key not in va or key not in vb:
            if not selected:
                problems.append(f"key {key!r} released by one run only")
            continue
        x, y = va[key], vb[key]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (x, y)):
            if x != y:
                problems.append(f"value of {key!r} differs")
            continue
        if tolerance is not None:
            tol = tolerance
        else:
            ha, hb = _half_width(a, key), _half_width(b, key)
            tol = 3.0 * ((ha or 0.0) + (hb or 0.0)) + (1.0 if _rounded(a) or _rounded(b) else 0.0)
        tol += 1e-9 * max(abs(x), abs(y))
        if not (math.isfinite(x) and math.isfinite(y)) or abs(x - y) > tol:
            problems.append(f"{key!r}: {x:.6g} vs {y:.6g} (tolerance {tol:.3g})")
    return problems


def check_compare(
    published: Mapping[str, Published],
    theirs: Mapping[str, Published],
    topic: str,
    tolerance: float | None,
    counts: dict[str, Any],
) -> list[Violation]:
    """Every window released by both runs (same metric and window) carries matching values."""
    by_window: dict[tuple[str, int, int], Published] = {}
    for pub in theirs.values():
        w = pub.window
        if w is not None:
            by_window.setdefault((pub.metric, w[0], w[1]), pub)
    violations: list[Violation] = []
    compared = 0
    for pub in published.values():
        w = pub.window
        other = by_window.get((pub.metric, w[0], w[1])) if w is not None else None
        if other is None:
            continue
        compared += 1
        problems = _value_problems(pub.doc, other.doc, tolerance)
        if problems:
            violations.append(
                Violation(
                    "value_mismatch",
                    f"{pub.label()} differs from {topic}'s release {other.release_id}: " + "; ".join(problems),
                    {"release_id": pub.release_id, "other_release_id": other.release_id},
                )
            )
    counts["compared_windows"] = compared
    if compared == 0:
        violations.append(
            Violation(
                "compare_empty",
                f"--compare-to {topic}: no window released by both runs "
                f"({len(published)} release_ids here, {len(theirs)} there)",
            )
        )
    return violations


def check_outages(
    published: Mapping[str, Published],
    found: Mapping[str, LedgerRelease | None],
    outages: Iterable[tuple[float, float]],
    counts: dict[str, Any],
) -> list[Violation]:
    """Nothing is published while the ledger is unreachable: a copy whose Kafka time falls in an outage
    [from, to] (epoch seconds) is a violation unless its charge was made before the outage began
    (charged, then the ledger went away before the publish: the protocol's in-flight case) or after
    it ended (a release's Kafka time is its public time P(w), not when it went out: one that missed
    P(w) during the outage is charged and published after it, still stamped P(w))."""
    spans = sorted((float(a), float(b)) for a, b in outages)
    violations: list[Violation] = []
    inside = 0
    for rid, pub in published.items():
        rec = found.get(rid)
        charged_ms = rec.charged_at_ms if rec is not None else None
        for stamp in pub.stamps:
            t = stamp / 1000
            span = next(((a, b) for a, b in spans if a <= t <= b), None)
            if span is None:
                continue
            inside += 1
            if charged_ms is not None and not span[0] * 1000 <= charged_ms <= span[1] * 1000:
                continue
            charged = f"charged {iso(charged_ms / 1000)}" if charged_ms is not None else "no charge time"
            violations.append(
                Violation(
                    "published_during_outage",
                    f"{pub.label()} was published at {iso(t)}, during the ledger outage "
                    f"[{iso(span[0])}, {iso(span[1])}] ({charged}, not before the outage)",
                    {"release_id": rid, "published_ms": stamp, "outage": [span[0], span[1]]},
                )
            )
            break
    counts["outages"] = len(spans)
    counts["published_in_outages"] = inside
    return violations


def foreign_ledger_records(
    records: Iterable[TopicRecord], topology_version: str, ledger_id: str | None
) -> list[tuple[TopicRecord, str | None]]:
    """The records of `topology_version` whose `ledger` names another ledger than `ledger_id`, each
    with the id it names (None: `"ledger": null`, charged to no ledger). One releases topic is fed by
    one ledger: a record from another was charged against another budget, so its release_id may
    carry a second noisy value. A record without the field (written before records named their
    ledger) or not a release record is not counted here (`index_releases` names malformed ones)."""
    out: list[tuple[TopicRecord, str | None]] = []
    for rec in records:
        try:
            doc = json.loads(rec.value) if rec.value is not None else None
        except ValueError:
            continue
        if not isinstance(doc, dict) or doc.get("topology_version") != topology_version or "ledger" not in doc:
            continue
        named = doc["ledger"]
        if named != ledger_id or ledger_id is None:
            out.append((rec, named if isinstance(named, str) else None))
    return out


def check_ledger_binding(
    records: Iterable[TopicRecord], topology_version: str, ledger_id: str | None, counts: dict[str, Any]
) -> list[Violation]:
    """Every release of this topology version on the releases topic that another ledger charged
    (`foreign_ledger_records`), one violation per record; `ledger_id` None (this ledger has no id
    yet) makes every record that names a ledger foreign."""
    violations: list[Violation] = []
    for rec, named in foreign_ledger_records(records, topology_version, ledger_id):
        rid = json.loads(rec.value or b"{}").get("release_id", "?")
        other = f"ledger {named}" if named is not None else "no ledger (null: an in-process ledger)"
        mine = f"this ledger's id {ledger_id}" if ledger_id is not None else "this ledger, which has no id yet"
        violations.append(
            Violation(
                "other_ledger",
                f"release_id {rid} at {rec.where}: charged to {other}, not {mine}; its release_id may carry "
                "a second noisy value (consumers keep the first record per release_id)",
                {"release_id": rid, "ledger": named, "partition": rec.partition, "offset": rec.offset},
            )
        )
    counts["releases_other_ledger"] = len(violations)
    return violations
