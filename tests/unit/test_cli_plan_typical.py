"""`dpstream plan FILE --typical M=V / --sample EVENTS.jsonl`: CI over typical value, warnings, errors."""

import json
from pathlib import Path

import pytest

from dpstream.workers.cli import main

TOPOLOGY = """\
version: 1
sources:
  clicks:
    topic: t.clicks
    privacy_unit: user_id
    timestamp: ts
budgets:
  b:
    epsilon: 1.0
    delta: 1.0e-6
    accounting: pure
    period: 1h
    reserve: 0.0
    warn_at: 0.8
metrics:
  views:
    source: clicks
    budget: b
    weight: 1
    window: {tumbling: 1m}
    aggregate: count
    contribution: {max_per_key: 2}
    mechanism: laplace
  pages:
    source: clicks
    budget: b
    weight: 1
    window: {tumbling: 1m}
    aggregate: count
    group_by: page
    keys: [home, cart]
    contribution: {max_keys: 1, max_per_key: 1}
    mechanism: laplace
  session:
    source: clicks
    budget: b
    weight: 1
    window: {tumbling: 1m}
    aggregate: mean
    value: secs
    bounds: [0, 100]
    contribution: {max_per_key: 1}
    mechanism: laplace
  top:
    source: clicks
    budget: b
    weight: 1
    window: {tumbling: 1m}
    aggregate: top_k
    k: 1
    group_by: page
    keys: [home, cart]
    contribution: {max_keys: 1, max_per_key: 1}
    mechanism: exponential
sinks:
  releases: t.releases
  dead_letter: t.dead-letter
"""

T0 = 1_800_000_000  # on the minute grid


@pytest.fixture
def topo(tmp_path: Path) -> Path:
    path = tmp_path / "t.yaml"
    path.write_text(TOPOLOGY, encoding="utf-8")
    return path


def _plan(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["plan", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _views_ci(capsys, topo: Path) -> float:
    rc, out, _ = _plan(capsys, str(topo), "--json")
    assert rc == 0
    (scope,) = json.loads(out)["scopes"]
    views = next(m for m in scope["metrics"] if m["name"] == "views")
    return views["components"][0]["ci95_half_width"]


def _metric(doc: dict, name: str) -> dict:
    return next(m for s in doc["scopes"] for m in s["metrics"] if m["name"] == name)


def test_typical_gives_the_ratio_and_warns_only_when_ci_exceeds_it(capsys, topo):
    """CI / typical in --json and the table; a warning line naming the metric where CI > typical only."""
    ci = _views_ci(capsys, topo)
    rc, out, _ = _plan(capsys, str(topo), "--json", "--typical", f"views={ci / 4}", "--typical", "pages=1e6")
    assert rc == 0
    doc = json.loads(out)
    views, pages = _metric(doc, "views")["typical"], _metric(doc, "pages")["typical"]
    assert views["ci_over_typical"] == pytest.approx(4.0) and views["exceeds"] is True
    assert views["origin"] == "typical" and "views" in views["warning"] and "4×" in views["warning"]
    assert pages["exceeds"] is False and pages["warning"] is None
    assert "typical" not in _metric(doc, "session")  # not given: unchanged

    rc, out, _ = _plan(capsys, str(topo), "--typical", f"views={ci / 4}", "--typical", "pages=1e6")
    warnings = [line.strip() for line in out.splitlines() if line.strip().startswith("WARNING")]
    assert len(warnings) == 1
    (w,) = warnings
    assert w.startswith("WARNING views:") and "4×" in w
    assert "longer window" in w and "larger weight" in w and "contribution.max_windows (at most" in w
    assert "CI/typ" in out

    rc, out, _ = _plan(capsys, str(topo), "--typical", f"views={ci * 4}")
    assert rc == 0 and "WARNING" not in out and "0.25" in out


def test_top_k_and_a_ratio_mean_have_no_ci_to_compare(capsys, topo):
    """top-k and a mean over a noisy count: n/a, never a warning."""
    rc, out, _ = _plan(capsys, str(topo), "--json", "--typical", "top=0.001", "--typical", "session=1e-9")
    doc = json.loads(out)
    for name in ("top", "session"):
        t = _metric(doc, name)["typical"]
        assert (t["ci_over_typical"], t["exceeds"], t["warning"]) == (None, False, None)
    rc, out, _ = _plan(capsys, str(topo), "--typical", "top=0.001")
    assert "n/a" in out and "WARNING" not in out


def _write_sample(path: Path) -> Path:
    """Two whole minutes: each has one heavy user (50 views) and three light ones (1 view each)."""
    rows = []
    for minute in range(2):
        base = T0 + 60 * minute
        rows += [{"user_id": "heavy", "ts": base + i * 0.5, "page": "home", "secs": 100} for i in range(50)]
        rows += [{"user_id": f"u{u}", "ts": base + 40 + u, "page": "cart", "secs": 10} for u in range(3)]
    rows.append({"user_id": "late", "ts": T0 + 120, "page": "home", "secs": 1})  # marks the end of minute 2
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\nnot json\n", encoding="utf-8")
    return path


def test_sample_computes_the_bounded_typical(capsys, topo, tmp_path):
    """The heavy user's 50 views count 2 (max_per_key): 2 + 3 = 5 per minute, not 53."""
    sample = _write_sample(tmp_path / "events.jsonl")
    rc, out, _ = _plan(capsys, str(topo), "--json", "--sample", str(sample))
    assert rc == 0
    doc = json.loads(out)
    views = _metric(doc, "views")["typical"]
    assert (views["value"], views["origin"]) == (5.0, "sample")
    # pages: per window the smallest declared key's count (home 1 from the heavy user, cart 3)
    assert _metric(doc, "pages")["typical"]["value"] == 1.0
    # session: one value per user and window, (100 + 3·10) / 4
    assert _metric(doc, "session")["typical"]["value"] == pytest.approx(32.5)
    assert doc["typical_sample"]["windows"]["views"] == 2 and doc["typical_sample"]["dp"] is False

    rc, out, _ = _plan(capsys, str(topo), "--sample", str(sample))
    assert rc == 0 and "NOT DP" in out
    assert any(line.strip().startswith("WARNING views:") for line in out.splitlines())


def test_typical_wins_over_the_sample(capsys, topo, tmp_path):
    sample = _write_sample(tmp_path / "events.jsonl")
    rc, out, _ = _plan(capsys, str(topo), "--json", "--sample", str(sample), "--typical", "views=1e9")
    views = _metric(json.loads(out), "views")["typical"]
    assert (views["value"], views["origin"], views["exceeds"]) == (1e9, "typical", False)


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--typical", "nosuch=3"], "--typical 'nosuch=3': FILE has no metric 'nosuch'; choose one of"),
        (["--typical", "views=abc"], "--typical 'views=abc': 'abc' is not a non-zero number"),
        (["--typical", "views=0"], "is not a non-zero number"),
        (["--typical", "views"], "write it as METRIC=VALUE"),
        (["--sample", "/nonexistent/ev.jsonl"], "--sample /nonexistent/ev.jsonl: cannot read"),
    ],
)
def test_user_mistakes_are_one_line_errors(capsys, topo, flags, needle):
    rc, out, err = _plan(capsys, str(topo), *flags)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err and "Traceback" not in err


def test_a_sample_without_events_of_the_source_is_a_one_line_error(capsys, topo, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"nope": 1}\nnot json\n', encoding="utf-8")
    rc, _, err = _plan(capsys, str(topo), "--sample", str(bad))
    assert rc == 2 and f"--sample {bad}: no line is a valid event of source 'clicks'" in err
    assert len(err.strip().splitlines()) == 1


def test_a_quantile_metric_in_the_sample_has_no_typical_value(capsys, topo, tmp_path):
    """A quantile's error is in ranks, not in its value's unit: `--sample` gives it no typical value
    (its partial is grid-cell counts) and the other metrics keep theirs."""
    text = topo.read_text(encoding="utf-8").replace(
        "metrics:\n",
        "metrics:\n"
        "  secs_pct:\n"
        "    source: clicks\n"
        "    budget: b\n"
        "    weight: 1\n"
        "    window: {tumbling: 1m}\n"
        "    aggregate: quantile\n"
        "    value: secs\n"
        "    bounds: [0, 200]\n"
        "    bins: 20\n"
        "    quantiles: [0.5, 0.9]\n"
        "    contribution: {max_per_key: 1}\n"
        "    mechanism: exponential\n",
        1,
    )
    with_quantile = tmp_path / "q.yaml"
    with_quantile.write_text(text, encoding="utf-8")
    rc, out, err = _plan(capsys, str(with_quantile), "--json", "--sample", str(_write_sample(tmp_path / "e.jsonl")))
    assert rc == 0, err
    doc = json.loads(out)
    assert "typical" not in _metric(doc, "secs_pct")
    assert _metric(doc, "views")["typical"]["value"] == 5.0
