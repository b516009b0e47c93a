"""`dpstream budget status|history|audit|reconcile|grant|parked|retry`: where each budget scope stands.

`parked` lists windows whose release kept failing on an internal error (held by the worker, never
dropped); `retry` (audited, with actor and reason) makes the worker release them again.

`budget status --json` prints one object, `{"scopes": [...]}`, each scope in the shape that
`dpstream.workers.ledger.reporting.status_json` documents (the README quotes it), plus `parked`,
`guarantee` (`unit-level`, or `event-level (weaker)` when a metric of the scope has
`privacy_unit: event`; null without `--topology`, since the ledger does not know the privacy unit)
and `event_level_metrics`. The text form says the event-level label on its own line.

`budget history --json` prints `{"history_version": 2, "scopes": {scope: [period, ...]}}`, each
period with `charged` (releases charged), `refused` and `reserve_granted` (what operators granted
of the reserve); `budget reconcile --json` prints `{"reconcile_version": 2, "ok", "scopes"}`, each
period with `stored_charges` beside `audited_charges`. Version 2 renamed history's `charged`
(v1: `granted`) and reconcile's `stored_charges` (v1: `stored_granted`): "grant" means only an
operator's grant of reserve.

The ledger is found by `--redis URL`, else `$DPSTREAM_REDIS` (what the runbooks use: the operator's
environment names the deployment's ledger), else the topology's `redis.url` (`--topology FILE`),
else redis://localhost:6379/0. Reading never changes the ledger.
"""

from __future__ import annotations

__all__ = ["register", "add_ledger_args", "default_actor", "open_cli_ledger"]

import argparse
import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from dpstream.topology.durations import parse_duration
from dpstream.topology.errors import ConfigError
from dpstream.topology.model import event_level_note, guarantee_label
from dpstream.workers.ledger import Ledger, ScopeStatus, open_ledger
from dpstream.workers.ledger.errors import LedgerUnavailable
from dpstream.workers.ledger.reporting import iso, parked_json, status_json
from dpstream.workers.ledger.units import units_to_float

_DEFAULT_REDIS = "redis://localhost:6379/0"


HISTORY_VERSION = 2
"""The shape of `budget history --json` (2: `charged` (v1: `granted`))."""
RECONCILE_VERSION = 2
"""The shape of `budget reconcile --json` (2: `stored_charges` (v1: `stored_granted`))."""

#: The ledger commands' wall clock: what "now" and "this period" mean for status, grants and --since.
#: One name so that tests pin it (monkeypatch) and the period arithmetic runs at any fixed time of day.
clock: Callable[[], float] = time.time


def _now() -> float:
    return clock()


def add_ledger_args(parser: argparse.ArgumentParser) -> None:
    """--redis, --topology, --allow-volatile, --json: how every ledger command finds and prints."""
    parser.add_argument(
        "--redis", metavar="URL", help="ledger Redis (default: $DPSTREAM_REDIS, the topology's, localhost)"
    )
    parser.add_argument("--topology", metavar="FILE", help="topology file: its redis.url and budget scopes")
    parser.add_argument("--allow-volatile", action="store_true", help="accept a Redis without AOF fsync always (loud)")
    parser.add_argument("--json", action="store_true", help="print JSON")


async def open_cli_ledger(args: argparse.Namespace) -> tuple[Ledger, list[str]]:
    """Open the ledger the command line names (without registering anything); also the topology's scopes."""
    url, scopes, topo = getattr(args, "redis", None) or os.environ.get("DPSTREAM_REDIS", "").strip(), [], None
    if getattr(args, "topology", None):
        from dpstream.topology.loader import load_topology

        topo = load_topology(args.topology)
        url = url or topo.redis.url
        scopes = sorted(topo.budgets)
    url = url or _DEFAULT_REDIS
    if url == "memory":
        raise ConfigError("--redis memory: the in-process ledger lives in one process only: give a redis:// URL")
    try:
        ledger = await open_ledger(url, None, allow_volatile=getattr(args, "allow_volatile", False), clock=_now)
    except LedgerUnavailable as exc:  # the same class (exit 1), with where the URL came from and what to check
        raise LedgerUnavailable(f"{str(exc).rstrip('.')}; {_where_url_came_from(args, topo)}") from None
    if topo is not None:
        # S for a scope the workers recorded none with yet (status reads the scope's own S first, so
        # with or without --topology a first period is projected from the same S)
        try:
            start = topo.schedule_start
            if start is None:
                start = await ledger.recorded_version_schedule_start(topo.topology_version)
            if start is not None:
                ledger.use_schedule_start(int(start))
        except BaseException:
            await ledger.close()
            raise
    return ledger, scopes


def _where_url_came_from(args: argparse.Namespace, topo: Any) -> str:
    """The fix hint of an unreachable or refusing ledger: which setting named it, and the credentials' names."""
    if getattr(args, "redis", None):
        source = "--redis"
    elif os.environ.get("DPSTREAM_REDIS", "").strip():
        source = "$DPSTREAM_REDIS"
    elif topo is not None and topo.redis.url:
        source = f"redis.url in {args.topology}"
    else:
        source = f"the default {_DEFAULT_REDIS} (none of --redis, $DPSTREAM_REDIS, --topology's redis.url given)"
    return (
        f"check the URL from {source} and that Redis runs there "
        "(credentials: $DPSTREAM_REDIS_USERNAME / $DPSTREAM_REDIS_PASSWORD)"
    )


def _run(args: argparse.Namespace, body: Callable[[Ledger, list[str]], Awaitable[int]]) -> int:
    async def main() -> int:
        ledger, scopes = await open_cli_ledger(args)
        try:
            return await body(ledger, scopes)
        finally:
            await ledger.close()

    return asyncio.run(main())


async def _scopes(ledger: Ledger, args: argparse.Namespace, topo_scopes: list[str]) -> list[str]:
    if getattr(args, "scope", None):
        return [args.scope]
    scopes = topo_scopes or await ledger.scopes()
    if not scopes:
        raise ConfigError("no budget scope is registered in this ledger: start a worker with the topology first")
    return scopes


def _status_text(s: ScopeStatus) -> str:
    cur = "ρ" if s.accounting == "zcdp" else "ε"
    hours, rest = divmod(s.seconds_to_period_end, 3600)
    lines = [
        f"{s.scope}  [{s.state.value.upper()}]  period {s.period_id} ({hours}h{rest // 60:02d}m left)",
        f"  spent {cur} {s.spent:.6g} of cap {s.cap:.6g}  ratio {s.ratio:.4f} (warn at {s.warn_at:g})"
        + (f"  ε-equivalent {s.epsilon_equiv:.4g} at δ={s.delta:g}" if s.accounting == "zcdp" else ""),
        f"  releases charged {s.charged}, refused {s.refused}",
        f"  pool left {s.pool_left:.6g}  reserve left {s.reserve_left:.6g}",
        f"  projected at period end {s.projected_spend:.6g} (ratio {s.projected_ratio:.3f})",
    ]
    if s.breaker is not None:
        kind = "manual" if s.breaker.manual else "automatic"
        lines.append(
            f"  breaker OPEN ({kind}) by {s.breaker.actor} at {iso(s.breaker.at_ms / 1000)}: {s.breaker.reason}"
        )
    return "\n".join(lines)


def _event_level_metrics(args: argparse.Namespace) -> dict[str, list[str]] | None:
    """Per scope of `--topology`, its event-level metrics (the plan's rule); None without a topology
    (the ledger does not know the privacy unit)."""
    if not getattr(args, "topology", None):
        return None
    from dpstream.topology.loader import load_topology
    from dpstream.topology.plan import build_plan

    plan = build_plan(load_topology(args.topology))
    return {s.name: [m.name for m in s.metrics if m.event_level] for s in plan.scopes}


def _guarantee_line(scope: str, event_level: dict[str, list[str]] | None) -> str:
    names = (event_level or {}).get(scope)
    if not names:
        return ""
    return f"\n  {event_level_note(names)}"


def _status(args: argparse.Namespace) -> int:
    event_level = _event_level_metrics(args)

    def guarantee(scope: str) -> dict[str, Any]:
        """`guarantee` (null without --topology) and the scope's event-level metrics."""
        if event_level is None:
            return {"guarantee": None, "event_level_metrics": None}
        names = event_level.get(scope, [])
        return {"guarantee": guarantee_label(bool(names)), "event_level_metrics": names}

    async def body(ledger: Ledger, topo_scopes: list[str]) -> int:
        scopes = await _scopes(ledger, args, topo_scopes)
        rows = [await ledger.status(scope) for scope in scopes]
        parked = [len(await ledger.parked(scope)) for scope in scopes]
        pairs = list(zip(rows, parked, strict=True))
        if args.json:
            doc = {"scopes": [{**status_json(s), "parked": n, **guarantee(s.scope)} for s, n in pairs]}
            print(json.dumps(doc, indent=2))
        else:
            print(
                "\n".join(
                    _status_text(s) + _guarantee_line(s.scope, event_level) + _parked_line(s.scope, n) for s, n in pairs
                )
            )
        return 0

    return _run(args, body)


def _parked_line(scope: str, n: int) -> str:
    if not n:
        return ""
    return f"\n  PARKED windows: {n} (their release kept failing): `dpstream budget parked --scope {scope}`"


def _parked(args: argparse.Namespace) -> int:
    async def body(ledger: Ledger, topo_scopes: list[str]) -> int:
        rows = [p for scope in await _scopes(ledger, args, topo_scopes) for p in await ledger.parked(scope)]
        if args.json:
            print(json.dumps({"parked": [parked_json(p) for p in rows]}, indent=2))
            return 0
        if not rows:
            print("no parked windows")
        for p in rows:
            retry = f"  retry asked by {p.retry_actor}: {p.retry_reason}" if p.state == "retry" else ""
            print(
                f"{p.scope} {p.metric} [{iso(p.window_start)}, {iso(p.window_end)}) release_id {p.release_id}: "
                f"{p.state}, {p.attempts} failed attempts ({p.error}) since {iso(p.parked_at_ms / 1000)}{retry}"
            )
        return 0

    return _run(args, body)


def _retry(args: argparse.Namespace) -> int:
    if bool(args.release_id) == bool(args.all):
        raise ConfigError("budget retry: give exactly one of --release-id ID (from `dpstream budget parked`) and --all")

    async def body(ledger: Ledger, topo_scopes: list[str]) -> int:
        n = await ledger.retry_parked(args.scope, args.release_id, args.reason, args.actor)
        if args.json:
            print(json.dumps({"scope": args.scope, "retried": n}))
        elif n:
            print(f"{args.scope}: {n} parked window(s) will be released again by the worker owning the metric")
        else:
            what = f"release_id {args.release_id} is not parked" if args.release_id else "no window is parked"
            print(f"{args.scope}: {what} (see `dpstream budget parked --scope {args.scope}`): nothing to retry")
        return 0 if n or args.all else 1

    return _run(args, body)


def _history(args: argparse.Namespace) -> int:
    async def body(ledger: Ledger, topo_scopes: list[str]) -> int:
        out: dict[str, list[dict[str, Any]]] = {}
        for scope in await _scopes(ledger, args, topo_scopes):
            out[scope] = [
                {
                    "period": p.period_id,
                    "start": iso(p.start),
                    "cap": units_to_float(p.cap_units),
                    "spent": units_to_float(p.spent_units),
                    "ratio": p.spent_units / p.cap_units if p.cap_units else 0.0,
                    "charged": p.charged,
                    "refused": p.refused,
                    "reserve_granted": units_to_float(p.grant_units),
                }
                for p in await ledger.history(scope, args.limit)
            ]
        if args.json:
            print(json.dumps({"history_version": HISTORY_VERSION, "scopes": out}, indent=2))
            return 0
        for scope, rows in out.items():
            print(scope)
            for r in rows:
                print(
                    f"  {r['period']:<20} spent {r['spent']:.6g} / {r['cap']:.6g}  ratio {r['ratio']:.4f}  "
                    f"charged {r['charged']}  refused {r['refused']}"
                )
        return 0

    return _run(args, body)


def _since_ms(text: str | None) -> int:
    """`--since`: a duration back from now (`1h`, `2d`) or an ISO-8601 UTC time."""
    if not text:
        return 0
    try:
        return int((_now() - parse_duration(text)) * 1000)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"--since {text!r}: not a duration (1h, 2d) or ISO-8601 time (2026-11-30T00:00Z)") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp() * 1000)


def _audit(args: argparse.Namespace) -> int:
    since = _since_ms(args.since)

    async def body(ledger: Ledger, topo_scopes: list[str]) -> int:
        entries = []
        for scope in await _scopes(ledger, args, topo_scopes):
            for e in await ledger.audit(scope, since, args.limit):
                entries.append(
                    {
                        "scope": scope,
                        "id": e.id,
                        "at": iso(e.at_ms / 1000),
                        **{k: v for k, v in e.fields.items() if v != ""},
                    }
                )
        if args.json:
            print(json.dumps({"entries": entries}, indent=2))
            return 0
        for entry in entries:
            detail = " ".join(
                f"{k}={entry[k]}"
                for k in ("period", "metric", "release_id", "cost", "ratio", "state", "actor")
                if k in entry
            )
            reason = f"  ({entry['reason']})" if "reason" in entry else ""
            print(f"{entry['at']} {entry['scope']} {entry['kind']:<13} {detail}{reason}")
        return 0

    return _run(args, body)


def _reconcile(args: argparse.Namespace) -> int:
    async def body(ledger: Ledger, topo_scopes: list[str]) -> int:
        reports = [await ledger.reconcile(scope) for scope in await _scopes(ledger, args, topo_scopes)]
        if args.json:
            print(
                json.dumps(
                    {
                        "reconcile_version": RECONCILE_VERSION,
                        "ok": all(r.ok for r in reports),
                        "scopes": [
                            {
                                "scope": r.scope,
                                "ok": r.ok,
                                "periods": [
                                    {
                                        "period": p.period_id,
                                        "ok": p.ok,
                                        "stored_units": p.stored_units,
                                        "audited_units": p.audited_units,
                                        "stored_charges": p.stored_charges,
                                        "audited_charges": p.audited_charges,
                                    }
                                    for p in r.periods
                                ],
                            }
                            for r in reports
                        ],
                    },
                    indent=2,
                )
            )
        else:
            for r in reports:
                for p in r.periods:
                    mark = "ok" if p.ok else "MISMATCH"
                    print(
                        f"{r.scope} {p.period_id}: stored {p.stored_units} units / {p.stored_charges} charges, "
                        f"audit {p.audited_units} units / {p.audited_charges} charges: {mark}"
                    )
                if not r.periods:
                    print(f"{r.scope}: no periods yet: ok")
        return 0 if all(r.ok for r in reports) else 1

    return _run(args, body)


def _grant(args: argparse.Namespace) -> int:
    async def body(ledger: Ledger, topo_scopes: list[str]) -> int:
        total = await ledger.grant_reserve(args.scope, args.amount, args.reason, args.actor)
        if args.json:
            print(json.dumps({"scope": args.scope, "granted_total": units_to_float(total)}))
        else:
            print(f"{args.scope}: ordinary metrics may now draw {units_to_float(total):.6g} of the reserve this period")
        return 0

    return _run(args, body)


def default_actor() -> str:
    """The operator's name for the audit trail: $USER, else 'operator'."""
    return os.environ.get("USER") or "operator"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `budget` and its sub-commands."""
    parser = subparsers.add_parser("budget", help="budget status, history, audit trail, reconciliation")
    sub = parser.add_subparsers(dest="budget_command", metavar="ACTION")
    parser.set_defaults(func=lambda args: parser.print_help() or 2)

    p = sub.add_parser("status", help="cap, spent, ratio, ε-equivalent, state of each scope's current period")
    p.add_argument("--scope")
    add_ledger_args(p)
    p.set_defaults(func=_status)

    p = sub.add_parser("history", help="past period blocks of each scope, newest first")
    p.add_argument("--scope")
    p.add_argument("--limit", type=int, default=30)
    add_ledger_args(p)
    p.set_defaults(func=_history)

    p = sub.add_parser("audit", help="the ledger's audit trail (charges, refusals, breaker, config)")
    p.add_argument("--scope")
    p.add_argument("--since", help="a duration back from now (1h) or an ISO-8601 time")
    p.add_argument("--limit", type=int, default=None)
    add_ledger_args(p)
    p.set_defaults(func=_audit)

    p = sub.add_parser("reconcile", help="rebuild spend from the audit stream; exit 1 on any mismatch")
    p.add_argument("--scope")
    add_ledger_args(p)
    p.set_defaults(func=_reconcile)

    p = sub.add_parser("parked", help="windows whose release kept failing on an internal error (held, not dropped)")
    p.add_argument("--scope")
    add_ledger_args(p)
    p.set_defaults(func=_parked)

    p = sub.add_parser("retry", help="make the worker release parked windows again (audited)")
    p.add_argument("--scope", required=True)
    p.add_argument("--release-id", help="one parked window (see `budget parked`)")
    p.add_argument("--all", action="store_true", help="every parked window of the scope")
    p.add_argument("--reason", required=True)
    p.add_argument("--actor", default=default_actor())
    add_ledger_args(p)
    p.set_defaults(func=_retry)

    p = sub.add_parser("grant", help="let ordinary metrics draw part of the reserve this period (audited)")
    p.add_argument("--scope", required=True)
    p.add_argument("--amount", type=float, required=True, help="in the scope's currency (ρ or ε)")
    p.add_argument("--reason", required=True)
    p.add_argument("--actor", default=default_actor())
    add_ledger_args(p)
    p.set_defaults(func=_grant)

    from dpstream.workers.commands.budget_report import register_report  # the period report card

    register_report(sub)
