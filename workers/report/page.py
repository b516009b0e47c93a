"""The report page: one self-contained HTML file (no network, no JavaScript) whose plots are drawn
by matplotlib and embedded as inline SVG.

Plots: spend against the plan over the period with the warn and cap lines and the breaker events;
burn rate (spend per hour against the plan's); each numeric metric's expected error against its
per-release ε with the fitted c/ε curve; spend share against weight share. Each figure is an
`<svg>` inside a `<figure data-plot="…">`, so a browser test can check that every one rendered.
"""

from __future__ import annotations

__all__ = ["PLOTS", "render_page", "write_page"]

import html
import io
import math
from pathlib import Path
from typing import Any

from dpstream.topology.model import event_level_note

PLOTS = ("spend", "burn_rate", "error_vs_epsilon", "share_vs_weight")
"""The figures every page has (`data-plot` names)."""


def _figure() -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")  # no display: figures only become SVG text
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.2, 3.6), dpi=96)
    return fig, ax


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
    """Hours into the period where the plan starts spending: the deployment start S in its first period."""
    s = rep["period"].get("schedule_start_epoch")
    return (s - rep["period"]["start_epoch"]) / 3600 if isinstance(s, (int, float)) else 0.0


def _spend_plot(rep: dict[str, Any]) -> str:
    fig, ax = _figure()
    xs, ys = _hours(rep)
    hours = rep["period"]["seconds"] / 3600
    ax.plot(xs, ys, drawstyle="steps-post", color="#1f5fa8", label="spent / cap")
    ax.plot([_plan_from(rep), hours], [0, _plan_ratio(rep)], color="#888", linestyle="--", label="plan")
    ax.axhline(rep["terms"]["warn_at"], color="#d08000", linewidth=1, label=f"warn ({rep['terms']['warn_at']:g})")
    ax.axhline(1.0, color="#b00000", linewidth=1.2, label="cap")
    start = rep["period"]["start_epoch"]
    labelled: set[str] = set()
    for ev in rep["timeline"]["events"]:
        if ev["kind"] in ("breaker_open", "breaker_close", "grant"):
            x = (ev.get("window_time", ev["at_ms"] / 1000) - start) / 3600
            if 0 <= x <= hours:
                colour = {"breaker_open": "#b00000", "breaker_close": "#2a8a2a", "grant": "#7a3db8"}[ev["kind"]]
                name = ev["kind"].replace("_", " ")
                ax.axvline(x, color=colour, linestyle=":", label=None if name in labelled else name)
                labelled.add(name)
    ax.set_xlim(0, hours)
    ax.set_ylim(0, 1.1)
    ax.set_xlabel("hours into the period (window end)")
    ax.set_ylabel("spent / cap")
    ax.set_title("Spend against the plan")
    ax.legend(fontsize=7, loc="upper left")
    return _svg(fig)


def _burn_plot(rep: dict[str, Any]) -> str:
    fig, ax = _figure()
    xs, ys = _hours(rep)
    hours = max(1, math.ceil(rep["period"]["seconds"] / 3600))
    per_hour = [0.0] * hours
    prev = 0.0
    for x, y in sorted(zip(xs, ys, strict=True)):
        h = min(hours - 1, max(0, int(x - 1e-9)))
        per_hour[h] += y - prev
        prev = y
    # the plan spends its ratio evenly from S (the period start after the first period) to the end
    span_h, lo = rep["period"]["seconds"] / 3600, _plan_from(rep)
    rate = _plan_ratio(rep) / (span_h - lo) if span_h > lo else 0.0
    plan = [rate * max(0.0, min(h + 1, span_h) - max(h, lo)) for h in range(hours)]
    burn = [p / q if q else 0.0 for p, q in zip(per_hour, plan, strict=True)]
    ax.bar([h + 0.5 for h in range(hours)], burn, width=0.9, color="#1f5fa8", label="burn rate (spend ÷ plan)")
    ax.axhline(1.0, color="#888", linestyle="--", label="on plan")
    ax.set_xlabel("hour of the period")
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
        eps = [p[0] for p in pts]
        err = [p[1] for p in pts]
        scale = u["fit"]["c"] / min(eps)  # plot E relative to the metric's largest fitted error
        line = ax.scatter(eps, [e / scale for e in err], s=6, label=f"{u['metric']} (c={u['fit']['c']:.3g})")
        lo, hi = min(eps), max(eps)
        lo, hi = lo / 2, hi * 2  # the curve beyond the period's few ε, to show its shape
        grid = [lo * (hi / lo) ** (i / 60) for i in range(61)]
        ax.plot(grid, [u["fit"]["c"] / g / scale for g in grid], color=line.get_facecolor()[0], linewidth=1)
        drawn = True
    if not drawn:
        ax.text(0.5, 0.5, "no numeric release in this period", ha="center", transform=ax.transAxes)
    ax.set_xscale("log")
    ax.set_xlabel("ε per release (pure-ε equivalent)")
    ax.set_ylabel("E|error| (÷ largest fitted)")
    ax.set_title("Error against ε, with the fitted E = c/ε")
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
    plots = {
        "spend": _spend_plot(rep),
        "burn_rate": _burn_plot(rep),
        "error_vs_epsilon": _error_plot(rep),
        "share_vs_weight": _share_plot(rep),
    }
    captions = {
        "spend": "Spent ÷ cap after each charge, the plan, the warn and cap lines, breaker and grant events.",
        "burn_rate": "Spend per hour ÷ the plan's spend per hour.",
        "error_vs_epsilon": "Each release's expected |error| against its ε, and the fitted E = c/ε per metric.",
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
                "releases",
                "sigma_mean",
                "ci95_half_width_mean",
                "expected_abs_error_mean",
                "planned_sigma",
                "c",
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
    parts.append(
        _table(
            adv.get("metrics", []),
            ["metric", "weight_now", "weight_advised", "expected_abs_error_this_period", "expected_abs_error_advised"],
        )
    )
    parts.append("</body></html>")
    return "\n".join(parts)


def write_page(rep: dict[str, Any], path: str | Path) -> Path:
    """Write the page to `path`; returns it."""
    out = Path(path)
    out.write_text(render_page(rep), encoding="utf-8")
    return out
