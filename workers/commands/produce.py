"""`dpstream produce FILE`: send synthetic events for a topology's source to Kafka at a steady rate."""

from __future__ import annotations

__all__ = ["register"]

import argparse
import sys

from dpstream.topology.durations import parse_duration
from dpstream.topology.errors import ConfigError


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `produce` sub-command."""
    parser = subparsers.add_parser(
        "produce",
        help="send synthetic events (Zipf-skewed users, optional malformed ones) to a source topic",
        description="Synthetic events for a topology's source: a few heavy users, many light ones; "
        "Kafka key = privacy unit. --speedup compresses event time so short runs close long windows.",
    )
    parser.add_argument("file", help="topology YAML")
    parser.add_argument("--rate", type=float, default=1000.0, help="events per wall-clock second (default 1000)")
    parser.add_argument("--users", type=int, default=1000, help="distinct privacy units (default 1000)")
    parser.add_argument("--duration", default="10s", help="how long to send, e.g. 30s, 5m (default 10s)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the synthetic RNG (events only, never noise)")
    parser.add_argument("--malformed", type=float, default=0.0, help="fraction of malformed events (default 0)")
    parser.add_argument(
        "--speedup",
        type=float,
        default=1.0,
        help="event-time seconds per wall second (e.g. 60); a live worker dead-letters "
        "events more than the source's max_future (default 1h) ahead of its clock, so raise "
        "max_future for long accelerated feeds (the demo does)",
    )
    parser.add_argument("--source", default=None, help="source name when the topology has several")
    parser.add_argument("--bootstrap", default=None, help="Kafka bootstrap servers (default: the topology's)")
    parser.add_argument("--jsonl", default=None, help="write the events to this JSONL file instead of Kafka")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from dpstream.topology.loader import load_topology
    from dpstream.workers.synthetic.generator import EventGenerator, GeneratorConfig, write_jsonl
    from dpstream.workers.synthetic.producer import produce

    topology = load_topology(args.file)
    if not args.rate > 0:
        raise ConfigError(f"--rate {args.rate}: must be a positive number of events per second")
    try:
        duration = parse_duration(args.duration)
    except ValueError as exc:
        raise ConfigError(f"--duration: {exc}") from None
    config = GeneratorConfig(users=args.users, seed=args.seed, malformed=args.malformed, speedup=args.speedup)
    generator = EventGenerator(topology, args.source, config)
    if args.jsonl:
        count = write_jsonl(args.jsonl, generator.events(int(args.rate * duration), rate=args.rate))
        print(f"wrote {count} events to {args.jsonl}")
        return 0
    bootstrap = args.bootstrap or topology.kafka.bootstrap
    stats = produce(bootstrap, generator, args.rate, duration)
    print(
        f"sent {stats.events} events ({stats.malformed} malformed) to {generator.source.topic} "
        f"in {stats.seconds:.1f} s",
        file=sys.stdout,
    )
    return 0
