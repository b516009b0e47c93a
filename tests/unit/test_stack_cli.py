"""`deploy/local/stack` command line: bad config paths refused before anything starts, options in any order,
the exporter and the exports, and the wrapper script's choice of Python."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from dpstream.workers.localstack import Ports, PrometheusHandle, Service, Stack, StackConfig, free_port
from dpstream.workers.localstack.__main__ import build_parser
from dpstream.workers.localstack.__main__ import main as stack_main
from dpstream.workers.localstack.monitoring import EXPORTER_PORT, render_prometheus_config, shipped_rules_path
from dpstream.workers.localstack.ports import port_open
from dpstream.workers.localstack.process import ManagedProcess

ROOT = Path(__file__).resolve().parents[2]
STACK = ROOT / "deploy" / "local" / "stack"
EXAMPLES = ROOT / "topology" / "examples"

_PORT_FLAGS = ("kafka", "kafka-controller", "redis", "prometheus", "alertmanager", "worker-metrics")


def _port_args() -> dict[str, int]:
    """One free, distinct loopback port per stack port flag (never the defaults)."""
    chosen: dict[str, int] = {}
    for flag in _PORT_FLAGS:
        chosen[flag] = free_port(avoid=frozenset(chosen.values()))
    return chosen


def _argv(ports: dict[str, int]) -> list[str]:
    return [arg for flag, port in ports.items() for arg in (f"--{flag}-port", str(port))]


@contextlib.contextmanager
def _downed_after(home: Path, ports: dict[str, int]) -> Iterator[None]:
    """Stop whatever a test started under `home`, whatever the test's outcome."""
    try:
        yield
    finally:
        stack_main(["down", "--home", str(home), *_argv(ports)])


def _bad_config(tmp_path: Path, kind: str) -> Path:
    if kind == "missing":
        return tmp_path / "nope.yml"
    directory = tmp_path / "a-directory.yml"
    directory.mkdir()
    return directory


@pytest.mark.parametrize(
    ("flag", "what"), [("--prometheus-config", "a prometheus.yml"), ("--alertmanager-config", "an alertmanager.yml")]
)
@pytest.mark.parametrize(("kind", "reason"), [("missing", "no such file"), ("dir", "not a file")])
def test_bad_config_path_is_refused_before_any_service_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, what: str, kind: str, reason: str
) -> None:
    """`up redis prometheus alertmanager --prometheus-config nope.yml` exits 2 with one line and starts nothing:
    no Redis listens on its port and no run record is written under the home."""
    home, ports = tmp_path / "home", _port_args()
    bad = _bad_config(tmp_path, kind)
    with _downed_after(home, ports):
        code = stack_main(
            ["up", "redis", "prometheus", "alertmanager", "--home", str(home), *_argv(ports), flag, str(bad)]
        )
        err = capsys.readouterr().err.splitlines()
        assert code == 2
        assert err == [f"stack: error: {flag} {bad.resolve()}: {reason}: give the path of {what}"]
        assert not port_open(ports["redis"])
        assert list(home.rglob("*.run.json")) == []


def test_rejected_prometheus_config_is_refused_before_redis_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A prometheus.yml that promtool rejects is also one line, exit 2, before Redis starts."""
    bad = tmp_path / "prometheus.yml"
    bad.write_text("global:\n  scrape_interval: not-a-duration\n", encoding="utf-8")
    home, ports = tmp_path / "home", _port_args()
    if shutil.which("promtool") is None:
        pytest.skip("promtool not installed (the stack installs it with `up prometheus`)")
    with _downed_after(home, ports):
        code = stack_main(
            ["up", "redis", "prometheus", "--home", str(home), *_argv(ports), "--prometheus-config", str(bad)]
        )
        err = capsys.readouterr().err.splitlines()
        assert code == 2
        assert len(err) == 1 and err[0].startswith(f"stack: error: {bad.resolve()}: rejected by promtool: ")
        assert not port_open(ports["redis"])
        assert list(home.rglob("*.run.json")) == []


def test_options_before_service_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`status --home H redis` is `status redis --home H`: only Redis is listed, under the given home."""
    ports = _port_args()
    outputs = []
    for argv in (
        ["status", "--home", str(tmp_path), *_argv(ports), "redis"],
        ["status", "redis", "--home", str(tmp_path), *_argv(ports)],
    ):
        assert stack_main(argv) == 0
        captured = capsys.readouterr()
        assert captured.err == ""
        outputs.append(captured.out.splitlines())
    for lines in outputs:
        assert lines[0].startswith(f"# status: state in {tmp_path.resolve()} (")
        assert [line.split()[0] for line in lines[1:]] == ["redis"]
        assert f"port {ports['redis']} " in lines[1]


def test_usage_names_the_script() -> None:
    """Usage and errors name `deploy/local/stack`, the command the README gives."""
    parser = build_parser()
    assert parser.prog == "deploy/local/stack"
    assert parser.format_usage().startswith("usage: deploy/local/stack ")


def test_default_prometheus_config_loads_shipped_rules_and_their_jobs(tmp_path: Path) -> None:
    """The stack's default prometheus.yml passes `promtool check config` with the shipped rules loaded, and
    scrapes every job the rules select (`job="..."`), so DPWorkerDown / DPExporterDown see real targets."""
    if shutil.which("promtool") is None:
        pytest.skip("promtool not installed (the stack installs it with `up prometheus`)")
    rules = shipped_rules_path()
    assert rules is not None, "deploy/prometheus/rules.yml missing from the checkout"
    rule_jobs = set(re.findall(r'job="([^"]+)"', rules.read_text(encoding="utf-8")))
    assert rule_jobs, "no job selector found in the shipped rules"
    path = tmp_path / "prometheus.yml"
    path.write_text(render_prometheus_config(29090, 29094, 26066, 29464, rules), encoding="utf-8")
    result = subprocess.run(["promtool", "check", "config", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert config["rule_files"] == [str(rules)]
    assert rule_jobs <= {job["job_name"] for job in config["scrape_configs"]}


# --- the exporter and the exports ------------------------------------------------------------------


def _fake_service(home: Path, name: str, port: int, marker: str) -> None:
    """A sleeping child recorded as the stack's `name` on `port` (its command line carries the marker the
    stack checks), so `status` reads a run file as it would for the real service."""
    data = home / name
    process = ManagedProcess(name, data / f"{name}.run.json", data / f"{name}.log", marker)
    data.mkdir(parents=True, exist_ok=True)
    process.spawn([sys.executable, "-c", "import time; time.sleep(120)", marker], port, cwd=data)


def _exports(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("export ")]


def test_status_prints_the_exports_of_the_running_stack(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`status` reads the run files: the running Kafka and Redis are printed as the `export` lines the example
    topologies read (their live ports, not the flags'), and the exporter on its recorded port."""
    home, ports = tmp_path / "home", _port_args()
    live = {name: free_port(avoid=frozenset(ports.values())) for name in ("kafka", "redis", "exporter")}
    with _downed_after(home, ports):
        _fake_service(home, "redis", live["redis"], "redis-server")
        _fake_service(home, "kafka", live["kafka"], str((home / "kafka" / "server.properties").resolve()))
        _fake_service(home, "exporter", live["exporter"], "dpstream.workers.cli exporter")
        assert stack_main(["status", "--home", str(home), *_argv(ports)]) == 0
        out = capsys.readouterr().out
        assert _exports(out) == [
            f"export DPSTREAM_KAFKA=127.0.0.1:{live['kafka']}",
            f"export DPSTREAM_REDIS=redis://127.0.0.1:{live['redis']}/0",
        ]
        exporter = next(line for line in out.splitlines() if line.startswith("exporter "))
        assert exporter.split()[1] == "up" and f"http://127.0.0.1:{live['exporter']}/metrics" in exporter
        for var in ("DPSTREAM_KAFKA", "DPSTREAM_REDIS"):  # the names the examples read
            assert f"${{{var}" in (EXAMPLES / "demo.yaml").read_text(encoding="utf-8")


def test_exports_only_for_running_services(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing running prints no export; Redis alone prints DPSTREAM_REDIS alone."""
    home, ports = tmp_path / "home", _port_args()
    with _downed_after(home, ports):
        assert stack_main(["status", "--home", str(home), *_argv(ports)]) == 0
        assert _exports(capsys.readouterr().out) == []
        _fake_service(home, "redis", ports["redis"], "redis-server")
        assert stack_main(["status", "--home", str(home), *_argv(ports)]) == 0
        assert _exports(capsys.readouterr().out) == [f"export DPSTREAM_REDIS=redis://127.0.0.1:{ports['redis']}/0"]


def test_prometheus_scrapes_the_exporter_port(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default prometheus.yml's dpstream-exporter target is the running exporter's port, else
    --exporter-port, else 9464; the worker job is --worker-metrics-port."""
    ports = _port_args()
    given = free_port(avoid=frozenset(ports.values()))
    stack_ports = Ports(
        kafka=ports["kafka"],
        kafka_controller=ports["kafka-controller"],
        redis=ports["redis"],
        prometheus=ports["prometheus"],
        alertmanager=ports["alertmanager"],
        worker_metrics=ports["worker-metrics"],
    )
    assert Stack(StackConfig(home=tmp_path, ports=stack_ports)).exporter_scrape_port() == EXPORTER_PORT
    stack = Stack(StackConfig(home=tmp_path, ports=replace(stack_ports, exporter=given)))
    assert stack.exporter_scrape_port() == given
    live = free_port(avoid=frozenset({*ports.values(), given}))
    _fake_service(tmp_path, "exporter", live, "dpstream.workers.cli exporter")
    try:
        assert stack.exporter_scrape_port() == live
        rendered: list[str] = []

        def fake_start(handle: PrometheusHandle) -> bool:
            rendered.append(
                render_prometheus_config(
                    handle.port, handle.alertmanager_port, handle.worker_metrics_port, handle.exporter_port
                )
            )
            return True

        monkeypatch.setattr(PrometheusHandle, "start", fake_start)
        stack.up([Service.PROMETHEUS])
        config = yaml.safe_load(rendered[0])
        targets = {job["job_name"]: job["static_configs"][0]["targets"] for job in config["scrape_configs"]}
        assert targets["dpstream-exporter"] == [f"127.0.0.1:{live}"]
        assert targets["dpstream-worker"] == [f"127.0.0.1:{ports['worker-metrics']}"]
    finally:
        stack.exporter.stop()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--with-monitoring"], "stack: error: exporter: serves the budget scopes of a topology: pass --topology FILE"),
        (
            ["exporter", "--topology", "nope.yaml"],
            "stack: error: --topology {cwd}/nope.yaml: no such file: give the path of a topology YAML",
        ),
        (
            ["redis", "--topology", "x.yaml"],
            "stack: error: --topology x.yaml: only the exporter reads it: add --with-monitoring (or service exporter)",
        ),
    ],
)
def test_exporter_topology_mistakes_are_refused_before_any_service_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, extra: list[str], message: str
) -> None:
    """`up --with-monitoring` without --topology (the exporter needs one), with a missing file, or --topology
    for a stack without the exporter: one line, exit 2, nothing started."""
    monkeypatch.chdir(tmp_path)
    home, ports = tmp_path / "home", _port_args()
    with _downed_after(home, ports):
        assert stack_main(["up", "redis", "--home", str(home), *_argv(ports), *extra]) == 2
        assert capsys.readouterr().err.splitlines() == [message.format(cwd=tmp_path.resolve())]
        assert not port_open(ports["redis"])
        assert list(home.rglob("*.run.json")) == []


# --- deploy/local/stack ------------------------------------------------------------------------------


def test_wrapper_names_a_python_that_cannot_import_dpstream(tmp_path: Path) -> None:
    """deploy/local/stack run with a `python` (first on PATH) that lacks dpstream says so in one line, names
    that python and `pip install -e`, and exits 2; it does not blame the wheel."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    result = subprocess.run(
        [str(STACK), "status", "--home", str(tmp_path / "home")], capture_output=True, text=True, env=env, check=False
    )
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(
        f"deploy/local/stack: dpstream is not importable by {venv / 'bin' / 'python'} "
        "(ModuleNotFoundError: No module named 'dpstream'): install it from this checkout with "
    )
    assert "-m pip install -e " in lines[0] and "wheel" not in lines[0]


def test_wrapper_runs_the_stack_with_a_python_that_imports_dpstream(tmp_path: Path) -> None:
    """With this test's Python first on PATH the wrapper runs the stack command."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(
        [str(STACK), "status", "--home", str(tmp_path), "redis"], capture_output=True, text=True, env=env, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1].split()[:2] == ["redis", "down"]
