"""`dpstream bench TARGET`: benchmarks that print figures and ratios against an in-run baseline."""

from __future__ import annotations

import argparse
import importlib
import importlib.util

TARGETS = ("noise", "ledger", "pipeline", "release", "replay", "soak", "running-total")
"""Sub-commands; each is the module `workers.bench.<name with - as _>`."""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `bench` and one sub-parser per benchmark module present under `workers.bench`."""
    parser = subparsers.add_parser("bench", help="run a benchmark (" + ", ".join(TARGETS) + ")")
    targets = parser.add_subparsers(dest="target", metavar="TARGET")
    for name in TARGETS:
        module_name = f"dpstream.workers.bench.{name.replace('-', '_')}"
        if importlib.util.find_spec(module_name) is not None:
            importlib.import_module(module_name).register(targets)
    parser.set_defaults(func=lambda args: parser.print_help() or 2)
