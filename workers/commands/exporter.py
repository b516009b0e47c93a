"""`dpstream exporter --topology FILE`: serve the budget gauges of a ledger on /metrics, read at scrape time.

The exporter reads the ledger read-only (it registers nothing): budget gauges exist while every worker is
down, and a budget shows once however many workers run. With the ledger unreachable it still answers,
with `dpstream_ledger_up 0`. It also reads the topology's public releases topic (the broker and TLS/SASL
a worker gets: the topology's `kafka:` and the DPSTREAM_KAFKA_* variables) and serves each metric's
latest release as the feed series (`dpstream_release_value{metric,key}` …); a metric whose key set has
no bound is refused with one line on stderr, and Kafka down leaves the budget gauges served. Like a
worker's web port, it is curator-side and binds 127.0.0.1 unless
`--bind` says otherwise.
"""

from __future__ import annotations

__all__ = ["register"]

import argparse

DEFAULT_PORT = 9464


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `exporter` sub-command."""
    parser = subparsers.add_parser(
        "exporter",
        help="serve budget gauges from the ledger and the released values on /metrics",
        description="Reads the ledger at every scrape (read-only) for the topology's budget scopes, and follows "
        "the topology's releases topic for each metric's latest noisy values.",
    )
    parser.add_argument("--topology", required=True, metavar="FILE", help="topology YAML: its scopes and plan")
    parser.add_argument("--redis", default=None, metavar="URL", help="ledger Redis (default: the topology's)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"HTTP port (default {DEFAULT_PORT})")
    parser.add_argument(
        "--bind",
        default="127.0.0.1",
        metavar="HOST",
        help="address to listen on (default 127.0.0.1); metrics are curator-side: bind wider only on a "
        "network that only the curator reaches",
    )
    parser.add_argument(
        "--allow-volatile",
        action="store_true",
        help="read a Redis without AOF fsync always (loud); otherwise it counts as unavailable",
    )
    parser.add_argument("--loglevel", default="WARNING", help="log level (default WARNING)")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    import asyncio
    import logging
    import sys

    from dpstream.topology.errors import ConfigError
    from dpstream.topology.loader import load_topology
    from dpstream.workers.runtime.kafka_security import KafkaSecurity
    from dpstream.workers.telemetry.exporter import ExporterFeed, exporter_telemetry, serve

    if not 0 < args.port < 65536:
        raise ConfigError(f"--port {args.port}: out of range; give 1-65535")
    logging.basicConfig(level=args.loglevel.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    topology = load_topology(args.topology)
    url = args.redis or topology.redis.url
    if url == "memory":
        raise ConfigError("--redis memory: the in-process ledger lives in one process only: give a redis:// URL")
    feed = ExporterFeed(topology, KafkaSecurity.from_env(kafka=topology.kafka))
    for reason in feed.latest.refused.values():
        print(f"dpstream exporter: {reason}", file=sys.stderr)
    telemetry = exporter_telemetry(topology, url, allow_volatile=args.allow_volatile, feed=feed)
    serving = (
        f"dpstream exporter: serving http://{args.bind}:{args.port}/metrics ({len(topology.budgets)} budget scope(s), "
        f"feed of {topology.sinks.releases} at {topology.kafka.bootstrap}: {len(feed.latest.served)} metric(s))"
    )

    async def serve_and_say() -> None:
        """Serve; say "serving" once the port is bound (a port in use prints only the error)."""
        ready = asyncio.Event()
        server = asyncio.create_task(serve(telemetry, args.bind, args.port, ready, feed))
        bound = asyncio.create_task(ready.wait())
        await asyncio.wait({server, bound}, return_when=asyncio.FIRST_COMPLETED)
        if ready.is_set():
            print(serving, file=sys.stderr, flush=True)
        else:
            bound.cancel()
        await server

    try:
        asyncio.run(serve_and_say())
    except OSError as exc:
        raise ConfigError(f"--bind {args.bind} --port {args.port}: cannot listen ({exc.strerror or exc})") from None
    return 0
