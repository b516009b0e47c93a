"""A reader that goes away (`dpstream replay … | head -1`) stops the command quietly: no traceback,
the exit status of a tool killed by SIGPIPE."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

_YAML = """\
version: 1
sources:
  s: {topic: t, privacy_unit: user_id, timestamp: ts}
budgets:
  b: {epsilon: 1.0, delta: 1.0e-6, accounting: zcdp, period: 1d}
metrics:
  per_minute: {source: s, budget: b, window: {tumbling: 1m}, aggregate: count, mechanism: gaussian}
sinks: {releases: r, dead_letter: d}
"""


def test_replay_into_a_closed_pipe_exits_quietly(tmp_path: Path) -> None:
    """A day of one-minute releases (about 1 MB of records, more than a pipe holds) read one line deep."""
    topology, events = tmp_path / "t.yaml", tmp_path / "events.jsonl"
    topology.write_text(_YAML)
    events.write_text("")
    argv = ["replay", str(topology), str(events), "--from", "2026-11-30T00:00:00Z", "--to", "2026-12-01T00:00:00Z"]
    code = "import sys; from dpstream.workers.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen([sys.executable, "-c", code, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()  # the reader is gone: the next writes fail with EPIPE
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert b'"release_id"' in first
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
