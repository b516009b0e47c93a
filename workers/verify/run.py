"""`verify_deployment`: read a live deployment (releases topic, dead-letter topic, ledger) and run every check.

Read only: topics are read without a consumer group, the ledger with plain reads (no script runs,
no scope is registered, no schedule start is recorded).
"""

from __future__ import annotations

__all__ = ["VerifyOptions", "verify_deployment"]

import asyncio
import time
from dataclasses import dataclass
from typing import Any, TypeGuard

from dpstream.topology.errors import ConfigError
from dpstream.topology.model import Topology
from dpstream.workers.ledger.durability import durability_problem
from dpstream.workers.ledger.keys import check_scope_name
from dpstream.workers.ledger.types import AuditKind
from dpstream.workers.runtime.kafka_security import KafkaSecurity
from dpstream.workers.verify import checks
from dpstream.workers.verify.report import VerifyReport, Violation, iso
from dpstream.workers.verify.sources import LedgerRelease, read_releases, read_topic, read_version_schedule_start

_ALL_PERIODS = 1_000_000
_RECONCILE_READS = 5


@dataclass(frozen=True)
class VerifyOptions:
    """Where the deployment is and how far its schedule is checked."""

    bootstrap: str
    redis_url: str
    grace_s: float = 60.0
    """A window counts as due once C(w) + grace has passed (room for release lag)."""
    now: float | None = None
    """The wall clock (default: time.time())."""
    since_s: int | None = None
    """Check no window starting before this (default: from the schedule start S)."""
    compare_to: str | None = None
    """Another run's releases topic (same broker): values of the same windows must match."""
    tolerance: float | None = None
    """Absolute tolerance of `compare_to`; default 3 × both records' 95 % CI half-widths."""
    allow_volatile: bool = False
    """Do not count a non-durable ledger Redis as a violation."""
    until_s: float | None = None
    """Check no window closing after this (default: now − grace), e.g. the time a deployment was stopped."""
    outages: tuple[tuple[float, float], ...] = ()
    """Intervals (epoch seconds) when the ledger was unreachable: nothing may be published in them."""


def _valid_scope(name: str | None) -> TypeGuard[str]:
    if not name:
        return False
    try:
        check_scope_name(name)
    except ConfigError:
        return False
    return True


async def _charges(
    client: Any, published: dict[str, checks.Published], scopes: list[str]
) -> dict[str, LedgerRelease | None]:
    """rid → its ledger record: under the scope its payload names first, else under any other scope."""
    found: dict[str, LedgerRelease | None] = {}
    first = {(p.scope, rid) for rid, p in published.items() if _valid_scope(p.scope)}
    got = await read_releases(client, first)
    for (_scope, rid), rec in got.items():
        found[rid] = rec
    rest = [rid for rid in published if rid not in found]
    if rest and scopes:
        got = await read_releases(client, [(s, rid) for rid in rest for s in scopes])
        for (_scope, rid), rec in sorted(got.items()):
            found.setdefault(rid, rec)
    return found


async def _reconcile(ledger: Any, scope: str) -> Any:
    """`Ledger.reconcile`, read again on a mismatch: it reads the audit stream and the period blocks one
    after the other, so a charge landing in between (a live worker) shows as a passing mismatch; a real
    one is there at every read."""
    report = await ledger.reconcile(scope)
    for _ in range(_RECONCILE_READS - 1):
        if report.ok:
            break
        await asyncio.sleep(0.2)
        report = await ledger.reconcile(scope)
    return report


async def verify_deployment(topology: Topology, options: VerifyOptions) -> VerifyReport:
    """Run every check against the deployment `options` points at; the report names each violation."""
    from dpstream.workers.ledger.redis_backend import RedisLedger, connect

    if options.grace_s < 0:
        raise ConfigError(f"--grace {options.grace_s:g}: must be >= 0 seconds")
    if options.redis_url == "memory":
        raise ConfigError("--redis memory: the in-process ledger lives in one process only: give a redis:// URL")
    now = time.time() if options.now is None else float(options.now)
    version = topology.topology_version
    report = VerifyReport(version)
    report.event_level_metrics = sorted(
        name for name, m in topology.metrics.items() if topology.sources[m.source].event_level
    )
    counts = report.counts

    kafka = KafkaSecurity.from_env(kafka=topology.kafka)  # as `dpstream worker` resolves it
    release_records = await read_topic(options.bootstrap, topology.sinks.releases, security=kafka)
    dead_records = await read_topic(options.bootstrap, topology.sinks.dead_letter, security=kafka)
    theirs_records = (
        await read_topic(options.bootstrap, options.compare_to, security=kafka) if options.compare_to else None
    )

    published, found_violations = checks.index_releases(release_records, counts)
    report.add(found_violations)

    client = connect(options.redis_url, max_connections=8)
    ledger = RedisLedger(client, options.redis_url, {})
    try:
        settings = await ledger.server_settings()
        problem = durability_problem(settings)
        if problem is not None and not options.allow_volatile:
            report.add(
                [
                    Violation(
                        "ledger_not_durable",
                        f"ledger Redis: {problem}: an acknowledged charge could "
                        "be lost on a crash (pass --allow-volatile to accept it)",
                    )
                ]
            )
        registered = set(await ledger.scopes())
        scopes = sorted(topology.budgets)
        counts["scopes_checked"] = 0
        counts["periods_checked"] = 0
        refusals: dict[str, str] = {}
        for scope in scopes:
            if scope not in registered:
                report.add(
                    [
                        Violation(
                            "scope_not_registered",
                            f"budget scope {scope} is not registered in the "
                            "ledger: no worker of this topology has started against it",
                            {"scope": scope},
                        )
                    ]
                )
                continue
            counts["scopes_checked"] += 1
            reconciled = await _reconcile(ledger, scope)
            blocks = await ledger.history(scope, _ALL_PERIODS)
            report.add(checks.check_budget(reconciled, blocks, counts))
            for entry in await ledger.audit(scope):
                if entry.kind is AuditKind.REFUSAL and entry.fields.get("release_id"):
                    refusals[entry.fields["release_id"]] = entry.fields.get("reason", "") or "refused"

        report.add(checks.check_ledger_binding(release_records, version, await ledger.recorded_ledger_id(), counts))
        found = await _charges(client, published, sorted(registered | set(scopes)))
        report.add(checks.check_charges(published, found, counts))
        if options.outages:
            report.add(checks.check_outages(published, found, options.outages, counts))

        start: int | None
        if topology.schedule_start is not None:
            start, start_from = int(topology.schedule_start), "topology"
        else:
            start, start_from = await read_version_schedule_start(client, version), "ledger"
        report.add(checks.check_this_version(topology, published, start, counts))
        until = now - options.grace_s
        if options.until_s is not None:
            until = min(until, options.until_s)
        report.schedule = {
            "start": start,
            "start_iso": iso(start) if start is not None else None,
            "source": start_from if start is not None else "none",
            "since": options.since_s,
            "checked_until": int(until),
            "grace_s": options.grace_s,
        }
        if start is None:
            report.add(
                [
                    Violation(
                        "no_schedule_start",
                        f"topology version {version} has no `start:` and the "
                        "ledger recorded no schedule start for it: no worker of this version has "
                        "started, so the schedule cannot be checked",
                    )
                ]
            )
            counts.update(windows_checked=0, windows_released=0, windows_refused=0, windows_missing=0)
        else:
            windows = list(checks.scheduled_windows(topology, start, until, options.since_s))
            unseen = [w for w in windows if w.release_id not in published and not refusals.get(w.release_id)]
            states: dict[str, LedgerRelease | None] = {}
            if unseen:
                scope_of = {m.name: m.budget for m in topology.metrics.values()}
                got = await read_releases(client, [(scope_of[w.metric], w.release_id) for w in unseen])
                states = {rid: rec for (_s, rid), rec in got.items()}
            report.add(checks.check_schedule(topology, windows, published, refusals, states, counts))
    finally:
        await ledger.close()

    report.add(checks.check_dead_letters(dead_records, counts))
    if theirs_records is not None:
        assert options.compare_to is not None
        theirs, _ = checks.index_releases(theirs_records, {})
        report.add(checks.check_compare(published, theirs, options.compare_to, options.tolerance, counts))
    return report
