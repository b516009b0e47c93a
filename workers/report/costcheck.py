"""Per-record cost check: each stored record's privacy event (`event`, see
`workers.release.event`), run through the privacy maps of the OpenDP measurements it names,
must give exactly the cost the ledger charged for it.

The event names each noisy part's mechanism, scale (integer units, ranks for a quantile) and
sensitivity d_in; the check maps every part at its d_in, and requires the parts to be the ones
the metric declares (mechanism, d_in, selections, level: what the mechanism the topology builds
at that cost names). A record whose scale or sensitivity was changed after the charge (a tampered
or corrupted ledger) maps to another cost, or names other parts, and is flagged. The parts found
here are also what the tight re-accounting composes.
"""

from __future__ import annotations

__all__ = ["Component", "RecordCheck", "check_record", "components_of"]

import math
from dataclasses import dataclass, field
from typing import Any

import opendp.prelude as dp

from dpstream.topology import accounting as acc
from dpstream.topology.errors import InternalError
from dpstream.topology.model import Accounting, Mechanism, Metric
from dpstream.topology.running_total import coefficient_norm
from dpstream.workers.ledger.units import cost_to_units
from dpstream.workers.noise import build_release_mechanism, measurements, prefix_sum
from dpstream.workers.noise.measurements import COST_RTOL
from dpstream.workers.release.event import EventError, Noise, NoiseEvent, PrivacyEvent
from dpstream.workers.report.collect import Charge

dp.enable_features("contrib")


@dataclass(frozen=True)
class Component:
    """One noisy part of a release as drawn: mechanism, integer-unit scale, sensitivity, cost by the map.

    kind: 'gaussian' (discrete Gaussian, sensitivity = L2), 'laplace' (discrete Laplace, L1) or
    'exponential' (k Gumbel / permute-and-flip selections, L∞ of the scores; `k` selections).
    """

    kind: str
    scale: float
    sensitivity: float
    mapped_cost: float
    k: int = 1
    epsilon0: float = 0.0
    """top-k only: the pure ε of one selection by OpenDP's map on monotone scores
    (`linf_distance(monotonic=True)`: counts of bounded contributions only grow when a unit is
    added), half the 2Δ∞/scale the ledger charges; what the tight PLD composes."""


@dataclass
class RecordCheck:
    """The outcome of one record's check: ok, or the problems found (one line each)."""

    release_id: str
    metric: str
    charged: float
    record_cost: float | None = None
    mapped: float | None = None
    components: list[Component] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when the record exists, names this release and its event maps to the charge."""
        return not self.problems


def _currency(accounting: Accounting, mechanism: Mechanism, mapped: float) -> float:
    """A map's output in the scope's currency (a pure ε in a zCDP scope costs ε²/2)."""
    if mechanism is Mechanism.LAPLACE and accounting is Accounting.ZCDP:
        return acc.pure_to_rho(mapped)
    return mapped


def _integer(kind: Mechanism, scale: float, d_in: float, accounting: Accounting) -> Component:
    """Discrete Gaussian (d_in an L2 distance) or Laplace (an L1 distance, a whole number) on integers."""
    meas, _pool = measurements._measurement(kind, scale)  # the same (cached) OpenDP object the releaser drew from
    if kind is Mechanism.GAUSSIAN:
        return Component("gaussian", scale, d_in, float(meas.map(d_in)))
    if not d_in.is_integer():
        raise EventError(f"discrete Laplace part with a fractional L1 sensitivity {d_in!r}")
    return Component("laplace", scale, d_in, _currency(accounting, kind, float(meas.map(int(d_in)))))


def _top_k(k: int, accounting: Accounting, scale: float, linf: int) -> Component:
    measure = dp.zero_concentrated_divergence() if accounting is Accounting.ZCDP else dp.max_divergence()
    domain = dp.vector_domain(dp.atom_domain(T="i64"))
    meas = dp.m.make_noisy_top_k(domain, dp.linf_distance(T="i64"), measure, k=k, scale=scale)
    monotone = dp.m.make_noisy_top_k(
        domain, dp.linf_distance(T="i64", monotonic=True), dp.max_divergence(), k=k, scale=scale
    )
    eps0 = float(monotone.map(linf)) / k
    return Component("exponential", scale, float(linf), float(meas.map(linf)), k=k, epsilon0=eps0)


def _quantile(accounting: Accounting, scale: float, alpha: float, candidates: list[float], d_in: int) -> Component:
    """One quantile level as drawn: OpenDP's private quantile at the event's scale (in ranks), mapped
    at d_in; for the tight accounting an exponential mechanism (one selection, k = 1) of pure ε
    2Δ/scale, Δ = max(α, 1 − α)·d_in (its scores are not monotone, so no halving)."""
    measure = dp.zero_concentrated_divergence() if accounting is Accounting.ZCDP else dp.max_divergence()
    domain = dp.vector_domain(dp.atom_domain(T=float, nan=False))
    meas = dp.m.make_private_quantile(
        domain, dp.symmetric_distance(), measure, candidates=candidates, alpha=alpha, scale=scale
    )
    sens = max(alpha, 1.0 - alpha) * d_in
    return Component("exponential", scale, sens, float(meas.map(d_in)), k=1, epsilon0=2.0 * sens / scale)


def _mapped(part: NoiseEvent, metric: Metric, accounting: Accounting) -> Component:
    """One part of an event with its OpenDP-mapped cost (in the scope's currency)."""
    if part.mechanism is Noise.GAUSSIAN:
        return _integer(Mechanism.GAUSSIAN, part.scale, part.d_in, accounting)
    if part.mechanism is Noise.MATRIX:  # a running total's period: a Gaussian on C x, as the ledger priced it
        return Component("gaussian", part.scale, part.d_in, prefix_sum.mapped_rho(part.k, part.scale, part.d_in))
    if part.mechanism is Noise.LAPLACE:
        return _integer(Mechanism.LAPLACE, part.scale, part.d_in, accounting)
    if not part.d_in.is_integer():
        raise EventError(f"{part.mechanism.value} part with a fractional d_in {part.d_in!r}")
    if part.mechanism is Noise.TOP_K:
        return _top_k(part.k, accounting, part.scale, int(part.d_in))
    if part.alpha is None:
        raise EventError("quantile part without its level alpha")
    return _quantile(accounting, part.scale, part.alpha, list(metric.candidates or ()), int(part.d_in))


def event_of(accounting: Accounting, record: dict[str, Any]) -> PrivacyEvent:
    """The record's privacy event (EventError when it has none, or one of another accounting)."""
    event = PrivacyEvent.of_fields(record.get("event"))
    if event.accounting is not accounting:
        raise EventError(f"event accounting {event.accounting.value!r} in a {accounting.value} scope")
    return event


def components_of(metric: Metric, accounting: Accounting, record: dict[str, Any]) -> list[Component]:
    """The noisy parts of a stored record's event, each with its OpenDP-mapped cost (EventError on a
    record without a readable event)."""
    return [_mapped(part, metric, accounting) for part in event_of(accounting, record).parts]


def _declared(part: NoiseEvent) -> tuple[str, float, int, float | None]:
    return (part.mechanism.value, part.d_in, part.k, part.alpha)


def _undeclared(metric: Metric, accounting: Accounting, event: PrivacyEvent) -> str | None:
    """Why the event's parts are not the ones the metric declares at the event's cost (None: they are)."""
    if metric.running_total:
        return _undeclared_running(metric, event)
    try:
        expected = build_release_mechanism(metric, accounting, event.cost, delta=event.delta).event
    except InternalError as exc:
        return f"the metric builds no mechanism at the event's cost and delta ({exc})"
    got, want = [_declared(p) for p in event.parts], [_declared(p) for p in expected.parts]
    if got != want:
        return f"event parts {got} are not the metric's {want} (mechanism, d_in, k, alpha)"
    return None


def _undeclared_running(metric: Metric, event: PrivacyEvent) -> str | None:
    """A running total's event must be one matrix Gaussian at d_in = L·‖c‖₂ over its steps (k = steps × keys)."""
    keys = len(metric.keys) if metric.keys is not None else 1
    if len(event.parts) != 1 or event.parts[0].mechanism is not Noise.MATRIX or event.parts[0].k % keys:
        return f"a running total's event is one {Noise.MATRIX.value} part over steps × {keys} keys"
    part = event.parts[0]
    want = float(metric.contribution.max_per_period or 0) * coefficient_norm(part.k // keys)
    if not math.isclose(part.d_in, want, rel_tol=1e-12):
        return f"event d_in {part.d_in!r} is not the metric's L·‖c‖₂ = {want!r}"
    return None


def check_record(charge: Charge, metric: Metric | None, accounting: Accounting) -> RecordCheck:
    """Check one charge against its stored record (see the module docstring)."""
    out = RecordCheck(charge.release_id, charge.metric, charge.cost)
    rec = charge.record
    if rec is None:
        out.problems.append("no stored record (past retention, or deleted)")
        return out
    if rec.get("_undecodable"):
        out.problems.append("stored record is not a JSON object")
        return out
    if metric is None:
        out.problems.append(f"metric {charge.metric!r} is not in the topology")
        return out
    if rec.get("release_id") != charge.release_id or rec.get("metric") != charge.metric:
        out.problems.append("stored record names another release or metric than its audit entry")
    try:
        out.record_cost = float(rec["cost"]["rho" if accounting is Accounting.ZCDP else "epsilon"])
        event = event_of(accounting, rec)
        out.components = [_mapped(part, metric, accounting) for part in event.parts]
    except (KeyError, TypeError, ValueError) as exc:  # EventError is a ValueError
        out.problems.append(f"record lacks its cost or privacy event ({type(exc).__name__}: {exc})")
        return out
    out.mapped = sum(c.mapped_cost for c in out.components)
    charged = charge.cost_units if charge.release_cost_units is None else charge.release_cost_units
    if cost_to_units(out.record_cost) != charged:
        out.problems.append(
            f"record cost {out.record_cost!r} is {cost_to_units(out.record_cost)} units; the ledger charged {charged}"
        )
    if event.cost != out.record_cost:
        out.problems.append(f"event cost {event.cost!r} is not the record's cost {out.record_cost!r}")
    undeclared = _undeclared(metric, accounting, event)
    if undeclared is not None:
        out.problems.append(undeclared)
    if not math.isclose(out.mapped, out.record_cost, rel_tol=COST_RTOL, abs_tol=0.0):
        out.problems.append(
            f"the event's scales map to {out.mapped!r} by the mechanisms' privacy maps, not the "
            f"{out.record_cost!r} charged"
        )
    elif out.mapped > out.record_cost:
        out.problems.append(f"the event's scales map to {out.mapped!r}, above the {out.record_cost!r} charged")
    return out
