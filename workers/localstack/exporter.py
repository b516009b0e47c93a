"""`dpstream exporter` as a stack service (`stack up --with-monitoring --topology FILE`): the budget gauges of
the stack's Redis on a port given or picked, so Prometheus's dpstream-exporter job has a real target."""

from __future__ import annotations

__all__ = ["ExporterHandle"]

import os
import sys
from pathlib import Path

from dpstream.topology.errors import ConfigError
from dpstream.workers.localstack.handle import Progress, ServiceHandle, no_progress
from dpstream.workers.localstack.monitoring import check_config_file, http_ready
from dpstream.workers.localstack.ports import HOST, free_port

_COMMAND = ("-m", "dpstream.workers.cli", "exporter")
_MARKER = "dpstream.workers.cli exporter"
"""What the exporter's command line contains (guards the run file against a recycled pid)."""


class ExporterHandle(ServiceHandle):
    """`dpstream exporter --topology FILE --redis URL --port N` as a child of the stack.

    `port` None picks a free port at start (never one in `avoid`); `topology` and `redis_url` are set by the
    stack before `start()` (the Redis URL is the live one, known only once Redis runs)."""

    name = "exporter"
    port_flag = "--exporter-port"

    def __init__(
        self,
        port: int | None,
        data_dir: Path,
        topology: Path | None = None,
        redis_url: str = f"redis://{HOST}:6379/0",
        avoid: frozenset[int] = frozenset(),
        start_timeout: float = 30.0,
        progress: Progress = no_progress,
    ) -> None:
        self.topology = Path(topology).expanduser().resolve() if topology is not None else None
        self.redis_url = redis_url
        self.env: dict[str, str] = {}
        """Variables added to the child's environment (the topology's `${DPSTREAM_KAFKA}` and the like)."""
        self._avoid = avoid
        super().__init__(port or 0, data_dir, start_timeout, progress)

    @property
    def url(self) -> str:
        """The exporter's /metrics."""
        return f"http://{HOST}:{self.port}/metrics"

    def check(self, env: dict[str, str]) -> None:
        """Refuse, in one line, what would make the exporter exit at start: no topology, or one that does not
        load with the stack's addresses in `env` (called by the stack before anything starts)."""
        from dpstream.topology.loader import load_topology  # the stack's CLI should start fast

        if self.topology is None:
            raise ConfigError("exporter: serves the budget scopes of a topology: pass --topology FILE")
        check_config_file("--topology", self.topology, "a topology YAML")
        load_topology(self.topology, env={**os.environ, **env})

    def start(self) -> bool:
        """Start on the given port, or on a free one picked now; False if it was already running."""
        if self.is_running():
            return False
        self.check(self.env)
        if not self._port:
            self._port = free_port(avoid=self._avoid)
        return super().start()

    def _marker(self) -> str:
        return _MARKER

    def _prepare(self) -> None:
        """Nothing to install: the exporter is this Python's dpstream."""

    def _argv(self) -> list[str]:
        return [
            sys.executable,
            *_COMMAND,
            "--topology",
            str(self.topology),
            "--redis",
            self.redis_url,
            "--port",
            str(self._port),
        ]

    def _env(self) -> dict[str, str] | None:
        return {**os.environ, **self.env}

    def _ready(self) -> bool:
        return http_ready(self._port, "/health")
