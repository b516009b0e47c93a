"""dpstream-ingest: Events per source by outcome and dead letters by reason."""

from __future__ import annotations

from typing import Any

from _panels import (
    Common,
    Grid,
    Q,
    Variable,
    bargauge_panel,
    dashboard,
    stat_panel,
    timeseries_panel,
)
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.models import common as cm

UID = "dpstream-ingest"

VARIABLES: list[Variable] = [
    Variable("source", "Source", "Event sources of the topology.", "label_values(dpstream_events_total, source)"),
]


def panels() -> list[Builder[Any]]:
    """The panels in grid order."""
    return [
        stat_panel(
            Common(
                id=1,
                title="Accepted events / s",
                description='rate(dpstream_events_total{outcome="accepted"}) over the selected sources.',
                grid=Grid(h=4, w=8, x=0, y=0),
                targets=[
                    Q(
                        (
                            'sum(rate(dpstream_events_total{source=~"$source",outcome="accepted"}[$__rate_interval]))'
                            " or on () vector(0)"
                        ),
                        "accepted/s",
                    ),
                ],
                unit="none",
                decimals=1,
                steps=[(None, "blue")],
            )
        ),
        stat_panel(
            Common(
                id=2,
                title="Not accepted",
                description="Share of events invalid, late, capped or clamped over the selected sources.",
                grid=Grid(h=4, w=8, x=8, y=0),
                targets=[
                    Q(
                        (
                            '(sum(rate(dpstream_events_total{source=~"$source",outcome!="accepted"}[$__rate_interval]))'
                            " or on () vector(0)) / "
                            'clamp_min(sum(rate(dpstream_events_total{source=~"$source"}[$__rate_interval])) '
                            "or on () vector(0), 1e-12)"
                        ),
                        "not accepted",
                    ),
                ],
                unit="percentunit",
                decimals=2,
                steps=[(None, "green"), (0.05, "orange"), (0.2, "red")],
            )
        ),
        stat_panel(
            Common(
                id=3,
                title="Dead letters (last 1 h)",
                description="increase(dpstream_dead_letters_total[1h]) over the selected sources.",
                grid=Grid(h=4, w=8, x=16, y=0),
                targets=[
                    Q(
                        ('sum(increase(dpstream_dead_letters_total{source=~"$source"}[1h])) or on () vector(0)'),
                        "dead letters",
                    ),
                ],
                decimals=0,
                steps=[(None, "green"), (1, "orange")],
            )
        ),
        timeseries_panel(
            Common(
                id=4,
                title="Events by outcome (/s)",
                description=(
                    "rate(dpstream_events_total) by outcome: accepted, invalid (dead-lettered), late "
                    "(window already closed by the event's own arrival), capped (over the contribution "
                    "bound), clamped (value clamped to bounds)."
                ),
                grid=Grid(h=9, w=12, x=0, y=4),
                targets=[
                    Q(
                        ('sum by (outcome) (rate(dpstream_events_total{source=~"$source"}[$__rate_interval]))'),
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
                id=5,
                title="Events by source and outcome (/s)",
                description="rate(dpstream_events_total) by source and outcome.",
                grid=Grid(h=9, w=12, x=12, y=4),
                targets=[
                    Q(
                        ('sum by (source, outcome) (rate(dpstream_events_total{source=~"$source"}[$__rate_interval]))'),
                        "{{source}} {{outcome}}",
                    ),
                ],
                unit="none",
                min=0,
            )
        ),
        timeseries_panel(
            Common(
                id=6,
                title="Share of events not accepted, by source and outcome",
                description="Each non-accepted outcome ÷ all events of its source.",
                grid=Grid(h=9, w=12, x=0, y=13),
                targets=[
                    Q(
                        (
                            "(sum by (source, outcome) "
                            '(rate(dpstream_events_total{source=~"$source",outcome!="accepted"}[$__rate_interval]))'
                            " / on (source) group_left () clamp_min(sum by (source) "
                            '(rate(dpstream_events_total{source=~"$source"}[$__rate_interval])), 1e-12)) or '
                            "on () vector(0)"
                        ),
                        "{{source}} {{outcome}}",
                    ),
                ],
                unit="percentunit",
                min=0,
            )
        ),
        timeseries_panel(
            Common(
                id=7,
                title="Dead letters by reason (/s)",
                description=(
                    "rate(dpstream_dead_letters_total) by reason (the fixed reason list; the raw event is"
                    " never logged)."
                ),
                grid=Grid(h=9, w=12, x=12, y=13),
                targets=[
                    Q(
                        (
                            "sum by (reason) "
                            '(rate(dpstream_dead_letters_total{source=~"$source"}[$__rate_interval])) or on '
                            "() vector(0)"
                        ),
                        "{{reason}}",
                    ),
                ],
                unit="none",
                min=0,
            ),
            fill_opacity=40,
            stacking=cm.StackingMode.NORMAL,
        ),
        bargauge_panel(
            Common(
                id=8,
                title="Dead letters in the last hour, by source and reason",
                description="increase(dpstream_dead_letters_total[1h]) by source and reason.",
                grid=Grid(h=8, w=24, x=0, y=22),
                targets=[
                    Q(
                        (
                            "sum by (source, reason) "
                            '(increase(dpstream_dead_letters_total{source=~"$source"}[1h])) or on () '
                            "vector(0)"
                        ),
                        "{{source}} {{reason}}",
                        instant=True,
                    ),
                ],
                decimals=0,
                min=0,
                steps=[(None, "orange")],
            )
        ),
    ]


def build() -> db.Dashboard:
    """The dpstream-ingest dashboard."""
    return dashboard(
        UID, "dpstream · Ingest", "Events per source by outcome and dead letters by reason.", VARIABLES, panels()
    )
