"""Kafka's jars from Maven Central, fetched once by `deploy/local/pom.xml`; a marker file makes later
starts skip mvn."""

from __future__ import annotations

__all__ = ["MARKER", "pom_digest", "libs_ready", "ensure_libs", "mvn_argv"]

import fcntl
import hashlib
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from dpstream.workers.localstack import sysdeps
from dpstream.workers.localstack.errors import ServiceStartError

MARKER = ".dpstream-libs-complete"

Runner = Callable[[list[str]], "subprocess.CompletedProcess[str]"]


def pom_digest(pom: Path) -> str:
    """sha256 of the pom: a changed pom (a new Kafka version) invalidates the fetched jars."""
    return hashlib.sha256(Path(pom).read_bytes()).hexdigest()


def libs_ready(libs_dir: Path, digest: str) -> bool:
    """True when `libs_dir` holds a complete fetch made from a pom with this digest."""
    marker = Path(libs_dir) / MARKER
    try:
        return marker.read_text(encoding="utf-8").strip() == digest and any(Path(libs_dir).glob("*.jar"))
    except OSError:
        return False


def mvn_argv(pom: Path, output_dir: Path) -> list[str]:
    """The Maven command that copies Kafka and its runtime dependencies into `output_dir`."""
    return [
        shutil.which("mvn") or "mvn",
        "-q",
        "-B",
        "-f",
        str(pom),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={output_dir}",
        "-DincludeScope=runtime",
    ]


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False)  # fixed argv


@contextmanager
def _lock(path: Path) -> Iterator[None]:
    """An exclusive file lock, so two starts at once (a test run and `up`) fetch only once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_libs(
    libs_dir: Path,
    pom: Path,
    progress: Callable[[str], None] = lambda _: None,
    run: Runner = _run,
) -> bool:
    """Fetch the jars into `libs_dir` unless a complete fetch is there; True if mvn ran.

    The fetch goes to a staging directory that replaces `libs_dir` only once mvn succeeded,
    so an interrupted download never leaves a half classpath behind a marker.
    """
    libs_dir = Path(libs_dir)
    digest = pom_digest(pom)
    if libs_ready(libs_dir, digest):
        return False
    with _lock(libs_dir.with_name(libs_dir.name + ".lock")):
        if libs_ready(libs_dir, digest):
            return False
        if run is _run:
            sysdeps.ensure([sysdeps.MAVEN], progress)
        staging = libs_dir.with_name(libs_dir.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        argv = mvn_argv(pom, staging)
        progress("fetching Kafka from Maven Central (first start only): " + " ".join(argv))
        result = run(argv)
        if result.returncode != 0 or not any(staging.glob("*.jar")):
            out = ((result.stdout or "") + (result.stderr or "")).strip().splitlines()[-15:]
            raise ServiceStartError(f"mvn could not fetch Kafka (exit {result.returncode}):\n" + "\n".join(out))
        (staging / MARKER).write_text(digest + "\n", encoding="utf-8")
        shutil.rmtree(libs_dir, ignore_errors=True)
        staging.rename(libs_dir)
    return True
