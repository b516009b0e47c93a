"""The README's "Your own topology, end to end" block runs as written: validate with a sample, plan
with typical values, the local stack, a worker, live events, the releases in the worker's log, the
budget status. Paths are made absolute and `stack up` gets free ports; nothing else is changed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dpstream.workers.localstack import free_port

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
STACK = ROOT / "deploy" / "local" / "stack"


def _block() -> str:
    """The first bash block after the README's "Your own topology" heading."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("### Your own topology") :]
    return section[section.index("```bash\n") + len("```bash\n") : section.index("\n```", section.index("```bash"))]


def test_the_readme_own_topology_path_runs_end_to_end(tmp_path: Path) -> None:
    """Every command of the block succeeds; the worker logs published releases and status shows a spend."""
    ports = {"--kafka-port": free_port(), "--kafka-controller-port": free_port(), "--redis-port": free_port()}
    script = _block()
    assert "deploy/local/stack up" in script and "dpstream worker shop.yaml &" in script
    flags = " ".join(f"{k} {v}" for k, v in ports.items())
    script = script.replace("deploy/local/stack up", f"deploy/local/stack up {flags}")
    script = script.replace("deploy/local/stack", str(STACK))
    script = script.replace("topology/examples/", f"{ROOT}/topology/examples/")
    env = dict(os.environ, DPSTREAM_HOME=str(tmp_path / "home"))
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("DPSTREAM_KAFKA", None), env.pop("DPSTREAM_REDIS", None)
    try:
        proc = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    finally:
        subprocess.run([str(STACK), "down"], env=env, capture_output=True, timeout=120, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    published = [line for line in out.splitlines() if re.search(r"\bpublished\b", line)]
    assert len(published) >= 4, out[-4000:]  # a few windows of the demo's four metrics
    assert "demo-hourly" in proc.stdout and "spent" in proc.stdout, proc.stdout[-2000:]
