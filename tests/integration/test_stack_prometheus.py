"""`deploy/local/stack up prometheus` with the default config: the shipped rules are loaded and the worker and
exporter are scraped under the job names those rules select, with alerts sent to the stack's Alertmanager; and
`up --with-monitoring` runs the exporter that Prometheus scrapes."""

from __future__ import annotations

import json
import shutil
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from dpstream.workers.localstack import free_port
from dpstream.workers.localstack.__main__ import main as stack_main
from dpstream.workers.localstack.kafka import default_libs_dir
from dpstream.workers.localstack.monitoring import EXPORTER_PORT, shipped_rules_path
from dpstream.workers.localstack.ports import port_open

_SETTLE_S = 60.0
"""How long to wait for Prometheus' first target discovery (a wait, not an assertion on time)."""


def _api(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5.0) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return body["data"]


def _active_targets(port: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + _SETTLE_S
    while True:
        targets: list[dict[str, Any]] = _api(port, "/api/v1/targets")["activeTargets"]
        if len({t["labels"]["job"] for t in targets}) >= 3 or time.monotonic() > deadline:
            return targets
        time.sleep(0.5)


def test_default_config_loads_shipped_rules_and_scrapes_rule_jobs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The running Prometheus has every group of deploy/prometheus/rules.yml, targets dpstream-worker on
    --worker-metrics-port and dpstream-exporter, and its Alertmanager is the stack's --alertmanager-port."""
    if shutil.which("prometheus") is None or shutil.which("promtool") is None:
        pytest.skip("prometheus / promtool not installed (the stack installs them with `up prometheus`)")
    rules = shipped_rules_path()
    assert rules is not None, "deploy/prometheus/rules.yml missing from the checkout"
    shipped_groups = {group["name"] for group in yaml.safe_load(rules.read_text(encoding="utf-8"))["groups"]}
    ports: dict[str, int] = {}
    for flag in ("prometheus", "alertmanager", "worker-metrics", "kafka", "kafka-controller", "redis"):
        ports[flag] = free_port(avoid=frozenset(ports.values()))
    argv = ["--home", str(tmp_path), *(a for f, p in ports.items() for a in (f"--{f}-port", str(p)))]
    try:
        assert stack_main(["up", "prometheus", *argv]) == 0, capsys.readouterr().err
        prometheus = ports["prometheus"]
        loaded = {group["name"] for group in _api(prometheus, "/api/v1/rules")["groups"]}
        assert loaded == shipped_groups
        targets = {(t["labels"]["job"], t["labels"]["instance"]) for t in _active_targets(prometheus)}
        assert ("dpstream-worker", f"127.0.0.1:{ports['worker-metrics']}") in targets
        assert ("dpstream-exporter", f"127.0.0.1:{EXPORTER_PORT}") in targets
        config = yaml.safe_load(_api(prometheus, "/api/v1/status/config")["yaml"])
        alertmanagers = config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
        assert alertmanagers == [f"127.0.0.1:{ports['alertmanager']}"]
    finally:
        assert stack_main(["down", "prometheus", *argv]) == 0


def test_with_monitoring_runs_the_exporter_that_prometheus_scrapes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`up --with-monitoring --topology demo.yaml` on free ports (the exporter's picked by the stack) starts the
    exporter against the stack's Redis, Prometheus's dpstream-exporter target on its port is up, `up` and
    `status` print the exports; `down` stops every service, the exporter too."""
    if shutil.which("prometheus") is None or shutil.which("promtool") is None:
        pytest.skip("prometheus / promtool not installed (the stack installs them with `up prometheus`)")
    home = tmp_path / "home"
    shared = default_libs_dir()
    if shared.is_dir():  # Kafka's jars from this machine's earlier download, not a second mvn run
        (home / "kafka").mkdir(parents=True)
        (home / "kafka" / "libs").symlink_to(shared)
    ports: dict[str, int] = {}
    for flag in ("prometheus", "alertmanager", "worker-metrics", "kafka", "kafka-controller", "redis"):
        ports[flag] = free_port(avoid=frozenset(ports.values()))
    argv = ["--home", str(home), *(a for f, p in ports.items() for a in (f"--{f}-port", str(p)))]
    topology = Path(__file__).resolve().parents[2] / "topology" / "examples" / "demo.yaml"
    exports = [
        f"export DPSTREAM_KAFKA=127.0.0.1:{ports['kafka']}",
        f"export DPSTREAM_REDIS=redis://127.0.0.1:{ports['redis']}/0",
    ]
    try:
        assert stack_main(["up", "--with-monitoring", "--topology", str(topology), *argv]) == 0, capsys.readouterr()
        out = capsys.readouterr().out.splitlines()
        assert out[-2:] == exports
        assert f"# prometheus: http://127.0.0.1:{ports['prometheus']} " in "\n".join(out)
        exporter_port = int(next(line for line in out if line.startswith("exporter ")).split()[5])
        assert exporter_port not in ports.values()
        deadline = time.monotonic() + _SETTLE_S
        while True:
            targets = _api(ports["prometheus"], "/api/v1/targets")["activeTargets"]
            exporter = [t for t in targets if t["labels"]["job"] == "dpstream-exporter"]
            if (exporter and exporter[0]["health"] == "up") or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert [(t["labels"]["instance"], t["health"]) for t in exporter] == [(f"127.0.0.1:{exporter_port}", "up")]
        assert stack_main(["status", *argv]) == 0
        status = capsys.readouterr().out.splitlines()
        assert status[-2:] == exports
        assert next(line for line in status if line.startswith("exporter ")).split()[1] == "up"
    finally:
        assert stack_main(["down", *argv]) == 0
    down = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in down[1:]] == [
        [name, "down"] for name in ("prometheus", "alertmanager", "exporter", "kafka", "redis")
    ]
    assert not any(port_open(p) for p in (*ports.values(), exporter_port))
