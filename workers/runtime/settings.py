"""Runtime settings of one worker process: where Kafka and Redis are, who it is, its timer periods."""

from __future__ import annotations

__all__ = ["RuntimeSettings"]

from dataclasses import dataclass, field
from typing import Any

from dpstream.topology.errors import ConfigError
from dpstream.topology.model import Topology
from dpstream.workers.runtime.kafka_security import KafkaSecurity


@dataclass(frozen=True)
class RuntimeSettings:
    """Connection and timing settings; the topology says what is released, this says where and how often."""

    bootstrap: str
    redis_url: str
    worker_id: str = "worker-1"
    web_port: int | None = None
    web_bind: str = "127.0.0.1"
    """Address the web server listens on: curator-side, so loopback unless told otherwise."""
    curator_metrics: bool = False
    """Serve the curator-only metrics on `/metrics` too (`--curator-metrics`: for a restricted Prometheus)."""
    partitions: int = 4
    """Partitions of topics the worker creates when missing."""
    batch_max_records: int = 20000
    shared_batch_max_records: int = 5000
    """Records per fetch in a process that also runs the release agent (role `all`)."""
    fetch_timeout_ms: int = 100
    close_interval_s: float = 1.0
    """How often partitions check for windows whose close time passed (and read end offsets)."""
    close_grace_s: float = 0.5
    """Windows close on end offsets read at least this long after C(w): room for broker/worker clock skew."""
    max_clock_skew_s: float = 0.5
    """Window closes are held while the measured worker-broker clock skew (± its uncertainty) may exceed
    this; at most `close_grace_s`, the room the close leaves for skew."""
    clock_probe_interval_s: float = 10.0
    """How often the ingest measures the clock skew (a probe record's broker append time)."""
    sweep_interval_s: float = 2.0
    """How often charged-but-unpublished releases are republished."""
    sweep_age_s: float = 5.0
    """A charged release older than this is republished by the sweeper."""
    datadir: str = ""
    session_timeout_s: float = 6.0
    """A consumer-group member that stops heart-beating (SIGKILL, a lost host) loses its partitions after
    this. Faust's default, 60 s, held a killed worker's partitions for a minute; 6 s is the broker's
    default `group.min.session.timeout.ms`, the shortest it accepts."""
    heartbeat_interval_s: float = 1.0
    """How often members heart-beat; a third of the session timeout or less, so one lost beat is no expiry."""
    kafka_security: KafkaSecurity = field(default_factory=KafkaSecurity.from_env)
    """TLS and SASL of every Kafka client of the worker (default: the `DPSTREAM_KAFKA_*` environment)."""
    park_after_attempts: int = 8
    """A window whose release fails this many times in a row on an internal error is parked (audited,
    alerted) until `dpstream budget retry`; ledger or Kafka outages never count."""

    def __post_init__(self) -> None:
        if not self.bootstrap:
            raise ConfigError("--bootstrap: empty; give host:port of a Kafka broker")
        if self.partitions < 1:
            raise ConfigError(f"--partitions {self.partitions}: need at least 1")
        if not 0 < self.max_clock_skew_s <= self.close_grace_s:
            raise ConfigError(
                f"max_clock_skew {self.max_clock_skew_s} s: must be positive and at most the close grace "
                f"({self.close_grace_s} s), the room a window's close leaves for clock skew"
            )
        if not self.clock_probe_interval_s > 0:
            raise ConfigError(f"clock_probe_interval {self.clock_probe_interval_s} s: must be positive")
        if self.park_after_attempts < 1:
            raise ConfigError(f"park_after_attempts {self.park_after_attempts}: need at least 1")
        if not 0 < 3 * self.heartbeat_interval_s <= self.session_timeout_s:
            raise ConfigError(
                f"heartbeat interval {self.heartbeat_interval_s} s: must be positive and at most a third of "
                f"the session timeout ({self.session_timeout_s} s)"
            )

    def kafka_options(self) -> dict[str, Any]:
        """TLS/SASL keywords every aiokafka client of the worker is built with."""
        return self.kafka_security.client_options()

    def group_timeouts(self) -> dict[str, int]:
        """aiokafka consumer-group keywords: session timeout and heartbeat interval (ms)."""
        return {
            "session_timeout_ms": int(self.session_timeout_s * 1000),
            "heartbeat_interval_ms": int(self.heartbeat_interval_s * 1000),
        }

    def group_id(self, topology: Topology) -> str:
        """Consumer group of the worker fleet for this topology version (several workers share it)."""
        return f"dpstream-{topology.topology_version}"
