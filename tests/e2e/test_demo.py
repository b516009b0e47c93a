"""`dpstream demo`: brings up its own stack with Prometheus and Alertmanager, shows noisy releases with useful
error bars beside the demo-only truth, where to look in Prometheus and a budget summary, and stops what it
started."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dpstream.workers.demo import DemoOptions, run_demo
from dpstream.workers.localstack import default_home, free_port
from dpstream.workers.localstack.ports import port_open

pytestmark = pytest.mark.e2e

METRICS = ("page_views", "active_users", "visitors", "basket_value", "session_seconds")
_NUM = r"-?[\d,]+(?:\.\d+)?"


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


def test_bounded_demo_shows_useful_releases_monitoring_and_a_budget_summary_then_stops(tmp_path: Path) -> None:
    """A 35 s demo exits 0 after release rows for every metric whose 95 % CI is at most ~10 % of the truth shown
    beside it, the Prometheus URL of the budget ratio with both targets scraped, and a budget summary; every port
    it opened is closed afterwards."""
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
        duration_s=35, home=tmp_path, budget_every_s=10, kafka_libs=default_home() / "kafka" / "libs", **ports
    )
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
    assert "(truth shown only in the demo)" in text
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
