"""`dpstream tail` on a real Kafka: a republished release shows once, a differing republish is a conflict
(said on stderr, never shown), `--json` prints the records, the default prints the worker's INFO row,
and SIGINT and a closed stdout pipe both end it with exit 0 and no traceback.

The tail runs as a subprocess (`python -m dpstream.workers.cli tail`) on a topology whose releases topic
is a fresh topic of the session broker; records are produced stamped with their P(w), as the release
agent does. `--from` pins the windows shown, so nothing depends on the time of day.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import pytest

from dpstream.workers.feed.testing import produce_releases, release_record
from dpstream.workers.release.display import release_line
from dpstream.workers.release.record import canonical_bytes

TOPOLOGY = """\
version: 1
sources:
  clicks: {{topic: {topic}.clicks, privacy_unit: user_id, timestamp: ts}}
budgets:
  b: {{epsilon: 1.0, delta: 1.0e-6, period: 1d}}
metrics:
  views:
    source: clicks
    budget: b
    weight: 1
    window: {{tumbling: 1h}}
    aggregate: count
    contribution: {{max_per_key: 1}}
    mechanism: gaussian
  by_page:
    source: clicks
    budget: b
    weight: 1
    window: {{tumbling: 1h}}
    aggregate: count
    group_by: page
    keys: [home, cart]
    contribution: {{max_per_key: 1, max_keys: 2}}
    mechanism: gaussian
kafka: {{bootstrap: "{bootstrap}"}}
sinks: {{releases: {topic}, dead_letter: {topic}.dlq}}
"""

HOUR = 3600
WAIT_S = 60.0


def _hours_ago(n: int) -> int:
    """A window start n hours before the current hour (records in the recent past: within retention)."""
    return (int(time.time()) // HOUR - n) * HOUR


class TailProcess:
    """`dpstream tail` as a subprocess, its stdout and stderr lines collected by threads."""

    def __init__(self, topology: Path, *args: str) -> None:
        argv = [sys.executable, "-m", "dpstream.workers.cli", "tail", str(topology), *args]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ))
        self.out: queue.Queue[str] = queue.Queue()
        self.err: list[str] = []
        assert self.proc.stdout is not None and self.proc.stderr is not None
        threading.Thread(target=self._pump, args=(self.proc.stdout, self.out), daemon=True).start()
        threading.Thread(target=self._collect, args=(self.proc.stderr,), daemon=True).start()

    @staticmethod
    def _pump(stream: IO[bytes], into: queue.Queue[str]) -> None:
        for raw in stream:
            into.put(raw.decode().rstrip("\n"))

    def _collect(self, stream: IO[bytes]) -> None:
        for raw in stream:
            self.err.append(raw.decode())

    def lines(self, n: int) -> list[str]:
        """The next n stdout lines (fails after WAIT_S without them)."""
        got = []
        for _ in range(n):
            try:
                got.append(self.out.get(timeout=WAIT_S))
            except queue.Empty:
                raise AssertionError(f"tail printed {got} only; stderr: {''.join(self.err)}") from None
        return got

    def wait_stderr(self, text: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while not any(text in line for line in self.err):
            assert time.monotonic() < deadline, f"no {text!r} on stderr: {''.join(self.err)}"
            time.sleep(0.1)

    def stop(self, sig: int = signal.SIGINT) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


def _row(record: dict) -> str | None:
    """The worker's INFO row of the record as published (its canonical bytes: keys sorted)."""
    return release_line(json.loads(canonical_bytes(record)))


@pytest.fixture
def releases_topic(kafka_broker) -> str:  # noqa: ANN001 - the session fixture's type lives in conftest
    return kafka_broker.new_topic("tail", partitions=2)


@pytest.fixture
def topology_file(tmp_path: Path, kafka_broker, releases_topic: str) -> Path:  # noqa: ANN001 - conftest's type
    path = tmp_path / "topology.yaml"
    path.write_text(TOPOLOGY.format(topic=releases_topic, bootstrap=kafka_broker.bootstrap))
    return path


def test_a_republished_release_shows_once_and_a_differing_one_is_a_conflict(
    kafka_broker,
    releases_topic: str,
    topology_file: Path,  # noqa: ANN001
) -> None:
    """--json: the first record of each release_id, byte for byte; a repeat is dropped; a differing
    republish is said on stderr and never printed."""
    start = _hours_ago(4)
    first = release_record("views", start, HOUR, {"": 10.0})
    second = release_record("views", start + HOUR, HOUR, {"": 12.0})
    changed = dict(first, values={"": 99.0})
    older = release_record("views", start - HOUR, HOUR, {"": 1.0})  # before --from: not shown
    asyncio.run(produce_releases(kafka_broker.bootstrap, releases_topic, [older, first, first, first, changed, second]))
    tail = TailProcess(topology_file, "--from", str(start), "--json")
    try:
        shown = tail.lines(2)
        tail.wait_stderr("conflict")
    finally:
        code = tail.stop()
    assert code == 0, "".join(tail.err)
    assert sorted(shown) == sorted([canonical_bytes(first).decode(), canonical_bytes(second).decode()])
    assert tail.out.empty()  # no third line: the repeats and the conflict were not printed
    assert [json.loads(line)["values"] for line in shown if json.loads(line)["release_id"] == first["release_id"]] == [
        {"": 10.0}
    ]
    conflicts = [line for line in tail.err if "conflict" in line]
    assert len(conflicts) == 1 and first["release_id"] in conflicts[0]
    assert "Traceback" not in "".join(tail.err)


def test_sigint_ends_a_following_tail_with_exit_0_and_the_worker_rows(
    kafka_broker,
    releases_topic: str,
    topology_file: Path,  # noqa: ANN001
) -> None:
    """The default output is the worker's INFO row of each release (`display.release_line`); --metric
    filters; a release produced while it follows shows up; SIGINT stops it with exit 0."""
    start = _hours_ago(3)
    grouped = release_record("by_page", start, HOUR, {"home": 5.0, "cart": 2.0}, half_width={"home": 1.0, "cart": 1.0})
    other = release_record("views", start, HOUR, {"": 3.0})
    asyncio.run(produce_releases(kafka_broker.bootstrap, releases_topic, [other, grouped]))
    tail = TailProcess(topology_file, "--from", str(start), "--metric", "by_page")
    try:
        assert tail.lines(1) == [_row(grouped)]
        later = release_record("by_page", start + HOUR, HOUR, {"home": 6.0, "cart": 1.0}, half_width=2.0)
        asyncio.run(produce_releases(kafka_broker.bootstrap, releases_topic, [later]))
        assert tail.lines(1) == [_row(later)]
    finally:
        code = tail.stop(signal.SIGINT)
    assert code == 0, "".join(tail.err)
    assert tail.out.empty() and not "".join(tail.err).strip()


def test_a_closed_stdout_pipe_ends_the_tail_with_exit_0_and_no_traceback(
    kafka_broker,
    releases_topic: str,
    topology_file: Path,  # noqa: ANN001
) -> None:
    """`dpstream tail … --json | head -1`: after the reader closed the pipe, the next release makes the
    tail stop quietly (exit 0)."""
    start = _hours_ago(3)
    asyncio.run(
        produce_releases(kafka_broker.bootstrap, releases_topic, [release_record("views", start, HOUR, {"": 1.0})])
    )
    argv = [sys.executable, "-m", "dpstream.workers.cli", "tail", str(topology_file), "--from", str(start), "--json"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ))
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert json.loads(line)["metric"] == "views"
        proc.stdout.close()  # what `head -1` does after its line
        for n in range(1, 5):  # lines may still fit the pipe's buffer until the tail learns it is closed
            more = [release_record("views", start + n * HOUR, HOUR, {"": float(n)})]
            asyncio.run(produce_releases(kafka_broker.bootstrap, releases_topic, more))
            try:
                proc.wait(timeout=10)
                break
            except subprocess.TimeoutExpired:
                continue
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read().decode() if proc.stderr else ""
    assert code == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err


def test_a_tail_started_before_its_topic_exists_waits_for_it(kafka_broker, tmp_path: Path) -> None:  # noqa: ANN001
    """No releases topic yet (no worker has run): the tail says it waits, then shows the first release."""
    import uuid

    topic = f"tail-later-{uuid.uuid4().hex[:12]}"
    path = tmp_path / "later.yaml"
    path.write_text(TOPOLOGY.format(topic=topic, bootstrap=kafka_broker.bootstrap))
    start = _hours_ago(2)
    tail = TailProcess(path, "--from", str(start), "--json")
    try:
        tail.wait_stderr("waiting for topic")
        kafka_broker.create_topics([topic], partitions=2)
        record = release_record("views", start, HOUR, {"": 8.0})
        asyncio.run(produce_releases(kafka_broker.bootstrap, topic, [record]))
        assert tail.lines(1) == [canonical_bytes(record).decode()]
    finally:
        code = tail.stop(signal.SIGTERM)
    assert code == 0, "".join(tail.err)


def test_an_unreachable_kafka_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """Nothing listens at the topology's broker: one `dpstream: error:` line naming it, no traceback."""
    from dpstream.workers.localstack import free_port

    bootstrap = f"127.0.0.1:{free_port()}"
    path = tmp_path / "nowhere.yaml"
    path.write_text(TOPOLOGY.format(topic="nowhere", bootstrap=bootstrap))
    done = subprocess.run(
        [sys.executable, "-m", "dpstream.workers.cli", "tail", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
        check=False,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dpstream: error: Kafka at " + bootstrap), done.stderr
