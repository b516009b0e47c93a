"""`dpstream worker` start errors a user can fix: one line naming the flag and the fix, exit 2, no traceback.

Each run is a child process (Faust's own output is captured too) with a Kafka address where nothing
listens: these errors must come before the worker touches Kafka. A run that gets past them stops at
Kafka with its own one-line error (exit 1), which the tests use as "the check let it through".
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from dpstream.workers.localstack import free_port

DEMO = Path(__file__).resolve().parents[2] / "topology" / "examples" / "demo.yaml"


def _env(tmp: Path) -> dict[str, str]:
    """The environment of a child `dpstream`: temporary files in `tmp` (TMPDIR), no DPSTREAM_* overrides."""
    tmp.mkdir(exist_ok=True)
    return {k: v for k, v in os.environ.items() if not k.startswith("DPSTREAM_")} | {"TMPDIR": str(tmp)}


def _dpstream(args: list[str], tmp: Path) -> subprocess.CompletedProcess[str]:
    """`dpstream ARGS` in a child process whose temporary files go to `tmp`."""
    argv = [sys.executable, "-m", "dpstream.workers.cli", *args]
    return subprocess.run(argv, env=_env(tmp), capture_output=True, text=True, timeout=120)


def _worker(redis_url: str, tmp: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """`dpstream worker demo.yaml` against `redis_url` and a Kafka address where nothing listens."""
    return _dpstream(
        ["worker", str(DEMO), "--bootstrap", f"127.0.0.1:{free_port()}", "--redis", redis_url, *extra], tmp
    )


def _one_line_error(run: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a user-fixable error (exit 2, no traceback); fails otherwise."""
    err = run.stderr.strip()
    assert run.returncode == 2, run.stderr
    assert "\n" not in err and "Traceback" not in err, run.stderr
    assert err.startswith("dpstream: error: "), run.stderr
    return err


def _stopped_at_kafka(run: subprocess.CompletedProcess[str]) -> None:
    """The run got past every start check and stopped at the unreachable Kafka, in one line."""
    err = run.stderr.strip()
    assert run.returncode == 1 and "\n" not in err and "Traceback" not in err, run.stderr
    assert "Kafka at 127.0.0.1:" in err and "cannot connect" in err, run.stderr


@contextmanager
def _volatile(redis: Any) -> Iterator[None]:
    """The test Redis with `appendfsync everysec` (not durable) for the block."""
    with redis.client() as client:
        client.config_set("appendfsync", "everysec")
        try:
            yield
        finally:
            client.config_set("appendfsync", "always")


def test_web_port_in_use_is_one_line(fresh_redis: Any, tmp_path: Path) -> None:
    """A --web-port another process listens on is refused before Faust starts: flags, cause and fix."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        err = _one_line_error(_worker(fresh_redis.url, tmp_path / "tmp", "--web-port", str(port)))
    assert f"--web-bind 127.0.0.1 --web-port {port}: cannot listen (address already in use): pick a free port" in err


def test_web_port_in_time_wait_is_not_reported_busy(fresh_redis: Any, tmp_path: Path) -> None:
    """A port held only by a closed connection in TIME_WAIT (a worker just stopped) is free for Faust's
    server (SO_REUSEADDR): the check lets it through."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio's servers (Faust's too) do
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            served, _ = listener.accept()
            served.close()  # the server side closes first: its end of the connection waits in TIME_WAIT
            assert client.recv(1) == b""
    with socket.socket() as plain, pytest.raises(OSError):  # the premise: a bind without SO_REUSEADDR fails
        plain.bind(("127.0.0.1", port))
    _stopped_at_kafka(_worker(fresh_redis.url, tmp_path / "tmp", "--web-port", str(port)))


def test_web_port_out_of_range_is_one_line(tmp_path: Path) -> None:
    """--web-port 0 (Faust would quietly take 6066) and 65536 are refused, naming the range."""
    for port in ("0", "65536"):
        err = _one_line_error(_worker("redis://127.0.0.1:1/0", tmp_path / "tmp", "--web-port", port))
        assert f"--web-port {port}: out of range; give 1-65535" in err


def test_volatile_redis_is_one_line_without_a_flag_the_worker_lacks(fresh_redis: Any, tmp_path: Path) -> None:
    """A worker on a Redis without fsync always refuses in one line that says how to make it durable and
    does not suggest --allow-volatile, which `worker` (and `replay`) lack; `budget`, which has it, still does."""
    with _volatile(fresh_redis):
        worker = _one_line_error(_worker(fresh_redis.url, tmp_path / "tmp"))
        budget = _one_line_error(_dpstream(["budget", "status", "--redis", fresh_redis.url], tmp_path / "tmp"))
        events = tmp_path / "events.jsonl"
        events.write_text("", encoding="utf-8")
        span = ["--from", "2026-11-30", "--to", "2026-12-01"]
        replay = _dpstream(["replay", str(DEMO), str(events), "--ledger", fresh_redis.url, *span], tmp_path / "tmp")
    assert f"redis {fresh_redis.url}: not durable: appendonly=yes, appendfsync=everysec" in worker
    assert "put `appendonly yes` and `appendfsync always` in its redis.conf" in worker
    assert "--allow-volatile" not in worker
    assert _one_line_error(replay).endswith("then CONFIG REWRITE)")  # replay has no --allow-volatile either
    assert budget.endswith(
        "in its redis.conf and restart it (or CONFIG SET both, then CONFIG REWRITE); "
        "or pass --allow-volatile for throwaway runs"
    )


def test_ingest_only_worker_on_volatile_redis_is_one_line(fresh_redis: Any, tmp_path: Path) -> None:
    """--role ingest (which opens the ledger without the topology) refuses a volatile Redis the same way."""
    with _volatile(fresh_redis):
        err = _one_line_error(_worker(fresh_redis.url, tmp_path / "tmp", "--role", "ingest"))
    assert "not durable" in err and "--allow-volatile" not in err


def test_no_temporary_datadir_is_left_behind(fresh_redis: Any, tmp_path: Path) -> None:
    """Without --datadir the worker's temporary data directory is gone after it exits (here: at the
    unreachable Kafka, after the directory was made); a --datadir the user gave is kept."""
    tmp = tmp_path / "tmp"
    _stopped_at_kafka(_worker(fresh_redis.url, tmp))
    assert _leftovers(tmp) == []
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep").write_text("x", encoding="utf-8")
    _stopped_at_kafka(_worker(fresh_redis.url, tmp, "--datadir", str(mine)))
    assert (mine / "keep").read_text(encoding="utf-8") == "x"


def _leftovers(tmp: Path) -> list[str]:
    """The worker data directories in `tmp`."""
    return sorted(p.name for p in tmp.iterdir() if p.name.startswith("dpstream-"))


def _healthy(port: int) -> bool:
    """The worker's web endpoint answers /health."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def test_temporary_datadir_is_removed_after_a_normal_stop(kafka_broker: Any, fresh_redis: Any, tmp_path: Path) -> None:
    """A worker that ran (its free --web-port served /health, its datadir existed) and stopped on SIGTERM
    leaves no data directory behind."""
    tmp, port = tmp_path / "tmp", free_port()
    argv = ["worker", str(DEMO), "--bootstrap", kafka_broker.bootstrap, "--redis", fresh_redis.url]
    log = tmp_path / "worker.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dpstream.workers.cli", *argv, "--web-port", str(port)],
            env=_env(tmp),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 90  # a bound on the wait, not a measured figure
            while proc.poll() is None and not _healthy(port) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert proc.poll() is None and _healthy(port), log.read_text(errors="replace")
            assert len(_leftovers(tmp)) == 1  # the premise: the running worker has its temporary datadir
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert "Traceback" not in log.read_text(errors="replace")
    assert _leftovers(tmp) == []
