"""One step of a running total (`release: running_total`) in the release protocol.

Step t of a period releases the total from the period's first step through t with correlated noise:
y_t = OpenDP's float Gaussian at σ applied to (C x)_t, published (C y)_t (`noise.prefix_sum`,
`topology.running_total`). σ is fixed by the period's lump, the cost the first step is charged
(later steps read it back from the first step's stored record), so a grant or a stretch never
moves it mid-period. The increments x and the noisy y of every step are curator-side state stored
with each step's charge (`ReleaseRequest.running_state`), so a restarted worker continues the same
noise from the ledger (`Ledger.running_steps`) and a known release id republishes its stored bytes.

A step the ledger never stored (refused after the lump: an operator's breaker, past the horizon)
counts as x = 0 and y = 0 in later totals: they stay private (a constant is data-independent) but
leave that step's increments out. Cost: two dot products of length t per key and step, and one
read of the period's stored steps (about 40 bytes per key and step).
"""

from __future__ import annotations

__all__ = ["PeriodHistory", "RunningStep", "decode_state", "encode_state", "first_step", "running_step"]

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpstream.topology.model import Accounting, Budget, Metric
from dpstream.topology.running_total import coefficient_norm, steps_per_period
from dpstream.topology.schedule import Schedule
from dpstream.workers.noise import prefix_sum
from dpstream.workers.noise.release import FrozenFields, apply_postprocess
from dpstream.workers.release.event import Noise, NoiseEvent, PrivacyEvent

MECHANISM = "gaussian_prefix_sum"
"""The record's `mechanism` of a running total's step."""


@dataclass(frozen=True)
class RunningStep:
    """What one step publishes and stores: the record's noise fields and the state its charge keeps."""

    noise_fields: dict[str, Any]
    state: bytes


def encode_state(x: list[float], y: list[float]) -> bytes:
    """A step's stored state: its increments and noisy values, one per key (floats round-trip in JSON)."""
    return json.dumps({"x": x, "y": y}, separators=(",", ":")).encode()


def decode_state(raw: bytes, keys: int) -> tuple[list[float], list[float]]:
    """(x, y) of a stored step state with `keys` values each."""
    doc = json.loads(raw)
    x, y = [float(v) for v in doc["x"]], [float(v) for v in doc["y"]]
    if len(x) != keys or len(y) != keys:
        raise ValueError(f"a stored running-total step holds {len(x)} values, the metric has {keys} keys")
    return x, y


_SIGMAS: dict[tuple[str, int, int, float], float] = {}
"""(metric, T, keys, lump) → σ: `prefix_sum.sigma_for_rho` maps up to a few dozen times per lump."""


def period_sigma(metric: Metric, budget: Budget, keys: int, lump: float) -> float:
    """σ of every y of a period whose lump is `lump` (ρ): the smallest whose mapped ρ fits the lump."""
    T = steps_per_period(metric, budget.period_s)
    key = (metric.name, T, keys, lump)
    sigma = _SIGMAS.get(key)
    if sigma is None:
        if len(_SIGMAS) >= 256:
            _SIGMAS.clear()
        bound = float(metric.contribution.max_per_period or 0)
        sigma = _SIGMAS[key] = prefix_sum.sigma_for_rho(T, bound, lump, keys)
    return sigma


_EVENTS: dict[tuple[str, int, int, float, float], PrivacyEvent] = {}
"""(metric, T, keys, lump, σ) → the period's event: built once a period, not per step (its d_in sums T terms)."""


def period_event(metric: Metric, budget: Budget, keys: int, lump: float, sigma: float) -> PrivacyEvent:
    """The record's `event` of every step of a period: the one matrix Gaussian, charged once (`max_windows` 1)."""
    T = steps_per_period(metric, budget.period_s)
    key = (metric.name, T, keys, lump, sigma)
    event = _EVENTS.get(key)
    if event is None:
        if len(_EVENTS) >= 256:
            _EVENTS.clear()
        event = _EVENTS[key] = _period_event(metric, T, keys, lump, sigma)
    return event


def _period_event(metric: Metric, T: int, keys: int, lump: float, sigma: float) -> PrivacyEvent:
    d_in = float(metric.contribution.max_per_period or 0) * coefficient_norm(T)
    part = NoiseEvent(Noise.MATRIX, sigma, d_in, lump, k=T * keys)
    return PrivacyEvent(Accounting.ZCDP, lump, (part,), max_windows=1, lump=lump)


def first_step(metric: Metric, budget: Budget, start: int, schedule_start: int | None) -> int:
    """The start of the period's first step under this deployment (its step 1)."""
    period_start = start // budget.period_s * budget.period_s
    return Schedule.of(metric, schedule_start).first_in_period(period_start)


class PeriodHistory(prefix_sum.RunningState):
    """A running total's steps of one period, from its first step at `first`: the releaser keeps one per
    (metric, period) so a step reads the ledger only after a restart, a takeover or a step it did not
    store itself (86,400 steps a day: 1.4 MB a key for x and y)."""

    __slots__ = ("first", "every", "lump")

    def __init__(self, first: int, every: int, T: int, keys: int) -> None:
        super().__init__(T, keys)
        self.first, self.every = first, every
        self.lump: float | None = None
        """The period's lump (its first step's charged cost), once known."""

    @classmethod
    def of_stored(
        cls, first: int, every: int, T: int, keys: int, stored: Mapping[int, bytes], upto: int
    ) -> PeriodHistory:
        """The history of the steps below `upto` from the ledger's stored states (`Ledger.running_steps`)."""
        history = cls(first, every, T, keys)
        for s, raw in stored.items():
            j = (s - first) // every
            if first <= s < upto and (s - first) % every == 0 and j < T:
                history.xs[:, j], history.ys[:, j] = decode_state(raw, keys)
        history.steps = (upto - first) // every
        return history

    def holds_before(self, start: int) -> bool:
        """True when it holds exactly the steps before `start`."""
        return self.first + self.steps * self.every == start

    def append_charged(self, x: np.ndarray, y: np.ndarray, cost: float) -> None:
        """Add the next step, stored with its charge at the period's lump `cost`."""
        self.append(x, y)
        self.lump = cost


def running_step(
    metric: Metric,
    budget: Budget,
    start: int,
    lump: float,
    true_values: Mapping[str, Any],
    history: PeriodHistory,
) -> tuple[RunningStep, np.ndarray, np.ndarray]:
    """Draw step `start` (the one after those `history` holds) from its true increments at the σ of
    `lump`: the step, and its x and y (for `history.append` once its charge stored them)."""
    keys = list(true_values)
    t = history.steps
    x_t = np.array([float(true_values[k]) for k in keys])
    sigma = period_sigma(metric, budget, len(keys), lump)
    y_t, totals = history.next(x_t, sigma)
    raw_values = {k: float(v) for k, v in zip(keys, totals, strict=True)}
    values, flags = apply_postprocess(raw_values, metric.postprocess)
    std = history.stddev(t + 1, sigma)
    fields: dict[str, Any] = {
        "values": values,
        "mechanism": MECHANISM,
        "noise": FrozenFields(scale=sigma, stddev=std),
        "ci": FrozenFields(level=0.95, half_width=prefix_sum.Z95 * std),
        "postprocess": FrozenFields(flags),
        "running_total": FrozenFields(
            step=t + 1, steps=steps_per_period(metric, budget.period_s), first_start=history.first
        ),
        "event": period_event(metric, budget, len(keys), lump, sigma).fields,
    }
    if not all(math.isfinite(v) for v in values.values()):
        raise ValueError(f"running total {metric.name!r}: a non-finite total")
    return RunningStep(fields, encode_state(x_t.tolist(), y_t.tolist())), x_t, y_t
