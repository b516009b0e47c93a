"""The demo's release rows: noisy values with their CI, nothing else."""

from __future__ import annotations

import json

from dpstream.workers.demo.feed import format_release


def test_release_row_shows_noisy_values_with_their_ci_and_skips_charge_markers() -> None:
    """A row shows the record's own (noisy) values and CI half-width; charge-only markers print nothing."""
    record = {"metric": "page_views", "window": {"start_epoch": 0, "end_epoch": 60},
              "budget": {"ratio_after": 0.25}, "values": {"home": 1234.0, "cart": -5.0, "search": 2.5},
              "ci": {"half_width": 400.0, "level": 0.95}}
    row = format_release(json.dumps(record).encode())
    assert row.startswith("page_views") and "00:00–00:01" in row and "25.00 %" in row
    assert "home=1,234 ±400" in row and "cart=-5 ±400" in row and "search=2.50 ±400" in row
    assert format_release(json.dumps({"charge_only": True, "release_id": "x@p"}).encode()) == ""
