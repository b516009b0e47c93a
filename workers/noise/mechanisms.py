"""Release mechanisms: true aggregates in, `NoisyRelease` out, charged exactly what the plan says.

`build_release_mechanism(metric, accounting, cost, delta=...)` builds (once per argument set,
cached) the OpenDP measurements for one release of `metric` at the granted `cost`, checking each
privacy map against the charge. Counts are noised as integers; real sums and means on a
fixed-point grid (`workers.noise.grid`); a mean without public denominator is a centred noisy
sum over a noisy count (cost split as `topology.calibration` says); histograms are one vector
release; top-k is OpenDP's noisy top-k; quantiles are OpenDP's private quantile per level
(`workers.noise.quantiles`); data-derived keys pass Laplace/Gaussian thresholding with the
partition-selection δ the plan grants (`delta`).

The noisy-ratio mean's interval is approximate (delta method on the noisy parts, post-processing
only): h ≈ z·√(σ_sum² + m̂²σ_count²)/max(n̂, 1), m̂ the noisy centred mean, capped at the bounds' width.
"""

from __future__ import annotations

__all__ = ["ReleaseMechanism", "build_release_mechanism", "TOP_K_SELECTION_SHARE"]

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any

from dpstream.topology.calibration import Z95, NoiseComponent, calibrate
from dpstream.topology.errors import InternalError
from dpstream.topology.model import Accounting, Aggregate, Mechanism, Metric
from dpstream.topology.selection import TOP_K_SELECTION_SHARE  # the plan's split, shared so both agree
from dpstream.workers.noise import discrete, measurements
from dpstream.workers.noise.grid import FixedPointGrid, at_range_end, choose_grid
from dpstream.workers.noise.release import FrozenFields, NoisyRelease, apply_postprocess
from dpstream.workers.release.event import Noise, NoiseEvent, PrivacyEvent

_NAMES = {Mechanism.LAPLACE: "discrete_laplace", Mechanism.GAUSSIAN: "discrete_gaussian"}
_EVENT_NOISE = {Mechanism.LAPLACE: Noise.LAPLACE, Mechanism.GAUSSIAN: Noise.GAUSSIAN}
_I64 = 2**63


@dataclass(frozen=True)
class _Codec:
    """How a true aggregate becomes grid integers and back: value ≈ units × unit."""

    unit: float
    per_key_units: int
    grid: FixedPointGrid | None
    """None for integer aggregates (counts), which are noised as they are."""
    divisor: float = 1.0
    """Public denominator of a mean: its input is the clamped raw sum, divided exactly here."""

    def encode(self, value: float | int) -> int:
        if self.grid is not None:
            exact = value if isinstance(value, Fraction) else Fraction(float(value))  # Fraction: an exact sum
            return self.grid.encode(exact / Fraction(self.divisor))
        if type(value) is int and -_I64 <= value < _I64:  # a plain count (the common case) is itself
            return value
        if isinstance(value, bool) or not float(value).is_integer():
            raise InternalError(f"count aggregate {type(value).__name__} is not an integer")
        return int(value)

    def decode(self, units: int) -> float:
        return self.grid.decode(units) if self.grid is not None else float(units)

    def decode_keys(self, keys: Iterable[str], units: Iterable[int]) -> dict[str, float]:
        """{key: decode(units)} over paired keys and units."""
        if self.grid is None:
            return dict(zip(keys, map(float, units), strict=True))
        return dict(zip(keys, map(self.grid.decode, units), strict=True))


def _exact(value: Any) -> float | Fraction:
    """A Fraction (an exact pipeline sum) as it is; anything else as a float."""
    return value if isinstance(value, Fraction) else float(value)


def _codec(component: NoiseComponent, integer: bool, divisor: float | None = None) -> _Codec:
    if integer:
        linf = component.sensitivity.linf
        if not float(linf).is_integer():
            raise InternalError(f"integer aggregate with non-integer sensitivity {linf}")
        return _Codec(1.0, int(linf), None)
    grid = choose_grid(component.sensitivity.linf, component.scale)
    return _Codec(grid.step, grid.per_key_units, grid, divisor or 1.0)


def _keys_touched(metric: Metric) -> int:
    return metric.contribution.max_keys if metric.group_by is not None else 1


def _released_keys(metric: Metric) -> tuple[str, ...] | None:
    """The public key list ('' for ungrouped), or None when keys come from the data."""
    if metric.group_by is None:
        return ("",)
    return metric.keys


def _noise(component: NoiseComponent, accounting: Accounting, codec: _Codec, keys: int) -> measurements.IntegerNoise:
    l1 = keys * codec.per_key_units
    l2 = math.sqrt(keys) * codec.per_key_units
    return measurements.integer_noise(component.mechanism, accounting, component.cost, l1, l2)


def _spread(noise: measurements.IntegerNoise, codec: _Codec) -> dict[str, float]:
    out = {"scale": noise.scale * codec.unit, "stddev": noise.stddev * codec.unit}
    if codec.grid is not None:
        out["grid_step"] = codec.unit
    return out


def _selection_info(thr: measurements.Threshold, unit: float, granted: float) -> dict[str, Any]:
    return {"mechanism": thr.name, "threshold": thr.threshold * unit, "delta": thr.delta, "delta_granted": granted}


def _noise_event(noise: measurements.IntegerNoise) -> NoiseEvent:
    """Integer noise as drawn: its scale and d_in (L2 for the Gaussian, L1 for Laplace) in integer units."""
    return NoiseEvent(_EVENT_NOISE[noise.mechanism], noise.scale, noise.d_in, noise.cost)


def _event(
    metric: Metric,
    accounting: Accounting,
    cost: float,
    parts: tuple[NoiseEvent, ...],
    thr: measurements.Threshold | None,
) -> PrivacyEvent:
    """The privacy event of a release at `cost`, its partition-selection δ the threshold's map (if
    any), with the metric's `contribution.max_windows` (the period composes only its m largest)."""
    delta = thr.delta if thr is not None else 0.0
    return PrivacyEvent(accounting, cost, parts, delta=delta, max_windows=metric.contribution.max_windows)


class ReleaseMechanism:
    """One metric's release at one cost: `release(true_values) -> NoisyRelease`."""

    metric: Metric
    cost: float
    delta: float
    event: PrivacyEvent
    """What a release at this cost is for privacy accounting (the record's `event`)."""
    partition_selection: dict[str, Any] | None = None
    """Static partition-selection facts (mechanism, threshold, δ) for the plan, or None."""
    clamped: int = 0
    """Keys whose true value was clamped to the fixed-point grid's range before noise, over this
    mechanism's releases: an un-noised fact about the data, so curator-side only (never in a record)."""

    def release(self, true_values: Mapping[str, Any]) -> NoisyRelease:  # pragma: no cover - interface
        """Noise one window's true aggregates."""
        raise NotImplementedError

    def noise_batch(self, true_value: Any, n: int) -> list[float]:  # pragma: no cover - interface
        """n independent releases of one key's true value, before post-processing (tests, audit)."""
        raise NotImplementedError


class _ValueRelease(ReleaseMechanism):
    """Counts, sums and means over a public denominator: one noisy integer per key.

    Inputs per key: an int count, or a clamped raw float sum (also for a public-denominator
    mean, which is noised on a grid in mean units and released as sum / denominator).
    """

    def __init__(self, metric: Metric, accounting: Accounting, cost: float, delta: float) -> None:
        (component,) = calibrate(metric, accounting, cost)
        self.metric, self.cost, self.delta = metric, cost, delta
        integer = metric.aggregate in (Aggregate.COUNT, Aggregate.COUNT_UNITS)
        self._codec = _codec(component, integer, metric.denominator)
        self._noise = _noise(component, accounting, self._codec, _keys_touched(metric))
        self._keys = _released_keys(metric)
        self._threshold = None
        suffix = "" if integer else "_fixed_point"
        self._name = _NAMES[component.mechanism] + suffix
        # the noise metadata of every release at this cost (read-only, the same objects in each release)
        self._spread = FrozenFields(_spread(self._noise, self._codec))
        self._ci = FrozenFields(level=discrete.LEVEL, half_width=self._noise.ci_half_width * self._codec.unit)
        self._flags = FrozenFields(apply_postprocess({}, metric.postprocess)[1])
        if self._keys is None:
            self._threshold = measurements.threshold(
                self._noise, accounting, metric.contribution.max_keys, self._codec.per_key_units, delta
            )
            self.partition_selection = _selection_info(self._threshold, self._codec.unit, delta)
        self.event = _event(metric, accounting, cost, (_noise_event(self._noise),), self._threshold)

    def release(self, true_values: Mapping[str, Any]) -> NoisyRelease:
        """Noisy value per public key (zero-filled), or per key surviving partition selection."""
        codec = self._codec
        if self._threshold is not None:
            encoded = {str(k): codec.encode(v) for k, v in true_values.items()}
            if codec.grid is not None:
                self.clamped += at_range_end(encoded.values())
            noisy_units = self._threshold.draw(encoded)
            raw = {k: codec.decode(u) for k, u in sorted(noisy_units.items())}
        else:
            assert self._keys is not None
            encode, get = codec.encode, true_values.get
            true_units = [encode(get(k, 0)) for k in self._keys]
            if codec.grid is not None:
                self.clamped += at_range_end(true_units)
            units = self._noise.draw(true_units)
            raw = codec.decode_keys(self._keys, units)
        values, _ = apply_postprocess(raw, self.metric.postprocess)  # `raw` is this release's own dict
        return NoisyRelease(
            values=values,
            mechanism=self._name,
            noise=self._spread,
            ci=self._ci,
            cost=self.cost,
            postprocess=self._flags,
            partition_selection=self.partition_selection,
            event=self.event,
        )

    def noise_batch(self, true_value: Any, n: int) -> list[float]:
        """n independent noisy copies of one key's value (one OpenDP vector call)."""
        units = self._noise.draw([self._codec.encode(true_value)] * n)
        return [self._codec.decode(u) for u in units]


class _RatioMeanRelease(ReleaseMechanism):
    """Mean without public denominator: mid + noisy centred sum / noisy count, clamped to the bounds."""

    def __init__(self, metric: Metric, accounting: Accounting, cost: float, delta: float) -> None:
        sum_part, count_part = calibrate(metric, accounting, cost)
        assert metric.bounds is not None
        self.metric, self.cost, self.delta = metric, cost, delta
        self._lower, self._upper = metric.bounds.lower, metric.bounds.upper
        self._mid = Fraction(metric.bounds.lower) / 2 + Fraction(metric.bounds.upper) / 2
        keys = _keys_touched(metric)
        self._sum_codec = _codec(sum_part, integer=False)
        self._count_codec = _codec(count_part, integer=True)
        self._sum = _noise(sum_part, accounting, self._sum_codec, keys)
        self._count = _noise(count_part, accounting, self._count_codec, keys)
        self._keys = _released_keys(metric)
        self._threshold = None
        self._name = _NAMES[sum_part.mechanism] + "_fixed_point_ratio"
        if self._keys is None:
            self._threshold = measurements.threshold(
                self._count, accounting, metric.contribution.max_keys, self._count_codec.per_key_units, delta
            )
            self.partition_selection = _selection_info(self._threshold, 1.0, delta)
        self.event = _event(
            metric, accounting, cost, (_noise_event(self._sum), _noise_event(self._count)), self._threshold
        )

    def _centred_units(self, total: float | Fraction, count: int) -> int:
        if not isinstance(total, Fraction) and not math.isfinite(total):
            raise InternalError("non-finite true sum reached the noisy-mean encoder")
        centred = Fraction(total) - self._mid * int(count)
        assert self._sum_codec.grid is not None
        return self._sum_codec.grid.encode(centred)

    def _finish(self, sum_units: int, count_units: int) -> tuple[float, float]:
        """The clamped noisy mean and its approximate 95 % half-width."""
        n_hat = max(float(count_units), 1.0)
        centred = self._sum_codec.decode(sum_units) / n_hat
        half_range = (self._upper - self._lower) / 2.0
        centred = min(max(centred, -half_range), half_range)
        s_sum = self._sum.stddev * self._sum_codec.unit
        s_count = self._count.stddev
        half = min(Z95 * math.sqrt(s_sum**2 + (centred * s_count) ** 2) / n_hat, self._upper - self._lower)
        return float(self._mid) + centred, half

    def release(self, true_values: Mapping[str, Any]) -> NoisyRelease:
        """Noisy mean per key from (clamped raw sum, count) pairs."""
        if self._threshold is not None:
            counts = self._threshold.draw({str(k): int(c) for k, (_, c) in true_values.items()})
            keys = tuple(sorted(counts))
            count_units = [counts[k] for k in keys]
        else:
            assert self._keys is not None
            keys = self._keys
            count_units = self._count.draw([int(true_values.get(k, (0.0, 0))[1]) for k in keys])
        pairs = [true_values.get(k, (0.0, 0)) for k in keys]
        centred = [self._centred_units(_exact(s), int(c)) for s, c in pairs]
        self.clamped += at_range_end(centred)
        sum_units = self._sum.draw(centred) if keys else []
        raw, halves = {}, {}
        for key, su, cu in zip(keys, sum_units, count_units, strict=True):
            raw[key], halves[key] = self._finish(su, cu)
        values, flags = apply_postprocess(raw, self.metric.postprocess)
        flags["clamp_bounds"] = True
        return NoisyRelease(
            values=values,
            mechanism=self._name,
            noise={"sum": _spread(self._sum, self._sum_codec), "count": _spread(self._count, self._count_codec)},
            ci={"level": discrete.LEVEL, "half_width": halves, "approximate": True},
            cost=self.cost,
            postprocess=flags,
            partition_selection=self.partition_selection,
            event=self.event,
        )

    def noise_batch(self, true_value: Any, n: int) -> list[float]:
        """n independent noisy means of one key's (sum, count)."""
        total, count = true_value
        sums = self._sum.draw([self._centred_units(_exact(total), int(count))] * n)
        counts = self._count.draw([int(count)] * n)
        return [self._finish(s, c)[0] for s, c in zip(sums, counts, strict=True)]


class _TopKRelease(ReleaseMechanism):
    """The k highest-count keys by OpenDP's noisy top-k; data-derived candidates are thresholded first."""

    def __init__(self, metric: Metric, accounting: Accounting, cost: float, delta: float) -> None:
        *selection, component = calibrate(metric, accounting, cost)  # ('selection',)? + 'value'
        self.metric, self.cost, self.delta = metric, cost, delta
        k = metric.k or 1
        linf = int(component.sensitivity.linf)
        self._keys = metric.keys
        self._threshold = None
        select_cost = component.cost
        parts: tuple[NoiseEvent, ...] = ()
        if selection:
            (part,) = selection
            noise = measurements.integer_noise(
                part.mechanism, accounting, part.cost, part.sensitivity.l1, part.sensitivity.l2
            )
            self._threshold = measurements.threshold(noise, accounting, metric.contribution.max_keys, linf, delta)
            self.partition_selection = _selection_info(self._threshold, 1.0, delta) | {
                "cost_share": TOP_K_SELECTION_SHARE
            }
            parts = (_noise_event(noise),)
        self._top = measurements.top_k(accounting, select_cost, k, linf)
        top = NoiseEvent(Noise.TOP_K, self._top.scale, float(linf), self._top.cost, k=self._top.k)
        self.event = _event(metric, accounting, cost, (top, *parts), self._threshold)

    def release(self, true_values: Mapping[str, Any]) -> NoisyRelease:
        """Keys in rank order; candidates are the declared keys or those surviving selection."""
        counts = {str(k): int(v) for k, v in true_values.items()}
        if self._threshold is not None:
            candidates = tuple(sorted(self._threshold.draw(counts)))
        else:
            assert self._keys is not None
            candidates = self._keys
        chosen = self._top.select([counts.get(k, 0) for k in candidates]) if candidates else []
        return NoisyRelease(
            values={},
            keys=tuple(candidates[i] for i in chosen),
            mechanism=self._top.name,
            noise={"scale": self._top.scale, "stddev": None},
            ci=None,
            cost=self.cost,
            postprocess={"round": False, "clamp_zero": False},
            partition_selection=self.partition_selection,
            event=self.event,
        )

    def noise_batch(self, true_value: Any, n: int) -> list[float]:
        """Index (into the declared keys) of the first-ranked key, n times: for tests and the audit."""
        scores = [int(true_value.get(k, 0)) for k in (self._keys or sorted(true_value))]
        return [float(self._top.select(scores)[0]) for _ in range(n)]


@lru_cache(maxsize=1024)
def _build(metric: Metric, accounting: Accounting, cost: float, delta: float) -> ReleaseMechanism:
    if metric.aggregate is Aggregate.QUANTILE:
        from dpstream.workers.noise.quantiles import QuantileRelease  # it subclasses ReleaseMechanism, from here

        return QuantileRelease(metric, accounting, cost, delta)
    if metric.aggregate is Aggregate.TOP_K:
        return _TopKRelease(metric, accounting, cost, delta)
    if metric.aggregate is Aggregate.MEAN and metric.denominator is None:
        return _RatioMeanRelease(metric, accounting, cost, delta)
    return _ValueRelease(metric, accounting, cost, delta)


def build_release_mechanism(
    metric: Metric, accounting: Accounting, cost: float, *, delta: float = 0.0
) -> ReleaseMechanism:
    """The (cached) mechanism releasing `metric` at `cost`; `delta` is its partition-selection δ.

    Raises InternalError if any OpenDP privacy map disagrees with the charge (1e-9 relative),
    or if data-derived keys are released without a δ in (0, 1).
    """
    if not math.isfinite(cost) or cost <= 0:
        raise InternalError(f"metric {metric.name!r}: release priced at non-positive cost {cost}")
    return _build(metric, accounting, float(cost), float(delta))
