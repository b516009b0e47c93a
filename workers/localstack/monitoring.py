"""Prometheus and Alertmanager from Debian's packages, each with a checked config and its own data dir."""

from __future__ import annotations

__all__ = [
    "EXPORTER_PORT",
    "PrometheusHandle",
    "AlertmanagerHandle",
    "check_config_file",
    "check_user_configs",
    "render_prometheus_config",
    "http_ready",
    "shipped_rules_path",
]

import json
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

from dpstream.topology.errors import ConfigError
from dpstream.workers.localstack import sysdeps
from dpstream.workers.localstack.handle import Progress, ServiceHandle, no_progress
from dpstream.workers.localstack.paths import render_template, repo_deploy_dir, template_path
from dpstream.workers.localstack.ports import HOST

EXPORTER_PORT = 9464
"""`dpstream exporter`'s default `--port`: the stack does not start the exporter, so its default config scrapes
this port (the exporter command lives above this layer, so the number is repeated here, not imported)."""


def shipped_rules_path() -> Path | None:
    """deploy/prometheus/rules.yml of this checkout (the shipped alert and recording rules), if it is there."""
    path = repo_deploy_dir().parent / "prometheus" / "rules.yml"
    return path if path.is_file() else None


def render_prometheus_config(
    prometheus_port: int,
    alertmanager_port: int,
    worker_metrics_port: int,
    exporter_port: int = EXPORTER_PORT,
    rules: Path | None = None,
) -> str:
    """The default prometheus.yml: the shipped rules (`rules`, None for none), the worker and exporter under the
    job names those rules select, Prometheus itself, and alerts to the local Alertmanager."""
    return render_template(
        "prometheus.yml",
        prometheus_port=prometheus_port,
        alertmanager_port=alertmanager_port,
        worker_metrics_port=worker_metrics_port,
        exporter_port=exporter_port,
        rule_files=json.dumps([str(rules)] if rules is not None else []),
    )


def check_config_file(flag: str, path: Path, kind: str) -> Path:
    """The resolved `path` if it is a readable file, else a one-line ConfigError naming `flag` and `kind`."""
    resolved = Path(path).expanduser().resolve()
    if not resolved.exists():
        raise ConfigError(f"{flag} {resolved}: no such file: give the path of {kind}")
    if not resolved.is_file():
        raise ConfigError(f"{flag} {resolved}: not a file: give the path of {kind}")
    try:
        with resolved.open("rb"):
            pass
    except OSError as exc:
        raise ConfigError(f"{flag} {resolved}: not readable ({exc.strerror}): fix its permissions") from exc
    return resolved


def check_user_configs(prometheus: Path | None, alertmanager: Path | None) -> None:
    """Check the user's config files before any service starts, so a bad path leaves nothing running: each
    must be a readable file, and is checked by promtool / amtool when that tool is installed."""
    if prometheus is not None:
        path = check_config_file("--prometheus-config", prometheus, "a prometheus.yml")
        promtool = shutil.which("promtool")
        if promtool:
            _check([promtool, "check", "config", str(path)], path)
    if alertmanager is not None:
        path = check_config_file("--alertmanager-config", alertmanager, "an alertmanager.yml")
        amtool = shutil.which("amtool")
        if amtool:
            _check([amtool, "check-config", str(path)], path)


def http_ready(port: int, path: str = "/-/ready") -> bool:
    """True when GET http://127.0.0.1:port/path answers 200 (Prometheus and Alertmanager both serve /-/ready)."""
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}{path}", timeout=1.0) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _check(argv: list[str], config: Path) -> None:
    """Run a config checker (promtool / amtool); a rejected config is the user's to fix."""
    result = subprocess.run(argv, capture_output=True, text=True, check=False)  # fixed argv
    if result.returncode != 0:
        lines = [ln.strip() for ln in (result.stderr + result.stdout).splitlines() if ln.strip()]
        reason = next(
            (ln for ln in lines if "FAILED" in ln or "error" in ln.lower()), lines[-1] if lines else "invalid"
        )
        raise ConfigError(f"{config}: rejected by {Path(argv[0]).name}: {reason}: fix the file and run again")


class PrometheusHandle(ServiceHandle):
    """A local Prometheus; `config_file` None means the rendered default from deploy/local/templates."""

    name = "prometheus"
    port_flag = "--prometheus-port"

    def __init__(
        self,
        port: int,
        data_dir: Path,
        config_file: Path | None = None,
        alertmanager_port: int = 9093,
        worker_metrics_port: int = 6066,
        exporter_port: int = EXPORTER_PORT,
        start_timeout: float = 60.0,
        progress: Progress = no_progress,
    ) -> None:
        self.user_config = Path(config_file).resolve() if config_file is not None else None
        self.alertmanager_port = alertmanager_port
        self.worker_metrics_port = worker_metrics_port
        self.exporter_port = exporter_port
        super().__init__(port, data_dir, start_timeout, progress)

    @property
    def url(self) -> str:
        """Base URL of the Prometheus web UI and API."""
        return f"http://{HOST}:{self.port}"

    @property
    def config_file(self) -> Path:
        """The config in use: the user's, or the rendered default."""
        return self.user_config or self.data_dir / "prometheus.yml"

    def _marker(self) -> str:
        return str(self.data_dir / "tsdb")

    def _prepare(self) -> None:
        sysdeps.ensure([sysdeps.PROMETHEUS, sysdeps.PROMTOOL], self.progress)
        if self.user_config is None:
            self.config_file.write_text(
                render_prometheus_config(
                    self._port,
                    self.alertmanager_port,
                    self.worker_metrics_port,
                    self.exporter_port,
                    shipped_rules_path(),
                ),
                encoding="utf-8",
            )
        else:
            check_config_file("--prometheus-config", self.user_config, "a prometheus.yml")
        _check([shutil.which("promtool") or "promtool", "check", "config", str(self.config_file)], self.config_file)

    def _argv(self) -> list[str]:
        return [
            shutil.which("prometheus") or "prometheus",
            f"--config.file={self.config_file}",
            f"--storage.tsdb.path={self.data_dir / 'tsdb'}",
            f"--web.listen-address={HOST}:{self._port}",
            "--web.enable-lifecycle",
        ]

    def _ready(self) -> bool:
        return http_ready(self._port)


class AlertmanagerHandle(ServiceHandle):
    """A local Alertmanager (clustering off); `config_file` None means deploy/local/templates/alertmanager.yml."""

    name = "alertmanager"
    port_flag = "--alertmanager-port"

    def __init__(
        self,
        port: int,
        data_dir: Path,
        config_file: Path | None = None,
        start_timeout: float = 60.0,
        progress: Progress = no_progress,
    ) -> None:
        self.user_config = Path(config_file).resolve() if config_file is not None else None
        super().__init__(port, data_dir, start_timeout, progress)

    @property
    def url(self) -> str:
        """Base URL of the Alertmanager web UI and API."""
        return f"http://{HOST}:{self.port}"

    @property
    def config_file(self) -> Path:
        """The config in use: the user's, or the shipped default."""
        return self.user_config or self.data_dir / "alertmanager.yml"

    def _marker(self) -> str:
        return str(self.data_dir / "storage")

    def _prepare(self) -> None:
        sysdeps.ensure([sysdeps.ALERTMANAGER], self.progress)
        if self.user_config is None:
            shutil.copyfile(template_path("alertmanager.yml"), self.config_file)
        else:
            check_config_file("--alertmanager-config", self.user_config, "an alertmanager.yml")
        amtool = shutil.which("amtool")
        if amtool:
            _check([amtool, "check-config", str(self.config_file)], self.config_file)

    def _argv(self) -> list[str]:
        return [
            shutil.which("prometheus-alertmanager") or "prometheus-alertmanager",
            f"--config.file={self.config_file}",
            f"--storage.path={self.data_dir / 'storage'}",
            f"--web.listen-address={HOST}:{self._port}",
            "--cluster.listen-address=",
        ]

    def _ready(self) -> bool:
        return http_ready(self._port)
