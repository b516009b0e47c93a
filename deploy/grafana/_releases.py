"""dpstream-releases: Noisy releases per metric: outcomes, noise σ, close → publish latency, lag and pending windows."""

from __future__ import annotations

from typing import Any

from _panels import (
    Common,
    Grid,
    Q,
    Variable,
    dashboard,
    stat_panel,
    timeseries_panel,
)
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.models import common as cm

UID = "dpstream-releases"

VARIABLES: list[Variable] = [
    Variable("metric", "Metric", "Released metrics of the topology.", "label_values(dpstream_releases_total, metric)"),
]


def panels() -> list[Builder[Any]]:
    """The panels in grid order."""
    return [
        stat_panel(
            Common(
                id=1,
                title="Published / min",
                description="Releases published per minute (outcome=published) over the selected metrics.",
                grid=Grid(h=4, w=6, x=0, y=0),
                targets=[
                    Q(
                        (
                            'sum(rate(dpstream_releases_total{metric=~"$metric",outcome="published"}[$__rate_interval]))'
                            " * 60 or on () vector(0)"
                        ),
                        "published/min",
                    ),
                ],
                decimals=1,
                steps=[(None, "blue")],
            )
        ),
        stat_panel(
            Common(
                id=2,
                title="Not released (last 1 h)",
                description=(
                    "Windows refused for budget or breaker, refused because the ledger was unavailable, "
                    "or failed, in the last hour."
                ),
                grid=Grid(h=4, w=6, x=6, y=0),
                targets=[
                    Q(
                        (
                            'sum(increase(dpstream_releases_total{metric=~"$metric",outcome=~"refused_budget|refused_breaker|ledger_unavailable|failed"}[1h]))'
                            " or on () vector(0)"
                        ),
                        "not released",
                    ),
                ],
                decimals=0,
                steps=[(None, "green"), (1, "red")],
            )
        ),
        stat_panel(
            Common(
                id=3,
                title="Oldest unreleased window",
                description="max(dpstream_release_lag_seconds): age of the oldest closed window not yet released.",
                grid=Grid(h=4, w=6, x=12, y=0),
                targets=[
                    Q('max(dpstream_release_lag_seconds{metric=~"$metric"})', "lag"),
                ],
                unit="s",
                steps=[(None, "green"), (60, "orange"), (300, "red")],
            )
        ),
        stat_panel(
            Common(
                id=4,
                title="Windows pending",
                description="sum(dpstream_windows_pending): closed windows waiting for partials or their release.",
                grid=Grid(h=4, w=6, x=18, y=0),
                targets=[
                    Q('sum(dpstream_windows_pending{metric=~"$metric"})', "pending"),
                ],
                decimals=0,
                steps=[(None, "blue")],
            )
        ),
        timeseries_panel(
            Common(
                id=5,
                title="Releases by outcome (/min)",
                description=(
                    "rate(dpstream_releases_total) by outcome: published, duplicate (a stored payload "
                    "republished), refused_budget, refused_breaker, ledger_unavailable, failed."
                ),
                grid=Grid(h=9, w=12, x=0, y=4),
                targets=[
                    Q(
                        ('sum by (outcome) (rate(dpstream_releases_total{metric=~"$metric"}[$__rate_interval])) * 60'),
                        "{{outcome}}",
                    ),
                ],
                unit="none",
                min=0,
            ),
            fill_opacity=40,
            stacking=cm.StackingMode.NORMAL,
        ),
        timeseries_panel(
            Common(
                id=6,
                title="Releases by metric and outcome (/min)",
                description="rate(dpstream_releases_total) by metric and outcome.",
                grid=Grid(h=9, w=12, x=12, y=4),
                targets=[
                    Q(
                        (
                            "sum by (metric, outcome) "
                            '(rate(dpstream_releases_total{metric=~"$metric"}[$__rate_interval])) * 60'
                        ),
                        "{{metric}} {{outcome}}",
                    ),
                ],
                unit="none",
                min=0,
            )
        ),
        timeseries_panel(
            Common(
                id=7,
                title="Share of windows not released, by metric",
                description=(
                    "Refused (budget, breaker), ledger unavailable or failed ÷ all release attempts, per "
                    "metric (1 h window)."
                ),
                grid=Grid(h=9, w=12, x=0, y=13),
                targets=[
                    Q(
                        (
                            "(sum by (metric) "
                            '(increase(dpstream_releases_total{metric=~"$metric",outcome=~"refused_budget|refused_breaker|ledger_unavailable|failed"}[1h]))'
                            " or 0 * sum by (metric) "
                            '(increase(dpstream_releases_total{metric=~"$metric"}[1h]))) / clamp_min(sum by '
                            '(metric) (increase(dpstream_releases_total{metric=~"$metric"}[1h])), 1e-12)'
                        ),
                        "{{metric}}",
                    ),
                ],
                unit="percentunit",
                min=0,
                max=1,
            )
        ),
        timeseries_panel(
            Common(
                id=8,
                title="Close → publish latency p50 / p99",
                description=(
                    "histogram_quantile over dpstream_release_latency_seconds: from a window's close time"
                    " to its publication, over the selected metrics."
                ),
                grid=Grid(h=9, w=12, x=12, y=13),
                targets=[
                    Q(
                        (
                            "histogram_quantile(0.5, sum by (le) "
                            '(rate(dpstream_release_latency_seconds_bucket{metric=~"$metric"}[$__rate_interval])))'
                        ),
                        "p50",
                    ),
                    Q(
                        (
                            "histogram_quantile(0.99, sum by (le) "
                            '(rate(dpstream_release_latency_seconds_bucket{metric=~"$metric"}[$__rate_interval])))'
                        ),
                        "p99",
                    ),
                    Q(
                        (
                            'sum(rate(dpstream_release_latency_seconds_sum{metric=~"$metric"}[$__rate_interval]))'
                            " / "
                            'clamp_min(sum(rate(dpstream_release_latency_seconds_count{metric=~"$metric"}[$__rate_interval])),'
                            " 1e-12)"
                        ),
                        "mean",
                    ),
                ],
                unit="s",
                min=0,
            )
        ),
        timeseries_panel(
            Common(
                id=9,
                title="Close → publish p50 / p99 by metric",
                description="Median and 99th percentile of dpstream_release_latency_seconds per metric.",
                grid=Grid(h=9, w=12, x=0, y=22),
                targets=[
                    Q(
                        (
                            "histogram_quantile(0.99, sum by (le, metric) "
                            '(rate(dpstream_release_latency_seconds_bucket{metric=~"$metric"}[$__rate_interval])))'
                        ),
                        "{{metric}} p99",
                    ),
                    Q(
                        (
                            "histogram_quantile(0.5, sum by (le, metric) "
                            '(rate(dpstream_release_latency_seconds_bucket{metric=~"$metric"}[$__rate_interval])))'
                        ),
                        "{{metric}} p50",
                    ),
                ],
                unit="s",
                min=0,
            )
        ),
        timeseries_panel(
            Common(
                id=10,
                title="Noise σ by metric",
                description=(
                    "dpstream_release_noise_stddev: standard deviation of the noise of the latest release"
                    " (grows when on_warning stretches the noise)."
                ),
                grid=Grid(h=9, w=12, x=12, y=22),
                targets=[
                    Q('max by (metric) (dpstream_release_noise_stddev{metric=~"$metric"})', "{{metric}}"),
                ],
                unit="none",
                min=0,
            )
        ),
        timeseries_panel(
            Common(
                id=11,
                title="Release lag by metric",
                description=(
                    "dpstream_release_lag_seconds: age of the oldest closed, unreleased window (a missing"
                    " partial delays a release)."
                ),
                grid=Grid(h=9, w=12, x=0, y=31),
                targets=[
                    Q('max by (metric) (dpstream_release_lag_seconds{metric=~"$metric"})', "{{metric}}"),
                ],
                unit="s",
                min=0,
            )
        ),
        timeseries_panel(
            Common(
                id=12,
                title="Windows pending by metric",
                description=(
                    "dpstream_windows_pending: closed windows waiting for every partition's partial or "
                    "for their release."
                ),
                grid=Grid(h=8, w=24, x=0, y=40),
                targets=[
                    Q('sum by (metric) (dpstream_windows_pending{metric=~"$metric"})', "{{metric}}"),
                ],
                unit="none",
                decimals=0,
                min=0,
            )
        ),
    ]


def build() -> db.Dashboard:
    """The dpstream-releases dashboard."""
    return dashboard(
        UID,
        "dpstream · Releases",
        ("Noisy releases per metric: outcomes, noise σ, close → publish latency, lag and pending windows."),
        VARIABLES,
        panels(),
    )
