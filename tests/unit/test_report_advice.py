"""The report's advice (workers/report/advice.py) and `dpstream plan --weights-from` (workers/commands/plan.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from dpstream.topology.errors import ConfigError
from dpstream.topology.loader import load_topology
from dpstream.topology.model import Accounting
from dpstream.topology.plan import build_plan
from dpstream.workers.cli import main
from dpstream.workers.report.advice import advice_section, with_weights
from dpstream.workers.report.utility import MetricUtility, noise_multiplier

EXAMPLE = Path(__file__).resolve().parents[2] / "topology" / "examples" / "web-analytics.yaml"


def _util(c: dict[str, float], mag: dict[str, float]) -> dict[str, MetricUtility]:
    """Utilities whose fit gives exactly c and whose released values average to mag (E = c/ε at one ε)."""
    out = {}
    for name in ("page_views", "active_users_5m", "basket_value", "session_seconds", "top_referrers"):
        u = MetricUtility(name, "x", 1)
        if name in c:
            u.multipliers, u.errors, u.sigmas, u.values = [0.01], [c[name] / 0.01], [1.0], [mag[name]]
        out[name] = u
    return out


def test_advice_satisfies_the_closed_form_and_keeps_the_pool() -> None:
    """zCDP: advised ε_j³ ∝ w_j c_j / (m_j N_j); top-k keeps its weight; numeric weights keep their sum."""
    topo = load_topology(EXAMPLE)
    c = {"page_views": 7.0, "active_users_5m": 0.8, "basket_value": 320.0, "session_seconds": 9.0}
    mag = {"page_views": 50.0, "active_users_5m": 300.0, "basket_value": 9000.0, "session_seconds": 1800.0}
    adv = advice_section(topo, "web-daily", Accounting.ZCDP, _util(c, mag))
    assert adv["weights"]["top_referrers"] == 1.0 and adv["not_advised"] == ["top_referrers"]
    assert math.isclose(sum(adv["weights"][n] for n in c), 7.0, rel_tol=1e-3)
    plan = build_plan(with_weights(topo, adv["weights"]))
    ratios = []
    for n in c:
        w = topo.metrics[n].weight
        eps = noise_multiplier(Accounting.ZCDP, plan.metric(n).per_release_cost)
        ratios.append(eps**3 * mag[n] * plan.metric(n).releases_per_period / (w * c[n]))
    assert max(ratios) / min(ratios) < 1.002  # equal up to the 4-digit rounding of the weights
    j = adv["weighted_relative_error"]
    assert j["advised"] < j["this_plan"]  # the optimum beats the plan under the current weights


def test_plan_weights_from_shows_the_advised_plan_without_changing_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`plan FILE --weights-from REPORT.json` prints the plan under the report's weights; FILE is unchanged."""
    report = tmp_path / "report.json"
    weights = {"page_views": 5.0, "active_users_5m": 1.0, "basket_value": 0.5, "session_seconds": 0.5}
    report.write_text(json.dumps({"report_version": 1, "advice": {"weights": weights}}))
    before = EXAMPLE.read_bytes()
    assert main(["plan", str(EXAMPLE), "--weights-from", str(report), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert EXAMPLE.read_bytes() == before
    assert doc["weights_from"]["weights"] == weights and doc["weights_from"]["file_changed"] is False
    shares = {m["name"]: m["weight_share"] for s in doc["scopes"] for m in s["metrics"]}
    assert math.isclose(shares["page_views"], 5.0 / 8.0)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json", "not JSON"),
        ('{"report_version": 1}', "no advice.weights"),
        ('{"report_version": 1, "advice": {"weights": {"nope": 1}}}', "names metric 'nope'"),
        ('{"report_version": 1, "advice": {"weights": {"page_views": -1}}}', "not a positive number"),
    ],
)
def test_plan_weights_from_errors_are_one_line(tmp_path: Path, content: str, message: str) -> None:
    """A bad report file is a one-line ConfigError naming the file and the fix."""
    from dpstream.workers.commands.plan import advised_weights

    path = tmp_path / "r.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message) as info:
        advised_weights(str(path), load_topology(EXAMPLE).metrics)
    assert "\n" not in str(info.value) and str(path) in str(info.value)
