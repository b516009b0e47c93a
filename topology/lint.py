"""Warnings about legal but probably unintended topologies (`dpstream validate` prints them, exit 0)."""

from __future__ import annotations

__all__ = ["DEFAULT_DELTA_CEILING", "lint_topology"]

from collections.abc import Callable
from fractions import Fraction

from dpstream.topology.allocation import hour_weights
from dpstream.topology.composition import unit_guarantees
from dpstream.topology.durations import format_duration
from dpstream.topology.errors import ConfigWarning
from dpstream.topology.model import EVENT_LEVEL_LABEL, Accounting, Budget, Mechanism, Topology, WindowKind
from dpstream.topology.schedule import Schedule
from dpstream.topology.validation import SourceMap

DEFAULT_DELTA_CEILING = 1e-5
"""Without `expected_units`, a δ above this is flagged: δ should be far below 1 / number of units."""

_UNITS_FACTOR = 10
"""With `expected_units: N`, δ must be at least this many times below 1/N."""


_Warn = Callable[[tuple[str, ...], str], None]
"""Records one warning at a topology key (its file line orders the output)."""


def lint_topology(topology: Topology, source_map: SourceMap | None = None) -> list[ConfigWarning]:
    """Every warning of a valid topology, in file order; `source_map` adds lines and load-time notes."""
    where = source_map or SourceMap(topology.path or "<topology>")
    found: list[tuple[int, ConfigWarning]] = list(where.notes)

    def warn(key: tuple[str, ...], message: str) -> None:
        found.append((where.line(*key), ConfigWarning(where.where(*key), message)))

    _lint_sources(topology, warn)
    for budget in topology.budgets.values():
        _lint_budget(topology, budget, where, warn)
    _lint_composition(topology, warn)
    _lint_windows(topology, warn)
    _lint_schedules(topology, warn)
    return [warning for _, warning in sorted(found, key=lambda item: item[0])]


def _lint_sources(topology: Topology, warn: _Warn) -> None:
    """Event-level units, create_time arrival, and sources no metric reads."""
    for source in topology.sources.values():
        if source.event_level:
            warn(
                ("source", source.name, "privacy_unit"),
                f"source '{source.name}': privacy_unit 'event': {EVENT_LEVEL_LABEL}: it protects single events, "
                "not people; name the field that identifies a person if there is one",
            )
        if source.create_time_arrival:
            warn(
                ("source", source.name, "arrival"),
                f"source '{source.name}': arrival 'create_time': an event stamped by its producer at or before a "
                "window's close but appended after it counts only if it lands before the worker reads the end "
                "offset, which depends on the worker's load (weaker); use a LogAppendTime topic and remove arrival",
            )
        if not any(m.source == source.name for m in topology.metrics.values()):
            warn(("source", source.name), f"source '{source.name}': no metric reads it; remove it or add a metric")


def _lint_budget(topology: Topology, budget: Budget, where: SourceMap, warn: _Warn) -> None:
    """One budget: its reserve against warn_at, a δ it does not use or sizes too large, and no metric."""
    subject = f"budget '{budget.name}'"
    if _exact(budget.reserve) < 1 - _exact(budget.warn_at):
        need_reserve = float(1 - _exact(budget.warn_at))
        need_warn_at = float(1 - _exact(budget.reserve))
        warn(
            ("budget", budget.name, "reserve"),
            f"{subject}: reserve {budget.reserve:g} < 1 - warn_at ({need_reserve:g}): the plan alone "
            f"spends past warn_at every period; raise reserve to {need_reserve:g} or warn_at to {need_warn_at:g}",
        )
    selecting = [m for m in topology.metrics_of(budget.name) if m.needs_partition_selection]
    if budget.accounting is Accounting.PURE and budget.delta > 0 and not selecting:
        warn(
            ("budget", budget.name, "delta"),
            f"{subject}: delta {budget.delta:g}: pure accounting uses δ only for partition selection of "
            "data-derived keys, and no metric of this budget selects keys; remove delta",
        )
    if budget.accounting is Accounting.ZCDP:
        _lint_zcdp_budget(topology, budget, where, warn)
    if not topology.metrics_of(budget.name):
        warn(("budget", budget.name), f"{subject}: no metric draws on it; remove it or add a metric")


def _lint_zcdp_budget(topology: Topology, budget: Budget, where: SourceMap, warn: _Warn) -> None:
    """A zCDP budget: δ against expected_units (or the default ceiling), and Laplace mixed with Gaussian."""
    subject = f"budget '{budget.name}'"
    units = where.expected_units.get(budget.name)
    if units is not None and budget.delta * units * _UNITS_FACTOR > 1:
        warn(
            ("budget", budget.name, "delta"),
            f"{subject}: delta {budget.delta:g} is not far below 1/expected_units (1/{units}); "
            f"use delta <= {1 / (units * _UNITS_FACTOR):.1g}",
        )
    elif units is None and budget.delta > DEFAULT_DELTA_CEILING:
        warn(
            ("budget", budget.name, "delta"),
            f"{subject}: delta {budget.delta:g} is large: δ should be far below 1/number of units; "
            f"use e.g. 1.0e-6 (or declare expected_units: N)",
        )
    mechanisms = {m.mechanism for m in topology.metrics_of(budget.name)}
    if {Mechanism.LAPLACE, Mechanism.GAUSSIAN} <= mechanisms:
        laplace = [m.name for m in topology.metrics_of(budget.name) if m.mechanism is Mechanism.LAPLACE]
        warn(
            ("metric", laplace[0], "mechanism"),
            f"{subject}: mixes laplace ({', '.join(laplace)}) and gaussian metrics under zcdp; a Laplace "
            "release costs ε²/2, usually more than a Gaussian of the same error; prefer gaussian throughout",
        )


def _lint_composition(topology: Topology, warn: _Warn) -> None:
    """Budgets that compose for one privacy unit (together more than any one of them promises)."""
    for unit in unit_guarantees(topology):
        if unit.composes:
            scopes = ", ".join(f"'{s.scope}' ({format_duration(s.period_s)})" for s in unit.scopes)
            warn(
                ("budget", unit.scopes[1].scope),
                f"privacy unit '{unit.privacy_unit}': budgets {scopes} over source(s) "
                f"{', '.join(repr(s) for s in unit.sources)} compose for one person: together {unit.summary()}, "
                "more than any one of them promises; size them knowing they add up, or charge the metrics "
                "to one budget",
            )


def _lint_windows(topology: Topology, warn: _Warn) -> None:
    """Hopping windows that straddle a period boundary (charged to both periods), and a
    `contribution.max_windows` no smaller than the windows per period (it caps nothing)."""
    for metric in topology.metrics.values():
        window = metric.window
        scope = topology.budgets.get(metric.budget)
        cap = metric.contribution.max_windows
        if cap is not None and scope is not None and cap >= window.releases_per_period(scope.period_s):
            warn(
                ("metric", metric.name, "contribution"),
                f"metric '{metric.name}': contribution.max_windows {cap}: not below the "
                f"{window.releases_per_period(scope.period_s)} windows per {format_duration(scope.period_s)} "
                f"period of budget '{scope.name}', so it caps nothing and costs nothing less; lower it or remove it",
            )
        if window.kind is WindowKind.HOPPING and scope is not None:
            straddling = window.size_s // window.every_s - 1
            warn(
                ("metric", metric.name, "window"),
                f"metric '{metric.name}': window {{hopping: {format_duration(window.size_s)}, every: "
                f"{format_duration(window.every_s)}}}: {straddling} window(s) per period straddle the "
                f"{format_duration(scope.period_s)} period boundary and are charged to both periods",
            )


def _lint_schedules(topology: Topology, warn: _Warn) -> None:
    """A shaped metric under `max_windows` m with m or more windows per period at its top weight: the
    period pays only its m costliest windows, all at the top weight, which then cost what they cost
    flat; the shape only makes the other windows cheaper (`topology.allocation`)."""
    for metric in topology.metrics.values():
        weights = hour_weights(metric.schedule)
        cap = metric.contribution.max_windows
        scope = topology.budgets.get(metric.budget)
        if weights is None or cap is None or scope is None:
            continue
        counts = Schedule.of(metric).starts_by_hour(0, scope.period_s)
        top = max(weights)
        up = sum(n for n, h in zip(counts, weights, strict=True) if h == top)
        if up >= cap:
            warn(
                ("metric", metric.name, "schedule"),
                f"metric '{metric.name}': schedule up-weights {up} windows per period, but contribution."
                f"max_windows {cap} pays only the {cap} costliest, all up-weighted: they cost what they cost "
                f"flat and the shape only makes the others cheaper; up-weight fewer than {cap} windows, or use "
                "schedule: flat",
            )


def _exact(value: float) -> Fraction:
    """The decimal the user wrote (0.2 stays 1/5), so 0.2 + 0.8 compares equal to 1."""
    return Fraction(repr(value))
