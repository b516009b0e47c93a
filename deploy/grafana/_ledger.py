"""dpstream-ledger: The Redis budget ledger: request latency by op, errors, availability."""

from __future__ import annotations

from typing import Any

from _panels import (
    Common,
    Grid,
    Q,
    Variable,
    dashboard,
    stat_panel,
    statetimeline_panel,
    timeseries_panel,
)
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.models import common as cm

UID = "dpstream-ledger"

VARIABLES: list[Variable] = []


def panels() -> list[Builder[Any]]:
    """The panels in grid order."""
    return [
        stat_panel(
            Common(
                id=1,
                title="Ledger up",
                description=(
                    "dpstream_ledger_up per scrape job: 0 means the Redis ledger is unreachable and "
                    "releases fail closed."
                ),
                grid=Grid(h=4, w=8, x=0, y=0),
                targets=[
                    Q("min by (job) (dpstream_ledger_up)", "{{job}}", instant=True),
                ],
                steps=[(None, "red"), (1, "green")],
                mappings={"0": ("down", "red"), "1": ("up", "green")},
            )
        ),
        stat_panel(
            Common(
                id=2,
                title="Ledger errors (last 1 h)",
                description="increase(dpstream_ledger_errors_total[1h]) over every op.",
                grid=Grid(h=4, w=8, x=8, y=0),
                targets=[
                    Q("sum(increase(dpstream_ledger_errors_total[1h])) or on () vector(0)", "errors"),
                ],
                decimals=0,
                steps=[(None, "green"), (1, "red")],
            )
        ),
        stat_panel(
            Common(
                id=3,
                title="Slowest op p99",
                description="The highest p99 of dpstream_ledger_request_duration_seconds across ops.",
                grid=Grid(h=4, w=8, x=16, y=0),
                targets=[
                    Q(
                        (
                            "max(histogram_quantile(0.99, sum by (le, op) "
                            "(rate(dpstream_ledger_request_duration_seconds_bucket[$__rate_interval]))))"
                        ),
                        "p99",
                    ),
                ],
                unit="s",
                steps=[(None, "green"), (0.05, "orange"), (0.25, "red")],
            )
        ),
        timeseries_panel(
            Common(
                id=4,
                title="Request latency p50 / p99 by op",
                description=(
                    "histogram_quantile over dpstream_ledger_request_duration_seconds by op (quote, "
                    "charge, commit, stored_payload, stored_charge, status)."
                ),
                grid=Grid(h=9, w=12, x=0, y=4),
                targets=[
                    Q(
                        (
                            "histogram_quantile(0.5, sum by (le, op) "
                            "(rate(dpstream_ledger_request_duration_seconds_bucket[$__rate_interval])))"
                        ),
                        "{{op}} p50",
                    ),
                    Q(
                        (
                            "histogram_quantile(0.99, sum by (le, op) "
                            "(rate(dpstream_ledger_request_duration_seconds_bucket[$__rate_interval])))"
                        ),
                        "{{op}} p99",
                    ),
                ],
                unit="s",
                min=0,
            )
        ),
        timeseries_panel(
            Common(
                id=5,
                title="Requests by op (/s)",
                description="rate(dpstream_ledger_request_duration_seconds_count) by op.",
                grid=Grid(h=9, w=12, x=12, y=4),
                targets=[
                    Q(
                        ("sum by (op) (rate(dpstream_ledger_request_duration_seconds_count[$__rate_interval]))"),
                        "{{op}}",
                    ),
                ],
                unit="none",
                min=0,
            )
        ),
        timeseries_panel(
            Common(
                id=6,
                title="Errors by op (/s)",
                description="rate(dpstream_ledger_errors_total) by op.",
                grid=Grid(h=9, w=12, x=0, y=13),
                targets=[
                    Q(
                        ("sum by (op) (rate(dpstream_ledger_errors_total[$__rate_interval])) or on () vector(0)"),
                        "{{op}}",
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
                id=7,
                title="Error ratio by op",
                description="Ledger errors ÷ ledger requests per op.",
                grid=Grid(h=9, w=12, x=12, y=13),
                targets=[
                    Q(
                        (
                            "(sum by (op) (rate(dpstream_ledger_errors_total[$__rate_interval])) or 0 * sum "
                            "by (op) "
                            "(rate(dpstream_ledger_request_duration_seconds_count[$__rate_interval]))) / "
                            "clamp_min(sum by (op) "
                            "(rate(dpstream_ledger_request_duration_seconds_count[$__rate_interval])), 1e-12)"
                        ),
                        "{{op}}",
                    ),
                ],
                unit="percentunit",
                min=0,
            )
        ),
        statetimeline_panel(
            Common(
                id=8,
                title="Ledger up over time",
                description="dpstream_ledger_up per scrape job and instance.",
                grid=Grid(h=8, w=12, x=0, y=22),
                targets=[
                    Q("min by (job, instance) (dpstream_ledger_up)", "{{job}} {{instance}}"),
                ],
                steps=[(None, "red"), (1, "green")],
                mappings={"0": ("down", "red"), "1": ("up", "green")},
            )
        ),
        timeseries_panel(
            Common(
                id=9,
                title="Releases lost to an unavailable ledger (/min)",
                description=(
                    'rate(dpstream_releases_total{outcome="ledger_unavailable"}) by metric: the ledger '
                    "fails closed, so these windows were not released."
                ),
                grid=Grid(h=8, w=12, x=12, y=22),
                targets=[
                    Q(
                        (
                            "sum by (metric) "
                            '(rate(dpstream_releases_total{outcome="ledger_unavailable"}[$__rate_interval])) '
                            "* 60 or on () vector(0)"
                        ),
                        "{{metric}}",
                    ),
                ],
                unit="none",
                min=0,
            )
        ),
    ]


def build() -> db.Dashboard:
    """The dpstream-ledger dashboard."""
    return dashboard(
        UID,
        "dpstream · Ledger",
        "The Redis budget ledger: request latency by op, errors, availability.",
        VARIABLES,
        panels(),
    )
