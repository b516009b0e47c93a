"""`dpstream budget report`'s user errors: one line naming the flag and the fix, exit 2, before any ledger is read."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpstream.workers.cli import main

EXAMPLE = Path(__file__).resolve().parents[2] / "topology" / "examples" / "web-analytics.yaml"
NO_REDIS = "redis://127.0.0.1:1/0"  # nothing listens there: these errors come before the ledger is opened


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--scope", "web-daily", "--redis", NO_REDIS], "--topology FILE is needed"),
        (["--scope", "nope", "--topology", str(EXAMPLE), "--redis", NO_REDIS], "--scope 'nope': not a budget scope"),
    ],
)
def test_user_errors_are_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A missing topology or an unknown scope: exit 2 with one line, no traceback."""
    assert main(["budget", "report", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err
