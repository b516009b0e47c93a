"""Tests of `dpstream plan FILE [--json]` end to end on the reference topologies."""

import json
from pathlib import Path

import pytest

from dpstream.workers.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "topology" / "examples"


def _plan_json(capsys, name: str) -> dict:
    assert main(["plan", str(EXAMPLES / name), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _metrics(doc: dict) -> dict:
    return {m["name"]: m for s in doc["scopes"] for m in s["metrics"]}


def test_seed_example_json_reproduces_seed_000(capsys):
    """seed-example.yaml --json: ε 0.4/0.6/0.5/0.5, b 2.5 / 166.67 / 0.02, top-5 at ε 0.5."""
    doc = _plan_json(capsys, "seed-example.yaml")
    m = _metrics(doc)
    assert [m[n]["per_release_cost"] for n in ("q1_count", "q2_sum", "q3_mean", "q4_top5")] == pytest.approx(
        [0.4, 0.6, 0.5, 0.5]
    )
    assert [m[n]["components"][0]["scale"] for n in ("q1_count", "q2_sum", "q3_mean")] == pytest.approx(
        [2.5, 166.67, 0.02], abs=5e-3
    )
    top = m["q4_top5"]
    assert (top["mechanism"], top["k"], top["per_release_epsilon"]) == ("exponential", 5, pytest.approx(0.5))
    # merchants come from the data: half of the 0.5 selects candidate keys, half ranks them
    selection, ranking = top["components"]
    assert (selection["component"], selection["mechanism"], ranking["mechanism"]) == (
        "selection",
        "laplace",
        "exponential",
    )
    assert (selection["epsilon"], ranking["epsilon"]) == (pytest.approx(0.25), pytest.approx(0.25))
    (scope,) = doc["scopes"]
    assert (scope["currency"], scope["delta"], scope["planned_total"]) == ("epsilon", 1e-6, pytest.approx(2.0))
    assert scope["selection_delta"] == 1e-6 and m["q4_top5"]["selection_delta"] == pytest.approx(1e-6)


def test_seed_adaptive_json_reproduces_seed_002(capsys):
    """seed-adaptive.yaml --json: reserve 0.4, ε 0.64/0.48/0.32/0.16, b 1.5625/2.0833/3.125/6.25."""
    doc = _plan_json(capsys, "seed-adaptive.yaml")
    (scope,) = doc["scopes"]
    assert scope["reserve"] == pytest.approx(0.4) and scope["pool"] == pytest.approx(1.6)
    metrics = scope["metrics"]
    assert [x["per_release_cost"] for x in metrics] == pytest.approx([0.64, 0.48, 0.32, 0.16])
    assert [x["components"][0]["scale"] for x in metrics] == pytest.approx([1.5625, 2.0833, 3.125, 6.25], abs=1e-4)
    assert scope["horizon"]["epsilon"] == pytest.approx(48.0)


def test_web_analytics_json_pool_and_releases(capsys):
    """web-analytics.yaml --json: releases 1440+1440+288+96+24 and planned ρ = 0.8·ρ*."""
    doc = _plan_json(capsys, "web-analytics.yaml")
    (scope,) = doc["scopes"]
    assert [x["releases_per_period"] for x in scope["metrics"]] == [1440, 1440, 288, 96, 24]
    assert scope["releases_per_period"] == 3288
    assert scope["planned_total"] == pytest.approx(0.8 * scope["cap"], rel=1e-12)
    assert scope["cap"] == pytest.approx(0.0241296, abs=5e-7)  # CKS20 cap at (1, 0.9e-6): 1e-7 is for selection
    assert scope["horizon"]["epsilon"] < scope["horizon"]["naive_epsilon"]


def test_table_output_names_every_scope_and_metric(capsys):
    """Without --json the plan prints a table naming the scope, its cap and every metric."""
    assert main(["plan", str(EXAMPLES / "web-analytics.yaml")]) == 0
    out = capsys.readouterr().out
    for word in (
        "web-daily",
        "ρ*=0.02413",
        "page_views",
        "active_users_5m",
        "hopping 5m/1m",
        "over 30 days",
        "partition sel.",
    ):
        assert word in out


def test_missing_file_is_one_line_and_exit_2(capsys, tmp_path):
    """A missing topology file prints one error line on stderr and exits 2, without a traceback."""
    assert main(["plan", str(tmp_path / "nope.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "nope.yaml" in err


def test_broken_topology_exits_2(capsys, tmp_path):
    """A topology with a mistake (ε ≤ 0) is reported as a ConfigError: exit 2, one line."""
    text = (EXAMPLES / "seed-adaptive.yaml").read_text().replace("epsilon: 2.0", "epsilon: -1")
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert main(["plan", str(path), "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "epsilon" in captured.err and captured.err.count("\n") == 1


def test_help_prints_percent_signs_once(capsys):
    """`plan --help` shows "95 % CI", not argparse's escaped "%%"."""
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    out = capsys.readouterr().out
    assert "%%" not in out and "95 % CI" in " ".join(out.split())


def test_table_footnote_explains_every_abbreviated_column(capsys):
    """The table's footnote says what ε-equiv, part, Δ1 and Δ2 mean (one ε-equivalent: the record's)."""
    assert main(["plan", str(EXAMPLES / "web-analytics.yaml")]) == 0
    lines = capsys.readouterr().out.splitlines()
    notes = " ".join(line.strip() for line in lines[[i for i, x in enumerate(lines) if x.startswith("ε-equiv:")][0] :])
    for term in ("ε-equiv:", "part:", "Δ1, Δ2:", "scale:"):
        assert term in notes, notes
    assert "cost.epsilon_equiv" in notes and "sensitivity" in notes
