"""Wait for a `dpstream worker` subprocess to say it is ready (the benches time it from then)."""

from __future__ import annotations

__all__ = ["wait_ready"]

import subprocess
import time
from pathlib import Path


def wait_ready(proc: subprocess.Popen, log_path: Path, timeout_s: float, what: str) -> None:
    """Return once the worker logged `READY_LINE` (group joined, tables recovered, services started);
    RuntimeError naming `what` and the log when it exits or `timeout_s` passes first."""
    from dpstream.workers.runtime.app import READY_LINE  # Faust is imported only when a bench runs one

    deadline = time.monotonic() + timeout_s
    needle = READY_LINE.encode()
    while time.monotonic() < deadline and proc.poll() is None:
        if needle in log_path.read_bytes():
            return
        time.sleep(0.1)
    raise RuntimeError(f"{what}: the worker did not become ready; see {log_path}")
