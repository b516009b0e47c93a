"""`dpstream worker FILE`: run one stream worker (a Faust app) for a topology until SIGTERM/SIGINT."""

from __future__ import annotations

__all__ = ["register"]

import argparse
import os
import socket


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
    parser.add_argument("--partitions", type=int, default=4, help="partitions of topics created when missing")
    parser.add_argument("--datadir", default=None, help="Faust data directory (default: a per-worker temp dir)")
    parser.add_argument("--loglevel", default="WARNING", help="log level (default WARNING)")
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
    import tempfile

    from dpstream.topology.errors import ConfigError

    if not 0 <= args.nice <= 19:
        raise ConfigError(f"--nice {args.nice}: out of range; give 0 (unchanged) to 19 (lowest priority)")
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
    settings = RuntimeSettings(
        bootstrap=args.bootstrap or topology.kafka.bootstrap,
        redis_url=args.redis or topology.redis.url,
        worker_id=worker_id,
        web_port=args.web_port,
        web_bind=args.web_bind,
        partitions=args.partitions,
        datadir=args.datadir or tempfile.mkdtemp(prefix=f"dpstream-{worker_id}-"),
        kafka_security=KafkaSecurity.from_env(kafka=topology.kafka),
    )
    return run_worker(build_runtime(topology, settings, Role(args.role)), loglevel=args.loglevel)
