"""Shared by the deploy/k8s/gen_*.py scripts: YAML output with literal blocks and the write/--check/--stdout CLI."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

import yaml

REPO = Path(__file__).resolve().parent.parent.parent
LABELS = {"app.kubernetes.io/name": "dpstream", "app.kubernetes.io/part-of": "dpstream"}


class _Dumper(yaml.SafeDumper):
    """Dumps multi-line strings as literal blocks, so embedded files and long expressions stay readable."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump(header: str, manifest: dict) -> str:
    """`header` (comment lines) followed by `manifest` as YAML, keys in insertion order."""
    return header + yaml.dump(manifest, Dumper=_Dumper, sort_keys=False, width=120, allow_unicode=True)


def main(doc: str, render: Callable[[], str], target: Path, argv: list[str] | None = None) -> int:
    """Write `render()` to `target`, or with --check exit 1 if `target` differs, or with --stdout print it."""
    parser = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--check", action="store_true", help="exit 1 if the committed file is stale")
    group.add_argument("--stdout", action="store_true", help="print instead of writing")
    args = parser.parse_args(argv)
    text = render()
    if args.stdout:
        sys.stdout.write(text)
        return 0
    if args.check:
        current = target.read_text(encoding="utf-8") if target.exists() else ""
        if current != text:
            print(f"{target.relative_to(REPO)} is stale: rerun its generator (named in its first line)", file=sys.stderr)
            return 1
        return 0
    target.write_text(text, encoding="utf-8")
    return 0
