"""Cross-entity rules of a topology (a metric against its source and budget) and where things were written.

Field-level checks live in the loader; the rules here need two entities at once: the metric's
source and budget must exist, its mechanism must suit the budget's accounting, its window
must divide the budget period, and a `contribution.max_windows` needs a unit-level source and
windows that never straddle a period boundary (each period counts its own windows only).
"""

from __future__ import annotations

__all__ = ["Problem", "TopologyError", "SourceMap", "check_metric_links"]

from collections.abc import Mapping
from dataclasses import dataclass, field

from dpstream.topology.durations import format_duration
from dpstream.topology.errors import ConfigError, ConfigWarning, one_line
from dpstream.topology.model import Accounting, Budget, Mechanism, Metric, Source, WindowKind
from dpstream.topology.readers import suggest


@dataclass(frozen=True, order=True)
class Problem:
    """One mistake: the 1-based line and the message after `FILE:LINE: `."""

    line: int
    text: str


class TopologyError(ConfigError):
    """The topology has mistakes; the message is the first in file order, `problems` holds all of them."""

    def __init__(self, path: str, problems: list[Problem]) -> None:
        ordered = sorted(problems, key=lambda p: p.line)
        self.path = path
        self.problems: tuple[str, ...] = tuple(one_line(f"{path}:{p.line}: {p.text}") for p in ordered)
        super().__init__(self.problems[0])


@dataclass(frozen=True)
class SourceMap:
    """Where each entity and field of a loaded topology was written, plus load-time notes.

    Keys are `("metric", name)` for the line of the name and `("metric", name, field)` for a
    field's value; kinds are source, budget, metric, sinks. `expected_units` holds the optional
    per-budget `expected_units` hint (used only by the δ warning); `notes` are warnings the loader
    found while reading (e.g. a δ ignored by pure accounting).
    """

    path: str
    lines: Mapping[tuple[str, ...], int] = field(default_factory=dict)
    expected_units: Mapping[str, int] = field(default_factory=dict)
    notes: tuple[tuple[int, ConfigWarning], ...] = ()

    def line(self, *key: str) -> int:
        """Line of the field, else of its entity, else 0 (unknown)."""
        for size in range(len(key), 0, -1):
            if key[:size] in self.lines:
                return self.lines[key[:size]]
        return 0

    def where(self, *key: str) -> str:
        """`FILE:LINE` (or just `FILE` when the line is unknown)."""
        line = self.line(*key)
        return f"{self.path}:{line}" if line else self.path


def check_metric_links(
    metric: Metric,
    sources: Mapping[str, Source],
    budgets: Mapping[str, Budget],
    broken: set[tuple[str, str]],
    where: SourceMap,
) -> list[Problem]:
    """Problems of `metric` against its source and budget (skipping entities that are broken themselves)."""
    subject = f"metric '{metric.name}'"
    problems: list[Problem] = []
    source = sources.get(metric.source)
    if source is not None and source.event_level and metric.contribution.max_windows is not None:
        problems.append(
            Problem(
                where.line("metric", metric.name, "contribution"),
                f"{subject}: contribution.max_windows {metric.contribution.max_windows}: source '{source.name}' "
                "is event-level (privacy_unit 'event': every event its own unit), so there is no unit to count "
                "windows of; remove max_windows",
            )
        )
    if source is None and ("source", metric.source) not in broken:
        problems.append(
            Problem(
                where.line("metric", metric.name, "source"),
                f"{subject}: source '{metric.source}': no such source; {suggest(metric.source, list(sources))}",
            )
        )
    budget = budgets.get(metric.budget)
    if budget is None:
        if ("budget", metric.budget) not in broken:
            problems.append(
                Problem(
                    where.line("metric", metric.name, "budget"),
                    f"{subject}: budget '{metric.budget}': no such budget; {suggest(metric.budget, list(budgets))}",
                )
            )
        return problems
    if budget.accounting is Accounting.PURE and metric.mechanism is Mechanism.GAUSSIAN:
        problems.append(
            Problem(
                where.line("metric", metric.name, "mechanism"),
                f"{subject}: mechanism 'gaussian': budget '{budget.name}' uses pure accounting, which allows "
                "laplace and exponential only; use mechanism: laplace, or accounting: zcdp in the budget",
            )
        )
    if budget.accounting is Accounting.PURE and metric.needs_partition_selection and budget.delta <= 0:
        problems.append(
            Problem(
                where.line("metric", metric.name, "group_by"),
                f"{subject}: group_by '{metric.group_by}': keys come from the data, which needs DP partition "
                f"selection with δ > 0, but budget '{budget.name}' is pure with no delta; declare keys: [...] "
                "or give the budget a delta (e.g. delta: 1.0e-6)",
            )
        )
    window = metric.window
    shape = (
        f"{{tumbling: {format_duration(window.size_s)}}}"
        if window.kind is WindowKind.TUMBLING
        else f"{{hopping: {format_duration(window.size_s)}, every: {format_duration(window.every_s)}}}"
    )
    if budget.period_s % window.size_s != 0:
        problems.append(
            Problem(
                where.line("metric", metric.name, "window"),
                f"{subject}: window {shape}: size {format_duration(window.size_s)} does not divide budget "
                f"'{budget.name}' period {format_duration(budget.period_s)}; pick a size that divides it "
                "(e.g. 1m, 5m, 15m, 1h)",
            )
        )
    elif metric.contribution.max_windows is not None and window.straddles(budget.period_s):
        problems.append(
            Problem(
                where.line("metric", metric.name, "contribution"),
                f"{subject}: contribution.max_windows {metric.contribution.max_windows}: window {shape} has "
                f"windows straddling the {format_duration(budget.period_s)} period boundary of budget "
                f"'{budget.name}', so one period's events would move which windows count in the next; use a "
                "tumbling window whose size divides the period, or remove max_windows",
            )
        )
    return problems
