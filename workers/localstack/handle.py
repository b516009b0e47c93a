"""The common life cycle of a local service: prepare, spawn, wait until it answers, stop or kill."""

from __future__ import annotations

__all__ = ["ServiceHandle", "Progress", "no_progress"]

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path

from dpstream.topology.errors import ConfigError
from dpstream.workers.localstack.errors import ServiceStartError
from dpstream.workers.localstack.paths import tail
from dpstream.workers.localstack.ports import port_open
from dpstream.workers.localstack.process import ManagedProcess

Progress = Callable[[str], None]


def no_progress(_: str) -> None:
    """Default progress sink: say nothing."""


class ServiceHandle(ABC):
    """One service on one loopback port with its state in `data_dir`; `start()` again reuses that state."""

    name: str = "service"
    port_flag: str = "--port"

    def __init__(self, port: int, data_dir: Path, start_timeout: float, progress: Progress = no_progress) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.start_timeout = start_timeout
        self.progress = progress
        self._port = port
        self._process = ManagedProcess(
            self.name, self.data_dir / f"{self.name}.run.json", self.log_file, self._marker()
        )

    @property
    def log_file(self) -> Path:
        """Where the service's own output goes."""
        return self.data_dir / f"{self.name}.log"

    @property
    def port(self) -> int:
        """The port it listens on: the live one if running, else the configured one."""
        rec = self._process.record()
        return rec.port if rec is not None else self._port

    @property
    def pid(self) -> int | None:
        """Pid of the running service, or None."""
        rec = self._process.record()
        return rec.pid if rec is not None else None

    def is_running(self) -> bool:
        """True while its process is alive (it may still be starting)."""
        return self._process.is_running()

    def start(self) -> bool:
        """Start it and wait until it answers; False (and nothing done) if it was already running."""
        if self._process.is_running():
            return False
        if port_open(self._port):
            raise ConfigError(
                f"{self.name}: port 127.0.0.1:{self._port} is already in use by another process: "
                f"stop that process or pass {self.port_flag} N"
            )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._prepare()
        self._process.spawn(self._argv(), self._port, cwd=self.data_dir, env=self._env())
        self._wait_ready()
        return True

    def stop(self, timeout: float = 30.0) -> bool:
        """Graceful stop (SIGTERM, then SIGKILL after `timeout` s); False if it was not running."""
        return self._process.stop(timeout)

    def kill(self) -> bool:
        """SIGKILL, as a crash would; the data directory stays for `start()` to recover from."""
        return self._process.kill()

    def log_files(self) -> list[Path]:
        """The service's log files: its captured output, plus any log the service writes itself."""
        return [self.log_file]

    def log_tail(self, lines: int = 25) -> str:
        """Last lines of every non-empty log of the service, for error messages."""
        parts = [tail(path, lines) for path in self.log_files() if path.exists() and path.stat().st_size > 0]
        return "\n".join(parts) if parts else f"(no log output in {self.data_dir})"

    def _env(self) -> dict[str, str] | None:
        """The child's environment; None inherits this process's (every service but the exporter)."""
        return None

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self._process.exited():
                self._process.stop(1.0)
                raise ServiceStartError(f"{self.name} exited during start-up (log {self.log_file}):\n{self.log_tail()}")
            if self._ready():
                return
            if time.monotonic() >= deadline:
                self._process.stop(5.0)
                raise ServiceStartError(
                    f"{self.name} did not answer on 127.0.0.1:{self._port} within {self.start_timeout:.0f} s "
                    f"(log {self.log_file}):\n{self.log_tail()}"
                )
            time.sleep(0.2)

    @abstractmethod
    def _marker(self) -> str:
        """A string the service's command line contains (guards against recycled pids)."""

    @abstractmethod
    def _prepare(self) -> None:
        """Install what is missing and write config before the first spawn."""

    @abstractmethod
    def _argv(self) -> list[str]:
        """The command line that runs the service in the foreground."""

    @abstractmethod
    def _ready(self) -> bool:
        """One quick probe: True once the service answers requests."""
