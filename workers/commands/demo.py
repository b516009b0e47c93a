"""`dpstream demo`: the README's main job — local Kafka + Redis, a worker on web-analytics.yaml, a live feed."""

from __future__ import annotations

__all__ = ["register"]

import argparse
from pathlib import Path

from dpstream.topology.durations import parse_duration
from dpstream.topology.errors import ConfigError


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `demo` sub-command."""
    parser = subparsers.add_parser(
        "demo",
        help="bring up a local stack, run a worker and a synthetic feed, show live DP releases",
        description="Brings up Kafka + Redis (deploy/local), prints the plan of web-analytics.yaml, starts a "
        "worker and a synthetic producer, and shows every release (noisy values ± 95 % CI) and the budget "
        "until Ctrl-C or --duration; then stops what it started.",
    )
    parser.add_argument("--duration", default=None, help="seconds (or e.g. 2m) of live feed, then exit 0")
    parser.add_argument("--home", type=Path, default=None, help="state directory (default ~/.cache/dpstream)")
    parser.add_argument("--kafka-port", type=int, default=9092)
    parser.add_argument("--kafka-controller-port", type=int, default=19093)
    parser.add_argument("--redis-port", type=int, default=6379)
    parser.add_argument("--rate", type=float, default=2000.0, help="synthetic events per second (default 2000)")
    parser.add_argument("--users", type=int, default=5000, help="distinct synthetic users (default 5000)")
    parser.add_argument("--speedup", type=float, default=60.0, help="event-time seconds per wall second (default 60)")
    parser.add_argument("--topology", type=Path, default=None, help="another topology instead of web-analytics.yaml")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from dpstream.workers.demo import DemoOptions, run_demo

    duration = None
    if args.duration is not None:
        try:
            duration = float(args.duration) if str(args.duration).replace(".", "", 1).isdigit() else parse_duration(args.duration)
        except ValueError as exc:
            raise ConfigError(f"--duration: {exc}") from None
    options = DemoOptions(
        duration_s=duration,
        home=args.home,
        kafka_port=args.kafka_port,
        kafka_controller_port=args.kafka_controller_port,
        redis_port=args.redis_port,
        rate=args.rate,
        users=args.users,
        speedup=args.speedup,
        topology_path=args.topology,
    )
    return run_demo(options, say=lambda line: print(line, flush=True))
