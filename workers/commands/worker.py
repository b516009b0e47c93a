"""`dpstream worker FILE`: run one stream worker (a Faust app) for a topology until SIGTERM/SIGINT."""

from __future__ import annotations

__all__ = ["register"]

import argparse
import contextlib
import errno
import logging
import os
import socket
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dpstream.topology.model import Topology

LIBRARY_LOGGERS = ("faust", "mode", "aiokafka", "kafka", "aiohttp")
"""Faust's, its service library's, the Kafka clients' and the web server's loggers: at WARNING unless
`--loglevel DEBUG` (their INFO is a page per start and a line per rebalance or scrape)."""

DEFAULT_LEVEL = logging.INFO
"""dpstream's own level without `--loglevel`: one line per published release (and little else)."""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `worker` sub-command."""
    parser = subparsers.add_parser(
        "worker",
        help="run a stream worker: batched ingest, bounding, windows, noisy releases charged to the ledger",
        description="Several workers with the same topology form one consumer group and share the partitions.",
    )
    parser.add_argument("file", help="topology YAML")
    parser.add_argument("--bootstrap", default=None, help="Kafka bootstrap servers (default: the topology's)")
    parser.add_argument("--redis", default=None, help="ledger Redis URL (default: the topology's)")
    parser.add_argument("--worker-id", default=None, help="name of this worker in logs and client ids")
    parser.add_argument("--web-port", type=int, default=None, help="serve the web endpoint on this port")
    parser.add_argument(
        "--web-bind",
        default="127.0.0.1",
        metavar="HOST",
        help="address the web endpoint listens on (default 127.0.0.1); the port is curator-side: "
        "bind it wider only on a network that only the curator reaches",
    )
    parser.add_argument(
        "--curator-metrics",
        action="store_true",
        help="serve the curator-only metrics on /metrics too (events and dead letters by outcome, release "
        "outcomes, latency and lag, windows pending, parked windows, ledger call timings): for a Prometheus "
        "only the curator reads; without it /metrics serves only the data-independent metrics",
    )
    parser.add_argument("--partitions", type=int, default=4, help="partitions of topics created when missing")
    parser.add_argument("--datadir", default=None, help="Faust data directory (default: a per-worker temp dir)")
    parser.add_argument(
        "--loglevel",
        "--log-level",
        dest="loglevel",
        default=None,
        metavar="LEVEL",
        help="dpstream's log level (default INFO: one line per published release, from its public record); "
        "Faust's, aiokafka's and mode's stay at WARNING unless LEVEL is DEBUG",
    )
    parser.add_argument(
        "--role",
        choices=("all", "ingest", "release"),
        default="all",
        help="run both halves (default), only the batch ingest, or only the release agent; "
        "one ingest and one release process per machine keep release latency off the ingest GIL",
    )
    parser.add_argument(
        "--nice",
        type=int,
        default=0,
        metavar="N",
        help="lower this process's CPU priority by N (0-19) first; e.g. 19 for an ingest process that "
        "shares cores with a release process, Redis or a broker, so their short bursts run at once "
        "instead of waiting for the ingest batch's time slice",
    )
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from dpstream.topology.errors import ConfigError

    if not 0 <= args.nice <= 19:
        raise ConfigError(f"--nice {args.nice}: out of range; give 0 (unchanged) to 19 (lowest priority)")
    if args.web_port is not None and not 0 < args.web_port < 65536:
        raise ConfigError(f"--web-port {args.web_port}: out of range; give 1-65535")
    if args.curator_metrics and args.web_port is None:
        raise ConfigError("--curator-metrics: no /metrics to serve them on; give --web-port N too")
    handler_level, logging_config = worker_logging(args.loglevel)
    if args.nice:
        os.nice(args.nice)

    from dpstream.topology.loader import load_topology
    from dpstream.workers.pipeline.unit_ids import check_unit_hashing
    from dpstream.workers.runtime.app import Role, build_runtime, run_worker
    from dpstream.workers.runtime.kafka_security import KafkaSecurity
    from dpstream.workers.runtime.settings import RuntimeSettings

    topology = load_topology(args.file)
    check_unit_hashing(topology)  # a missing HMAC secret is one line now, not a traceback at the first batch
    worker_id = args.worker_id or f"{socket.gethostname()}-{os.getpid()}"
    role = Role(args.role)
    redis_url = args.redis or topology.redis.url
    # Faust would report these inside its own start, as a traceback: check them first, before Kafka too.
    if args.web_port is not None:
        _check_listen(args.web_bind, args.web_port)
    bootstrap = args.bootstrap or topology.kafka.bootstrap
    _check_ledger(redis_url, topology if role is not Role.INGEST else None, worker_id, bootstrap)
    with _datadir(args.datadir, worker_id) as datadir:
        settings = RuntimeSettings(
            bootstrap=bootstrap,
            redis_url=redis_url,
            worker_id=worker_id,
            web_port=args.web_port,
            web_bind=args.web_bind,
            curator_metrics=args.curator_metrics,
            partitions=args.partitions,
            datadir=datadir,
            kafka_security=KafkaSecurity.from_env(kafka=topology.kafka),
        )
        runtime = build_runtime(topology, settings, role)
        runtime.app.conf.logging_config = logging_config  # faust.Worker merges it into its own setup
        return run_worker(runtime, loglevel=handler_level)


class LibraryChatter(logging.Filter):
    """Drops Faust's and mode's own records below `level`, whichever logger carries them: a mode
    Service defined in dpstream (the ingest service, the idempotent producer) logs its lifecycle
    ("Starting...", "Creating topic ...") through its module's logger, i.e. under `dpstream`."""

    def __init__(self, level: int | str) -> None:
        super().__init__()
        self.level = logging.getLevelName(level) if isinstance(level, str) else level
        import faust
        import mode

        self._homes = tuple(os.path.dirname(str(package.__file__)) + os.sep for package in (faust, mode))

    def filter(self, record: logging.LogRecord) -> bool:
        """Keep a record at `level` or above, or one logged from outside Faust's and mode's code."""
        return record.levelno >= self.level or not record.pathname.startswith(self._homes)


def worker_logging(given: str | None) -> tuple[str, dict[str, Any]]:
    """(the level of Faust's log handler, the `logging_config` faust.Worker merges into its own) for
    `--loglevel given`: dpstream at `given` (default INFO), the root and `LIBRARY_LOGGERS` at
    WARNING or higher, unless `given` is DEBUG (then everything at DEBUG). Only levels change here;
    what dpstream logs is its own choice (release lines come from public records only)."""
    from dpstream.topology.errors import ConfigError

    names = logging.getLevelNamesMapping()
    if given is not None and given.upper() not in names:
        choices = ", ".join(("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"))
        raise ConfigError(f"--loglevel {given}: not a log level; give one of {choices}")
    ours = names[given.upper()] if given is not None else DEFAULT_LEVEL
    theirs = ours if ours <= logging.DEBUG else max(ours, logging.WARNING)
    name = logging.getLevelName
    config = {
        "merge": True,  # mode keeps its formatters; its handler is restated here with the filter
        "filters": {"library_chatter": {"()": LibraryChatter, "level": name(theirs)}},
        "handlers": {  # mode's own console handler (mode.utils.logging._setup_logging), at `ours`
            "default": {
                "level": name(ours),
                "class": "colorlog.StreamHandler",
                "formatter": "colored",
                "filters": ["library_chatter"],
            }
        },
        "root": {"level": name(theirs)},
        "loggers": {
            "dpstream": {"level": name(ours)},
            **{library: {"level": name(theirs)} for library in LIBRARY_LOGGERS},
        },
    }
    return name(ours), config


_LISTEN_FIXES = {
    errno.EADDRINUSE: "pick a free port",
    errno.EADDRNOTAVAIL: "give an address of this machine (or 0.0.0.0)",
    errno.EACCES: "pick a port above 1023",
}
"""The fix a `--web-bind/--web-port` bind error names, by errno (others: check the address and port)."""


def _check_listen(host: str, port: int) -> None:
    """ConfigError (one line) unless the web endpoint can listen on `host:port`: bind every address
    Faust's web server (asyncio `create_server`) would, with its SO_REUSEADDR, then close them."""
    from dpstream.topology.errors import ConfigError

    flags = f"--web-bind {host} --web-port {port}"
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(f"{flags}: cannot resolve {host} ({exc.strerror}): give an address of this machine") from None
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
    except OSError as exc:
        fix = _LISTEN_FIXES.get(exc.errno or 0, "check the address and port")
        raise ConfigError(f"{flags}: cannot listen ({(exc.strerror or str(exc)).lower()}): {fix}") from None
    finally:
        for sock in sockets:
            sock.close()


def _check_ledger(url: str, topology: Topology | None, actor: str, bootstrap: str) -> None:
    """Open and close the ledger as this worker's start will (URL, durability, the topology's scopes), so
    its ConfigError is one line before Faust starts; an unreachable ledger is left to the start, which waits.
    A publishing worker (`topology` given) also checks that its releases topic holds no record of its
    topology version from another ledger (`verify.binding`); if the ledger is unreachable now, the
    release side runs that check when it first reaches it (`ReleaseSide.start`)."""
    import asyncio
    import time

    from dpstream.workers.ledger import MEMORY, LedgerUnavailable, open_ledger
    from dpstream.workers.ledger.connection import redact
    from dpstream.workers.runtime.kafka_security import KafkaSecurity
    from dpstream.workers.verify.binding import check_publishing_ledger

    if url == MEMORY:
        return

    async def open_and_close() -> None:
        ledger = await open_ledger(url, topology, actor=actor)
        try:
            if topology is not None:
                security = KafkaSecurity.from_env(kafka=topology.kafka)
                await check_publishing_ledger(bootstrap, topology, ledger, redact(url), time.time(), security)
        finally:
            await ledger.close()

    try:
        asyncio.run(open_and_close())
    except LedgerUnavailable:
        return


@contextlib.contextmanager
def _datadir(given: str | None, worker_id: str) -> Iterator[str]:
    """`--datadir` as given, else a temporary directory removed when the worker exits (stop or error)."""
    if given:
        yield given
        return
    with tempfile.TemporaryDirectory(prefix=f"dpstream-{worker_id}-", ignore_cleanup_errors=True) as path:
        yield path
