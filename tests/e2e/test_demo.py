"""`dpstream demo`: brings up its own stack, shows noisy releases and the budget, and stops what it started."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpstream.workers.demo import DemoOptions, run_demo
from dpstream.workers.localstack import default_home, free_port
from dpstream.workers.localstack.ports import port_open

pytestmark = pytest.mark.e2e

METRICS = ("page_views", "active_users_5m", "basket_value", "session_seconds", "top_referrers")


def test_bounded_demo_shows_releases_and_budget_then_stops_its_stack(tmp_path: Path) -> None:
    """A 20 s demo exits 0 after release rows and a budget line; its Kafka and Redis are down afterwards."""
    ports = {"kafka_port": free_port(), "kafka_controller_port": free_port(), "redis_port": free_port()}
    lines: list[str] = []
    options = DemoOptions(duration_s=20, home=tmp_path, budget_every_s=5, kafka_libs=default_home() / "kafka" / "libs",
                          **ports)
    assert run_demo(options, say=lines.append) == 0
    rows = [line for line in lines if line.split(" ", 1)[0] in METRICS]
    assert len(rows) >= 5, lines
    assert any(line.startswith("budget web-daily: ") for line in lines)
    assert any("plan of " in line for line in lines)
    assert lines[-1].startswith("demo done: ") and f"{len(rows)} releases shown" in lines[-1]
    assert not port_open(ports["kafka_port"]) and not port_open(ports["redis_port"])
