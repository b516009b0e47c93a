"""`dpstream exporter` on a port in use: one line naming --bind/--port and why, exit 2, and no
"serving" line before it (it is printed once the port is bound)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from dpstream.workers.cli import main

_YAML = """\
version: 1
sources:
  s: {topic: t, privacy_unit: u, timestamp: ts}
budgets:
  b: {epsilon: 1.0, accounting: pure, period: 1d}
metrics:
  m: {source: s, budget: b, window: {tumbling: 1h}, aggregate: count, mechanism: laplace}
sinks: {releases: r, dead_letter: d}
"""


def test_a_port_in_use_is_one_line_and_nothing_claims_to_serve(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topology = tmp_path / "t.yaml"
    topology.write_text(_YAML)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["exporter", "--topology", str(topology), "--redis", "redis://127.0.0.1:1/0", "--port", str(port)])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.splitlines() == [err] and f"--port {port}: cannot listen" in err, err
    assert "serving" not in err
