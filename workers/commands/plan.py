"""`dpstream plan FILE [--json]`: the budget plan of a topology — costs, noise and guarantees."""

from __future__ import annotations

__all__ = ["register", "run"]

import argparse
import json


def run(args: argparse.Namespace) -> int:
    """Load the topology, build its plan and print it as a table or as JSON; returns 0."""
    from dpstream.topology.loader import load_topology
    from dpstream.topology.plan import build_plan, plan_to_json
    from dpstream.topology.plan_render import render_plan

    plan = build_plan(load_topology(args.file))
    if args.json:
        print(json.dumps(plan_to_json(plan), indent=2, ensure_ascii=False))
    else:
        print(render_plan(plan))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `plan` subcommand."""
    parser = subparsers.add_parser(
        "plan",
        help="print the budget plan of a topology (costs, noise scales, 30-day guarantee)",
        description="Per budget scope: cap, reserve, releases per period and the guarantee over 30 days; "
        "per metric: weight share, per-release cost and ε-equivalent, noise scale, σ, 95%% CI, expected error.",
    )
    parser.add_argument("file", metavar="FILE", help="topology YAML file")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON (shape: topology/plan.py)")
    parser.set_defaults(func=run)
