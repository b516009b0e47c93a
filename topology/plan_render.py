"""A readable text table of a budget plan (what `dpstream plan FILE` prints without --json)."""

from __future__ import annotations

__all__ = ["render_plan"]

from collections.abc import Mapping

from dpstream.topology.durations import format_duration
from dpstream.topology.model import EVENT_LEVEL_LABEL
from dpstream.topology.plan import MetricPlan, Plan, ScopePlan, TypicalComparison, format_ratio, typical_warning


def _num(x: float | None) -> str:
    """Four significant digits, plain where readable, scientific for very small or large."""
    if x is None:
        return "-"
    if x == 0:
        return "0"
    if 1e-3 <= abs(x) < 1e6:
        return f"{x:.4g}"
    return f"{x:.3e}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:  # every row has one cell per column
        return "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))

    return [line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def _window(m: MetricPlan) -> str:
    if m.overlap == 1:
        return f"tumbling {format_duration(m.window_size_s)}"
    return f"hopping {format_duration(m.window_size_s)}/{format_duration(m.window_every_s)} (x{m.overlap})"


def _ratio(t: TypicalComparison | None) -> str:
    """CI / typical as text: '-' without a typical value, 'n/a' when the plan has no CI to compare."""
    if t is None:
        return "-"
    return format_ratio(t.ratio)


def _scope_lines(s: ScopePlan, typical: Mapping[str, TypicalComparison]) -> list[str]:
    cur = "ρ" if s.currency == "rho" else "ε"
    promise = f"ε={_num(s.epsilon)}" + (f", δ={s.delta:g}" if s.delta else " (pure)")
    lines = [
        f"scope {s.name}: {s.accounting.value}, {promise} per {format_duration(s.period_s)} (UTC periods)",
        f"  cap {'ρ*' if s.currency == 'rho' else 'ε'}={_num(s.cap)}  "
        f"reserve {s.reserve_fraction:g} ({cur}={_num(s.reserve)})  "
        f"pool {cur}={_num(s.pool)}  warn_at {s.warn_at:g}  releases/period {s.releases_per_period}",
        f"  planned {cur}={_num(s.planned_total)}{' (= pool)' if s.metrics else ''}, "
        f"ε-equivalent {_num(s.planned_epsilon)}" + (f" at δ={s.delta:g}" if s.delta else ""),
    ]
    h = s.horizon
    if h.rho is not None:
        lines.append(
            f"  over {h.days} days ({h.periods} periods): ρ={_num(h.rho)} → ε={_num(h.epsilon)} at δ={h.delta:g} "
            f"(reserve spent too: ε={_num(h.epsilon_if_reserve_spent)}; naive {h.periods}·ε={_num(h.naive_epsilon)}, "
            f"δ={h.naive_delta:g})"
        )
    else:
        lines.append(
            f"  over {h.days} days ({h.periods} periods): ε={_num(h.epsilon)} "
            f"(reserve spent too: ε={_num(h.epsilon_if_reserve_spent)})"
        )
    if s.event_level:
        lines.append("  EVENT-LEVEL: some metrics protect single events, not people (weaker guarantee)")
    if any(m.create_time_arrival for m in s.metrics):
        lines.append(
            "  CREATE-TIME ARRIVAL: some metrics count events by their producer's time; a late-appended event's "
            "inclusion may depend on the worker's load (weaker guarantee)"
        )
    header = [
        "metric",
        "aggregate",
        "mechanism",
        "window",
        "share",
        "rel/period",
        f"{cur}/release",
        "ε-equiv",
        "part",
        "Δ1",
        "Δ2",
        "scale",
        "σ",
        "95% CI ±",
        "E|err|",
    ]
    capped = any(m.uncapped_components is not None for m in s.metrics)
    if capped:
        header.insert(header.index("σ") + 1, "σ no cap")
    compare = any(m.name in typical for m in s.metrics)
    if compare:
        header += ["typical", "CI/typ"]
    rows: list[list[str]] = []
    for m in s.metrics:
        label = m.name + (f" [{EVENT_LEVEL_LABEL}]" if m.event_level else "")
        label += " [create-time arrival]" if m.create_time_arrival else ""
        aggregate = m.aggregate + (f" k={m.k}" if m.k else "") + (" [partition sel.]" if m.partition_selection else "")
        for i, c in enumerate(m.components):
            lead = (
                [
                    label,
                    aggregate,
                    m.mechanism.value,
                    _window(m),
                    f"{m.weight_share:.3f}",
                    str(m.releases_per_period) + (f" (cap {m.max_windows})" if m.max_windows is not None else ""),
                    _num(m.per_release_cost),
                    _num(m.per_release_epsilon),
                ]
                if i == 0
                else [""] * 8
            )
            quantile = c.rank_error95 is not None
            sigmas = [_num(c.stddev)]
            if capped:  # σ without the metric's max_windows beside it ('-' for a metric without one)
                uncapped = m.uncapped_components[i] if m.uncapped_components is not None else None
                sigmas.append(_num(uncapped.stddev) if uncapped is not None else "-")
            rows.append(
                lead
                + [
                    f"{c.component} {cur} {_num(c.cost)}" if quantile else c.component,
                    _num(c.l1),
                    _num(c.l2),
                    _num(c.scale),
                    *sigmas,
                    f"rank {_num(c.rank_error95)}" if quantile else _num(c.ci95_half_width),
                    _num(c.expected_abs_error),
                ]
            )
            if compare:
                t = typical.get(m.name)
                rows[-1] += [_num(t.value) if t is not None else "-", _ratio(t)] if i == 0 else ["", ""]
    if rows:
        lines += ["  " + r for r in _table(header, rows)]
    else:
        lines.append("  (no metric draws on this scope)")
    for m in s.metrics:
        lines += _segment_lines(m, cur)
    for m in s.metrics:
        t = typical.get(m.name)
        warning = typical_warning(m, t) if t is not None else None
        if warning:
            lines.append("  " + warning)
    return lines


def _segment_lines(m: MetricPlan, cur: str) -> list[str]:
    """A shaped metric's σ per run of hours (its row shows the mean over the period's paid windows)."""
    if not m.segments:
        return []
    name = f" {m.schedule_name}" if m.schedule_name else ""
    lines = [f"  {m.name} schedule{name} (UTC hours; its row: the mean over the paid windows):"]
    for seg in m.segments:
        noise = ", ".join(
            f"{c.component} σ {_num(c.stddev)}" if c.stddev is not None else f"{c.component} scale {_num(c.scale)}"
            for c in seg.components
        )
        lines.append(
            f"    {seg.hours} weight {seg.weight:g}: {seg.releases_per_period} rel/period, "
            f"{cur}/release {_num(seg.per_release_cost)}, {noise}"
        )
    return lines


def render_plan(plan: Plan, typical: Mapping[str, TypicalComparison] | None = None) -> str:
    """The plan as a text report: one block per scope, one row per noisy part of a release; with
    `typical` (metric → comparison), columns typical and CI/typ and a warning line where CI > typical."""
    typical = typical or {}
    lines = [
        f"plan of {plan.topology_path or '<topology>'} (version {plan.topology_version})",
        f"releases: published at P(w) = close time + publish_delay {format_duration(plan.publish_delay_s)}, "
        "stamped with P(w) (a release that misses it is late, never earlier)",
        "",
    ]
    for s in plan.scopes:
        lines += _scope_lines(s, typical) + [""]
    for unit in plan.privacy_units:
        if unit.composes:
            scopes = ", ".join(s.scope for s in unit.scopes)
            lines += [
                f"privacy unit {unit.privacy_unit}: budgets {scopes} compose for one person "
                f"(sources {', '.join(unit.sources)}): {unit.summary()}",
                "  WARNING: no budget counts the others' spend; each promise above holds alone, "
                "together they give only this (pure ε counts as ε²/2 in ρ)",
                "",
            ]
    lines += [
        "ε-equiv: one release's cost as (ε, δ)-DP at the scope's conversion δ: the record's cost.epsilon_equiv,",
        "  and budget status converts the spend the same way. part: the noisy part of a release a row",
        "  describes (value, a mean's sum and count, top-k's key selection). Δ1, Δ2: that part's L1 and",
        "  L2 sensitivity, what one person can move it by under the contribution bounds.",
        "scale: Laplace b, Gaussian σ, or top-k Gumbel scale; CI and E|err| are of the noise alone.",
    ]
    if any(c.rank_error95 is not None for s in plan.scopes for m in s.metrics for c in m.components):
        lines.append(
            "quantile parts (p50, ...) show their own cost; their scale is in ranks, and 'rank r' is the error "
            "statement: with probability ≥ 95 % the released candidate's rank error (|#below − α·n| without ties) is "
            "at most r above the grid's smallest (no value interval: it would depend on the data)."
        )
    for m in (m for s in plan.scopes for m in s.metrics if m.running_total_steps is not None):
        std = m.running_total_max_stddev or 0.0
        lines.append(
            f"running total {m.name}: one Gaussian a period over its {m.running_total_steps} steps, charged whole "
            f"(ρ={m.per_release_cost:.4g}) with the period's first step; scale is each step's σ and the released "
            f"total at step t has std σ·‖c_<t‖₂, up to {std:.4g} (95 % CI ±{1.959963984540054 * std:.4g}) at the last."
        )
    if any(m.max_windows is not None and m.running_total_steps is None for s in plan.scopes for m in s.metrics):
        lines.append(
            "rel/period (cap m): contribution.max_windows: one unit counts in at most m windows a period, so each "
            "release is priced at the metric's share over m; σ no cap: the same release's σ without it."
        )
    if typical:
        lines.append(
            "CI/typ: the 95% CI half-width over the typical true value per window (n/a: top-k, or a mean "
            "whose count is noisy, has no CI of its own here)."
        )
    return "\n".join(lines)
