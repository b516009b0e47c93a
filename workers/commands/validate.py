"""`dpstream validate FILE [--json]`: check a topology file; exit 0 (with warnings) or 2 with one line
per mistake (all of them, in file order)."""

from __future__ import annotations

__all__ = ["register", "run"]

import argparse
import json
import sys

from dpstream.topology.errors import ConfigError
from dpstream.topology.loader import load_with_warnings
from dpstream.topology.validation import TopologyError


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `validate` subcommand."""
    parser = subparsers.add_parser(
        "validate",
        help="check a topology file (exit 2 with one FILE:LINE: line per mistake)",
        description="Check a topology file: every mistake is one line naming FILE:LINE, the entity, "
        "the field, the bad value and the fix (exit 2); warnings are printed and exit 0.",
    )
    parser.add_argument("file", metavar="FILE", help="topology YAML file")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object on stdout")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Load and lint `args.file`; print the summary (or JSON). Every mistake of the topology is one
    stderr line (exit 2); any other ConfigError (no such file) propagates to the CLI (exit 2)."""
    try:
        topology, warnings = load_with_warnings(args.file)
    except ConfigError as exc:
        problems = exc.problems if isinstance(exc, TopologyError) else (str(exc),)
        if args.json:
            json.dump({"ok": False, "file": args.file, "error": str(exc), "errors": list(problems)}, sys.stdout)
            print()
        if not isinstance(exc, TopologyError):
            raise
        for problem in problems:
            print(f"dpstream: error: {problem}", file=sys.stderr)
        return 2
    if args.json:
        doc = {
            "ok": True,
            "file": args.file,
            "topology_version": topology.topology_version,
            "sources": len(topology.sources),
            "budgets": len(topology.budgets),
            "metrics": len(topology.metrics),
            "warnings": [{"where": w.where, "message": w.message} for w in warnings],
        }
        json.dump(doc, sys.stdout, indent=2, ensure_ascii=False)
        print()
        return 0
    print(
        f"ok: {args.file}: {len(topology.sources)} sources, {len(topology.budgets)} budgets, "
        f"{len(topology.metrics)} metrics (topology_version {topology.topology_version})"
    )
    for warning in warnings:
        print(warning)
    return 0
