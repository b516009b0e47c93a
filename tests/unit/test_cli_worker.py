"""`dpstream worker` argument errors: one line, exit 2, no traceback, before anything is started."""

from __future__ import annotations

import pytest

from dpstream.workers.cli import main


@pytest.mark.parametrize("nice", ["-1", "20"])
def test_nice_out_of_range_is_a_one_line_error(nice, tmp_path, capsys):
    """--nice outside 0..19 names the flag and the fix."""
    code = main(["worker", str(tmp_path / "unused.yaml"), "--nice", nice])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.count("\n") == 0 and f"--nice {nice}" in err and "0 (unchanged) to 19" in err


def test_max_windows_is_refused_by_the_live_ingest_in_one_line(tmp_path, capsys):
    """The live ingest cannot yet restore max_windows counts after a restart: one line, exit 2, before any start."""
    topology = tmp_path / "capped.yaml"
    topology.write_text(
        "version: 1\n"
        "sources: {clicks: {topic: t.clicks, privacy_unit: user_id}}\n"
        "budgets: {b: {epsilon: 1.0, delta: 1.0e-6, period: 1d}}\n"
        "metrics:\n"
        "  views: {source: clicks, budget: b, window: {tumbling: 1m}, aggregate: count, mechanism: gaussian,\n"
        "          contribution: {max_windows: 60}}\n"
        "sinks: {releases: out, dead_letter: dlq}\n",
        encoding="utf-8",
    )
    code = main(["worker", str(topology)])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.count("\n") == 0 and "metric 'views': contribution.max_windows" in err and "dpstream replay" in err
