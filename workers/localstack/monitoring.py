"""Prometheus and Alertmanager from Debian's packages, each with a checked config and its own data dir."""

from __future__ import annotations

__all__ = ["PrometheusHandle", "AlertmanagerHandle", "render_prometheus_config", "http_ready"]

import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

from dpstream.topology.errors import ConfigError
from dpstream.workers.localstack import sysdeps
from dpstream.workers.localstack.handle import Progress, ServiceHandle, no_progress
from dpstream.workers.localstack.paths import render_template, template_path
from dpstream.workers.localstack.ports import HOST


def render_prometheus_config(prometheus_port: int, alertmanager_port: int, worker_metrics_port: int) -> str:
    """The default prometheus.yml: scrape itself and a dpstream worker, alert to the local Alertmanager."""
    return render_template(
        "prometheus.yml",
        prometheus_port=prometheus_port,
        alertmanager_port=alertmanager_port,
        worker_metrics_port=worker_metrics_port,
    )


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
        start_timeout: float = 60.0,
        progress: Progress = no_progress,
    ) -> None:
        self.user_config = Path(config_file).resolve() if config_file is not None else None
        self.alertmanager_port = alertmanager_port
        self.worker_metrics_port = worker_metrics_port
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
                render_prometheus_config(self._port, self.alertmanager_port, self.worker_metrics_port),
                encoding="utf-8",
            )
        elif not self.user_config.is_file():
            raise ConfigError(
                f"--prometheus-config {self.user_config}: no such file: give the path of a prometheus.yml"
            )
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
        elif not self.user_config.is_file():
            raise ConfigError(
                f"--alertmanager-config {self.user_config}: no such file: give the path of an alertmanager.yml"
            )
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
