"""Redis for the budget ledger: Debian's redis-server with AOF `appendfsync always`, one data dir per instance."""

from __future__ import annotations

__all__ = ["RedisHandle", "render_redis_conf", "start_redis"]

import shutil
from pathlib import Path

from dpstream.workers.localstack import sysdeps
from dpstream.workers.localstack.handle import Progress, ServiceHandle, no_progress
from dpstream.workers.localstack.paths import render_template
from dpstream.workers.localstack.ports import HOST


def render_redis_conf(port: int, data_dir: Path) -> str:
    """The redis.conf text: loopback only, AOF with fsync on every write, no RDB snapshots."""
    data_dir = Path(data_dir).resolve()
    return render_template("redis.conf", port=port, data_dir=data_dir, log_file=data_dir / "redis-server.log")


class RedisHandle(ServiceHandle):
    """A local redis-server; `kill()` + `start()` recovers from the same AOF (the ledger's crash test)."""

    name = "redis"
    port_flag = "--redis-port"

    def __init__(
        self, port: int, data_dir: Path, start_timeout: float = 20.0, progress: Progress = no_progress
    ) -> None:
        super().__init__(port, data_dir, start_timeout, progress)

    @property
    def url(self) -> str:
        """redis:// URL for redis-py (`redis.Redis.from_url`)."""
        return f"redis://{HOST}:{self.port}/0"

    @property
    def conf_file(self) -> Path:
        """The generated redis.conf."""
        return self.data_dir / "redis.conf"

    @property
    def server_log(self) -> Path:
        """Redis's own log file (set by `logfile` in the config)."""
        return self.data_dir / "redis-server.log"

    def log_files(self) -> list[Path]:
        """Captured stdout plus Redis's own log file."""
        return [self.log_file, self.server_log]

    def _marker(self) -> str:
        return "redis-server"

    def _prepare(self) -> None:
        sysdeps.ensure([sysdeps.REDIS], self.progress)
        self.conf_file.write_text(render_redis_conf(self._port, self.data_dir), encoding="utf-8")

    def _argv(self) -> list[str]:
        return [shutil.which("redis-server") or "redis-server", str(self.conf_file)]

    def _ready(self) -> bool:
        import redis  # imported here: the stack's CLI should start fast

        client = redis.Redis(host=HOST, port=self._port, socket_connect_timeout=0.5, socket_timeout=1.0)
        try:
            return bool(client.ping())
        except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
            return False  # ResponseError: "LOADING" while it replays the AOF
        finally:
            client.close()


def start_redis(port: int, data_dir: Path, progress: Progress = no_progress) -> RedisHandle:
    """Start (or find already running) a Redis on 127.0.0.1:`port` with its AOF in `data_dir`."""
    handle = RedisHandle(port, data_dir, progress=progress)
    handle.start()
    return handle
