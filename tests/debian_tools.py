"""Command-line tools from Debian packages for tests: on PATH, else apt-get installed as root, else skipped."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def debian_tool(binary: str, package: str, hint: str) -> str:
    """`binary`'s path: from PATH, else `apt-get install package` when root (as the local stack does),
    else the test is skipped with `hint` saying how to get it."""
    path = shutil.which(binary)
    if path:
        return path
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip(f"{binary} not installed ({hint})")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update"], ["apt-get", "install", "-y", "--no-install-recommends", package]):
        result = subprocess.run(argv, env=env, capture_output=True, text=True, check=False, timeout=1200)
        if result.returncode != 0:
            pytest.fail(f"`{' '.join(argv)}` failed: {(result.stderr or result.stdout).strip()[-500:]}")
    path = shutil.which(binary)
    if not path:
        pytest.fail(f"apt-get installed {package} but {binary} is not on PATH")
    return path
