"""The whole local stack under one state directory: `up`, `status` and `down`, each idempotent."""

from __future__ import annotations

__all__ = ["Service", "CORE", "MONITORING", "ServiceStatus", "StackConfig", "Stack"]

import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path

from dpstream.workers.localstack.handle import Progress, ServiceHandle, no_progress
from dpstream.workers.localstack.kafka import KafkaHandle
from dpstream.workers.localstack.monitoring import AlertmanagerHandle, PrometheusHandle
from dpstream.workers.localstack.paths import default_home
from dpstream.workers.localstack.ports import HOST, Ports
from dpstream.workers.localstack.redis import RedisHandle


class Service(Enum):
    """A service of the local stack; the order here is the start order (and reversed, the stop order)."""

    REDIS = "redis"
    """Budget ledger store (AOF, fsync always)."""
    KAFKA = "kafka"
    """Event source, partials and releases topics."""
    ALERTMANAGER = "alertmanager"
    """Receives the budget alerts (the webhook receivers of the monitored stack)."""
    PROMETHEUS = "prometheus"
    """Scrapes the workers' /metrics."""


CORE: tuple[Service, ...] = (Service.REDIS, Service.KAFKA)
MONITORING: tuple[Service, ...] = (Service.ALERTMANAGER, Service.PROMETHEUS)


@dataclass(frozen=True)
class ServiceStatus:
    """One service's state as `status` prints it; `note` says what `up`/`down` just did."""

    service: Service
    up: bool
    pid: int | None
    port: int
    address: str
    note: str = ""

    def line(self) -> str:
        """One aligned line: service, up/down, pid, port, address, note."""
        pid = str(self.pid) if self.pid is not None else "-"
        text = (
            f"{self.service.value:<13} {'up' if self.up else 'down':<5} pid {pid:<8} port {self.port:<6} {self.address}"
        )
        return f"{text}  ({self.note})" if self.note else text


@dataclass(frozen=True)
class StackConfig:
    """Where the stack keeps state, its ports, and optional Prometheus / Alertmanager config files."""

    home: Path = field(default_factory=default_home)
    ports: Ports = field(default_factory=Ports)
    prometheus_config: Path | None = None
    alertmanager_config: Path | None = None
    kafka_libs: Path | None = None
    """Kafka's jars; default `<home>/kafka/libs` (a second home can share the first one's download)."""


class Stack:
    """The local services as one unit; handles are built from the config, state lives in the files."""

    def __init__(self, config: StackConfig | None = None, progress: Progress = no_progress) -> None:
        self.config = config or StackConfig()
        self.progress = progress
        home, ports = Path(self.config.home).resolve(), self.config.ports
        self._handles: dict[Service, ServiceHandle] = {
            Service.REDIS: RedisHandle(ports.redis, home / "redis", progress=progress),
            Service.KAFKA: KafkaHandle(
                ports.kafka,
                ports.kafka_controller,
                home / "kafka",
                libs_dir=self.config.kafka_libs or home / "kafka" / "libs",
                progress=progress,
            ),
            Service.ALERTMANAGER: AlertmanagerHandle(
                ports.alertmanager, home / "alertmanager", self.config.alertmanager_config, progress=progress
            ),
            Service.PROMETHEUS: PrometheusHandle(
                ports.prometheus,
                home / "prometheus",
                self.config.prometheus_config,
                alertmanager_port=ports.alertmanager,
                worker_metrics_port=ports.worker_metrics,
                progress=progress,
            ),
        }

    def handle(self, service: Service) -> ServiceHandle:
        """The handle of one service (for `.url`, `.bootstrap`, `.stop()`, ...)."""
        return self._handles[service]

    @property
    def kafka(self) -> KafkaHandle:
        """The Kafka handle (`.bootstrap`)."""
        handle = self._handles[Service.KAFKA]
        assert isinstance(handle, KafkaHandle)
        return handle

    @property
    def redis(self) -> RedisHandle:
        """The Redis handle (`.url`)."""
        handle = self._handles[Service.REDIS]
        assert isinstance(handle, RedisHandle)
        return handle

    def up(self, services: Iterable[Service] = CORE) -> list[ServiceStatus]:
        """Start the services that are not running, in dependency order; running ones are left alone."""
        statuses = []
        for service in _ordered(services):
            handle = self._handles[service]
            started_at = time.monotonic()
            if handle.start():
                note = f"started in {time.monotonic() - started_at:.1f} s"
            else:
                note = "already up"
                wanted = self._configured_port(service)
                if handle.port != wanted:
                    note += f" on port {handle.port}, not {wanted}: run `down` first to move it"
            statuses.append(self._status(service, note))
        return statuses

    def status(self, services: Iterable[Service] = tuple(Service)) -> list[ServiceStatus]:
        """Each service: up or down, pid, port, address."""
        return [self._status(service) for service in _ordered(services)]

    def down(self, services: Iterable[Service] = tuple(Service)) -> list[ServiceStatus]:
        """Stop running services in reverse start order; stopping a stopped service is fine."""
        statuses = []
        for service in reversed(_ordered(services)):
            before = self._status(service)
            started_at = time.monotonic()
            stopped = self._handles[service].stop()
            note = f"stopped in {time.monotonic() - started_at:.1f} s" if stopped else "was not running"
            statuses.append(replace(before, up=False, pid=None, note=note))
        return statuses

    def _configured_port(self, service: Service) -> int:
        return int(getattr(self.config.ports, service.value))

    def _status(self, service: Service, note: str = "") -> ServiceStatus:
        handle = self._handles[service]
        pid = handle.pid
        port = handle.port
        address = {
            Service.KAFKA: f"{HOST}:{port}",
            Service.REDIS: f"redis://{HOST}:{port}/0",
        }.get(service, f"http://{HOST}:{port}")
        return ServiceStatus(service=service, up=pid is not None, pid=pid, port=port, address=address, note=note)


def _ordered(services: Iterable[Service]) -> list[Service]:
    """The given services, deduplicated, in start order."""
    wanted = set(services)
    return [service for service in Service if service in wanted]
