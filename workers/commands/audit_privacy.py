"""`dpstream audit-privacy`: the empirical DP audit of every noise mechanism, plus its power check."""

from __future__ import annotations

__all__ = ["EXIT_INCONCLUSIVE", "Verdict", "register", "run", "verdict_of"]

import argparse
import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dpstream.topology.errors import ConfigError

if TYPE_CHECKING:
    from dpstream.workers.audit.empirical import AuditResult

DEFAULT_TRIALS = 20_000
"""Also the power check's fallback need: the trial count at which tests/privacy/test_audit.py shows every
planted leak flagged (strict bounds >= 0.4 nats over their claims)."""

EXIT_INCONCLUSIVE = 3
"""Every real mechanism passed, but too few trials to flag the planted leaks: rerun with more."""


@dataclass(frozen=True)
class Verdict:
    """The audit's outcome: "ok", "failed" or "inconclusive" (then `trials_needed` to rerun with)."""

    outcome: str
    trials_needed: int | None = None

    @property
    def exit_code(self) -> int:
        """0 ok, 1 failed, EXIT_INCONCLUSIVE inconclusive."""
        return {"ok": 0, "failed": 1}.get(self.outcome, EXIT_INCONCLUSIVE)


def verdict_of(real: list[AuditResult], broken: list[AuditResult], trials: int) -> Verdict:
    """Failed when a shipped mechanism is flagged (at any trial count); inconclusive when only planted
    leaks went unflagged and `trials` is below what flagging them needs (the largest `trials_to_flag` of
    them, rounded up to a thousand, at most DEFAULT_TRIALS; DEFAULT_TRIALS for one whose rates show no
    excess yet); failed when they went unflagged at enough trials (the check has lost its power); else ok."""
    from dpstream.workers.audit.empirical import trials_to_flag

    if not all(r.passed for r in real):
        return Verdict("failed")
    missed = [r for r in broken if r.passed]
    if not missed:
        return Verdict("ok")
    # an estimate above DEFAULT_TRIALS comes from a near-tie at few draws: the default is known to suffice
    needs = [trials_to_flag(r) for r in missed]
    needed = min(DEFAULT_TRIALS, math.ceil(max(DEFAULT_TRIALS if n is None else n for n in needs) / 1000) * 1000)
    return Verdict("inconclusive", needed) if trials < needed else Verdict("failed")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `audit-privacy` sub-command."""
    parser = subparsers.add_parser(
        "audit-privacy",
        help="empirical lower bounds on ε for every mechanism (and a broken one that must be flagged)",
        description="Black-box DP audit (Jagielski et al. 2020): Clopper-Pearson lower bounds on ε at worst-case "
        "neighbouring inputs. Exit 0 when every real mechanism passes and every broken one is flagged; 1 when a real "
        f"mechanism is flagged (at any --trials) or a broken one passes at enough trials; {EXIT_INCONCLUSIVE} when "
        "every real mechanism passes but --trials is too small for the power check to flag the broken ones "
        "(rerun with the --trials it names).",
    )
    parser.add_argument("--trials", type=int, default=DEFAULT_TRIALS, help=f"draws per side (default {DEFAULT_TRIALS})")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--no-power-check", action="store_true", help="skip the half-scale (broken) mechanisms")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the audit; 0 when all verdicts are as expected, 1 when not, EXIT_INCONCLUSIVE when too few trials."""
    # imported here: the audit loads OpenDP, which every other command would pay for at start-up
    from dpstream.workers.audit.empirical import STRICT_ALPHA, audit, broken_cases, standard_cases

    if args.trials < 200:
        raise ConfigError(f"audit-privacy: --trials {args.trials}: too few to bound anything; use at least 200")
    real = [audit(case, args.trials) for case in standard_cases()]
    broken = [] if args.no_power_check else [audit(case, args.trials) for case in broken_cases()]
    verdict = verdict_of(real, broken, args.trials)
    ok = verdict.outcome == "ok"
    if args.json:
        print(
            json.dumps(
                {
                    "ok": ok,
                    "verdict": verdict.outcome,
                    "trials_needed": verdict.trials_needed,
                    "strict_alpha": STRICT_ALPHA,
                    "mechanisms": [r.as_dict() for r in real],
                    "power_check": [r.as_dict() for r in broken],
                },
                indent=2,
            )
        )
    else:
        inconclusive = verdict.outcome == "inconclusive"
        _table("mechanisms (must pass)", real, expect_pass=True)
        if broken:
            title = "power check: half-scale mechanisms (must be flagged)"
            _table(title, broken, expect_pass=False, quiet=inconclusive)
        if inconclusive:
            print(
                f"\npower check inconclusive at {args.trials} trials (needs >= {verdict.trials_needed} to catch the "
                f"planted leaks); rerun with --trials {verdict.trials_needed}"
            )
        else:
            print(f"\nverdict bound: Clopper-Pearson at alpha={STRICT_ALPHA:g}; {'OK' if ok else 'FAILED'}")
    return verdict.exit_code


def _table(title: str, results: list[AuditResult], expect_pass: bool, quiet: bool = False) -> None:
    """The results; a verdict other than expected is marked, unless `quiet` (an inconclusive power check)."""
    print(f"\n{title}")
    print(f"  {'mechanism':<84} {'trials':>7} {'delta':>8} {'claimed':>8} {'lb95':>7} {'lb_strict':>9}  verdict")
    for r in results:
        verdict = "pass" if r.passed else "FLAGGED"
        mark = "" if r.passed == expect_pass else ("  (too few trials)" if quiet else "  <-- unexpected")
        print(
            f"  {r.name:<84} {r.trials:>7} {r.delta:>8.0e} {r.claimed_epsilon:>8.3f} "
            f"{r.epsilon_lower_95:>7.3f} {r.epsilon_lower_strict:>9.3f}  {verdict}{mark}"
        )
