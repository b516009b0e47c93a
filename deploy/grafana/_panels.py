"""Small builders over grafana-foundation-sdk for the dpstream dashboards: one call per panel shape.

Every dashboard shares the same data source, links, annotations and time settings, and its panels
repeat a few shapes (stat, gauge, bar gauge, time series, state timeline); these helpers keep the
dashboard modules to their content: titles, queries, units and thresholds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from grafana_foundation_sdk.builders import bargauge, gauge, prometheus, stat, statetimeline, timeseries
from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm

DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="dpstream-prometheus")
"""The provisioned Prometheus data source (deploy/grafana/provisioning/datasources/prometheus.yaml)."""

Steps = Sequence[tuple[float | None, str]]
"""Threshold steps as (value, colour); the first value is None (the base colour)."""


@dataclass(frozen=True)
class Q:
    """One Prometheus target: expression, legend and whether it is an instant query."""

    expr: str
    legend: str
    instant: bool = False


@dataclass(frozen=True)
class Grid:
    """A panel's place on the 24-column grid."""

    h: int
    w: int
    x: int
    y: int

    def pos(self) -> dm.GridPos:
        """The SDK's GridPos."""
        return dm.GridPos(h=self.h, w=self.w, x=self.x, y=self.y)


@dataclass
class Common:
    """What every panel has: id, title, description, place, targets, and field defaults."""

    id: int
    title: str
    description: str
    grid: Grid
    targets: Sequence[Q]
    unit: str | None = None
    decimals: float | None = None
    min: float | None = None
    max: float | None = None
    steps: Steps | None = None
    mappings: dict[str, tuple[str, str]] | None = None
    overrides: list[tuple[str, list[dm.DynamicConfigValue]]] = field(default_factory=list)
    repeat: str | None = None
    transformations: list[dm.DataTransformerConfig] = field(default_factory=list)


def query(target: Q, ref_id: str) -> prometheus.Dataquery:
    """A Prometheus target on the dpstream data source (range unless instant)."""
    built = prometheus.Dataquery().ref_id(ref_id).datasource(DATASOURCE).expr(target.expr)
    built = built.legend_format(target.legend)
    return built.instant() if target.instant else built.range()


def thresholds(steps: Steps) -> db.ThresholdsConfig:
    """Absolute threshold steps."""
    return (
        db.ThresholdsConfig()
        .mode(dm.ThresholdsMode.ABSOLUTE)
        .steps([dm.Threshold(value=value, color=color) for value, color in steps])
    )


def value_mappings(mapping: dict[str, tuple[str, str]]) -> list[dm.ValueMapping]:
    """One value-to-text mapping: value -> (text, colour), indexed in order."""
    options = {
        value: dm.ValueMappingResult(text=text, color=color, index=index)
        for index, (value, (text, color)) in enumerate(mapping.items())
    }
    return [dm.ValueMap(options=options)]


def by_query(ref_id: str, properties: list[dm.DynamicConfigValue]) -> tuple[str, list[dm.DynamicConfigValue]]:
    """An override for the series of one query."""
    return (ref_id, properties)


def dashed(color: str | None = None) -> list[dm.DynamicConfigValue]:
    """Override properties: a dashed line, optionally in a fixed colour."""
    properties = [dm.DynamicConfigValue(id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]})]
    if color:
        properties.append(dm.DynamicConfigValue(id_val="color", value={"mode": "fixed", "fixedColor": color}))
    return properties


def mapped(mapping: dict[str, tuple[str, str]], steps: Steps | None = None) -> list[dm.DynamicConfigValue]:
    """Override properties: value mappings (value -> text, colour), and optionally their own thresholds."""
    properties = [dm.DynamicConfigValue(id_val="mappings", value=value_mappings(mapping))]
    if steps is not None:
        properties.append(dm.DynamicConfigValue(id_val="thresholds", value=thresholds(steps).build()))
    return properties


def threshold_from(ref_id: str, field_name: str) -> dm.DataTransformerConfig:
    """A transformation: the first threshold step's value is the last value of query ref_id's field."""
    return dm.DataTransformerConfig(
        id_val="configFromData",
        options={"configRefId": ref_id, "mappings": [{"fieldName": field_name, "handlerKey": "threshold1"}]},
    )


def _apply(panel: Any, spec: Common) -> Any:
    """Set the fields every panel shares."""
    panel = panel.id(spec.id).title(spec.title).description(spec.description).grid_pos(spec.grid.pos())
    panel = panel.datasource(DATASOURCE)
    for index, target in enumerate(spec.targets):
        panel = panel.with_target(query(target, chr(ord("A") + index)))
    if spec.unit is not None:
        panel = panel.unit(spec.unit)
    if spec.decimals is not None:
        panel = panel.decimals(spec.decimals)
    if spec.min is not None:
        panel = panel.min(spec.min)
    if spec.max is not None:
        panel = panel.max(spec.max)
    if spec.steps is not None:
        panel = panel.thresholds(thresholds(spec.steps))
    if spec.mappings is not None:
        panel = panel.mappings(value_mappings(spec.mappings))
    for ref_id, properties in spec.overrides:
        panel = panel.override_by_query(ref_id, properties)
    if spec.repeat:
        panel = panel.repeat(spec.repeat).repeat_direction("h")
    for transformation in spec.transformations:
        panel = panel.with_transformation(transformation)
    return panel


def _reduce() -> cb.ReduceDataOptions:
    return cb.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False)


def _legend(show: bool = True) -> cb.VizLegendOptions:
    return (
        cb.VizLegendOptions()
        .display_mode(cm.LegendDisplayMode.LIST)
        .placement(cm.LegendPlacement.BOTTOM)
        .show_legend(show)
    )


def stat_panel(
    spec: Common,
    color_mode: cm.BigValueColorMode = cm.BigValueColorMode.BACKGROUND,
    graph_mode: cm.BigValueGraphMode = cm.BigValueGraphMode.NONE,
    text_mode: cm.BigValueTextMode = cm.BigValueTextMode.VALUE_AND_NAME,
) -> stat.Panel:
    """A big-number stat of the last value."""
    panel = _apply(stat.Panel(), spec)
    return (
        panel.reduce_options(_reduce())
        .color_mode(color_mode)
        .graph_mode(graph_mode)
        .text_mode(text_mode)
        .justify_mode(cm.BigValueJustifyMode.AUTO)
        .orientation(cm.VizOrientation.AUTO)
    )


def gauge_panel(spec: Common) -> gauge.Panel:
    """A gauge of the last value with threshold markers."""
    panel = _apply(gauge.Panel(), spec)
    return (
        panel.reduce_options(_reduce())
        .show_threshold_labels(False)
        .show_threshold_markers(True)
        .orientation(cm.VizOrientation.AUTO)
    )


def bargauge_panel(spec: Common) -> bargauge.Panel:
    """Horizontal bars of the last value per series."""
    panel = _apply(bargauge.Panel(), spec)
    return (
        panel.reduce_options(_reduce())
        .display_mode(cm.BarGaugeDisplayMode.BASIC)
        .orientation(cm.VizOrientation.HORIZONTAL)
        .show_unfilled(True)
        .value_mode(cm.BarGaugeValueMode.COLOR)
        .min_viz_height(16)
        .min_viz_width(8)
    )


def timeseries_panel(
    spec: Common,
    fill_opacity: float = 0,
    stacking: cm.StackingMode = cm.StackingMode.NONE,
    draw_style: cm.GraphDrawStyle = cm.GraphDrawStyle.LINE,
    threshold_style: cm.GraphTresholdsStyleMode | None = None,
    log_scale: bool = False,
    legend: bool = True,
) -> timeseries.Panel:
    """Lines over time, one per series; optionally stacked, filled, with threshold lines or a log axis."""
    panel = _apply(timeseries.Panel(), spec)
    panel = (
        panel.draw_style(draw_style)
        .line_width(1)
        .fill_opacity(fill_opacity)
        .show_points(cm.VisibilityMode.NEVER)
        .span_nulls(False)
        .stacking(cb.StackingConfig().mode(stacking).group("A"))
        .legend(_legend(legend))
        .tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING))
    )
    if threshold_style is not None:
        panel = panel.thresholds_style(cb.GraphThresholdsStyleConfig().mode(threshold_style))
    if log_scale:
        panel = panel.scale_distribution(cb.ScaleDistributionConfig().type(cm.ScaleDistribution.LOG).log(10))
    return panel


def statetimeline_panel(spec: Common) -> statetimeline.Panel:
    """A state timeline: one band per series, merged values."""
    panel = _apply(statetimeline.Panel(), spec)
    return (
        panel.fill_opacity(80)
        .line_width(0)
        .merge_values(True)
        .show_value(cm.VisibilityMode.AUTO)
        .align_value(cm.TimelineValueAlignment.LEFT)
        .row_height(0.9)
        .legend(_legend(False))
    )


@dataclass(frozen=True)
class Variable:
    """A label_values query variable on the dpstream data source."""

    name: str
    label: str
    description: str
    query: str
    include_all: bool = True


def variable(spec: Variable) -> db.QueryVariable:
    """A multi-value query variable refreshed on time-range change, sorted, with 'All' matching any value."""
    built = (
        db.QueryVariable(spec.name)
        .label(spec.label)
        .description(spec.description)
        .datasource(DATASOURCE)
        .query(spec.query)
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .regex("")
        .hide(dm.VariableHide.DONT_HIDE)
    )
    if spec.include_all:
        built = built.include_all(True).all_value(".*")
        built = built.current(dm.VariableOption(selected=True, text=["All"], value=["$__all"]))
    return built


def dashboard(
    uid: str,
    title: str,
    description: str,
    variables: Sequence[Variable],
    panels: Sequence[cogbuilder.Builder[Any]],
) -> db.Dashboard:
    """A dpstream dashboard: fixed uid, tag `dpstream`, UTC, last 24 h, 30 s refresh, a link to the others."""
    built = (
        db.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["dpstream"])
        .timezone("utc")
        .editable()
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .version(1)
        .refresh("30s")
        .live_now(False)
        .time("now-24h", "now")
        .fiscal_year_start_month(0)
        .week_start("")
        .link(
            db.DashboardLink("dpstream dashboards")
            .type(dm.DashboardLinkType.DASHBOARDS)
            .tags(["dpstream"])
            .as_dropdown(True)
            .include_vars(True)
            .keep_time(True)
            .icon("external link")
            .target_blank(False)
            .tooltip("")
            .url("")
        )
    )
    for spec in variables:
        built = built.with_variable(variable(spec))
    for panel in panels:
        built = built.with_row(panel) if isinstance(panel, db.Row) else built.with_panel(panel)
    return built
