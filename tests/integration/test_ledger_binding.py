"""One releases topic, one ledger, on a real broker and Redis: a worker refuses to start (one line, exit 2,
before Faust) against a releases topic holding records of its topology version charged to another ledger
id, and `dpstream verify` names each such record; the ledger that charged them is not flagged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dpstream.workers.cli import main
from tests.e2e.harness import send

pytestmark = pytest.mark.integration

SPAN = ["--from", "2026-11-30T00:00:00Z", "--to", "2026-11-30T03:00:00Z"]


def _topology(tmp: Path, releases: str, dead: str) -> Path:
    path = tmp / "topology.yaml"
    path.write_text(
        f"""
version: 1
sources:
  clicks: {{topic: {releases}-src, privacy_unit: user_id, timestamp: ts}}
budgets:
  b: {{epsilon: 1.0, delta: 1.0e-6, period: 1d}}
metrics:
  hourly: {{source: clicks, budget: b, window: {{tumbling: 1h}}, aggregate: count, mechanism: gaussian}}
sinks: {{releases: {releases}, dead_letter: {dead}}}
""",
        encoding="utf-8",
    )
    return path


def _replayed_onto(topology: Path, ledger_url: str, bootstrap: str, releases: str, tmp: Path) -> list[dict]:
    """`dpstream replay` charged to `ledger_url`, its records produced onto `releases` (key = release_id)."""
    events, out = tmp / "events.jsonl", tmp / "replayed.jsonl"
    events.write_text("", encoding="utf-8")
    assert main(["replay", str(topology), str(events), "--ledger", ledger_url, "--out", str(out), *SPAN]) == 0
    records = [json.loads(line) for line in out.read_bytes().splitlines()]
    send(bootstrap, releases, [(r["release_id"].encode(), json.dumps(r).encode()) for r in records])
    return records


def _worker(topology: Path, bootstrap: str, redis_url: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    """`dpstream worker` in a child process (temporary files in `tmp`, no DPSTREAM_* overrides)."""
    tmp.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPSTREAM_")} | {"TMPDIR": str(tmp)}
    argv = [sys.executable, "-m", "dpstream.workers.cli", "worker", str(topology)]
    argv += ["--bootstrap", bootstrap, "--redis", redis_url]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)


def test_a_worker_refuses_a_releases_topic_fed_by_another_ledger(
    tmp_path: Path, kafka_broker: Any, fresh_redis: Any
) -> None:
    """Releases of this topology version charged to namespace `elsewhere` are on the topic; a worker on the
    default namespace (a fresh ledger with its own id) stops in one line naming both ids, exit 2, before
    Faust starts (no Faust output)."""
    releases = kafka_broker.new_topic("t-binding-releases")
    topology = _topology(tmp_path, releases, kafka_broker.new_topic("t-binding-dead"))
    records = _replayed_onto(
        topology, f"{fresh_redis.url}?namespace=elsewhere", kafka_broker.bootstrap, releases, tmp_path
    )
    theirs = {r["ledger"] for r in records}
    assert len(records) == 3 and len(theirs) == 1 and None not in theirs
    run = _worker(topology, kafka_broker.bootstrap, fresh_redis.url, tmp_path / "tmp")
    err = run.stderr.strip()
    assert run.returncode == 2, run.stderr
    assert "\n" not in err and "Traceback" not in err and err.startswith("dpstream: error: "), run.stderr
    assert f"releases topic {releases!r} holds 3 record(s) of topology version" in err
    assert f"charged to ledger id {theirs.pop()}" in err and "(id " in err, err


def test_verify_names_each_record_charged_to_another_ledger(
    tmp_path: Path, kafka_broker: Any, fresh_redis: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """`verify --redis <default namespace>` reports `other_ledger` once per record another namespace
    charged; `verify` against that namespace reports none (and creates no id where there was none)."""
    releases = kafka_broker.new_topic("t-binding-verify")
    topology = _topology(tmp_path, releases, kafka_broker.new_topic("t-binding-verify-dead"))
    other = f"{fresh_redis.url}?namespace=elsewhere"
    _replayed_onto(topology, other, kafka_broker.bootstrap, releases, tmp_path)

    def kinds(redis_url: str) -> list[dict]:
        capsys.readouterr()
        argv = ["verify", "--topology", str(topology), "--bootstrap", kafka_broker.bootstrap, "--redis", redis_url]
        main([*argv, "--json"])
        doc = json.loads(capsys.readouterr().out)
        return [v for v in doc["violations"] if v["kind"] == "other_ledger"]

    flagged = kinds(fresh_redis.url)
    assert len(flagged) == 3 and all("charged to ledger" in v["message"] for v in flagged), flagged
    assert kinds(other) == []
    with fresh_redis.client() as client:
        assert client.get("dpstream:{ledger}:id") is None  # verify only reads
