"""`dpstream demo`: the README's main job — local Kafka, Redis, Prometheus and Alertmanager, a worker and an
exporter on topology/examples/demo.yaml, a live synthetic feed, the releases beside their (demo-only) truth."""

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
        help="bring up a local stack with monitoring, run a worker and a live feed, show DP releases and the budget",
        description="Brings up Kafka, Redis, Prometheus and Alertmanager (deploy/local), says what demo.yaml costs "
        "(ε per hour) and buys (95 % CI per metric), starts a worker and an exporter, feeds synthetic clicks at "
        "wall-clock time and shows every release (noisy value ± 95 % CI beside the demo-only truth), the budget "
        "and the alerts until Ctrl-C or --duration; then prints a budget summary and stops what it started.",
    )
    parser.add_argument("--duration", default=None, help="seconds (or e.g. 2m) of live feed, then exit 0")
    parser.add_argument("--home", type=Path, default=None, help="state directory (default ~/.cache/dpstream)")
    parser.add_argument("--kafka-port", type=int, default=9092)
    parser.add_argument("--kafka-controller-port", type=int, default=19093)
    parser.add_argument("--redis-port", type=int, default=6379)
    parser.add_argument("--prometheus-port", type=int, default=9090)
    parser.add_argument("--alertmanager-port", type=int, default=9093)
    parser.add_argument("--worker-web-port", type=int, default=6066, help="the worker's /metrics (default 6066)")
    parser.add_argument("--exporter-port", type=int, default=9464, help="the exporter's /metrics (default 9464)")
    parser.add_argument(
        "--webhook-port", type=int, default=9097, help="the demo's receiver of Alertmanager's webhooks (default 9097)"
    )
    parser.add_argument("--no-monitoring", action="store_true", help="skip Prometheus, Alertmanager and the exporter")
    parser.add_argument("--rate", type=float, default=2000.0, help="synthetic events per second (default 2000)")
    parser.add_argument("--users", type=int, default=100_000, help="distinct synthetic users (default 100000)")
    parser.add_argument("--topology", type=Path, default=None, help="another topology instead of demo.yaml")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from dpstream.workers.demo import DemoOptions, run_demo

    duration = None
    if args.duration is not None:
        try:
            text = str(args.duration)
            duration = float(text) if text.replace(".", "", 1).isdigit() else parse_duration(text)
        except ValueError as exc:
            raise ConfigError(f"--duration: {exc}") from None
    if not args.rate > 0:
        raise ConfigError(f"--rate {args.rate}: must be a positive number of events per second")
    options = DemoOptions(
        duration_s=duration,
        home=args.home,
        kafka_port=args.kafka_port,
        kafka_controller_port=args.kafka_controller_port,
        redis_port=args.redis_port,
        prometheus_port=args.prometheus_port,
        alertmanager_port=args.alertmanager_port,
        worker_web_port=args.worker_web_port,
        exporter_port=args.exporter_port,
        webhook_port=args.webhook_port,
        monitoring=not args.no_monitoring,
        rate=args.rate,
        users=args.users,
        topology_path=args.topology,
    )
    return run_demo(options, say=lambda line: print(line, flush=True))
