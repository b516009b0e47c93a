"""`deploy/local/stack up|status|down` (`python -m dpstream.workers.localstack`): the local stack from the
command line; options and service names may come in any order."""

from __future__ import annotations

__all__ = ["main", "build_parser"]

import argparse
import shlex
import sys
import time
from pathlib import Path

from dpstream.topology.errors import ConfigError, DpstreamError
from dpstream.workers.localstack.monitoring import EXPORTER_PORT, check_user_configs
from dpstream.workers.localstack.paths import default_home
from dpstream.workers.localstack.ports import Ports
from dpstream.workers.localstack.stack import CORE, MONITORING, Service, ServiceStatus, Stack, StackConfig

_DEFAULTS = Ports()
_PORT_HELP = {
    "kafka": "Kafka broker port",
    "redis": "Redis port",
    "prometheus": "Prometheus port",
    "alertmanager": "Alertmanager port",
    "kafka_controller": "Kafka KRaft controller port",
    "worker_metrics": "a worker's --web-port, scraped by the default prometheus.yml as job dpstream-worker",
}


def build_parser() -> argparse.ArgumentParser:
    """Parser of the stack command: an action, optional service names, home and ports."""
    parser = argparse.ArgumentParser(
        prog="deploy/local/stack",
        description="Run dpstream's local stack (Kafka KRaft, Redis; the exporter, Prometheus, Alertmanager) on "
        "127.0.0.1; up and status end with the DPSTREAM_KAFKA / DPSTREAM_REDIS exports to paste.",
    )
    parser.add_argument("action", choices=("up", "status", "down"))
    parser.add_argument(
        "services",
        nargs="*",
        metavar="SERVICE",
        help="kafka, redis, exporter, prometheus, alertmanager (default for up: kafka redis; for status/down: all)",
    )
    parser.add_argument(
        "--home", type=Path, default=None, help="state directory (default $DPSTREAM_HOME or ~/.cache/dpstream)"
    )
    parser.add_argument(
        "--with-monitoring",
        action="store_true",
        help="up: also `dpstream exporter` (needs --topology), Prometheus scraping it, and Alertmanager",
    )
    parser.add_argument(
        "--topology",
        type=Path,
        default=None,
        metavar="FILE",
        help="up: the topology whose budgets the exporter serves (read with DPSTREAM_KAFKA / DPSTREAM_REDIS set "
        "to the stack's addresses)",
    )
    parser.add_argument(
        "--brokers",
        type=int,
        default=1,
        metavar="N",
        help="up: Kafka KRaft nodes (default 1; 3 gives a replicated cluster, node N on --kafka-port + 100·(N-1))",
    )
    for name in ("kafka", "kafka_controller", "redis", "prometheus", "alertmanager", "worker_metrics"):
        flag = "--" + name.replace("_", "-") + "-port"
        default = getattr(_DEFAULTS, name)
        note = _PORT_HELP[name]
        parser.add_argument(
            flag, dest=f"{name}_port", type=int, default=default, metavar="N", help=f"{note} (default {default})"
        )
    parser.add_argument(
        "--exporter-port",
        type=int,
        default=None,
        metavar="N",
        help="the exporter's port (default: a free one picked at start); the default prometheus.yml scrapes the "
        f"running exporter, else this port, else {EXPORTER_PORT}",
    )
    parser.add_argument(
        "--prometheus-config",
        type=Path,
        default=None,
        metavar="FILE",
        help="prometheus.yml to use instead of the default (which loads deploy/prometheus/rules.yml and scrapes "
        "jobs dpstream-worker on --worker-metrics-port and dpstream-exporter on the exporter's port)",
    )
    parser.add_argument(
        "--alertmanager-config",
        type=Path,
        default=None,
        metavar="FILE",
        help="alertmanager.yml to use instead of the default",
    )
    return parser


def _services(args: argparse.Namespace) -> tuple[Service, ...]:
    known = [s.value for s in Service]
    for name in args.services:
        if name not in known:
            raise ConfigError(f"service {name!r}: unknown: choose from {', '.join(known)}")
    if args.services:
        chosen = tuple(Service(name) for name in args.services)
    elif args.action == "up":
        chosen = CORE
    else:
        chosen = tuple(Service)
    return chosen + MONITORING if args.with_monitoring else chosen


def _run(args: argparse.Namespace) -> int:
    if args.brokers < 1:
        raise ConfigError(f"--brokers {args.brokers}: need at least 1 Kafka broker")
    services = _services(args)
    if args.action == "up":  # before anything starts: a bad path must not leave earlier services running
        check_user_configs(args.prometheus_config, args.alertmanager_config)
        if args.topology is not None and Service.EXPORTER not in services:
            raise ConfigError(
                f"--topology {args.topology}: only the exporter reads it: add --with-monitoring (or service exporter)"
            )
    ports = Ports(
        kafka=args.kafka_port,
        kafka_controller=args.kafka_controller_port,
        redis=args.redis_port,
        prometheus=args.prometheus_port,
        alertmanager=args.alertmanager_port,
        worker_metrics=args.worker_metrics_port,
        exporter=args.exporter_port,
    )
    config = StackConfig(
        home=(args.home.expanduser().resolve() if args.home else default_home()),
        ports=ports,
        prometheus_config=args.prometheus_config,
        alertmanager_config=args.alertmanager_config,
        topology=args.topology,
    )
    stack = Stack(config, progress=lambda msg: print(msg, file=sys.stderr, flush=True), brokers=args.brokers)
    action = {"up": stack.up, "status": stack.status, "down": stack.down}[args.action]
    started = time.monotonic()
    statuses = action(services)
    print(f"# {args.action}: state in {config.home} ({time.monotonic() - started:.1f} s)")
    for status in statuses:
        print(status.line())
    if args.action != "down":
        for line in _after_lines(stack, statuses):
            print(line)
    return 0


def _after_lines(stack: Stack, statuses: list[ServiceStatus]) -> list[str]:
    """What `up` and `status` print after the table: the Prometheus URL, and the exports to paste (for the
    running Kafka and Redis) under the names the example topologies read."""
    running = {s.service for s in statuses if s.up}
    lines = []
    if len(stack.kafka_cluster.nodes) > 1 and Service.KAFKA in running:
        lines.append(f"# kafka bootstrap: {stack.kafka_cluster.bootstrap}")
    if Service.PROMETHEUS in running:
        lines.append(f"# prometheus: {stack.prometheus.url} (targets: {stack.prometheus.url}/targets)")
    exports = stack.exports(running)
    if exports:
        lines.append("# paste into your shell (topology/examples read these):")
        lines += [f"export {name}={shlex.quote(value)}" for name, value in exports.items()]
    return lines


def main(argv: list[str] | None = None) -> int:
    """Entry point; user mistakes print one line and exit 2, a service that fails to start exits 1."""
    args = build_parser().parse_intermixed_args(argv)  # `status --home H redis` as well as `status redis --home H`
    try:
        return _run(args)
    except ConfigError as exc:
        print(f"stack: error: {exc}", file=sys.stderr)
        return 2
    except DpstreamError as exc:
        print(f"stack: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
