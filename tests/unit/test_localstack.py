"""Pure parts of workers/localstack: config rendering, ports, the fetch marker, run files, idempotent CLI."""

from __future__ import annotations

import base64
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dpstream.topology.errors import ConfigError
from dpstream.workers.localstack import Ports, Service, Stack, StackConfig, free_port
from dpstream.workers.localstack.__main__ import main as stack_main
from dpstream.workers.localstack.errors import ServiceStartError
from dpstream.workers.localstack.kafka import new_cluster_id, render_server_properties
from dpstream.workers.localstack.kafka_libs import MARKER, ensure_libs, libs_ready, mvn_argv, pom_digest
from dpstream.workers.localstack.monitoring import render_prometheus_config
from dpstream.workers.localstack.paths import default_home, tail
from dpstream.workers.localstack.process import ManagedProcess, RunRecord
from dpstream.workers.localstack.redis import render_redis_conf
from dpstream.workers.localstack.sysdeps import PROMETHEUS, PROMTOOL, REDIS, install_hint, missing


def _properties(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if line.strip() and not line.startswith("#"))
    return {key.strip(): value.strip() for key, value in pairs}


# --- config rendering -------------------------------------------------------------------------------


def test_redis_conf_is_durable_and_loopback_only(tmp_path: Path) -> None:
    """redis.conf binds 127.0.0.1 on the given port with AOF fsync on every write and no RDB snapshots."""
    conf = render_redis_conf(16399, tmp_path / "my redis")
    lines = set(conf.splitlines())
    assert {"bind 127.0.0.1", "port 16399", "appendonly yes", "appendfsync always", 'save ""'} <= lines
    assert f'dir "{(tmp_path / "my redis").resolve()}"' in lines
    assert "daemonize no" in lines and "${" not in conf


def test_server_properties_single_node_kraft(tmp_path: Path) -> None:
    """server.properties makes one combined KRaft node on the given loopback ports with 1-replica internals."""
    props = _properties(render_server_properties(29092, 29093, tmp_path / "data"))
    assert props["process.roles"] == "broker,controller"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:29093"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:29092,CONTROLLER://127.0.0.1:29093"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:29092"
    assert props["log.dirs"] == str((tmp_path / "data").resolve())
    assert props["num.partitions"] == "4"
    assert props["auto.create.topics.enable"] == "false"
    for key in (
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
        "default.replication.factor",
    ):
        assert props[key] == "1", key
    assert props["group.initial.rebalance.delay.ms"] == "0"


def test_server_properties_options(tmp_path: Path) -> None:
    """Partition count and topic auto-creation follow the arguments."""
    props = _properties(render_server_properties(1, 2, tmp_path, partitions=8, auto_create_topics=True))
    assert props["num.partitions"] == "8" and props["offsets.topic.num.partitions"] == "8"
    assert props["auto.create.topics.enable"] == "true"


def test_prometheus_default_config_targets_the_stack_ports() -> None:
    """The default prometheus.yml scrapes itself, the worker and the exporter under the rules' job names and
    alerts to the stack's Alertmanager."""
    config = yaml.safe_load(render_prometheus_config(29090, 29094, 26066, 29464))
    targets = {job["job_name"]: job["static_configs"][0]["targets"] for job in config["scrape_configs"]}
    assert targets == {
        "prometheus": ["127.0.0.1:29090"],
        "dpstream-worker": ["127.0.0.1:26066"],
        "dpstream-exporter": ["127.0.0.1:29464"],
    }
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["127.0.0.1:29094"]


def test_prometheus_default_config_passes_promtool(tmp_path: Path) -> None:
    """promtool accepts the rendered default config."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (the stack installs it with `up prometheus`)")
    path = tmp_path / "prometheus.yml"
    path.write_text(render_prometheus_config(29090, 29094, 26066), encoding="utf-8")
    result = subprocess.run([promtool, "check", "config", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_cluster_id_shape() -> None:
    """A cluster id is 22 URL-safe base64 characters encoding 16 bytes, never starting with '-'."""
    for _ in range(200):
        cid = new_cluster_id()
        assert len(cid) == 22 and not cid.startswith("-")
        assert len(base64.urlsafe_b64decode(cid + "==")) == 16


# --- ports -----------------------------------------------------------------------------------------


def test_default_ports_are_distinct() -> None:
    """The default ports are valid and give the usual client addresses."""
    ports = Ports()
    assert ports.kafka_bootstrap == "127.0.0.1:9092"
    assert ports.redis_url == "redis://127.0.0.1:6379/0"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"redis": 9092}, r"--redis-port 9092: already used by --kafka-port"),
        ({"kafka": 0}, r"--kafka-port 0: not a TCP port"),
        ({"prometheus": 70000}, r"--prometheus-port 70000: not a TCP port"),
        ({"alertmanager": True}, r"--alertmanager-port True: not a TCP port"),
    ],
)
def test_bad_ports_are_config_errors(kwargs: dict[str, object], message: str) -> None:
    """A duplicate or out-of-range port is one ConfigError naming the flag, the value and the fix."""
    with pytest.raises(ConfigError, match=message):
        Ports(**kwargs)  # type: ignore[arg-type]  # deliberately ill-typed values: the check under test


def test_free_port_is_bindable_and_avoids() -> None:
    """free_port returns a loopback port that can be bound and is not in the avoid set."""
    first = free_port()
    second = free_port(avoid=frozenset({first}))
    assert second != first
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", second))


# --- Kafka jar fetch marker ------------------------------------------------------------------------


class _FakeMaven:
    """Stands in for the mvn command line: writes a jar into -DoutputDirectory and counts calls."""

    def __init__(self, returncode: int = 0) -> None:
        self.calls: list[list[str]] = []
        self.returncode = returncode

    def __call__(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        self.calls.append(argv)
        out = Path(next(a for a in argv if a.startswith("-DoutputDirectory=")).split("=", 1)[1])
        if self.returncode == 0:
            (out / "kafka_2.13-3.9.1.jar").write_bytes(b"jar")
        return subprocess.CompletedProcess(argv, self.returncode, "", "[ERROR] no network")


def _pom(tmp_path: Path, text: str = "<project>3.9.1</project>") -> Path:
    pom = tmp_path / "pom.xml"
    pom.write_text(text, encoding="utf-8")
    return pom


def test_fetch_runs_once_then_marker_skips_mvn(tmp_path: Path) -> None:
    """The first start runs mvn and writes the marker; the second start does not run mvn at all."""
    pom, libs, mvn = _pom(tmp_path), tmp_path / "libs", _FakeMaven()
    assert ensure_libs(libs, pom, run=mvn) is True
    assert (libs / MARKER).read_text().strip() == pom_digest(pom)
    assert ensure_libs(libs, pom, run=mvn) is False
    assert len(mvn.calls) == 1 and libs_ready(libs, pom_digest(pom))


def test_changed_pom_refetches(tmp_path: Path) -> None:
    """A different pom (a new Kafka version) invalidates the marker and replaces the jars."""
    libs, mvn = tmp_path / "libs", _FakeMaven()
    ensure_libs(libs, _pom(tmp_path, "<project>3.9.1</project>"), run=mvn)
    (libs / "stale-3.9.1.jar").write_bytes(b"old")
    assert ensure_libs(libs, _pom(tmp_path, "<project>4.0.0</project>"), run=mvn) is True
    assert len(mvn.calls) == 2 and not (libs / "stale-3.9.1.jar").exists()


def test_failed_fetch_leaves_no_marker(tmp_path: Path) -> None:
    """A failing mvn raises with its output and leaves nothing that looks complete."""
    pom, libs = _pom(tmp_path), tmp_path / "libs"
    with pytest.raises(ServiceStartError, match="no network"):
        ensure_libs(libs, pom, run=_FakeMaven(returncode=1))
    assert not libs_ready(libs, pom_digest(pom))


def test_marker_without_jars_is_not_ready(tmp_path: Path) -> None:
    """A marker alone (jars deleted) does not count as a complete fetch."""
    libs = tmp_path / "libs"
    libs.mkdir()
    (libs / MARKER).write_text("abc\n")
    assert not libs_ready(libs, "abc")


def test_mvn_command_copies_runtime_deps(tmp_path: Path) -> None:
    """The mvn command is copy-dependencies of the given pom into the given directory, runtime scope."""
    argv = mvn_argv(tmp_path / "pom.xml", tmp_path / "out")
    assert argv[1:] == [
        "-q",
        "-B",
        "-f",
        str(tmp_path / "pom.xml"),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={tmp_path / 'out'}",
        "-DincludeScope=runtime",
    ]


# --- system packages -------------------------------------------------------------------------------


def test_missing_and_install_hint() -> None:
    """Missing binaries are listed once and the hint names the exact apt-get command, packages deduplicated."""
    absent = missing([REDIS, PROMETHEUS, PROMTOOL, REDIS], which=lambda name: None)
    assert absent == [REDIS, PROMETHEUS, PROMTOOL]
    assert install_hint(absent) == (
        "missing redis-server, prometheus, promtool: install with "
        "`sudo apt-get install -y redis-server prometheus` and run again"
    )
    assert missing([REDIS], which=lambda name: f"/usr/bin/{name}") == []


# --- run files and processes -----------------------------------------------------------------------


def test_run_record_round_trip_and_garbage(tmp_path: Path) -> None:
    """A run record reads back as written; an unreadable one reads as None."""
    path = tmp_path / "x.run.json"
    RunRecord(pid=123, port=6379, argv=("redis-server", "a.conf")).write(path)
    assert RunRecord.read(path) == RunRecord(pid=123, port=6379, argv=("redis-server", "a.conf"))
    path.write_text("{not json")
    assert RunRecord.read(path) is None


def test_managed_process_stop_and_kill(tmp_path: Path) -> None:
    """A spawned process is found through its run file, and stop/kill end it and remove the file."""
    marker = str(tmp_path / "sleeper")
    argv = [sys.executable, "-c", "import time, sys; time.sleep(600)", marker]
    proc = ManagedProcess("sleeper", tmp_path / "s.run.json", tmp_path / "s.log", marker)
    rec = proc.spawn(argv, port=1, cwd=tmp_path)
    again = ManagedProcess("sleeper", tmp_path / "s.run.json", tmp_path / "s.log", marker)
    assert again.record() == rec and again.is_running()
    assert proc.stop(timeout=5) is True and not proc.run_file.exists() and not again.is_running()
    assert proc.stop() is False
    proc.spawn(argv, port=1, cwd=tmp_path)
    assert proc.kill() is True and not proc.is_running()


def test_recycled_pid_is_not_ours(tmp_path: Path) -> None:
    """A run file whose pid now belongs to another program (marker absent) reads as not running and is removed."""
    run_file = tmp_path / "k.run.json"
    RunRecord(pid=os.getpid(), port=9092, argv=("java",)).write(run_file)
    proc = ManagedProcess("kafka", run_file, tmp_path / "k.log", marker=str(tmp_path / "server.properties"))
    assert proc.record() is None and not run_file.exists()


# --- paths and the stack command -------------------------------------------------------------------


def test_home_env_overrides(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """DPSTREAM_HOME moves the state directory; without it the default is ~/.cache/dpstream."""
    monkeypatch.setenv("DPSTREAM_HOME", str(tmp_path / "state"))
    assert default_home() == (tmp_path / "state").resolve()
    monkeypatch.delenv("DPSTREAM_HOME")
    assert default_home() == (Path.home() / ".cache" / "dpstream").resolve()


def test_tail_keeps_last_lines(tmp_path: Path) -> None:
    """tail returns the last lines of a log, and says so when there is no log."""
    log = tmp_path / "a.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert tail(log, 3) == "line 97\nline 98\nline 99"
    assert "no log" in tail(tmp_path / "missing.log")


def test_status_and_down_on_empty_home_are_idempotent(tmp_path: Path) -> None:
    """With nothing started, status shows every service down and down succeeds, twice."""
    stack = Stack(StackConfig(home=tmp_path))
    assert [(s.service, s.up) for s in stack.status()] == [(service, False) for service in Service]
    for _ in range(2):
        assert all(s.note == "was not running" and not s.up for s in stack.down())


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The stack command exits 0 on status, 2 with one line on a bad port or unknown service."""
    assert stack_main(["status", "--home", str(tmp_path)]) == 0
    assert "kafka" in capsys.readouterr().out
    assert stack_main(["up", "--home", str(tmp_path), "--redis-port", "9092"]) == 2
    assert stack_main(["up", "nope", "--home", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "stack: error: --redis-port 9092: already used by --kafka-port: give each service its own port",
        "stack: error: service 'nope': unknown: choose from redis, kafka, exporter, alertmanager, prometheus",
    ]


def test_server_properties_three_node_cluster(tmp_path: Path) -> None:
    """A node of a three-node cluster names every voter and replicates internal topics 3 ways, min ISR 2."""
    voters = [(1, 29093), (2, 29193), (3, 29293)]
    props = _properties(render_server_properties(29192, 29193, tmp_path, node_id=2, voters=voters))
    assert props["node.id"] == "2"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:29093,2@127.0.0.1:29193,3@127.0.0.1:29293"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:29192,CONTROLLER://127.0.0.1:29193"
    for key in ("offsets.topic.replication.factor", "transaction.state.log.replication.factor"):
        assert props[key] == "3", key
    assert props["min.insync.replicas"] == props["transaction.state.log.min.isr"] == "2"


def test_stack_refuses_a_home_formatted_for_another_broker_count(tmp_path: Path) -> None:
    """`up --brokers 3` on a home whose Kafka was formatted as one node is one line, before any start."""
    from dpstream.topology.errors import ConfigError

    (tmp_path / "kafka" / "data").mkdir(parents=True)
    (tmp_path / "kafka" / "data" / "meta.properties").write_text("node.id=1\n")
    stack = Stack(StackConfig(home=tmp_path), brokers=3)
    with pytest.raises(ConfigError, match=r"belongs to a 1-broker cluster, not 3: run `stack down`"):
        stack.kafka_cluster.start()
    assert [s.name for s in stack.status([Service.KAFKA])] == ["kafka", "kafka-2", "kafka-3"]


def test_cli_refuses_zero_brokers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--brokers 0` is one line and exit 2."""
    assert stack_main(["up", "--brokers", "0", "--home", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == "stack: error: --brokers 0: need at least 1 Kafka broker"
