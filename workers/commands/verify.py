"""`dpstream verify --topology FILE`: check the invariants of a live deployment; exit 1 naming each violation.

Reads (never writes) the releases topic, the dead-letter topic and the ledger; see
`dpstream.workers.verify` for the checks and `dpstream.workers.verify.report` for the output.
Exit 0: no violation; 1: violations (or the deployment could not be read); 2: a usage error.
"""

from __future__ import annotations

__all__ = ["register"]

import argparse
import math
import os
from datetime import UTC


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `verify` sub-command."""
    parser = subparsers.add_parser(
        "verify",
        help="check a live deployment's invariants (releases topic, dead letters, ledger); exit 1 on any violation",
        description="Reads the releases topic, the dead-letter topic and the ledger, and names each violation "
        "in one line: a release_id published with two payloads, a published release without a charge, spend "
        "not equal to the audit stream's charges or above its cap, selection δ above its cap, a scheduled "
        "window neither released nor refused with a reason, a release published during a given ledger "
        "outage. Exit 0 when none, 1 otherwise, 2 on usage errors.",
    )
    parser.add_argument("--topology", required=True, metavar="FILE", help="the deployment's topology YAML")
    parser.add_argument(
        "--bootstrap", default=None, metavar="HOST:PORT", help="Kafka (default: $DPSTREAM_KAFKA, the topology's)"
    )
    parser.add_argument(
        "--redis", default=None, metavar="URL", help="ledger Redis (default: $DPSTREAM_REDIS, the topology's)"
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="a window must be released once its close time plus this has passed (default 60)",
    )
    parser.add_argument(
        "--since",
        default=None,
        metavar="TIME",
        help="check only windows starting at or after TIME (ISO-8601 UTC or epoch seconds); "
        "default: the schedule start",
    )
    parser.add_argument(
        "--until",
        default=None,
        metavar="TIME",
        help="check only windows closing by TIME (ISO-8601 UTC or epoch seconds), e.g. when the "
        "deployment was stopped; default: now minus --grace",
    )
    parser.add_argument(
        "--outage",
        action="append",
        default=[],
        metavar="FROM/TO",
        help="an interval (ISO-8601 UTC or epoch seconds, FROM/TO) when the ledger Redis was "
        "unreachable: nothing may be published in it unless charged before it began; repeatable",
    )
    parser.add_argument(
        "--compare-to",
        default=None,
        metavar="TOPIC",
        help="another run's releases topic (same broker): with ε large, every window both "
        "released must carry matching values",
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        default=None,
        metavar="X",
        help="absolute tolerance of --compare-to (default: 3 × both releases' 95 %% CI half-widths)",
    )
    parser.add_argument(
        "--allow-volatile",
        action="store_true",
        help="do not count a ledger Redis without AOF fsync always as a violation",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object (verify_version 2)")
    parser.set_defaults(func=_run)


def _time(text: str, option: str) -> float:
    """Epoch seconds from epoch seconds or an ISO-8601 time (UTC unless it names a zone)."""
    from datetime import datetime

    from dpstream.topology.errors import ConfigError

    try:
        value = float(text)
    except ValueError:
        try:
            dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise ConfigError(f"{option} {text!r}: not epoch seconds or an ISO-8601 time (2026-11-30T00:00Z)") from None
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=UTC)
        return dt.timestamp()
    if not math.isfinite(value):
        raise ConfigError(f"{option} {text!r}: not a finite time")
    return value


def _since(text: str | None) -> int | None:
    return None if text is None else int(_time(text, "--since"))


def _outage(text: str) -> tuple[float, float]:
    from dpstream.topology.errors import ConfigError

    start, sep, end = text.partition("/")
    if not sep:
        raise ConfigError(f"--outage {text!r}: give FROM/TO (epoch seconds or ISO-8601 times)")
    a, b = _time(start, "--outage"), _time(end, "--outage")
    if b < a:
        raise ConfigError(f"--outage {text!r}: TO is before FROM")
    return a, b


def _run(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from dpstream.topology.errors import ConfigError
    from dpstream.topology.loader import load_topology
    from dpstream.workers.verify import VerifyOptions, render_json, render_text, verify_deployment

    if not math.isfinite(args.grace) or args.grace < 0:
        raise ConfigError(f"--grace {args.grace:g}: give a number of seconds >= 0")
    if args.tolerance is not None and (not math.isfinite(args.tolerance) or args.tolerance < 0):
        raise ConfigError(f"--tolerance {args.tolerance:g}: give a number >= 0")
    if args.tolerance is not None and not args.compare_to:
        raise ConfigError("--tolerance: only meaningful with --compare-to TOPIC")
    topology = load_topology(args.topology)
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # its connection errors come back as one line
    options = VerifyOptions(
        bootstrap=args.bootstrap or os.environ.get("DPSTREAM_KAFKA", "").strip() or topology.kafka.bootstrap,
        redis_url=args.redis or os.environ.get("DPSTREAM_REDIS", "").strip() or topology.redis.url,
        grace_s=args.grace,
        since_s=_since(args.since),
        compare_to=args.compare_to,
        tolerance=args.tolerance,
        allow_volatile=args.allow_volatile,
        until_s=_time(args.until, "--until") if args.until is not None else None,
        outages=tuple(_outage(text) for text in args.outage),
    )
    report = asyncio.run(verify_deployment(topology, options))
    print(render_json(report) if args.json else render_text(report), flush=True)
    return 0 if report.ok else 1
