"""`dpstream schema`: print the JSON Schema of the topology format (for editors and CI checks)."""

from __future__ import annotations

__all__ = ["register", "run"]

import argparse
import json
import os
import sys

from dpstream.topology.schema import topology_schema


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `schema` subcommand."""
    parser = subparsers.add_parser(
        "schema",
        help="print the JSON Schema (draft 2020-12) of the topology format",
        description="Print the JSON Schema of the topology YAML format, generated from the model. "
        "Point your editor at it, e.g. '# yaml-language-server: $schema=topology.schema.json'.",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Write the schema as indented JSON to stdout."""
    text = json.dumps(topology_schema(), indent=2, ensure_ascii=False) + "\n"
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:  # `dpstream schema | head` is not an error
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keeps interpreter shutdown quiet
    return 0
