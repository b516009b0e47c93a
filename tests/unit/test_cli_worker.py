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
