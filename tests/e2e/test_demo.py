"""`dpstream demo`: brings up its own stack with Prometheus and Alertmanager, shows noisy releases with useful
error bars beside the demo-only truth, where to look in Prometheus and a budget summary, and stops what it
started."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from dpstream.topology.loader import load_topology
from dpstream.topology.plan import build_plan
from dpstream.workers.demo import DemoOptions, run_demo
from dpstream.workers.demo.run import demo_topology_path
from dpstream.workers.demo.sizing import DemoPopulation, first_useful_step, typical_values
from dpstream.workers.localstack import default_home, free_port
from dpstream.workers.localstack.ports import port_open

pytestmark = pytest.mark.e2e

METRICS = ("page_views", "active_users", "visitors", "basket_value", "basket_so_far", "session_seconds")
RUNNING = "basket_so_far"
_NUM = r"-?[\d,]+(?:\.\d+)?"
_ENV = {"DPSTREAM_KAFKA": "127.0.0.1:9092", "DPSTREAM_REDIS": "redis://127.0.0.1:6379/0"}


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def _values(lines: list[str]) -> dict[str, list[tuple[float, float, float]]]:
    """(noisy, ± half-width, truth) per metric, parsed from the release rows."""
    out: dict[str, list[tuple[float, float, float]]] = {m: [] for m in METRICS}
    for i, line in enumerate(lines):
        name = line.split(" ", 1)[0]
        if name not in METRICS:
            continue
        single = re.search(rf"%\s+({_NUM}) ±({_NUM})(?: s)?\s+truth ({_NUM})", line)
        if single:
            out[name].append((_num(single[1]), _num(single[2]), _num(single[3])))
            continue
        grouped = re.search(rf"%\s+±({_NUM})\s+(.*)$", line)
        assert grouped and lines[i + 1].lstrip().startswith("truth"), line
        half = _num(grouped[1])
        noisy = dict(re.findall(rf"(\w+) ({_NUM})", grouped[2]))
        truth = dict(re.findall(rf"(\w+) ({_NUM})", lines[i + 1].split("truth", 1)[1]))
        assert noisy.keys() == truth.keys(), (line, lines[i + 1])
        out[name] += [(_num(noisy[k]), half, _num(truth[k])) for k in noisy]
    return out


def _steps(lines: list[str]) -> list[tuple[int, float, float]]:
    """(step, ± half-width, truth) of the running total's rows, in the order shown."""
    out = []
    for line in lines:
        row = re.search(rf"%\s+{_NUM} ±({_NUM})\s+truth ({_NUM})\s+total since [\d:]+, step (\d+)/\d+", line)
        if line.startswith(RUNNING + " ") and row:
            out.append((int(row[3]), _num(row[1]), _num(row[2])))
    return out


def _first_useful_step() -> int:
    """The running total's first step whose planned 95 % CI is within 10 % of its typical total."""
    topology = load_topology(demo_topology_path(), env=_ENV)
    metric, plan = topology.metrics[RUNNING], build_plan(topology).metric(RUNNING)
    step = first_useful_step(metric, plan, typical_values(topology, DemoPopulation())[RUNNING])
    assert step is not None
    return step


HOUR_MARGIN_S = 300.0
"""The demo runs about 100 s from its start (stack, 65 s of feed, the last releases). Its running total
restarts at each top of the UTC hour (a new budget period): started closer than this to it, the demo
could show no step of either period late enough (step 5) for the CI bar this test holds it to."""


def _clear_of_the_hour_boundary() -> None:
    """Wait for the hour to turn when fewer than `HOUR_MARGIN_S` are left of it, so that what this test
    checks does not depend on the time of day. (The other metrics' noise no longer does: a demo started
    at hh:58 prices the hour's pool over the windows left of it, as planned, see
    `test_release_canonical_order_capped`.)"""
    left = 3600 - time.time() % 3600
    if left < HOUR_MARGIN_S:
        time.sleep(left + 2)


def test_bounded_demo_shows_useful_releases_monitoring_and_a_budget_summary_then_stops(tmp_path: Path) -> None:
    """A 65 s demo exits 0 after release rows for every metric whose 95 % CI is at most ~10 % of the truth shown
    beside it, the Prometheus URL of the budget ratio with both targets scraped, and a budget summary; every port
    it opened is closed afterwards.

    The running total basket_so_far is held to that bar only from the first step where its plan meets it
    (step 5, 50 s of totals): its CI is that of one lump a period, 1.96·σ·‖c_<t‖₂, which at step 1 is ~37 % of
    a 10 s total (σ ∝ L, and L = 20,000 EUR per user an hour must leave nearly every user uncut), and falls
    relative to the total as the total grows. The demo runs 65 s so that step 5 (closed 52 s after the schedule
    start, which lies up to ~11 s after the feed starts) is always shown; the earlier steps must show CIs that
    grow with the step, as the correlated noise's do."""
    ports: dict[str, int] = {}
    for name in (
        "kafka_port",
        "kafka_controller_port",
        "redis_port",
        "prometheus_port",
        "alertmanager_port",
        "worker_web_port",
        "exporter_port",
        "webhook_port",
    ):
        ports[name] = free_port(frozenset(ports.values()))
    lines: list[str] = []
    options = DemoOptions(
        duration_s=65, home=tmp_path, budget_every_s=10, kafka_libs=default_home() / "kafka" / "libs", **ports
    )
    _clear_of_the_hour_boundary()
    assert run_demo(options, say=lines.append) == 0, "\n".join(lines)
    text = "\n".join(lines)

    values = _values(lines)
    for metric in METRICS:
        assert values[metric], f"no release row of {metric}:\n{text}"
    for metric in ("page_views", "active_users", "basket_value"):
        big = [(v, h, t) for v, h, t in values[metric] if t >= 1000]
        assert big, f"{metric}: no row with a truth of at least 1,000:\n{text}"
        for _v, half, truth in big:
            assert half <= 0.10 * truth, f"{metric}: ±{half} vs truth {truth}"
    useful = _first_useful_step()
    steps = _steps(lines)
    assert len(steps) == len(values[RUNNING]), text
    late = [(step, half, truth) for step, half, truth in steps if step >= useful]
    assert late, f"{RUNNING}: no row at step {useful} or later:\n{text}"
    for step, half, truth in late:
        assert half <= 0.10 * truth, f"{RUNNING} step {step}: ±{half} vs truth {truth}"
    for (s0, h0, _), (s1, h1, _) in zip(steps, steps[1:], strict=False):
        if s1 == s0 + 1:  # the next step of one period: one σ, a std σ·‖c_<t‖₂ that grows with t
            assert h1 >= h0, f"{RUNNING}: ±{h1} at step {s1} after ±{h0} at step {s0}"
    assert "(truth shown only in the demo)" in text
    # every release is priced as the demo predicted from the ledger's rule (a note flags any that is not:
    # a phantom charge in the canonical order once drew page_views' noise at 1.6× its prediction)
    assert "vs the prediction" not in text, text
    assert "noise at this point of the period" in text and "what it costs" in text

    prometheus = f"http://127.0.0.1:{ports['prometheus_port']}"
    assert f"{prometheus}/graph?g0.expr=dpstream_budget_spent_ratio" in text
    assert "2/2 dpstream targets up" in text, text  # Prometheus scraped the worker and the exporter
    assert re.search(r"alerts: (none firing|firing: )", text)

    summary = lines.index("budget summary:")
    tail = "\n".join(lines[summary:])
    assert re.search(
        r"spent ρ [\d.e-]+ of the cap [\d.e-]+ = [\d.]+ %, ε-equivalent [\d.]+; "
        r"releases charged \d+, refused 0",
        tail,
    ), tail
    assert re.search(r"this run: \d+ releases shown", tail)

    for name, number in ports.items():
        assert not port_open(number), f"{name} {number} still open after the demo"
