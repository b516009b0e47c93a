"""`dpstream demo --topology FILE` refuses a topology the user can fix before it starts any service."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpstream.workers.cli import main
from dpstream.workers.localstack.ports import free_port


@pytest.mark.parametrize("content", [None, "version: 1\nsources: {}\n"])
def test_a_bad_topology_is_one_line_and_starts_nothing(
    content: str | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "topology.yaml"
    if content is not None:
        path.write_text(content)
    flags = ["--kafka-port", "--kafka-controller-port", "--redis-port", "--prometheus-port", "--alertmanager-port"]
    flags += ["--worker-web-port", "--exporter-port", "--webhook-port"]
    picked: set[int] = set()
    for _ in flags:  # distinct: the OS may hand a port just closed out again
        picked.add(free_port(avoid=frozenset(picked)))
    ports = [arg for flag, port in zip(flags, sorted(picked), strict=True) for arg in (flag, str(port))]
    home = tmp_path / "home"
    assert main(["demo", "--duration", "5", "--topology", str(path), "--home", str(home), *ports]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err, err
    assert "started" not in captured.out + captured.err  # no service was started
    pid_files = [p for p in home.rglob("*.pid")] if home.exists() else []
    assert pid_files == []
