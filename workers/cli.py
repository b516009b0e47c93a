"""The `dpstream` command line: a thin dispatcher over `workers.commands.*`.

Each subcommand lives in its own module with a `register(subparsers)` function that adds its
parser and sets `func(args) -> int`. User mistakes (`ConfigError`) print one line and exit 2;
nothing a user can fix ever shows a traceback.
"""

from __future__ import annotations

__all__ = ["main", "build_parser"]

import argparse
import importlib
import importlib.util
import sys

from dpstream.topology.errors import ConfigError, DpstreamError

COMMANDS = (
    "validate",
    "plan",
    "schema",
    "worker",
    "exporter",
    "replay",
    "produce",
    "demo",
    "budget",
    "breaker",
    "audit_privacy",
    "verify",
    "bench",
)


def build_parser() -> argparse.ArgumentParser:
    """The full parser, with every subcommand module that is present."""
    parser = argparse.ArgumentParser(
        prog="dpstream",
        description="Differentially private metrics from Kafka streams, with an atomic privacy-budget ledger.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        module_name = f"dpstream.workers.commands.{name}"
        if importlib.util.find_spec(module_name) is None:
            continue
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `dpstream` console script; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"dpstream: error: {exc}", file=sys.stderr)
        return 2
    except DpstreamError as exc:
        print(f"dpstream: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
