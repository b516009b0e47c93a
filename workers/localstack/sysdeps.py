"""System packages the local stack needs: found on PATH, installed with apt-get as root, else named exactly."""

from __future__ import annotations

__all__ = ["Requirement", "JAVA", "MAVEN", "REDIS", "PROMETHEUS", "PROMTOOL", "ALERTMANAGER", "missing", "ensure"]

import os
import shutil
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from dpstream.topology.errors import ConfigError


@dataclass(frozen=True)
class Requirement:
    """A binary the stack runs and the Debian package that provides it."""

    binary: str
    package: str


JAVA = Requirement("java", "openjdk-17-jre-headless")
MAVEN = Requirement("mvn", "maven")
REDIS = Requirement("redis-server", "redis-server")
PROMETHEUS = Requirement("prometheus", "prometheus")
PROMTOOL = Requirement("promtool", "prometheus")
ALERTMANAGER = Requirement("prometheus-alertmanager", "prometheus-alertmanager")


def missing(
    requirements: Iterable[Requirement], which: Callable[[str], str | None] = shutil.which
) -> list[Requirement]:
    """The requirements whose binary is not on PATH, in order, without duplicates."""
    out: list[Requirement] = []
    for req in requirements:
        if which(req.binary) is None and req not in out:
            out.append(req)
    return out


def install_hint(absent: list[Requirement]) -> str:
    """The one-line message for a non-root user: which binaries are missing and the exact command."""
    binaries = ", ".join(req.binary for req in absent)
    packages = " ".join(dict.fromkeys(req.package for req in absent))
    return f"missing {binaries}: install with `sudo apt-get install -y {packages}` and run again"


def ensure(requirements: Iterable[Requirement], progress: Callable[[str], None] = lambda _: None) -> None:
    """Make every binary available: apt-get install the missing packages as root, else raise ConfigError."""
    absent = missing(requirements)
    if not absent:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise ConfigError(install_hint(absent))
    packages = list(dict.fromkeys(req.package for req in absent))
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update"], ["apt-get", "install", "-y", "--no-install-recommends", *packages]):
        progress("$ " + " ".join(argv))
        result = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            last = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["(no output)"]
            raise ConfigError(f"`{' '.join(argv)}` failed ({last[0]}): {install_hint(absent)}")
    still = missing(absent)
    if still:
        raise ConfigError(install_hint(still))
