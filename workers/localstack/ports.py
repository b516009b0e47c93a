"""Loopback ports of the local stack: defaults, validation, and picking free ones for tests."""

from __future__ import annotations

__all__ = ["HOST", "Ports", "free_port", "port_open"]

import socket
from dataclasses import dataclass, fields

from dpstream.topology.errors import ConfigError

HOST = "127.0.0.1"


@dataclass(frozen=True)
class Ports:
    """One port per service, all on 127.0.0.1; checked to be valid and distinct (the exporter's when given)."""

    kafka: int = 9092
    kafka_controller: int = 19093
    redis: int = 6379
    prometheus: int = 9090
    alertmanager: int = 9093
    worker_metrics: int = 6066
    exporter: int | None = None
    """`dpstream exporter`'s port when the stack runs it; None picks a free one at start."""

    def __post_init__(self) -> None:
        seen: dict[int, str] = {}
        for field in fields(self):
            value = getattr(self, field.name)
            if value is None and field.name == "exporter":
                continue
            flag = "--" + field.name.replace("_", "-") + "-port"
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
                raise ConfigError(f"{flag} {value!r}: not a TCP port: use an integer in 1..65535")
            if value in seen:
                raise ConfigError(
                    f"{flag} {value}: already used by --{seen[value].replace('_', '-')}-port: "
                    "give each service its own port"
                )
            seen[value] = field.name

    @property
    def kafka_bootstrap(self) -> str:
        """Kafka bootstrap servers string for clients."""
        return f"{HOST}:{self.kafka}"

    @property
    def redis_url(self) -> str:
        """redis:// URL of the stack's Redis."""
        return f"redis://{HOST}:{self.redis}/0"


def free_port(avoid: frozenset[int] = frozenset()) -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the OS picks it), not in `avoid`."""
    for _ in range(64):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((HOST, 0))
            port = sock.getsockname()[1]
        if port not in avoid:
            return int(port)
    raise ConfigError("no free loopback port found after 64 tries: free some ports on 127.0.0.1")


def port_open(port: int, host: str = HOST, timeout: float = 0.5) -> bool:
    """True when something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
