"""`dpstream budget report --scope S [--period P] [--json] [--html FILE]`: the period report card.

Built from the ledger's audit stream and stored release records only (see
`dpstream.workers.report`): accounting (every charge, the per-record cost check, the total as
charged, the tight PLD / RDP recomputation and the gap, which is never credited back), utility
per metric, fairness, and allocation advice for the next period. Exit 0, or 1 when a record fails
the cost check or the audit does not reconcile with the stored spend.
"""

from __future__ import annotations

__all__ = ["register_report", "make_report", "render_text"]

import argparse
import asyncio
import json
from typing import Any

from dpstream.topology.errors import ConfigError
from dpstream.topology.model import event_level_note


async def make_report(ledger: Any, topology: Any, scope: str, period: str | None) -> dict[str, Any]:
    """Collect the period from an open ledger and build its report."""
    from dpstream.workers.report.build import build_report
    from dpstream.workers.report.collect import collect_period

    data = await collect_period(ledger, topology, scope, period)
    return await asyncio.to_thread(build_report, data)


def render_text(rep: dict[str, Any]) -> str:
    """The report as a few readable lines (the JSON has everything)."""
    acc = rep["accounting"]
    ch = acc["charged"]
    cur = "ρ" if acc["currency"] == "rho" else "ε"
    rc = acc["record_check"]
    lines = [
        f"report card: {rep['scope']} period {rep['period']['id']} "
        f"({rep['period']['start']} .. {rep['period']['end']})",
        *([f"  {event_level_note(names)}"] if (names := rep.get("event_level_metrics")) else []),
        f"  charged: {cur} {ch['total']:.6g} of cap {ch['cap']:.6g} (ratio {ch['ratio']:.4f}); "
        f"ε {ch['epsilon']:.6g} at δ {ch['delta']:.3g}; audit reconciles: {'yes' if ch['reconciles'] else 'NO'}",
        f"  per-record cost check: {rc['ok']} of {rc['checked']} ok"
        + (f", {len(rc['flagged'])} FLAGGED" if rc["flagged"] else ""),
    ]
    for f in rc["flagged"][:10]:
        lines.append(f"    FLAGGED {f['metric']} {f['release_id'][:16]}…: {'; '.join(f['problems'])}")
    if acc.get("tight"):
        t, gap = acc["tight"], acc["gap"]
        lines.append(
            f"  tight (non-adaptive) ε at δ {t['delta']:.3g}: PLD {t['pld_epsilon']:.6g}, RDP {t['rdp_epsilon']:.6g} "
            f"(order {t['rdp_order']:g}); gap {gap['epsilon']:.4g} ({100 * gap['relative']:.1f} %), not credited back:"
        )
        lines.append(f"    {gap['reason']}")
    lines.append("  utility (per metric): releases, mean σ, mean 95 % CI, E|error|, fit E = c/noise_multiplier")
    for u in rep["utility"]:
        if "fit" in u:
            lines.append(
                f"    {u['metric']:<20} {u['releases']:>5}  σ {u['sigma_mean']:.4g}  ±{u['ci95_half_width_mean']:.4g}  "
                f"E {u['expected_abs_error_mean']:.4g}  c {u['fit']['c']:.4g}  planned σ "
                + (f"{u['planned_sigma']:.4g}" if u.get("planned_sigma") else "-")
            )
        else:
            lines.append(f"    {u['metric']:<20} {u['releases']:>5}  ({u.get('note') or u.get('aggregate', '')})")
    lines.append("  fairness: spend share vs weight share; refused / stretched / skipped")
    for f in rep["fairness"]:
        lines.append(
            f"    {f['metric']:<20} {100 * f['spend_share']:5.1f} % vs {100 * f['weight_share']:5.1f} %  "
            f"refused {f['refused']}  stretched {f['stretched']}  skipped {f['skipped']}"
        )
    adv = rep["advice"]
    w = adv.get("weighted_relative_error") or {}
    lines.append("  advice for the next period (weights minimising Σ importance × relative error, same cap):")
    for m in adv.get("metrics", []):
        lines.append(
            f"    {m['metric']:<20} weight {m['weight_now']:g} -> {m['weight_advised']:g}  "
            f"E {m['expected_abs_error_this_period']:.4g} -> {m['expected_abs_error_advised']:.4g}"
        )
    if w.get("predicted_change") is not None:
        lines.append(
            f"    weighted relative error: {w['this_period']:.4g} -> {w['advised']:.4g} (× {w['predicted_change']:.3f}"
            + (f", {w['verdict']})" if w.get("verdict") else ")")
        )
    return "\n".join(lines)


def _exit_code(rep: dict[str, Any]) -> int:
    acc = rep["accounting"]
    return 0 if not acc["record_check"]["flagged"] and acc["charged"]["reconciles"] else 1


def _run(args: argparse.Namespace) -> int:
    from dpstream.workers.commands.budget import open_cli_ledger

    if not args.topology:
        raise ConfigError(
            "budget report: --topology FILE is needed (the metrics' declared sensitivities); "
            "give the deployment's topology"
        )

    for module, why in (("dp_accounting", "the tight re-accounting"), ("matplotlib", "the --html page")):
        if module == "matplotlib" and not args.html:
            continue
        try:
            __import__(module)
        except ImportError:
            raise ConfigError(
                f"budget report: {why} needs {module}: install the extra with pip install 'dpstream[report]' "
                "(in a checkout: pip install -e '.[report]')"
            ) from None

    async def main() -> dict[str, Any]:
        from dpstream.topology.loader import load_topology

        topology = load_topology(args.topology)
        if args.scope not in topology.budgets:
            known = ", ".join(sorted(topology.budgets))
            raise ConfigError(f"--scope {args.scope!r}: not a budget scope of {args.topology}; one of {known}")
        ledger, _scopes = await open_cli_ledger(args)
        try:
            return await make_report(ledger, topology, args.scope, args.period)
        finally:
            await ledger.close()

    rep = asyncio.run(main())
    if args.html:
        from dpstream.workers.report.page import write_page

        write_page(rep, args.html)
    if args.json:
        print(json.dumps(rep, indent=1, ensure_ascii=False))
    else:
        print(render_text(rep))
        if args.html:
            print(f"  page: {args.html}")
    return _exit_code(rep)


def register_report(sub: argparse._SubParsersAction) -> None:
    """Add `budget report` to the `budget` sub-commands."""
    from dpstream.workers.commands.budget import add_ledger_args

    p = sub.add_parser("report", help="the period report card: exact re-accounting, utility, fairness, advice")
    p.add_argument("--scope", required=True)
    p.add_argument("--period", help="period id (default: the newest period block)")
    p.add_argument("--html", metavar="FILE", help="also write the page (one self-contained HTML file with plots)")
    add_ledger_args(p)
    p.set_defaults(func=_run)
