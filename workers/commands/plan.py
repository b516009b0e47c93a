"""`dpstream plan FILE [--json] [--weights-from REPORT.json]`: the budget plan of a topology — costs,
noise and guarantees; with `--weights-from`, the plan under the weights a period report advised
(`dpstream budget report --json`'s `advice.weights`), without changing FILE."""

from __future__ import annotations

__all__ = ["register", "run", "advised_weights"]

import argparse
import json
import math
from typing import Any

from dpstream.topology.errors import ConfigError


def advised_weights(path: str, metrics: dict[str, Any]) -> dict[str, float]:
    """`advice.weights` of a report file, checked against the topology's metrics (one-line ConfigError)."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except OSError as exc:
        raise ConfigError(
            f"--weights-from {path}: cannot read ({exc.strerror}); give a `budget report --json` file"
        ) from None
    except ValueError:
        raise ConfigError(
            f"--weights-from {path}: not JSON; give the output of `dpstream budget report --json`"
        ) from None
    weights = doc.get("advice", {}).get("weights") if isinstance(doc, dict) else None
    if not isinstance(weights, dict) or doc.get("report_version") != 1:
        raise ConfigError(
            f"--weights-from {path}: no advice.weights of a report_version 1 report; give a `budget report --json` file"
        )
    out: dict[str, float] = {}
    for name, w in weights.items():
        if name not in metrics:
            raise ConfigError(
                f"--weights-from {path}: advice.weights names metric {name!r}, which FILE does not have; "
                "give the report of this topology"
            )
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w <= 0:
            raise ConfigError(f"--weights-from {path}: advice.weights.{name} {w!r} is not a positive number")
        out[name] = float(w)
    return out


def run(args: argparse.Namespace) -> int:
    """Load the topology, build its plan (under advised weights if asked) and print it; returns 0."""
    from dpstream.topology.loader import load_topology
    from dpstream.topology.plan import build_plan, plan_to_json
    from dpstream.topology.plan_render import render_plan

    topology = load_topology(args.file)
    weights: dict[str, float] | None = None
    if args.weights_from:
        from dpstream.workers.report.advice import with_weights

        weights = advised_weights(args.weights_from, topology.metrics)
        topology = with_weights(topology, weights)
    plan = build_plan(topology)
    if args.json:
        doc = plan_to_json(plan)
        if weights is not None:
            doc["weights_from"] = {"report": args.weights_from, "weights": weights, "file_changed": False}
        print(json.dumps(doc, indent=2, ensure_ascii=False))
    else:
        if weights is not None:
            shown = ", ".join(f"{k} {v:g}" for k, v in weights.items())
            print(f"plan under the weights advised by {args.weights_from} ({shown}); {args.file} is unchanged\n")
        print(render_plan(plan))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `plan` subcommand."""
    parser = subparsers.add_parser(
        "plan",
        help="print the budget plan of a topology (costs, noise scales, 30-day guarantee)",
        description="Per budget scope: cap, reserve, releases per period and the guarantee over 30 days; "
        "per metric: weight share, per-release cost and ε-equivalent, noise scale, σ, 95 % CI, expected error.",
    )
    parser.add_argument("file", metavar="FILE", help="topology YAML file")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON (shape: topology/plan.py)")
    parser.add_argument(
        "--weights-from",
        metavar="REPORT",
        help="show the plan under the weights advised by `dpstream budget report --json` (FILE is not changed)",
    )
    parser.set_defaults(func=run)
