"""The report page: one self-contained HTML file (no network, no JavaScript) whose plots are drawn
by matplotlib and embedded as inline SVG.

Plots: spend against the plan with the warn and cap lines and the breaker events; burn rate (spend
per time bin against the plan's); each numeric metric's expected error against its per-release noise
multiplier (√(2ρ) or ε, `utility.noise_multiplier`) with the fitted c/m curve; spend share against
weight share. The time axis of the first two zooms to the span that has charges (`_view`), with the
whole period below as context, so minutes of charges in a day are not one vertical line. Each figure
is an `<svg>` inside a `<figure data-plot="…">`, so a browser test can check that every one rendered.
"""

from __future__ import annotations

__all__ = ["PLOTS", "render_page", "write_page"]

import bisect
import html
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpstream.topology.model import event_level_note

PLOTS = ("spend", "burn_rate", "error_vs_noise_multiplier", "share_vs_weight")
"""The figures every page has (`data-plot` names)."""


def _figure() -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")  # no display: figures only become SVG text
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.2, 3.6), dpi=96)
    return fig, ax


ZOOM_MARGIN = 0.05
"""Margin each side of the zoomed time axis, as a share of the span shown."""
ZOOM_MIN_H = 2 / 60
"""The narrowest zoom, in hours (charges seconds apart are not a sliver of an axis)."""
ZOOM_WHOLE = 0.9
"""A zoom covering this share of the period or more shows the whole period instead."""
_BIN_HOURS = (1 / 60, 2 / 60, 5 / 60, 10 / 60, 15 / 60, 0.5, 1.0, 2.0, 3.0, 6.0, 12.0, 24.0)
"""Burn-rate bin widths (hours): the narrowest giving at most 30 bins over the view."""


@dataclass(frozen=True)
class _View:
    """The time axis of the spend and burn plots: [lo, hi] hours into the period, drawn in minutes
    (`scale` 60) when it spans 3 h or less, else in hours."""

    lo: float
    hi: float
    period_h: float

    @property
    def zoomed(self) -> bool:
        return self.lo > 0.0 or self.hi < self.period_h

    @property
    def scale(self) -> float:
        return 60.0 if self.hi - self.lo <= 3.0 else 1.0

    def text(self, hours: float) -> str:
        """A time into the period as the axis reads it: h:mm in minutes, else hours."""
        if self.scale == 60.0:
            m = round(hours * 60)
            return f"{m // 60}:{m % 60:02d}"
        return f"{hours:.4g} h"


def _view(rep: dict[str, Any]) -> _View:
    """The span that has charges (first to last window end) with a margin; the whole period when there
    is no charge, when every charge is at one window end (nothing to spread: the plan line gives the
    context), or when the span covers most of the period."""
    period_h = rep["period"]["seconds"] / 3600
    xs, _ = _hours(rep)
    if not xs or max(xs) - min(xs) <= 1e-9:
        return _View(0.0, period_h, period_h)
    lo, hi = min(xs), max(xs)
    shown = max(hi - lo, ZOOM_MIN_H)
    pad = (shown - (hi - lo)) / 2 + ZOOM_MARGIN * shown
    lo, hi = max(0.0, lo - pad), hi + pad  # past the period's end too: its last window ends there
    if hi - lo >= ZOOM_WHOLE * period_h:
        return _View(0.0, period_h, period_h)
    return _View(lo, hi, period_h)


def _timed_figure(view: _View, schedule_start: float | None) -> tuple[Any, Any]:
    """A figure for a plot over time: when zoomed, a thin overview bar of the whole period below it
    with the zoomed span shaded and the schedule start S (`schedule_start`, hours; in a first period) marked."""
    if not view.zoomed:
        return _figure()
    _figure()  # selects the Agg backend
    import matplotlib.pyplot as plt

    plt.close()
    fig, (ax, ov) = plt.subplots(2, 1, figsize=(7.2, 4.0), dpi=96, gridspec_kw={"height_ratios": [12, 1]})
    ov.set_gid("period-overview")
    ov.axvspan(0.0, view.period_h, color="#e4e4e4")
    ov.axvspan(view.lo, view.hi, color="#1f5fa8")
    if schedule_start is not None:
        ov.axvline(schedule_start, color="#222", linewidth=1)
        ov.text(schedule_start, 0.5, "S ", fontsize=7, va="center", ha="right")
    ov.set_xlim(0.0, view.period_h)
    ov.set_yticks([])
    ov.tick_params(labelsize=7)
    start = "; S: the schedule start" if schedule_start is not None else ""
    ov.set_xlabel(
        f"the whole period, 0–{view.period_h:g} h (hours); shaded: the span shown above, the one with charges{start}",
        fontsize=7,
    )
    return fig, ax


def _time_axis(ax: Any, view: _View, what: str) -> None:
    """Label the x axis of a plot over time; in minutes, ticks read h:mm into the period."""
    if view.scale == 60.0:
        from matplotlib.ticker import FuncFormatter, MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(nbins=8, steps=[1, 2, 3, 5, 6, 10]))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda m, _pos: f"{int(m // 60)}:{int(round(m % 60)):02d}"))
        ax.set_xlabel(f"time into the period, h:mm ({what})")
    else:
        ax.set_xlabel(f"hours into the period ({what})")


def _svg(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    fig.tight_layout()
    fig.savefig(buf, format="svg", metadata={"Date": None})  # no timestamp: the same report, the same page
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]  # drop the XML prolog and doctype: inline SVG in HTML5


def _hours(rep: dict[str, Any]) -> tuple[list[float], list[float]]:
    """(hours into the period of each charge's window end, ratio after it)."""
    start = rep["period"]["start_epoch"]
    tl = rep["timeline"]
    xs, ys = [], []
    for (at_ms, ratio), end in zip(tl["spend"], tl["window_ends"], strict=True):
        t = end if isinstance(end, (int, float)) else at_ms / 1000
        xs.append((t - start) / 3600)
        ys.append(ratio)
    return xs, ys


def _plan_ratio(rep: dict[str, Any]) -> float:
    terms = rep["terms"]
    return 1.0 - terms["reserve"] / terms["cap"] if terms["cap"] else 0.8


def _plan_from(rep: dict[str, Any]) -> float:
    """Hours into the period where the plan starts spending: the schedule start S in its first period."""
    s = rep["period"].get("schedule_start_epoch")
    return (s - rep["period"]["start_epoch"]) / 3600 if isinstance(s, (int, float)) else 0.0


def _planned_at(rep: dict[str, Any]) -> Any:
    """x hours into the period → the plan's spent / cap by then: the report's plan curve (a step at each
    window end), else (an older report) the plan ratio spent evenly from S to the period end."""
    curve = rep.get("plan_curve")
    if curve:
        hours, ratio = curve["hours"], curve["ratio"]
        return lambda x: ratio[bisect.bisect_right(hours, x + 1e-9) - 1] if x + 1e-9 >= hours[0] else 0.0
    span_h, lo = rep["period"]["seconds"] / 3600, _plan_from(rep)
    rate = _plan_ratio(rep) / (span_h - lo) if span_h > lo else 0.0
    return lambda x: rate * max(0.0, min(x, span_h) - lo)


def _spend_plot(rep: dict[str, Any]) -> str:
    view = _view(rep)
    fig, ax = _timed_figure(view, _plan_from(rep) or None)
    k = view.scale
    xs, ys = _hours(rep)
    hours = rep["period"]["seconds"] / 3600
    (line,) = ax.plot([x * k for x in xs], ys, drawstyle="steps-post", color="#1f5fa8", label="spent / cap")
    line.set_gid("spend-line")  # named in the SVG: the page test reads the charges' x positions
    ax.patch.set_gid("spend-plot-area")
    curve = rep.get("plan_curve")
    if curve:  # the plan as the gauges count it: front-loaded under max_windows, shaped by a schedule
        ax.plot(
            [x * k for x in curve["hours"]],
            curve["ratio"],
            drawstyle="steps-post",
            color="#888",
            linestyle="--",
            label="plan",
        )
    else:
        ax.plot([_plan_from(rep) * k, hours * k], [0, _plan_ratio(rep)], color="#888", linestyle="--", label="plan")
    ax.axhline(rep["terms"]["warn_at"], color="#d08000", linewidth=1, label=f"warn ({rep['terms']['warn_at']:g})")
    ax.axhline(1.0, color="#b00000", linewidth=1.2, label="cap")
    start = rep["period"]["start_epoch"]
    labelled: set[str] = set()
    for ev in rep["timeline"]["events"]:
        if ev["kind"] in ("breaker_open", "breaker_close", "grant"):
            x = (ev.get("window_time", ev["at_ms"] / 1000) - start) / 3600
            if view.lo <= x <= view.hi:
                colour = {"breaker_open": "#b00000", "breaker_close": "#2a8a2a", "grant": "#7a3db8"}[ev["kind"]]
                name = ev["kind"].replace("_", " ")
                ax.axvline(x * k, color=colour, linestyle=":", label=None if name in labelled else name)
                labelled.add(name)
    ax.set_xlim(view.lo * k, view.hi * k)
    ax.set_ylim(0, 1.1)
    _time_axis(ax, view, "window end")
    ax.set_ylabel("spent / cap")
    ax.set_title("Spend against the plan" + (" (zoomed to the span with charges)" if view.zoomed else ""))
    ax.legend(fontsize=7, loc="upper left")
    return _svg(fig)


def _burn_plot(rep: dict[str, Any]) -> str:
    view = _view(rep)
    fig, ax = _timed_figure(view, _plan_from(rep) or None)
    k = view.scale
    xs, ys = _hours(rep)
    width = next((w for w in _BIN_HOURS if (view.hi - view.lo) / w <= 30), _BIN_HOURS[-1])
    first = math.floor(view.lo / width + 1e-9) * width
    bins = max(1, math.ceil((view.hi - first) / width - 1e-9))
    spent = [0.0] * bins
    prev = 0.0
    for x, y in sorted(zip(xs, ys, strict=True)):
        b = min(bins - 1, max(0, math.floor((x - first) / width - 1e-9)))  # a charge at a bin's end is in it
        spent[b] += y - prev
        prev = y
    edges = [first + i * width for i in range(bins + 1)]
    planned = _planned_at(rep)
    plan = [planned(b1) - planned(b0) for b0, b1 in zip(edges, edges[1:], strict=False)]
    burn = [p / q if q else 0.0 for p, q in zip(spent, plan, strict=True)]
    bars = ax.bar(
        [(e + width / 2) * k for e in edges[:-1]],
        burn,
        width=0.9 * width * k,
        color="#1f5fa8",
        label="burn rate (spend ÷ plan)",
    )
    for i, bar in enumerate(bars):
        bar.set_gid(f"burn-bar-{i}")  # named in the SVG: the page test reads the bars
    ax.axhline(1.0, color="#888", linestyle="--", label="on plan")
    ax.set_xlim(edges[0] * k, edges[-1] * k)
    bin_text = f"{width * 60:g} min" if width < 1 else f"{width:g} h"
    _time_axis(ax, view, f"bins of {bin_text}")
    ax.set_ylabel("× planned spend rate")
    ax.set_title("Burn rate")
    ax.legend(fontsize=7)
    return _svg(fig)


def _error_plot(rep: dict[str, Any]) -> str:
    fig, ax = _figure()
    drawn = False
    for u in rep["utility"]:
        pts = u.get("points")
        if not pts or "fit" not in u:
            continue
        mult = [p[0] for p in pts]
        err = [p[1] for p in pts]
        scale = u["fit"]["c"] / min(mult)  # plot E relative to the metric's largest fitted error
        line = ax.scatter(mult, [e / scale for e in err], s=6, label=f"{u['metric']} (c={u['fit']['c']:.3g})")
        lo, hi = min(mult), max(mult)
        lo, hi = lo / 2, hi * 2  # the curve beyond the period's few multipliers, to show its shape
        grid = [lo * (hi / lo) ** (i / 60) for i in range(61)]
        ax.plot(grid, [u["fit"]["c"] / g / scale for g in grid], color=line.get_facecolor()[0], linewidth=1)
        drawn = True
    if not drawn:
        ax.text(0.5, 0.5, "no numeric release in this period", ha="center", transform=ax.transAxes)
    ax.set_xscale("log")
    ax.set_xlabel("noise multiplier m per release (√(2ρ) zCDP, ε pure; not an ε-equivalent)")
    ax.set_ylabel("E|error| (÷ largest fitted)")
    ax.set_title("Error against the noise multiplier, with the fitted E = c/m")
    ax.legend(fontsize=7)
    return _svg(fig)


def _share_plot(rep: dict[str, Any]) -> str:
    fig, ax = _figure()
    rows = rep["fairness"]
    names = [r["metric"] for r in rows]
    x = list(range(len(rows)))
    ax.bar([i - 0.2 for i in x], [r["weight_share"] for r in rows], width=0.4, color="#999", label="weight share")
    ax.bar([i + 0.2 for i in x], [r["spend_share"] for r in rows], width=0.4, color="#1f5fa8", label="spend share")
    ax.set_xticks(x)
    ax.set_xticklabels(names, fontsize=7, rotation=15)
    ax.set_ylabel("share of the period")
    ax.set_title("Spend share against weight")
    ax.legend(fontsize=7)
    return _svg(fig)


def _table(rows: list[dict[str, Any]], cols: list[str]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = []
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c)
            text = f"{v:.4g}" if isinstance(v, float) else ("" if v is None else str(v))
            cells.append(f"<td>{html.escape(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


_CSS = (
    "body{font-family:sans-serif;max-width:980px;margin:1em auto;color:#222}"
    "table{border-collapse:collapse;font-size:12px;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 6px}"
    "figure{margin:1em 0}figcaption{font-size:12px;color:#555}.flag{color:#b00000;font-weight:bold}"
)


def render_page(rep: dict[str, Any]) -> str:
    """The whole page as one HTML string (inline SVG plots, inline CSS, no script, no link)."""
    acc = rep["accounting"]
    ch, rc = acc["charged"], acc["record_check"]
    tight, gap = acc.get("tight"), acc.get("gap")
    view = _view(rep)
    zoom = (
        f"; zoomed to {view.text(view.lo)}–{view.text(view.hi)} into the period, the span with charges, the "
        f"whole {view.period_h:g} h period in the bar below."
        if view.zoomed
        else "."
    )
    plots = {
        "spend": _spend_plot(rep),
        "burn_rate": _burn_plot(rep),
        "error_vs_noise_multiplier": _error_plot(rep),
        "share_vs_weight": _share_plot(rep),
    }
    captions = {
        "spend": "Spent ÷ cap after each charge, the plan, the warn and cap lines, breaker and grant events" + zoom,
        "burn_rate": "Spend per time bin ÷ the plan's spend in it" + zoom,
        "error_vs_noise_multiplier": "Each release's expected |error| against its noise multiplier m (√(2ρ) in a "
        "zCDP scope, ε in a pure one: the scale of the error model, not an ε-equivalent), and the fitted "
        "E = c/m per metric.",
        "share_vs_weight": "Each metric's share of the period's spend against its weight share.",
    }
    esc = html.escape
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>dpstream report {esc(rep['scope'])} {esc(rep['period']['id'])}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>Report card: {esc(rep['scope'])}, period {esc(rep['period']['id'])}</h1>",
        f"<p>{esc(rep['period']['start'])} .. {esc(rep['period']['end'])}; {esc(rep['source'])}.</p>",
        *(
            [f"<p>First period of the deployment: its schedule starts at {esc(first)} (nothing before it).</p>"]
            if (first := rep["period"].get("schedule_start"))
            else []
        ),
        *(
            [f"<p class='flag'>{esc(event_level_note(names))}.</p>"]
            if (names := rep.get("event_level_metrics"))
            else []
        ),
        "<h2>Accounting</h2>",
        f"<p>Charged: {esc(acc['currency'])} {ch['total']:.6g} of cap {ch['cap']:.6g} (ratio {ch['ratio']:.4f}), "
        f"ε {ch['epsilon']:.6g} at δ {ch['delta']:.3g}; audit reconciles: {'yes' if ch['reconciles'] else 'NO'}.</p>",
        f"<p>Per-record cost check: {rc['ok']} of {rc['checked']} records ok"
        + (f", <span class='flag'>{len(rc['flagged'])} flagged</span>" if rc["flagged"] else "")
        + f". Rule: {esc(rc['rule'])}.</p>",
    ]
    if rc["flagged"]:
        parts.append(_table(rc["flagged"][:50], ["metric", "release_id", "problems"]))
    if tight and gap:
        parts.append(
            f"<p>Tight non-adaptive recomputation at δ {tight['delta']:.3g}: PLD ε {tight['pld_epsilon']:.6g}, "
            f"RDP ε {tight['rdp_epsilon']:.6g}. Gap {gap['epsilon']:.4g} ({100 * gap['relative']:.1f} %), "
            f"<b>not credited back</b>: {esc(gap['reason'])}.</p>"
        )
    for name in PLOTS:
        parts.append(f"<figure data-plot='{name}'>{plots[name]}<figcaption>{esc(captions[name])}</figcaption></figure>")
    parts.append("<h2>Utility per metric</h2>")
    parts.append(
        _table(
            [{**u, "c": (u.get("fit") or {}).get("c")} for u in rep["utility"]],
            [
                "metric",
                "aggregate",
                "releases",
                "sigma_mean",
                "ci95_half_width_mean",
                "expected_abs_error_mean",
                "planned_sigma",
                "c",
                "note",
            ],
        )
    )
    parts.append("<h2>Fairness</h2>")
    parts.append(
        _table(rep["fairness"], ["metric", "weight_share", "spend_share", "charged", "refused", "stretched", "skipped"])
    )
    adv = rep["advice"]
    parts.append("<h2>Advice for the next period</h2>")
    parts.append(f"<p>{esc(adv.get('objective', ''))}. {esc(adv.get('closed_form', ''))}.</p>")
    if span := adv.get("span"):
        parts.append(f"<p>Compared over the same span: {esc(span['note'])}.</p>")
    if (w := adv.get("weighted_relative_error")) and w.get("verdict"):
        if (span or {}).get("first_period"):  # the verdict is over a whole next period (plan vs plan)
            nxt = w["next_period"]
            parts.append(
                f"<p>Weighted relative error {w['this_period']:.4g} this period; over a whole next period "
                f"{nxt['this_plan']:.4g} with the current weights, {nxt['advised']:.4g} advised "
                f"(× {w['predicted_change']:.3f}: {esc(w['verdict'])}).</p>"
            )
        else:
            parts.append(
                f"<p>Weighted relative error {w['this_period']:.4g} this period, {w['advised']:.4g} advised "
                f"(× {w['predicted_change']:.3f}: {esc(w['verdict'])}).</p>"
            )
    parts.append(
        _table(
            adv.get("metrics", []),
            [
                "metric",
                "weight_now",
                "weight_advised",
                "expected_abs_error_this_period",
                "expected_abs_error_planned",
                "expected_abs_error_advised",
                "expected_abs_error_advised_next_period",
            ],
        )
    )
    parts.append("</body></html>")
    return "\n".join(parts)


def write_page(rep: dict[str, Any], path: str | Path) -> Path:
    """Write the page to `path`; returns it."""
    out = Path(path)
    out.write_text(render_page(rep), encoding="utf-8")
    return out
