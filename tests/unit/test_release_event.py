"""The release's privacy event (`workers.release.event`): built by every mechanism, its parts' OpenDP
maps add up to the charged cost, it survives the record's JSON, and the runtime never needs
dp_accounting for it."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from importlib.resources import files
from typing import Any

import pytest

from dpstream.topology.loader import load_topology_text
from dpstream.topology.model import Accounting, Metric
from dpstream.workers.noise import build_release_mechanism
from dpstream.workers.release.event import EventError, Noise, PrivacyEvent
from dpstream.workers.report.costcheck import components_of


def _metrics() -> list[tuple[str, Metric, Accounting]]:
    """Every example's per-window metric (a running total has no per-release mechanism: its period's one
    event is `workers.release.running`'s, tested in test_release_running_total.py)."""
    examples = files("dpstream.topology").joinpath("examples")
    out = []
    for path in sorted(examples.iterdir(), key=lambda p: p.name):
        if path.name.endswith(".yaml"):
            topo = load_topology_text(path.read_text(), path.name)
            for m in topo.metrics.values():
                if not m.running_total:
                    out.append((f"{path.name}:{m.name}", m, topo.budgets[m.budget].accounting))
    return out


_METRICS = _metrics()
_EXPECTED_NOISE = {"count", "count_units", "sum", "mean"}


def _mechanism(metric: Metric, accounting: Accounting, cost: float) -> Any:
    return build_release_mechanism(metric, accounting, cost, delta=1e-9 if metric.keys is None else 0.0)


@pytest.mark.parametrize("cost", [1e-5, 0.37])
@pytest.mark.parametrize(("name", "metric", "accounting"), _METRICS, ids=[n for n, _, _ in _METRICS])
def test_every_mechanism_builds_an_event_whose_maps_are_its_cost(
    name: str, metric: Metric, accounting: Accounting, cost: float
) -> None:
    """Each example metric's event: its cost is the charge, its parts' costs add up to it, each part's
    OpenDP map at its d_in (as the report card maps it) is that part's cost, and a selection's δ is
    the threshold's own."""
    mech = _mechanism(metric, accounting, cost)
    event = mech.event
    assert event.accounting is accounting and event.cost == cost
    assert math.isclose(math.fsum(p.cost for p in event.parts), cost, rel_tol=1e-12)
    record = {"event": json.loads(json.dumps(event.fields))}
    comps = components_of(metric, accounting, record)
    for part, comp in zip(event.parts, comps, strict=True):
        assert math.isclose(comp.mapped_cost, part.cost, rel_tol=1e-9) and comp.mapped_cost <= part.cost
    kinds = [p.mechanism for p in event.parts]
    if metric.aggregate.value == "quantile":
        assert kinds == [Noise.QUANTILE] * len(metric.quantiles or ())
        assert [p.alpha for p in event.parts] == list(metric.quantiles or ())
    elif metric.aggregate.value == "top_k":
        assert kinds[0] is Noise.TOP_K and event.parts[0].k == metric.k
        assert len(kinds) == (2 if metric.keys is None else 1)
    else:
        assert metric.aggregate.value in _EXPECTED_NOISE
        assert len(kinds) == (2 if metric.aggregate.value == "mean" and metric.denominator is None else 1)
        assert set(kinds) == {Noise.GAUSSIAN if metric.mechanism.value == "gaussian" else Noise.LAPLACE}
    selection = mech.partition_selection
    assert event.delta == (selection["delta"] if selection is not None else 0.0)
    assert event.max_windows == metric.contribution.max_windows and event.lump is None


@pytest.mark.parametrize(("name", "metric", "accounting"), _METRICS[:6], ids=[n for n, _, _ in _METRICS[:6]])
def test_the_event_round_trips_through_the_record_json(name: str, metric: Metric, accounting: Accounting) -> None:
    """`of_fields(json(fields)) == event`, and every release at one cost hands the same `fields` object."""
    mech = _mechanism(metric, accounting, 0.02)
    assert PrivacyEvent.of_fields(json.loads(json.dumps(mech.event.fields))) == mech.event
    assert mech.event.fields is mech.event.fields


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d.pop("parts"),
        lambda d: d.update(parts=[]),
        lambda d: d.update(accounting="renyi"),
        lambda d: d.update(cost="0.1"),
        lambda d: d.update(cost=math.inf),
        lambda d: d["parts"][0].update(mechanism="gumbel"),
        lambda d: d["parts"][0].update(k=0),
        lambda d: d["parts"][0].pop("d_in"),
        lambda d: d.update(parts=[1.0]),
    ],
)
def test_a_malformed_event_is_refused(change: Any) -> None:
    """A missing field or a value of the wrong kind is an EventError (a ValueError), never a wrong event."""
    topo_metric, accounting = _METRICS[0][1], _METRICS[0][2]
    doc = json.loads(json.dumps(_mechanism(topo_metric, accounting, 0.02).event.fields))
    change(doc)
    with pytest.raises(EventError):
        PrivacyEvent.of_fields(doc)
    with pytest.raises(EventError):
        PrivacyEvent.of_fields(None)


def test_the_runtime_builds_events_without_dp_accounting() -> None:
    """Building a mechanism (and so its event) and a record imports no dp_accounting."""
    code = (
        "import sys\n"
        "import dpstream.workers.noise, dpstream.workers.release, dpstream.workers.release.event\n"
        "print('dp_accounting' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
