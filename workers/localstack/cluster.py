"""A Redis Cluster of local primaries for the ledger (Debian's redis-server, `redis-cli --cluster create`).

Each node is the local stack's redis.conf (AOF, fsync always) plus templates/redis-cluster.conf.
`RedisClusterGroup.url` is the `redis+cluster://` URL the ledger takes.
"""

from __future__ import annotations

__all__ = ["ClusterNodeHandle", "RedisClusterGroup"]

import shutil
import subprocess
import time
from pathlib import Path

from dpstream.workers.localstack.errors import ServiceStartError
from dpstream.workers.localstack.handle import Progress, no_progress
from dpstream.workers.localstack.paths import render_template
from dpstream.workers.localstack.ports import HOST, free_port
from dpstream.workers.localstack.redis import RedisHandle


class ClusterNodeHandle(RedisHandle):
    """A redis-server with cluster mode on (its cluster state in `data_dir/nodes.conf`)."""

    def __init__(
        self, port: int, data_dir: Path, bus_port: int, node_timeout_ms: int = 5000, progress: Progress = no_progress
    ) -> None:
        super().__init__(port, data_dir, progress=progress)
        self.bus_port = bus_port
        self.node_timeout_ms = node_timeout_ms

    def _prepare(self) -> None:
        super()._prepare()
        extra = render_template(
            "redis-cluster.conf", data_dir=self.data_dir, node_timeout_ms=self.node_timeout_ms, bus_port=self.bus_port
        )
        with self.conf_file.open("a", encoding="utf-8") as conf:
            conf.write("\n" + extra)


class RedisClusterGroup:
    """`primaries` cluster nodes on free loopback ports under `base_dir`, slots spread evenly, no replicas."""

    def __init__(self, base_dir: Path, primaries: int = 3, progress: Progress = no_progress) -> None:
        base = Path(base_dir).resolve()
        ports = _distinct_free_ports(2 * primaries)
        self.nodes = [
            ClusterNodeHandle(ports[2 * i], base / f"node{i}", ports[2 * i + 1], progress=progress)
            for i in range(primaries)
        ]

    @property
    def url(self) -> str:
        """`redis+cluster://127.0.0.1:p1,127.0.0.1:p2,…` (every node a seed)."""
        return "redis+cluster://" + ",".join(f"{HOST}:{n.port}" for n in self.nodes)

    def start(self, timeout: float = 60.0) -> None:
        """Start the nodes, create the cluster once (a restart keeps nodes.conf), wait until it serves;
        on any failure every node started is stopped again."""
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise

    def _start(self, timeout: float) -> None:
        for node in self.nodes:
            node.start()
        if not all(self._state(n.port)[1] for n in self.nodes):
            argv = [shutil.which("redis-cli") or "redis-cli", "--cluster", "create"]
            argv += [f"{HOST}:{n.port}" for n in self.nodes] + ["--cluster-replicas", "0", "--cluster-yes"]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
            if done.returncode != 0:
                raise ServiceStartError(f"redis-cli --cluster create failed:\n{done.stdout}{done.stderr}")
        deadline = time.monotonic() + timeout
        while not all(self._state(n.port) == ("ok", True) for n in self.nodes):
            if time.monotonic() >= deadline:
                raise ServiceStartError(f"redis cluster {self.url}: not ok within {timeout:.0f} s")
            time.sleep(0.2)

    def stop(self) -> None:
        """Stop every node."""
        for node in self.nodes:
            node.stop()

    def flush(self) -> None:
        """Empty every node (tests)."""
        import redis

        for node in self.nodes:
            with redis.Redis(host=HOST, port=node.port) as client:
                client.flushall()

    @staticmethod
    def _state(port: int) -> tuple[str, bool]:
        """(cluster_state, all 16384 slots assigned) as the node on `port` sees it."""
        import redis

        try:
            with redis.Redis(host=HOST, port=port, socket_timeout=2.0, decode_responses=True) as client:
                info = client.execute_command("CLUSTER INFO")
        except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
            return ("down", False)
        if isinstance(info, dict):
            fields = {str(k): str(v) for k, v in info.items()}
        else:
            fields = dict(line.split(":", 1) for line in str(info).split() if ":" in line)
        return (fields.get("cluster_state", "?"), fields.get("cluster_slots_assigned") == "16384")


def _distinct_free_ports(count: int) -> list[int]:
    """`count` different free loopback ports (data and cluster-bus ports)."""
    out: list[int] = []
    while len(out) < count:
        port = free_port()
        if port not in out:
            out.append(port)
    return out
