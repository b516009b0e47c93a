"""The verdict of `dpstream audit-privacy`: a shipped mechanism flagged is FAILED at any trial count; planted
leaks left unflagged at too few trials are "inconclusive" (exit 3, naming the trials to rerun with), not
FAILED; unflagged at enough trials they are FAILED (the check lost its power)."""

from __future__ import annotations

import json
import math

import pytest

from dpstream.workers.audit.empirical import STRICT_ALPHA, AuditResult, broken_cases, trials_to_flag
from dpstream.workers.audit.stats import clopper_pearson
from dpstream.workers.cli import main
from dpstream.workers.commands.audit_privacy import DEFAULT_TRIALS, EXIT_INCONCLUSIVE, verdict_of


def _result(name: str, k0: int, k1: int, draws: int, claimed: float, strict: float) -> AuditResult:
    """A result as `audit` returns it: the estimate half's counts and the bounds (strict decides)."""
    return AuditResult(name, 2 * draws, "X >= 0, D vs D'", 0.0, claimed, strict, strict, k0, k1, draws)


REAL_OK = _result("real", 50, 48, 1000, 1.0, 0.2)
REAL_LEAKS = _result("real", 900, 10, 1000, 1.0, 3.1)  # strict bound over its claim: a leak
CAUGHT = _result("BROKEN caught", 95, 1, 100, 1.0, 2.5)
MISSED = _result("BROKEN missed", 90, 5, 100, 1.0, 0.9)  # clear excess at 95 %, strict bound short of it
MISSED_NO_EXCESS = _result("BROKEN no excess", 60, 20, 100, 1.0, 0.1)


def test_all_as_expected_is_ok() -> None:
    """Every shipped mechanism passes, every planted leak is flagged: ok, exit 0."""
    v = verdict_of([REAL_OK], [CAUGHT], 200)
    assert (v.outcome, v.exit_code) == ("ok", 0)


def test_a_shipped_mechanism_flagged_is_failed_at_any_trial_count() -> None:
    """A real failure is FAILED (exit 1) even when the power check is also short of trials."""
    for trials in (200, 2_000, DEFAULT_TRIALS):
        v = verdict_of([REAL_OK, REAL_LEAKS], [MISSED], trials)
        assert (v.outcome, v.exit_code) == ("failed", 1)


def test_planted_leaks_missed_at_too_few_trials_are_inconclusive() -> None:
    """Missed below the trials the bound needs: inconclusive (exit 3) with that need; missed at or above
    it: FAILED."""
    need = trials_to_flag(MISSED)
    assert need is not None and 200 < need < DEFAULT_TRIALS
    v = verdict_of([REAL_OK], [CAUGHT, MISSED], 200)
    assert (v.outcome, v.exit_code) == ("inconclusive", EXIT_INCONCLUSIVE)
    assert v.trials_needed == math.ceil(need / 1000) * 1000
    assert verdict_of([REAL_OK], [CAUGHT, MISSED], v.trials_needed).outcome == "failed"


def test_a_miss_with_no_visible_excess_needs_the_default() -> None:
    """Rates showing no excess over the claim give no estimate: the need is the default trial count,
    at which the power check is known to flag every planted leak."""
    assert trials_to_flag(MISSED_NO_EXCESS) is None
    v = verdict_of([REAL_OK], [MISSED, MISSED_NO_EXCESS], 2_000)
    assert (v.outcome, v.trials_needed) == ("inconclusive", DEFAULT_TRIALS)
    assert verdict_of([REAL_OK], [MISSED_NO_EXCESS], DEFAULT_TRIALS).outcome == "failed"


def test_a_larger_excess_needs_fewer_trials() -> None:
    """The estimate follows the test's own bound: the farther the rates are apart, the fewer draws."""
    wide, narrow = trials_to_flag(_result("w", 95, 2, 100, 1.0, 0.0)), trials_to_flag(MISSED)
    assert wide is not None and narrow is not None and wide < narrow


def test_cli_at_few_trials_is_inconclusive(capsys: pytest.CaptureFixture[str]) -> None:
    """At 200 trials a planted leak cannot be flagged (permute-and-flip claims eps = 2, more than the largest
    strict bound 100 draws per side can give), so the run is inconclusive, not FAILED; a shipped
    mechanism fails its audit with probability < 1e-7 each."""
    draws = 100
    top = clopper_pearson(draws, draws, STRICT_ALPHA)[0] / clopper_pearson(0, draws, STRICT_ALPHA)[1]
    assert any(c.claim.deltas() == (0.0,) and c.claim.epsilon_at(0.0) > math.log(top) for c in broken_cases())
    code = main(["audit-privacy", "--trials", "200"])
    out = capsys.readouterr().out
    assert code == EXIT_INCONCLUSIVE
    last = out.strip().splitlines()[-1]
    assert last.startswith("power check inconclusive at 200 trials (needs >= ") and "rerun with --trials " in last
    assert "FAILED" not in out and "unexpected" not in out
    code = main(["audit-privacy", "--trials", "200", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == EXIT_INCONCLUSIVE and doc["verdict"] == "inconclusive" and doc["trials_needed"] > 200
