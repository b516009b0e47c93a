"""The whole local stack under one state directory: `up`, `status` and `down`, each idempotent."""

from __future__ import annotations

__all__ = ["Service", "CORE", "MONITORING", "KAFKA_ENV", "REDIS_ENV", "ServiceStatus", "StackConfig", "Stack"]

import dataclasses
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path

from dpstream.workers.localstack.exporter import ExporterHandle
from dpstream.workers.localstack.handle import Progress, ServiceHandle, no_progress
from dpstream.workers.localstack.kafka import KafkaCluster, KafkaHandle
from dpstream.workers.localstack.monitoring import EXPORTER_PORT, AlertmanagerHandle, PrometheusHandle
from dpstream.workers.localstack.paths import default_home
from dpstream.workers.localstack.ports import HOST, Ports
from dpstream.workers.localstack.redis import RedisHandle


class Service(Enum):
    """A service of the local stack; the order here is the start order (and reversed, the stop order)."""

    REDIS = "redis"
    """Budget ledger store (AOF, fsync always)."""
    KAFKA = "kafka"
    """Event source, partials and releases topics."""
    EXPORTER = "exporter"
    """`dpstream exporter`: the budget gauges of the stack's Redis for one topology (needs `topology`)."""
    ALERTMANAGER = "alertmanager"
    """Receives the budget alerts (the webhook receivers of the monitored stack)."""
    PROMETHEUS = "prometheus"
    """Scrapes the workers' /metrics."""


CORE: tuple[Service, ...] = (Service.REDIS, Service.KAFKA)
MONITORING: tuple[Service, ...] = (Service.EXPORTER, Service.ALERTMANAGER, Service.PROMETHEUS)

KAFKA_ENV = "DPSTREAM_KAFKA"
REDIS_ENV = "DPSTREAM_REDIS"
"""The variables the example topologies read (`${DPSTREAM_KAFKA:-...}`): `up` and `status` print them to paste."""


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
        port = str(self.port) if self.port else "-"  # 0: picked at start (the exporter without --exporter-port)
        name = self.name or self.service.value
        text = f"{name:<13} {'up' if self.up else 'down':<5} pid {pid:<8} port {port:<6} {self.address}"
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
    topology: Path | None = None
    """The topology the exporter serves the budgets of (required to start the exporter)."""


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
            Service.EXPORTER: ExporterHandle(
                ports.exporter,
                home / "exporter",
                self.config.topology,
                avoid=frozenset(p for p in dataclasses.astuple(ports) if p is not None),
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
    def kafka_cluster(self) -> KafkaCluster:
        """Every Kafka node (one unless `brokers` > 1); `.bootstrap` lists them all."""
        return self._cluster

    @property
    def redis(self) -> RedisHandle:
        """The Redis handle (`.url`)."""
        handle = self._handles[Service.REDIS]
        assert isinstance(handle, RedisHandle)
        return handle

    @property
    def exporter(self) -> ExporterHandle:
        """The exporter handle (`.url`)."""
        handle = self._handles[Service.EXPORTER]
        assert isinstance(handle, ExporterHandle)
        return handle

    @property
    def prometheus(self) -> PrometheusHandle:
        """The Prometheus handle (`.url`)."""
        handle = self._handles[Service.PROMETHEUS]
        assert isinstance(handle, PrometheusHandle)
        return handle

    def exports(self, services: Iterable[Service] = CORE) -> dict[str, str]:
        """`KAFKA_ENV` / `REDIS_ENV` and their values, for those of `services` that are running (live ports)."""
        wanted = set(services)
        out = {}
        if Service.KAFKA in wanted and self.kafka.is_running():
            out[KAFKA_ENV] = self._cluster.bootstrap
        if Service.REDIS in wanted and self.redis.is_running():
            out[REDIS_ENV] = self.redis.url
        return out

    def exporter_scrape_port(self) -> int:
        """The port the default prometheus.yml scrapes as dpstream-exporter: the running exporter's, else
        the configured `--exporter-port`, else the exporter's own default."""
        if self.exporter.is_running():
            return self.exporter.port
        return self.config.ports.exporter or EXPORTER_PORT

    def up(self, services: Iterable[Service] = CORE) -> list[ServiceStatus]:
        """Start the services that are not running, in dependency order; running ones are left alone.
        Everything that can be refused (the exporter's topology) is refused before anything starts."""
        ordered = _ordered(services)
        if Service.EXPORTER in ordered and not self.exporter.is_running():
            self.exporter.check(self._child_env())
        statuses = []
        for service in ordered:
            handle = self._handles[service]
            started_at = time.monotonic()
            self._wire(service)
            if service is Service.KAFKA and len(self._cluster.nodes) > 1:
                note = f"cluster started in {time.monotonic() - started_at:.1f} s" if self._cluster.start() else ""
                statuses += [replace(s, note=note or "already up") for s in self._kafka_statuses()]
                continue
            if handle.start():
                note = f"started in {time.monotonic() - started_at:.1f} s"
            else:
                note = "already up"
                wanted = self._configured_port(service)
                if wanted is not None and handle.port != wanted:
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

    def _child_env(self) -> dict[str, str]:
        """The stack's addresses under the variables topologies read (live ports, else configured ones)."""
        return {KAFKA_ENV: self._cluster.bootstrap, REDIS_ENV: self.redis.url}

    def _wire(self, service: Service) -> None:
        """Give a service the live addresses of the ones started before it."""
        if service is Service.EXPORTER:
            self.exporter.redis_url = self.redis.url
            self.exporter.env = self._child_env()
        elif service is Service.PROMETHEUS:
            self.prometheus.exporter_port = self.exporter_scrape_port()

    def _configured_port(self, service: Service) -> int | None:
        port = getattr(self.config.ports, service.value)
        return int(port) if port is not None else None

    def _status(self, service: Service, note: str = "") -> ServiceStatus:
        handle = self._handles[service]
        pid = handle.pid
        port = handle.port
        address = {
            Service.KAFKA: f"{HOST}:{port}",
            Service.REDIS: f"redis://{HOST}:{port}/0",
            Service.EXPORTER: f"http://{HOST}:{port}/metrics",
        }.get(service, f"http://{HOST}:{port}")
        if not port:  # the exporter's port is picked when it starts
            address = "-"
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
