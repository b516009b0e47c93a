"""`dpstream demo`: brings up its own stack, shows noisy releases and the budget, and stops what it started."""

from __future__ import annotations

import json
from pathlib import Path

from dpstream.workers.demo import DemoOptions, run_demo
from dpstream.workers.demo.feed import format_release
from dpstream.workers.localstack import default_home, free_port
from dpstream.workers.localstack.ports import port_open

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


def test_release_row_shows_noisy_values_with_their_ci_and_skips_charge_markers() -> None:
    """A row shows the record's own (noisy) values and CI half-width; charge-only markers print nothing."""
    record = {"metric": "page_views", "window": {"start_epoch": 0, "end_epoch": 60},
              "budget": {"ratio_after": 0.25}, "values": {"home": 1234.0, "cart": -5.0, "search": 2.5},
              "ci": {"half_width": 400.0, "level": 0.95}}
    row = format_release(json.dumps(record).encode())
    assert row.startswith("page_views") and "00:00–00:01" in row and "25.00 %" in row
    assert "home=1,234 ±400" in row and "cart=-5 ±400" in row and "search=2.50 ±400" in row
    assert format_release(json.dumps({"charge_only": True, "release_id": "x@p"}).encode()) == ""
