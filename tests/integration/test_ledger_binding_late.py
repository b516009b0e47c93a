"""One releases topic, one ledger, when the ledger comes up after the worker (real broker, real Redis).

The CLI's start check needs the ledger's id, so it is skipped while Redis is down; the release side then
runs the same check when it first reaches the ledger, and a worker whose releases topic holds records of
its topology version charged to another ledger publishes nothing: it stops with the check's one line.
The check reads the releases topic only from the ledger's idempotency horizon (plus a margin) on.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from dpstream.topology.errors import ConfigError
from dpstream.topology.loader import load_topology
from dpstream.workers.ledger import open_ledger
from dpstream.workers.localstack import RedisHandle, free_port
from dpstream.workers.verify.binding import check_publishing_ledger, read_since_ms
from dpstream.workers.verify.sources import read_topic
from tests.integration.test_ledger_binding import _replayed_onto, _topology

pytestmark = pytest.mark.integration

WAIT_S = 120.0
"""Upper bound on each wait for the child worker (a hang fails the test instead of blocking it)."""


def _wait_for(path: Path, text: str, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + WAIT_S
    while text not in path.read_text(encoding="utf-8", errors="replace"):
        assert proc.poll() is None, path.read_text(encoding="utf-8", errors="replace")
        assert time.monotonic() < deadline, f"{text!r} never logged: {path.read_text(encoding='utf-8')}"
        time.sleep(0.2)


def test_a_worker_started_before_its_ledger_refuses_a_foreign_releases_topic_once_it_reaches_it(
    tmp_path: Path, kafka_broker: Any, fresh_redis: Any
) -> None:
    """Redis down at start (the start check is skipped), three releases of this version charged to another
    ledger on the topic; once Redis is up the release-only worker logs the check's reason on one line, no
    traceback, exits 2, and the topic still holds only those three records."""
    releases = kafka_broker.new_topic("t-binding-late")
    topology = _topology(tmp_path, releases, kafka_broker.new_topic("t-binding-late-dead"))
    records = _replayed_onto(topology, f"{fresh_redis.url}?namespace=other", kafka_broker.bootstrap, releases, tmp_path)
    theirs = records[0]["ledger"]
    own = RedisHandle(free_port(), tmp_path / "own-redis")  # this worker's ledger: not running yet
    log = tmp_path / "worker.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPSTREAM_")} | {"TMPDIR": str(tmp_path)}
    argv = [sys.executable, "-m", "dpstream.workers.cli", "worker", str(topology), "--role", "release"]
    argv += ["--bootstrap", kafka_broker.bootstrap, "--redis", own.url]
    with log.open("w", encoding="utf-8") as err:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err, text=True)
    try:
        _wait_for(log, "release side start: ledger unavailable", proc)
        own.start()
        code = proc.wait(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        own.stop()
    text = log.read_text(encoding="utf-8")
    assert code == 2, text
    assert "Traceback" not in text, text
    reason = [line for line in text.splitlines() if "release side: refusing to publish: releases topic" in line]
    assert len(reason) == 1 and f"charged to ledger id {theirs}" in reason[0], text
    assert text.rstrip().splitlines()[-1].startswith("dpstream: error: releases topic"), text
    assert len(asyncio.run(read_topic(kafka_broker.bootstrap, releases, timeout_s=30))) == len(records) == 3


def test_the_check_reads_no_record_stamped_before_the_horizon(
    tmp_path: Path, kafka_broker: Any, fresh_redis: Any
) -> None:
    """A foreign record stamped before the ledger's idempotency horizon (less a margin) is not read (its
    window is expired on this ledger too); the same record stamped after it is found and refused."""
    releases = kafka_broker.new_topic("t-binding-horizon", partitions=1)
    topology = load_topology(str(_topology(tmp_path, releases, kafka_broker.new_topic("t-binding-horizon-dead"))))
    foreign = {"topology_version": topology.topology_version, "ledger": "f" * 32, "release_id": "r1"}

    async def body() -> tuple[bool, bool]:
        ledger = await open_ledger(fresh_redis.url, topology, actor="test")
        now = time.time()
        since = read_since_ms(ledger.idempotency_horizon_s, now)
        assert since is not None and since > 0
        producer = AIOKafkaProducer(bootstrap_servers=kafka_broker.bootstrap, acks="all")
        await producer.start()

        async def refused() -> bool:
            try:
                await check_publishing_ledger(kafka_broker.bootstrap, topology, ledger, "test", now)
            except ConfigError:
                return True
            return False

        try:
            await producer.send_and_wait(releases, json.dumps(foreign).encode(), timestamp_ms=since - 1)
            before = await refused()
            await producer.send_and_wait(releases, json.dumps(foreign).encode(), timestamp_ms=since)
            after = await refused()
        finally:
            await producer.stop()
            await ledger.close()
        return before, after

    assert asyncio.run(body()) == (False, True)
