"""`dpstream audit-privacy`: the empirical DP audit of every noise mechanism, plus its power check."""

from __future__ import annotations

__all__ = ["register", "run"]

import argparse
import json
from typing import TYPE_CHECKING

from dpstream.topology.errors import ConfigError

if TYPE_CHECKING:
    from dpstream.workers.audit.empirical import AuditResult

DEFAULT_TRIALS = 20_000


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `audit-privacy` sub-command."""
    parser = subparsers.add_parser(
        "audit-privacy",
        help="empirical lower bounds on ε for every mechanism (and a broken one that must be flagged)",
        description="Black-box DP audit (Jagielski et al. 2020): Clopper-Pearson lower bounds on ε at worst-case "
        "neighbouring inputs. Exit 0 when every real mechanism passes and every broken one is flagged.",
    )
    parser.add_argument("--trials", type=int, default=DEFAULT_TRIALS, help=f"draws per side (default {DEFAULT_TRIALS})")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--no-power-check", action="store_true", help="skip the half-scale (broken) mechanisms")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the audit; 0 when all verdicts are as expected, 1 otherwise."""
    # imported here: the audit loads OpenDP, which every other command would pay for at start-up
    from dpstream.workers.audit.empirical import STRICT_ALPHA, audit, broken_cases, standard_cases

    if args.trials < 200:
        raise ConfigError(f"audit-privacy: --trials {args.trials}: too few to bound anything; use at least 200")
    real = [audit(case, args.trials) for case in standard_cases()]
    broken = [] if args.no_power_check else [audit(case, args.trials) for case in broken_cases()]
    ok = all(r.passed for r in real) and all(not r.passed for r in broken)
    if args.json:
        print(
            json.dumps(
                {
                    "ok": ok,
                    "strict_alpha": STRICT_ALPHA,
                    "mechanisms": [r.as_dict() for r in real],
                    "power_check": [r.as_dict() for r in broken],
                },
                indent=2,
            )
        )
    else:
        _table("mechanisms (must pass)", real, expect_pass=True)
        if broken:
            _table("power check: half-scale mechanisms (must be flagged)", broken, expect_pass=False)
        print(f"\nverdict bound: Clopper-Pearson at alpha={STRICT_ALPHA:g}; {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


def _table(title: str, results: list[AuditResult], expect_pass: bool) -> None:
    print(f"\n{title}")
    print(f"  {'mechanism':<84} {'trials':>7} {'delta':>8} {'claimed':>8} {'lb95':>7} {'lb_strict':>9}  verdict")
    for r in results:
        verdict = "pass" if r.passed else "FLAGGED"
        mark = "" if r.passed == expect_pass else "  <-- unexpected"
        print(
            f"  {r.name:<84} {r.trials:>7} {r.delta:>8.0e} {r.claimed_epsilon:>8.3f} "
            f"{r.epsilon_lower_95:>7.3f} {r.epsilon_lower_strict:>9.3f}  {verdict}{mark}"
        )
