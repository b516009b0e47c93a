"""The whole local stack under one state directory: `up`, `status` and `down`, each idempotent."""

from __future__ import annotations

__all__ = ["Service", "CORE", "MONITORING", "ServiceStatus", "StackConfig", "Stack"]

import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path

from dpstream.workers.localstack.handle import Progress, ServiceHandle, no_progress
from dpstream.workers.localstack.kafka import KafkaCluster, KafkaHandle
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
    name: str = ""
    """The printed name when it is not the service's (`kafka-2` for the second broker of a cluster)."""

    def line(self) -> str:
        """One aligned line: service, up/down, pid, port, address, note."""
        pid = str(self.pid) if self.pid is not None else "-"
        name = self.name or self.service.value
        text = f"{name:<13} {'up' if self.up else 'down':<5} pid {pid:<8} port {self.port:<6} {self.address}"
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

    def __init__(self, config: StackConfig | None = None, progress: Progress = no_progress, brokers: int = 1) -> None:
        """`brokers` > 1 makes Kafka a KRaft cluster (`--brokers 3`; node N on port kafka + 100·(N−1))."""
        self.config = config or StackConfig()
        self.progress = progress
        home, ports = Path(self.config.home).resolve(), self.config.ports
        # A home whose state has N nodes (an earlier `up --brokers N`) is that cluster for every command.
        brokers = max(brokers, *_existing_nodes(home))
        self._cluster = KafkaCluster(
            brokers,
            ports.kafka,
            ports.kafka_controller,
            home,
            libs_dir=self.config.kafka_libs or home / "kafka" / "libs",
            progress=progress,
        )
        self._handles: dict[Service, ServiceHandle] = {
            Service.REDIS: RedisHandle(ports.redis, home / "redis", progress=progress),
            Service.KAFKA: self._cluster.nodes[0],
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
    def kafka_cluster(self) -> KafkaCluster:
        """Every Kafka node (one unless `brokers` > 1); `.bootstrap` lists them all."""
        return self._cluster

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
            if service is Service.KAFKA and len(self._cluster.nodes) > 1:
                note = f"cluster started in {time.monotonic() - started_at:.1f} s" if self._cluster.start() else ""
                statuses += [replace(s, note=note or "already up") for s in self._kafka_statuses()]
                continue
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
        """Each service (each Kafka node): up or down, pid, port, address."""
        out: list[ServiceStatus] = []
        for service in _ordered(services):
            out += self._kafka_statuses() if service is Service.KAFKA else [self._status(service)]
        return out

    def down(self, services: Iterable[Service] = tuple(Service)) -> list[ServiceStatus]:
        """Stop running services in reverse start order; stopping a stopped service is fine."""
        statuses = []
        for service in reversed(_ordered(services)):
            started_at = time.monotonic()
            if service is Service.KAFKA and len(self._cluster.nodes) > 1:
                befores = self._kafka_statuses()  # nodes stop together: one alone waits for its lost quorum
                stopped = self._cluster.stop()
                note = f"cluster stopped in {time.monotonic() - started_at:.1f} s" if stopped else "was not running"
                statuses += [replace(b, up=False, pid=None, note=note if b.up else "was not running") for b in befores]
                continue
            before = self._status(service)
            stopped = self._handles[service].stop()
            note = f"stopped in {time.monotonic() - started_at:.1f} s" if stopped else "was not running"
            statuses.append(replace(before, up=False, pid=None, note=note))
        return statuses

    def _kafka_statuses(self) -> list[ServiceStatus]:
        """One status per Kafka node: `kafka` (node 1), `kafka-2`, ..."""
        out = []
        for n, node in enumerate(self._cluster.nodes, start=1):
            pid = node.pid
            name = "kafka" if n == 1 else f"kafka-{n}"
            out.append(ServiceStatus(Service.KAFKA, pid is not None, pid, node.port, f"{HOST}:{node.port}", name=name))
        return out

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


def _existing_nodes(home: Path) -> list[int]:
    """Node numbers of Kafka state directories under `home` (`kafka` is 1, `kafka-N` is N); at least [1]."""
    found = [1]
    for path in home.glob("kafka-*"):
        suffix = path.name.removeprefix("kafka-")
        if path.is_dir() and suffix.isdigit():
            found.append(int(suffix))
    return found


def _ordered(services: Iterable[Service]) -> list[Service]:
    """The given services, deduplicated, in start order."""
    wanted = set(services)
    return [service for service in Service if service in wanted]
