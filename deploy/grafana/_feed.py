"""dpstream-feed: the released noisy values themselves, per metric, with their CI band and budget ratio.

The series come from `dpstream exporter --topology FILE`, which follows the public releases topic:
data-independent (workers/telemetry/classes.py), so this dashboard is safe for any audience.
"""

from __future__ import annotations

from typing import Any

from _panels import Common, Grid, Q, Variable, by_query, dashboard, dashed, stat_panel, timeseries_panel
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.models import common as cm

UID = "dpstream-feed"

VALUE = 'dpstream_release_value{metric=~"$metric",key=~"$key"}'
HALF_WIDTH = 'dpstream_release_ci_half_width{metric=~"$metric",key=~"$key"}'
RATIO = 'dpstream_release_ratio_after{metric=~"$metric"}'
AGE = 'time() - dpstream_release_window_end_timestamp_seconds{metric=~"$metric"}'

VARIABLES: list[Variable] = [
    Variable(
        "metric",
        "Metric",
        "Metrics the exporter serves from the releases topic.",
        "label_values(dpstream_release_value, metric)",
    ),
    Variable(
        "key",
        "Key",
        "Keys of the selected metrics' latest releases (declared or DP-selected).",
        'label_values(dpstream_release_value{metric=~"$metric"}, key)',
    ),
]


def panels() -> list[Builder[Any]]:
    """A row per metric (repeated over $metric): the values with their band, the ratio, the window's age."""
    row = db.Row("$metric").id(1).repeat("metric").grid_pos(db.dashboard.GridPos(h=1, w=24, x=0, y=0))
    values = timeseries_panel(
        Common(
            id=2,
            title="Noisy value ± 95 % CI: $metric",
            description=(
                "The released noisy value of each key in the latest window (dpstream_release_value), with the "
                "95 % confidence interval's bounds (± dpstream_release_ci_half_width) as dashed lines."
            ),
            grid=Grid(h=9, w=16, x=0, y=1),
            targets=[
                Q(VALUE, "{{key}}"),
                Q(f"{VALUE} + {HALF_WIDTH}", "{{key}} upper"),
                Q(f"{VALUE} - {HALF_WIDTH}", "{{key}} lower"),
            ],
            overrides=[by_query("B", dashed()), by_query("C", dashed())],
        )
    )
    ratio = stat_panel(
        Common(
            id=3,
            title="Budget ratio after the latest release",
            description=(
                "The scope's spent ratio recorded with the metric's latest release (charges whose public "
                "time P(w) has passed). The budget dashboard shows the scope's own warn_at."
            ),
            grid=Grid(h=5, w=8, x=16, y=1),
            targets=[Q(RATIO, "{{metric}}")],
            unit="percentunit",
            decimals=1,
            min=0,
            max=1,
            steps=[(None, "green"), (0.8, "orange"), (1, "red")],
        ),
        graph_mode=cm.BigValueGraphMode.AREA,
    )
    age = stat_panel(
        Common(
            id=4,
            title="Age of the latest window",
            description="Seconds since the end of the metric's latest released window.",
            grid=Grid(h=4, w=8, x=16, y=6),
            targets=[Q(AGE, "{{metric}}")],
            unit="s",
            decimals=0,
            steps=[(None, "blue")],
        )
    )
    return [row, values, ratio, age]


def build() -> db.Dashboard:
    """The dpstream-feed dashboard."""
    return dashboard(
        UID,
        "dpstream feed",
        "The noisy metrics feed as released: each metric's values per key with their 95 % CI band, the "
        "scope's budget ratio after the release and the age of the latest window. Data-independent series.",
        VARIABLES,
        panels(),
    )
