"""The ledger's highly available shape on loopback: a Redis primary, replicas and Redis Sentinel.

Debian's `redis-server` and `redis-sentinel` (installed with apt-get as root when missing), each
with its own data directory; primary and replicas all run AOF with `appendfsync always`, since a
failover makes a replica the ledger. `SentinelLedger.url` is the `redis+sentinel://` URL the ledger
takes; a node's `kill()` + `wait_failover()` is the failover the tests drive. With a
`NodeSecurity`, every node and sentinel listens on TLS only, nodes take ACL users (replication as
user `replica`, Sentinel as user `sentinel`) and the URL is `rediss+sentinel://`.
"""

from __future__ import annotations

__all__ = ["ReplicaHandle", "SentinelHandle", "SentinelLedger"]

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dpstream.workers.localstack import sysdeps
from dpstream.workers.localstack.errors import ServiceStartError
from dpstream.workers.localstack.handle import Progress, ServiceHandle, no_progress
from dpstream.workers.localstack.paths import render_template
from dpstream.workers.localstack.ports import HOST, free_port
from dpstream.workers.localstack.redis import RedisHandle
from dpstream.workers.localstack.redis_secure import NodeSecurity, SecureRedisHandle, SecureReplicaHandle

SENTINEL = sysdeps.Requirement("redis-sentinel", "redis-sentinel")


class ReplicaHandle(RedisHandle):
    """A redis-server started as a replica of `primary_port` (Sentinel may point it elsewhere later)."""

    def __init__(self, port: int, data_dir: Path, primary_port: int, progress: Progress = no_progress) -> None:
        super().__init__(port, data_dir, progress=progress)
        self.primary_port = primary_port

    def _prepare(self) -> None:
        super()._prepare()
        extra = render_template("redis-replica.conf", primary_port=self.primary_port, auth="")
        with self.conf_file.open("a", encoding="utf-8") as conf:
            conf.write("\n" + extra)


def _replication(port: int, **kwargs: Any) -> dict[str, object]:
    """`INFO replication` of the node on `port` ({} when it does not answer)."""
    import redis

    client = redis.Redis(host=HOST, port=port, socket_connect_timeout=0.5, socket_timeout=1.0, **kwargs)
    try:
        return dict(client.info("replication"))
    except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
        return {}
    finally:
        client.close()


class SentinelHandle(ServiceHandle):
    """One redis-sentinel monitoring the primary as `master_name`."""

    name = "sentinel"
    port_flag = "--sentinel-port"

    def __init__(
        self,
        port: int,
        data_dir: Path,
        primary_port: int,
        *,
        master_name: str = "dpstream",
        quorum: int = 1,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 3000,
        security: NodeSecurity | None = None,
        progress: Progress = no_progress,
    ) -> None:
        super().__init__(port, data_dir, 20.0, progress)
        self.security = security
        self.primary_port = primary_port
        self.master_name = master_name
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms

    @property
    def conf_file(self) -> Path:
        """The generated sentinel.conf (Sentinel rewrites it as it learns)."""
        return self.data_dir / "sentinel.conf"

    def log_files(self) -> list[Path]:
        """Captured stdout plus Sentinel's own log file."""
        return [self.log_file, self.data_dir / "sentinel-server.log"]

    def master_address(self) -> tuple[str, int] | None:
        """Where this sentinel says the primary is now, or None if it cannot answer."""
        import redis

        client = redis.Redis(host=HOST, port=self.port, socket_connect_timeout=0.5, socket_timeout=1.0, **self._tls())
        try:
            got = client.sentinel_get_master_addr_by_name(self.master_name)
        except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
            return None
        finally:
            client.close()
        if not got:
            return None
        host = got[0].decode() if isinstance(got[0], bytes) else str(got[0])
        return (host, int(got[1]))

    def known_replicas(self) -> int:
        """Replicas this sentinel knows and sees up (not down, not disconnected)."""
        import redis

        client = redis.Redis(host=HOST, port=self.port, socket_connect_timeout=0.5, socket_timeout=1.0, **self._tls())
        try:
            rows = client.sentinel_slaves(self.master_name)
        except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
            return 0
        finally:
            client.close()
        return sum(1 for r in rows if not ({"s_down", "o_down", "disconnected"} & set(str(r["flags"]).split(","))))

    def _tls(self) -> dict[str, Any]:
        return self.security.tls_kwargs() if self.security is not None else {}

    def _marker(self) -> str:
        return "sentinel"

    def _prepare(self) -> None:
        sysdeps.ensure([sysdeps.REDIS, SENTINEL], self.progress)
        text = render_template(
            "sentinel.conf",
            port=self._port,
            data_dir=self.data_dir,
            log_file=self.data_dir / "sentinel-server.log",
            master_name=self.master_name,
            primary_port=self.primary_port,
            quorum=self.quorum,
            down_after_ms=self.down_after_ms,
            failover_timeout_ms=self.failover_timeout_ms,
            auth=self._auth(),
        )
        self.conf_file.write_text(text, encoding="utf-8")

    def _auth(self) -> str:
        """TLS and the `sentinel` user's credentials on the nodes, when the group is secured."""
        if self.security is None:
            return ""
        return self.security.tls_conf(self._port) + (
            f"sentinel auth-user {self.master_name} sentinel\n"
            f"sentinel auth-pass {self.master_name} {self.security.sentinel_password}\n"
        )

    def _argv(self) -> list[str]:
        return [shutil.which("redis-sentinel") or "redis-sentinel", str(self.conf_file)]

    def _ready(self) -> bool:
        return self.master_address() is not None


class SentinelLedger:
    """A primary, `replicas` replicas and `sentinels` sentinels on free loopback ports under `base_dir`."""

    def __init__(
        self,
        base_dir: Path,
        *,
        replicas: int = 1,
        sentinels: int = 1,
        master_name: str = "dpstream",
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 3000,
        security: NodeSecurity | None = None,
        progress: Progress = no_progress,
    ) -> None:
        base = Path(base_dir).resolve()
        primary_port = free_port()
        self.master_name = master_name
        self.security = security
        self.nodes: list[RedisHandle] = []
        for i in range(replicas + 1):
            port, data = (primary_port, base / "node0") if i == 0 else (free_port(), base / f"node{i}")
            if security is not None:
                secure = SecureRedisHandle(port, data, security) if i == 0 else None
                self.nodes.append(secure or SecureReplicaHandle(port, data, security, primary_port))
            elif i == 0:
                self.nodes.append(RedisHandle(port, data, progress=progress))
            else:
                self.nodes.append(ReplicaHandle(port, data, primary_port, progress=progress))
        self.sentinels = [
            SentinelHandle(
                free_port(),
                base / f"sentinel{i}",
                primary_port,
                master_name=master_name,
                quorum=sentinels // 2 + 1,
                down_after_ms=down_after_ms,
                failover_timeout_ms=failover_timeout_ms,
                security=security,
                progress=progress,
            )
            for i in range(sentinels)
        ]

    @property
    def url(self) -> str:
        """The ledger URL: `redis+sentinel://127.0.0.1:p1,…/master-name/0`."""
        hosts = ",".join(f"{HOST}:{s.port}" for s in self.sentinels)
        scheme = "redis" if self.security is None else "rediss"
        return f"{scheme}+sentinel://{hosts}/{self.master_name}/0"

    def start(self, timeout: float = 30.0) -> None:
        """Start every node and sentinel; return once each sentinel sees every replica up. On any
        failure everything started is stopped again."""
        try:
            for node in self.nodes:
                node.start()
            for sentinel in self.sentinels:
                sentinel.start()
            self.wait_replicas(len(self.nodes) - 1, timeout)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop sentinels first (so nothing fails over during shutdown), then the nodes."""
        for handle in [*self.sentinels, *self.nodes]:
            handle.stop()

    def primary(self) -> RedisHandle:
        """The node the sentinels name as primary now."""
        addr = self.sentinels[0].master_address()
        for node in self.nodes:
            if addr is not None and node.port == addr[1]:
                return node
        raise ServiceStartError(f"sentinel names primary {addr}, which is none of this group's nodes")

    def wait_replicas(self, count: int, timeout: float = 30.0) -> None:
        """Block until the primary has `count` replicas in sync and every sentinel sees them up
        (ServiceStartError after `timeout` s)."""

        def ready() -> bool:
            info = _replication(self.primary().port, **self._admin())
            online = sum(
                1
                for k, v in info.items()
                if k.startswith("slave") and isinstance(v, dict) and v.get("state") == "online"
            )
            return online >= count and all(s.known_replicas() >= count for s in self.sentinels)

        self._wait(ready, timeout, f"{count} replicas in sync")

    def wait_failover(self, old_port: int, timeout: float = 60.0) -> RedisHandle:
        """Block until the sentinels name a primary other than `old_port`; that node."""

        def moved() -> bool:
            addrs = {s.master_address() for s in self.sentinels}
            return len(addrs) == 1 and None not in addrs and next(iter(addrs)) != (HOST, old_port)

        self._wait(moved, timeout, "a failover")
        return self.primary()

    def _admin(self) -> dict[str, Any]:
        return self.security.admin_kwargs() if self.security is not None else {}

    def _wait(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() >= deadline:
                logs = "\n".join(s.log_tail(15) for s in self.sentinels)
                raise ServiceStartError(f"sentinel group: no {what} within {timeout:.0f} s:\n{logs}")
            time.sleep(0.1)
