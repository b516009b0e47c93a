"""`deploy/local/stack` command line: bad config paths refused before anything starts, options in any order."""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from dpstream.workers.localstack import free_port
from dpstream.workers.localstack.__main__ import build_parser
from dpstream.workers.localstack.__main__ import main as stack_main
from dpstream.workers.localstack.monitoring import render_prometheus_config, shipped_rules_path
from dpstream.workers.localstack.ports import port_open

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
