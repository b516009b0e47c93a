"""dpstream-budget: Privacy budget per scope: spend against cap and plan, burn rate, breaker, time to exhaustion."""

from __future__ import annotations

from typing import Any

from _panels import (
    Common,
    Grid,
    Q,
    Variable,
    by_query,
    dashboard,
    dashed,
    gauge_panel,
    mapped,
    stat_panel,
    statetimeline_panel,
    threshold_from,
    timeseries_panel,
)
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.models import common as cm

UID = "dpstream-budget"

VARIABLES: list[Variable] = [
    Variable(
        "scope",
        "Budget scope",
        ("Budget scopes served by the exporter and the workers (read from the ledger at scrape time)."),
        "label_values(dpstream_budget_spent_ratio, scope)",
    ),
]


def panels() -> list[Builder[Any]]:
    """The panels in grid order."""
    return [
        gauge_panel(
            Common(
                id=1,
                title="Spent / cap: $scope",
                description=(
                    "This period's spend as a fraction of the scope's cap (dpstream_budget_spent_ratio). "
                    "The first threshold is the scope's warn ratio (dpstream_budget_warn_ratio, query B):"
                    " past it the reserve is being drawn. Red at 1: the cap is reached."
                ),
                grid=Grid(h=7, w=6, x=0, y=0),
                targets=[
                    Q('max by (scope) (dpstream_budget_spent_ratio{scope=~"$scope"})', "{{scope}}", instant=True),
                    Q('max(dpstream_budget_warn_ratio{scope=~"$scope"})', "warn_ratio", instant=True),
                ],
                unit="percentunit",
                decimals=1,
                min=0,
                max=1,
                steps=[(None, "green"), (0.8, "orange"), (1, "red")],
                repeat="scope",
                transformations=[threshold_from("B", "warn_ratio")],
            )
        ),
        stat_panel(
            Common(
                id=2,
                title="Budget state",
                description=(
                    "Current state per scope from dpstream_budget_state: normal, warning (spent ratio at "
                    "or past the warn ratio: noise stretched or releases thinned) or open (nothing is "
                    "released)."
                ),
                grid=Grid(h=4, w=6, x=0, y=7),
                targets=[
                    Q(
                        (
                            'max by (scope) (dpstream_budget_state{scope=~"$scope",state="warning"}) + 2 * '
                            'max by (scope) (dpstream_budget_state{scope=~"$scope",state="open"})'
                        ),
                        "{{scope}}",
                        instant=True,
                    ),
                ],
                steps=[(None, "green"), (1, "orange"), (2, "red")],
                mappings={"0": ("normal", "green"), "1": ("warning", "orange"), "2": ("open", "red")},
            )
        ),
        stat_panel(
            Common(
                id=3,
                title="Breaker",
                description=(
                    "dpstream_breaker_open per scope: 1 while the breaker refuses every release of the scope."
                ),
                grid=Grid(h=4, w=4, x=6, y=7),
                targets=[
                    Q('max by (scope) (dpstream_breaker_open{scope=~"$scope"})', "{{scope}}", instant=True),
                ],
                steps=[(None, "green"), (1, "red")],
                mappings={"0": ("closed", "green"), "1": ("open", "red")},
            )
        ),
        stat_panel(
            Common(
                id=4,
                title="ε spent this period",
                description="dpstream_budget_epsilon_spent: the period's spend converted to ε at the scope's δ.",
                grid=Grid(h=4, w=5, x=10, y=7),
                targets=[
                    Q('max by (scope) (dpstream_budget_epsilon_spent{scope=~"$scope"})', "{{scope}}", instant=True),
                ],
                decimals=3,
                steps=[(None, "blue")],
            )
        ),
        stat_panel(
            Common(
                id=5,
                title="Reserve",
                description=(
                    "dpstream_budget_reserve_ratio: fraction of the cap never planned (drawn only by "
                    "operators or metrics allowed to use it)."
                ),
                grid=Grid(h=4, w=4, x=15, y=7),
                targets=[
                    Q('max by (scope) (dpstream_budget_reserve_ratio{scope=~"$scope"})', "{{scope}}", instant=True),
                ],
                unit="percentunit",
                steps=[(None, "blue")],
            )
        ),
        stat_panel(
            Common(
                id=6,
                title="Period ends in",
                description=(
                    "Time left in the current budget period (dpstream_budget_period_end_timestamp_seconds − now)."
                ),
                grid=Grid(h=4, w=5, x=19, y=7),
                targets=[
                    Q(
                        ('max by (scope) (dpstream_budget_period_end_timestamp_seconds{scope=~"$scope"}) - time()'),
                        "{{scope}}",
                        instant=True,
                    ),
                ],
                unit="s",
                steps=[(None, "blue")],
            )
        ),
        timeseries_panel(
            Common(
                id=7,
                title="Spend vs plan this period",
                description=(
                    "Spent ratio against the ratio the plan has spent by now "
                    "(dpstream_budget_planned_ratio), with the warn ratio. Spend above the plan line "
                    "means the budget is burning faster than planned."
                ),
                grid=Grid(h=9, w=12, x=0, y=11),
                targets=[
                    Q('max by (scope) (dpstream_budget_spent_ratio{scope=~"$scope"})', "{{scope}} spent"),
                    Q('max by (scope) (dpstream_budget_planned_ratio{scope=~"$scope"})', "{{scope}} plan"),
                    Q('max by (scope) (dpstream_budget_warn_ratio{scope=~"$scope"})', "{{scope}} warn"),
                ],
                unit="percentunit",
                min=0,
                overrides=[by_query("C", dashed("orange"))],
            )
        ),
        timeseries_panel(
            Common(
                id=8,
                title="Burn rate (actual ÷ planned spend rate)",
                description=(
                    "rate(dpstream_budget_spent_total[W]) ÷ avg_over_time(dpstream_budget_planned_spend_rate[W]) "
                    "per scope, the spend against the plan's over the same window W (a max_windows metric's "
                    "plan is front-loaded): 1 is on plan, above 1 burns faster than planned. Lines at 6 and "
                    "14.4 are the "
                    "DPBudgetBurnRateElevated and DPBudgetBurnRateHigh thresholds (on a daily scope their"
                    " windows are 15 m and 5 m)."
                ),
                grid=Grid(h=9, w=12, x=12, y=11),
                targets=[
                    Q(
                        (
                            "max by (scope, currency) "
                            '(rate(dpstream_budget_spent_total{scope=~"$scope"}[$__rate_interval])) / '
                            "clamp_min(max by (scope, currency) (avg_over_time("
                            'dpstream_budget_planned_spend_rate{scope=~"$scope"}[$__rate_interval])), 1e-12)'
                        ),
                        "{{scope}} now",
                    ),
                    Q(
                        (
                            "max by (scope, currency) "
                            '(rate(dpstream_budget_spent_total{scope=~"$scope"}[15m])) / clamp_min(max by '
                            "(scope, currency) (avg_over_time("
                            'dpstream_budget_planned_spend_rate{scope=~"$scope"}[15m])), 1e-12)'
                        ),
                        "{{scope}} 15m",
                    ),
                    Q(
                        (
                            "max by (scope, currency) "
                            '(rate(dpstream_budget_spent_total{scope=~"$scope"}[1h])) / clamp_min(max by '
                            "(scope, currency) (avg_over_time("
                            'dpstream_budget_planned_spend_rate{scope=~"$scope"}[1h])), 1e-12)'
                        ),
                        "{{scope}} 1h",
                    ),
                ],
                unit="none",
                decimals=2,
                min=0,
                steps=[(None, "green"), (6, "orange"), (14.4, "red")],
            ),
            threshold_style=cm.GraphTresholdsStyleMode.LINE_AND_AREA,
        ),
        timeseries_panel(
            Common(
                id=9,
                title="Spend per hour vs plan (scope currency)",
                description=(
                    "increase(dpstream_budget_spent_total[1h]) against what the plan spent in the same hour "
                    "(avg_over_time(dpstream_budget_planned_spend_rate[1h]) × 3600), in the scope's currency "
                    "(ρ for zCDP, ε for pure)."
                ),
                grid=Grid(h=9, w=12, x=0, y=20),
                targets=[
                    Q(
                        ('max by (scope, currency) (increase(dpstream_budget_spent_total{scope=~"$scope"}[1h]))'),
                        "{{scope}} spent/h ({{currency}})",
                    ),
                    Q(
                        (
                            "max by (scope, currency) "
                            '(avg_over_time(dpstream_budget_planned_spend_rate{scope=~"$scope"}[1h])) * 3600'
                        ),
                        "{{scope}} planned/h ({{currency}})",
                    ),
                ],
                unit="none",
                min=0,
            )
        ),
        timeseries_panel(
            Common(
                id=10,
                title="Spent and cap (scope currency)",
                description=(
                    "dpstream_budget_spent and dpstream_budget_cap of the current period, in the scope's currency."
                ),
                grid=Grid(h=9, w=12, x=12, y=20),
                targets=[
                    Q(
                        'max by (scope, currency) (dpstream_budget_spent{scope=~"$scope"})',
                        "{{scope}} spent ({{currency}})",
                    ),
                    Q(
                        'max by (scope, currency) (dpstream_budget_cap{scope=~"$scope"})',
                        "{{scope}} cap ({{currency}})",
                    ),
                ],
                unit="none",
                min=0,
            )
        ),
        timeseries_panel(
            Common(
                id=11,
                title="Time to exhaustion vs time to period end",
                description=(
                    "(cap − spent) ÷ the last hour's spend rate: when the cap is reached at the current "
                    "rate (capped at 30 days when nothing is spent), against the time left in the period."
                    " Exhaustion below the period end means releases will be refused before the budget "
                    "renews."
                ),
                grid=Grid(h=9, w=12, x=0, y=29),
                targets=[
                    Q(
                        (
                            "clamp_max(clamp_min(min by (scope) ((max by (scope, currency) "
                            '(dpstream_budget_cap{scope=~"$scope"}) - max by (scope, currency) '
                            '(dpstream_budget_spent{scope=~"$scope"})) / clamp_min(max by (scope, currency) '
                            '(rate(dpstream_budget_spent_total{scope=~"$scope"}[1h])), 1e-12)), 0), 2592000)'
                        ),
                        "{{scope}} to exhaustion",
                    ),
                    Q(
                        ('max by (scope) (dpstream_budget_period_end_timestamp_seconds{scope=~"$scope"}) - time()'),
                        "{{scope}} to period end",
                    ),
                ],
                unit="s",
                min=0,
            ),
            log_scale=True,
        ),
        statetimeline_panel(
            Common(
                id=12,
                title="Breaker and budget state",
                description=(
                    "dpstream_breaker_open (closed/open) and dpstream_budget_state (normal/warning/open) "
                    "per scope over time."
                ),
                grid=Grid(h=9, w=12, x=12, y=29),
                targets=[
                    Q('max by (scope) (dpstream_breaker_open{scope=~"$scope"})', "{{scope}} breaker"),
                    Q(
                        (
                            'max by (scope) (dpstream_budget_state{scope=~"$scope",state="warning"}) + 2 * '
                            'max by (scope) (dpstream_budget_state{scope=~"$scope",state="open"})'
                        ),
                        "{{scope}} state",
                    ),
                ],
                steps=[(None, "green"), (1, "orange"), (2, "red")],
                overrides=[
                    by_query(
                        "A", mapped({"0": ("closed", "green"), "1": ("open", "red")}, [(None, "green"), (1, "red")])
                    ),
                    by_query("B", mapped({"0": ("normal", "green"), "1": ("warning", "orange"), "2": ("open", "red")})),
                ],
            )
        ),
        stat_panel(
            Common(
                id=13,
                title="Ledger up (per scrape job)",
                description=(
                    "dpstream_ledger_up: 0 means the budget figures above are stale and releases fail closed."
                ),
                grid=Grid(h=3, w=24, x=0, y=38),
                targets=[
                    Q("min by (job) (dpstream_ledger_up)", "{{job}}", instant=True),
                ],
                steps=[(None, "red"), (1, "green")],
                mappings={"0": ("down", "red"), "1": ("up", "green")},
            )
        ),
    ]


def build() -> db.Dashboard:
    """The dpstream-budget dashboard."""
    return dashboard(
        UID,
        "dpstream · Privacy budget",
        "Privacy budget per scope: spend against cap and plan, burn rate, breaker, time to exhaustion.",
        VARIABLES,
        panels(),
    )
