"""`dpstream plan FILE [--json] [--weights-from REPORT.json] [--typical M=V ...] [--sample EVENTS.jsonl]`:
the budget plan of a topology — costs, noise and guarantees; with `--weights-from`, the plan under
the weights a period report advised (`dpstream budget report --json`'s `advice.weights`), without
changing FILE; with typical values (given, or from a sample: `commands._typical`), each metric's
95 % CI over its typical value and a warning where the noise swamps it."""

from __future__ import annotations

__all__ = ["register", "run", "advised_weights"]

import argparse
import json
import math
from typing import Any

from dpstream.topology.errors import ConfigError
from dpstream.workers.commands._typical import SampleTypicals, parse_typical, sample_typicals


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
    given = parse_typical(args.typical or (), topology.metrics)
    sample = sample_typicals(topology, args.sample, args.source) if args.sample else None
    comparisons = _comparisons(plan, given, sample)
    if args.json:
        doc = plan_to_json(plan, comparisons)
        if weights is not None:
            doc["weights_from"] = {"report": args.weights_from, "weights": weights, "file_changed": False}
        if sample is not None:
            doc["typical_sample"] = {
                "file": sample.path,
                "source": sample.source,
                "events": sample.events,
                "windows": sample.windows,
                "dp": False,
            }
        print(json.dumps(doc, indent=2, ensure_ascii=False))
    else:
        if weights is not None:
            shown = ", ".join(f"{k} {v:g}" for k, v in weights.items())
            print(f"plan under the weights advised by {args.weights_from} ({shown}); {args.file} is unchanged\n")
        if sample is not None:
            print("\n".join(_sample_lines(sample, given)) + "\n")
        print(render_plan(plan, comparisons))
    return 0


def _comparisons(plan: Any, given: dict[str, float], sample: SampleTypicals | None) -> dict[str, Any]:
    """metric → `TypicalComparison`; a value given with --typical wins over the sample's."""
    from dpstream.topology.plan import compare_typical

    values = {name: (v, "sample") for name, v in (sample.values if sample else {}).items()}
    values.update({name: (v, "typical") for name, v in given.items()})
    return {name: compare_typical(plan.metric(name), v, origin) for name, (v, origin) in values.items()}


def _sample_lines(sample: SampleTypicals, given: dict[str, float]) -> list[str]:
    """What the sample gave, labelled as exact figures for the curator (and which metrics it could not size)."""
    lines = [
        f"typical values from {sample.path} (source {sample.source}, {sample.events} events): exact, NOT DP; "
        "for the data owner's planning only, never publish them"
    ]
    short = [n for n, w in sample.windows.items() if not w and n not in given]
    if short:
        lines.append(f"  no whole window in the sample for {', '.join(short)}: give a longer sample or --typical")
    return lines


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `plan` subcommand."""
    parser = subparsers.add_parser(
        "plan",
        help="print the budget plan of a topology (costs, noise scales, 30-day guarantee)",
        description="Per budget scope: cap, reserve, releases per period and the guarantee over 30 days; "
        "per metric: weight share, per-release cost and ε-equivalent, noise scale, σ, 95 % CI, expected error. "
        "With typical values (--typical, --sample): CI / typical per metric and a warning where the 95 % CI "
        "exceeds the typical value (n/a for top-k and for a mean over a noisy count, whose CI the plan lacks).",
    )
    parser.add_argument("file", metavar="FILE", help="topology YAML file")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON (shape: topology/plan.py)")
    parser.add_argument(
        "--weights-from",
        metavar="REPORT",
        help="show the plan under the weights advised by `dpstream budget report --json` (FILE is not changed)",
    )
    parser.add_argument(
        "--typical",
        action="append",
        metavar="METRIC=VALUE",
        help="the typical true value of one window of METRIC (per key: the key you care about); repeatable; "
        "wins over --sample",
    )
    parser.add_argument(
        "--sample",
        metavar="EVENTS.jsonl",
        help="compute typical values from a sample of the source's events (JSON lines), bounded and windowed "
        "as the worker does: per metric the median over the sample's whole windows of the true value; per "
        "key, the smallest declared key's (data-derived keys: the median key's). The sample's figures are "
        "exact, NOT DP: a planning aid for the data owner, never to publish",
    )
    parser.add_argument("--source", metavar="NAME", help="the source --sample's events belong to (if FILE has several)")
    parser.set_defaults(func=run)
