"""Grafana provisioning in deploy/grafana/: dashboards, data source, dashboard provider, alert rules.

Static checks only (stdlib, pyyaml, pytest; promtool when installed): every panel query is PromQL over
the metric contract of DESIGN §7 (or a recording rule of deploy/prometheus/rules.yml) and the
dashboard variables. Running the queries against a Prometheus that scrapes a real worker is left to
an end-to-end test.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
GRAFANA = REPO / "deploy" / "grafana"
DASHBOARDS = GRAFANA / "dashboards"
PROVISIONING = GRAFANA / "provisioning"
ALERTS = PROVISIONING / "alerting" / "dpstream-alerts.yaml"
COMPOSE = REPO / "deploy" / "compose" / "compose.yaml"
RULES_YML = REPO / "deploy" / "prometheus" / "rules.yml"
RULES_TESTS = REPO / "deploy" / "prometheus" / "rules.test.yml"
RUNBOOKS = REPO / "deploy" / "runbooks"
DATASOURCE_UID = "dpstream-prometheus"

# DESIGN §7: the metric names are a contract.
CONTRACT_METRICS = {
    "dpstream_budget_cap",
    "dpstream_budget_spent",
    "dpstream_budget_spent_ratio",
    "dpstream_budget_warn_ratio",
    "dpstream_budget_planned_ratio",
    "dpstream_budget_spent_total",
    "dpstream_budget_planned_spend_rate",
    "dpstream_budget_epsilon_spent",
    "dpstream_budget_period_end_timestamp_seconds",
    "dpstream_budget_period_seconds",
    "dpstream_budget_reserve_ratio",
    "dpstream_budget_state",
    "dpstream_breaker_open",
    "dpstream_ledger_up",
    "dpstream_releases_total",
    "dpstream_release_noise_stddev",
    "dpstream_release_lag_seconds",
    "dpstream_windows_pending",
    "dpstream_events_total",
    "dpstream_dead_letters_total",
    "dpstream_ledger_errors_total",
    # the feed series `dpstream exporter --topology` serves from the releases topic (dpstream-feed)
    "dpstream_release_value",
    "dpstream_release_ci_half_width",
    "dpstream_release_ratio_after",
    "dpstream_release_window_end_timestamp_seconds",
}
CONTRACT_HISTOGRAMS = {"dpstream_release_latency_seconds", "dpstream_ledger_request_duration_seconds"}
ALLOWED_METRICS = CONTRACT_METRICS | {h + s for h in CONTRACT_HISTOGRAMS for s in ("_bucket", "_sum", "_count")}

# Which variables each dashboard defines, their queries, and the metrics each one must filter.
EXPECTED_VARIABLES = {
    "dpstream-budget": {"scope"},
    "dpstream-releases": {"metric"},
    "dpstream-ingest": {"source"},
    "dpstream-ledger": set(),
    "dpstream-feed": {"metric", "key"},
}
VARIABLE_QUERIES = {
    "scope": "label_values(dpstream_budget_spent_ratio, scope)",
    "metric": "label_values(dpstream_releases_total, metric)",
    "source": "label_values(dpstream_events_total, source)",
}
# The feed dashboard reads the exporter's feed series, so its variables list their labels instead.
FEED_VARIABLE_QUERIES = {
    "metric": "label_values(dpstream_release_value, metric)",
    "key": 'label_values(dpstream_release_value{metric=~"$metric"}, key)',
}
FILTERED_BY = {
    # variable: metric-name pattern whose every selector on that dashboard carries `label=~"$variable"`
    "scope": re.compile(r"dpstream_(budget_\w+|breaker_open)$"),
    "metric": re.compile(r"dpstream_(releases_total|release_\w+|windows_pending)$"),
    "source": re.compile(r"dpstream_(events_total|dead_letters_total)$"),
    "key": re.compile(r"dpstream_release_(value|ci_half_width)$"),
}
BUILTIN_VARIABLES = {"__rate_interval"}
ALL_VARIABLES = set(VARIABLE_QUERIES) | set(FEED_VARIABLE_QUERIES) | BUILTIN_VARIABLES

BUDGET_ALERTS = {
    "DPBudgetWarning",
    "DPBudgetExhausted",
    "DPBreakerOpen",
    "DPBudgetBurnRateHigh",
    "DPBudgetBurnRateElevated",
    "DPBudgetProjectedExhaustion",
}

PROMQL_FUNCTIONS = {
    # aggregation operators
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    # functions
    "abs",
    "absent",
    "absent_over_time",
    "avg_over_time",
    "ceil",
    "changes",
    "clamp",
    "clamp_max",
    "clamp_min",
    "count_over_time",
    "day_of_month",
    "day_of_week",
    "day_of_year",
    "days_in_month",
    "delta",
    "deriv",
    "exp",
    "floor",
    "histogram_quantile",
    "holt_winters",
    "hour",
    "idelta",
    "increase",
    "irate",
    "label_join",
    "label_replace",
    "last_over_time",
    "ln",
    "log2",
    "log10",
    "max_over_time",
    "min_over_time",
    "minute",
    "month",
    "predict_linear",
    "present_over_time",
    "quantile_over_time",
    "rate",
    "resets",
    "round",
    "scalar",
    "sgn",
    "sort",
    "sort_desc",
    "sqrt",
    "stddev_over_time",
    "stdvar_over_time",
    "sum_over_time",
    "time",
    "timestamp",
    "vector",
    "year",
}
PROMQL_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
}

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_VARIABLE = re.compile(r"\$\{?(\w+)(?::\w+)?\}?")
_IDENT = re.compile(r"(?<![\w.])([A-Za-z_:][\w:]*)(\s*\()?")
_SELECTOR = re.compile(r"(?<![\w.:])(dpstream_\w+)\s*(\{[^{}]*\})?")


@functools.cache
def recording_rules() -> set[str]:
    """Names recorded by deploy/prometheus/rules.yml, if that file exists."""
    if not RULES_YML.exists():
        return set()
    groups = yaml.safe_load(RULES_YML.read_text(encoding="utf-8"))["groups"]
    return {rule["record"] for group in groups for rule in group["rules"] if "record" in rule}


def promql_identifiers(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, function names) an expression uses; strings, matchers, ranges and groupings are skipped."""
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _VARIABLE.sub(" ", text)
    metrics, functions = set(), set()
    for match in _IDENT.finditer(text):
        name, call = match.group(1), match.group(2)
        if name in PROMQL_KEYWORDS:
            continue
        (functions if call else metrics).add(name)
    return metrics, functions


def expand(expr: str) -> str:
    """The expression with the dashboard variables replaced as Grafana would for "All" and a 1m rate interval."""
    return (
        expr.replace("$__rate_interval", "1m")
        .replace("$scope", ".*")
        .replace("$metric", ".*")
        .replace("$source", ".*")
        .replace("$key", ".*")
    )


@functools.cache
def load_dashboards() -> dict[str, dict]:
    return {path.stem: json.loads(path.read_text(encoding="utf-8")) for path in sorted(DASHBOARDS.glob("*.json"))}


def all_panels(dashboard: dict) -> list[dict]:
    """Panels, including those nested in collapsed rows."""
    panels = []
    for panel in dashboard.get("panels", []):
        panels.append(panel)
        panels.extend(panel.get("panels", []))
    return panels


def data_panels(dashboard: dict) -> list[dict]:
    return [panel for panel in all_panels(dashboard) if panel.get("type") != "row"]


@functools.cache
def load_alert_rules() -> list[dict]:
    document = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    return [rule for group in document["groups"] for rule in group["rules"]]


def dashboard_exprs() -> list[tuple[str, str]]:
    """(where, expr) for every panel target of every dashboard."""
    found = []
    for uid, dashboard in load_dashboards().items():
        for panel in data_panels(dashboard):
            for target in panel.get("targets", []):
                found.append(
                    (f"{uid} panel {panel['id']} '{panel.get('title')}' {target.get('refId')}", target["expr"])
                )
    return found


def alert_exprs() -> list[tuple[str, str]]:
    return [
        (f"alert {rule['title']} {query['refId']}", query["model"]["expr"])
        for rule in load_alert_rules()
        for query in rule["data"]
        if query.get("datasourceUid") == DATASOURCE_UID
    ]


DASHBOARD_FILES = sorted(DASHBOARDS.glob("*.json"))


def test_the_five_dashboards_exist_with_their_fixed_uids():
    """deploy/grafana/dashboards holds exactly the five dashboards, each file named after its fixed uid."""
    dashboards = load_dashboards()
    assert set(dashboards) == set(EXPECTED_VARIABLES)
    for stem, dashboard in dashboards.items():
        assert dashboard["uid"] == stem


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.stem)
def test_dashboard_is_provisionable_json(path: Path):
    """Valid JSON with a title, no numeric id (Grafana assigns it), tags, and every data source the fixed uid."""
    dashboard = json.loads(path.read_text(encoding="utf-8"))
    assert dashboard.get("id") is None
    assert dashboard["title"].strip()
    assert "dpstream" in dashboard.get("tags", [])
    assert isinstance(dashboard.get("schemaVersion"), int)
    uids = []

    def walk(node):
        if isinstance(node, dict):
            source = node.get("datasource")
            if isinstance(source, dict) and source.get("type") == "prometheus":
                uids.append(source.get("uid"))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(dashboard)
    assert uids and set(uids) == {DATASOURCE_UID}


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.stem)
def test_dashboard_variables(path: Path):
    """Each dashboard defines exactly its variables, each a label_values query on the contract metric."""
    dashboard = json.loads(path.read_text(encoding="utf-8"))
    variables = dashboard.get("templating", {}).get("list", [])
    assert {variable["name"] for variable in variables} == EXPECTED_VARIABLES[dashboard["uid"]]
    for variable in variables:
        query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
        queries = FEED_VARIABLE_QUERIES if dashboard["uid"] == "dpstream-feed" else VARIABLE_QUERIES
        assert query == queries[variable["name"]]
        assert variable["type"] == "query"
        assert variable["datasource"]["uid"] == DATASOURCE_UID
        if variable.get("includeAll"):
            assert variable.get("allValue") == ".*", "an 'All' that matches every value, also ones not yet seen"


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.stem)
def test_panels_have_queries_unique_ids_and_fit_the_grid(path: Path):
    """Every panel has a unique id, at least one non-empty target expression and a gridPos inside 24 columns."""
    dashboard = json.loads(path.read_text(encoding="utf-8"))
    panels = all_panels(dashboard)
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), f"duplicate panel ids in {path.name}"
    assert data_panels(dashboard)
    for panel in data_panels(dashboard):
        targets = panel.get("targets", [])
        assert targets, f"panel {panel['id']} '{panel['title']}' has no query"
        assert all(target.get("expr", "").strip() for target in targets), f"panel {panel['id']}: empty expr"
        ref_ids = [target["refId"] for target in targets]
        assert len(ref_ids) == len(set(ref_ids)), f"panel {panel['id']}: duplicate refIds"
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24 and grid["h"] > 0
        repeat = panel.get("repeat")
        if repeat:
            assert repeat in EXPECTED_VARIABLES[dashboard["uid"]]


@pytest.mark.parametrize(
    "where,expr", [pytest.param(where, expr, id=where) for where, expr in dashboard_exprs() + alert_exprs()]
)
def test_queries_use_only_contract_metrics_and_known_functions(where: str, expr: str):
    """Each query reads only the DESIGN §7 metrics (or recording rules) with real PromQL functions."""
    metrics, functions = promql_identifiers(expr)
    assert metrics, f"{where}: no metric in {expr!r}"
    unknown = metrics - ALLOWED_METRICS - recording_rules()
    assert not unknown, f"{where}: not in the metric contract: {sorted(unknown)}"
    assert functions <= PROMQL_FUNCTIONS, f"{where}: unknown functions {sorted(functions - PROMQL_FUNCTIONS)}"
    for opening, closing in ("()", "[]", "{}"):
        assert expr.count(opening) == expr.count(closing), f"{where}: unbalanced {opening}{closing}"


def test_panel_queries_use_only_their_dashboards_variables():
    """Variables in a query are the dashboard's own (or $__rate_interval), and each is used where it applies."""
    for uid, dashboard in load_dashboards().items():
        defined = EXPECTED_VARIABLES[uid] | BUILTIN_VARIABLES
        for panel in data_panels(dashboard):
            for target in panel["targets"]:
                expr = target["expr"]
                used = set(_VARIABLE.findall(expr))
                assert used <= defined, f"{uid} panel {panel['id']}: undefined variables {sorted(used - defined)}"
                for variable in EXPECTED_VARIABLES[uid]:
                    for name, matchers in _SELECTOR.findall(expr):
                        if FILTERED_BY[variable].match(name):
                            assert f'=~"${variable}"' in (matchers or ""), (
                                f"{uid} panel {panel['id']}: {name} is not filtered by ${variable}"
                            )


def test_every_variable_is_used_by_some_panel():
    for uid, dashboard in load_dashboards().items():
        exprs = " ".join(target["expr"] for panel in data_panels(dashboard) for target in panel["targets"])
        for variable in EXPECTED_VARIABLES[uid]:
            assert f"${variable}" in exprs, f"{uid}: ${variable} is defined but no panel uses it"


def test_budget_dashboard_shows_the_required_figures():
    """Gauges with the warn threshold, spend vs plan, burn rate, breaker timeline, time to exhaustion."""
    budget = load_dashboards()["dpstream-budget"]
    exprs = {panel["id"]: " ".join(t["expr"] for t in panel["targets"]) for panel in data_panels(budget)}
    by_type = {}
    for panel in data_panels(budget):
        by_type.setdefault(panel["type"], []).append(panel)
    gauge = by_type["gauge"][0]
    assert "dpstream_budget_spent_ratio" in exprs[gauge["id"]] and "dpstream_budget_warn_ratio" in exprs[gauge["id"]]
    assert any("dpstream_budget_spent_ratio" in e and "dpstream_budget_planned_ratio" in e for e in exprs.values()), (
        "spend vs plan"
    )
    assert any(
        re.search(r"rate\(dpstream_budget_spent_total", e) and "dpstream_budget_planned_spend_rate" in e
        for e in exprs.values()
    ), "burn rate"
    assert any(
        "dpstream_breaker_open" in exprs[p["id"]] and "dpstream_budget_state" in exprs[p["id"]]
        for p in by_type["state-timeline"]
    ), "breaker timeline"
    assert any(
        "dpstream_budget_cap" in e
        and "rate(dpstream_budget_spent_total" in e
        and "dpstream_budget_period_end_timestamp_seconds" in e
        for e in exprs.values()
    ), "time to exhaustion vs period end"


def test_releases_ingest_and_ledger_dashboards_show_the_required_figures():
    dashboards = load_dashboards()

    def text(uid):
        return " ".join(t["expr"] for p in data_panels(dashboards[uid]) for t in p["targets"])

    releases = text("dpstream-releases")
    for needle in (
        "sum by (outcome) (rate(dpstream_releases_total",
        "dpstream_release_noise_stddev",
        "histogram_quantile(0.5, sum by (le) (rate(dpstream_release_latency_seconds_bucket",
        "histogram_quantile(0.99, sum by (le) (rate(dpstream_release_latency_seconds_bucket",
        "dpstream_release_lag_seconds",
        "dpstream_windows_pending",
    ):
        assert needle in releases
    ingest = text("dpstream-ingest")
    assert "sum by (outcome) (rate(dpstream_events_total" in ingest
    assert "sum by (reason) (rate(dpstream_dead_letters_total" in ingest
    ledger = text("dpstream-ledger")
    for quantile in ("0.5", "0.99"):
        assert (
            f"histogram_quantile({quantile}, sum by (le, op) (rate(dpstream_ledger_request_duration_seconds_bucket"
            in ledger
        )
    assert "dpstream_ledger_errors_total" in ledger and "dpstream_ledger_up" in ledger


def test_feed_dashboard_shows_each_metrics_values_band_ratio_and_age():
    """dpstream-feed repeats per $metric: the noisy values per $key with their CI band, the ratio, the window age."""
    feed = load_dashboards()["dpstream-feed"]
    rows = [panel for panel in all_panels(feed) if panel["type"] == "row"]
    assert [row.get("repeat") for row in rows] == ["metric"], "one row, repeated per metric"
    exprs = {panel["title"]: [t["expr"] for t in panel["targets"]] for panel in data_panels(feed)}
    value = 'dpstream_release_value{metric=~"$metric",key=~"$key"}'
    half = 'dpstream_release_ci_half_width{metric=~"$metric",key=~"$key"}'
    assert [value, f"{value} + {half}", f"{value} - {half}"] in exprs.values(), "value with its CI band"
    assert ['dpstream_release_ratio_after{metric=~"$metric"}'] in exprs.values()
    assert ['time() - dpstream_release_window_end_timestamp_seconds{metric=~"$metric"}'] in exprs.values()


def test_the_contract_names_here_are_the_telemetry_contract():
    """Every metric this file allows is classed in dpstream.workers.telemetry.classes (DESIGN §7)."""
    from dpstream.workers.telemetry.classes import METRIC_CLASSES

    assert set(METRIC_CLASSES) >= CONTRACT_METRICS | CONTRACT_HISTOGRAMS


def test_divisions_guard_against_a_zero_denominator():
    """A ratio's denominator is clamp_min(…, 1e-12) or filtered (> 0), so an idle system still shows series."""
    for where, expr in dashboard_exprs():
        for match in re.finditer(r"\)\s*/\s*(\S+)", expr):
            rest = expr[match.start(1) :]
            assert rest.startswith(("clamp_min(", "on (")) or "> 0)" in rest[:200], f"{where}: unguarded division"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian package prometheus)")
def test_promtool_parses_every_query(tmp_path: Path):
    """promtool accepts every panel and alert query (variables expanded) as a recording rule expression."""
    rules = [
        {"record": f"dpstream_check:query_{index}", "expr": expand(expr)}
        for index, (_, expr) in enumerate(dashboard_exprs() + alert_exprs())
    ]
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard-queries", "rules": rules}]}), encoding="utf-8")
    result = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_datasource_provisioning():
    """One Prometheus data source with the fixed uid; its URL comes from $PROMETHEUS_URL, whose default is
    documented."""
    path = PROVISIONING / "datasources" / "prometheus.yaml"
    text = path.read_text(encoding="utf-8")
    document = yaml.safe_load(text)
    assert document["apiVersion"] == 1
    (source,) = document["datasources"]
    assert source["uid"] == DATASOURCE_UID and source["type"] == "prometheus"
    assert source["url"] == "${PROMETHEUS_URL}"
    comments = "\n".join(line for line in text.splitlines() if line.lstrip().startswith("#"))
    assert "PROMETHEUS_URL" in comments and "http://prometheus:9090" in comments


def test_dashboard_provider_points_at_the_mounted_dashboards():
    """The file provider's path is where compose mounts deploy/grafana/dashboards."""
    document = yaml.safe_load((PROVISIONING / "dashboards" / "dpstream.yaml").read_text(encoding="utf-8"))
    assert document["apiVersion"] == 1
    (provider,) = document["providers"]
    assert provider["type"] == "file"
    path = provider["options"]["path"]
    grafana = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))["services"]["grafana"]
    mounts = {}
    for volume in grafana["volumes"]:
        source, target = volume.split(":")[:2]
        mounts[target] = source
    assert mounts.get(path) == "../grafana/dashboards"
    assert mounts.get("/etc/grafana/provisioning") == "../grafana/provisioning"


def test_alert_rules_provisioning_shape():
    """Grafana alerting file provisioning: the six budget alerts, each a query on dpstream-prometheus, reduce,
    threshold."""
    document = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    assert document["apiVersion"] == 1
    for group in document["groups"]:
        assert group["folder"] and group["name"] and re.fullmatch(r"\d+[smh]", group["interval"])
    rules = load_alert_rules()
    assert {rule["title"] for rule in rules} == BUDGET_ALERTS
    assert len({rule["uid"] for rule in rules}) == len(rules)
    for rule in rules:
        title = rule["title"]
        data = {query["refId"]: query for query in rule["data"]}
        assert len(data) == len(rule["data"]), f"{title}: duplicate refIds"
        assert rule["condition"] in data, f"{title}: condition {rule['condition']} is not a refId"
        prometheus = [q for q in rule["data"] if q.get("datasourceUid") == DATASOURCE_UID]
        assert prometheus, f"{title}: no query against {DATASOURCE_UID}"
        for query in rule["data"]:
            model = query["model"]
            assert model.get("refId", query["refId"]) == query["refId"]
            if query["datasourceUid"] == DATASOURCE_UID:
                assert model["expr"].strip() and "relativeTimeRange" in query
                assert "$" not in model["expr"], f"{title}: alert queries take no dashboard variables"
            else:
                assert query["datasourceUid"] == "__expr__", f"{title}: unknown data source {query['datasourceUid']}"
                assert model["type"] in {"reduce", "threshold", "math", "classic_conditions", "resample"}
                if "expression" in model and model["type"] != "math":
                    assert model["expression"] in data, f"{title}: {query['refId']} reads a missing refId"
        assert re.fullmatch(r"\d+[smh]", str(rule["for"]))
        assert rule["labels"]["severity"] in {"critical", "warning"}
        annotations = rule["annotations"]
        assert annotations["summary"].strip() and annotations["description"].strip()
        assert annotations["runbook_url"].endswith(f"deploy/runbooks/{title}.md")
        if RUNBOOKS.is_dir():
            assert (RUNBOOKS / f"{title}.md").is_file(), f"{title}: no runbook deploy/runbooks/{title}.md"
        assert "$value" not in annotations["summary"] + annotations["description"], "no ledger figure in notifications"


@pytest.mark.skipif(not RULES_YML.exists(), reason="deploy/prometheus/rules.yml not written yet")
def test_alert_rules_match_the_prometheus_rules():
    """Each Grafana rule carries the same for, labels and annotations as its rules.yml alert."""
    groups = yaml.safe_load(RULES_YML.read_text(encoding="utf-8"))["groups"]
    prometheus = {rule["alert"]: rule for group in groups for rule in group["rules"] if "alert" in rule}
    for rule in load_alert_rules():
        theirs = prometheus.get(rule["title"])
        assert theirs is not None, f"{rule['title']} is not an alert of deploy/prometheus/rules.yml"
        assert rule["for"] == theirs.get("for", "0s")
        assert rule["labels"] == theirs["labels"]
        assert rule["annotations"] == theirs["annotations"]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian package prometheus)")
@pytest.mark.skipif(not RULES_TESTS.exists(), reason="deploy/prometheus/rules.test.yml not written yet")
def test_grafana_alerts_pass_the_prometheus_alert_tests(tmp_path: Path):
    """The Grafana rules' queries, run as Prometheus alerts, pass rules.test.yml's cases for the six budget alerts.

    Grafana fires a rule's instance when its query returns a positive value for `for`; a Prometheus alert
    when its expression returns the series for `for`. So the same cases (fires / stays silent at the
    boundary, one alert per scope whichever targets serve the gauges) hold for both.
    """
    alerts = [
        {
            "alert": rule["title"],
            "expr": next(q["model"]["expr"] for q in rule["data"] if q.get("datasourceUid") == DATASOURCE_UID),
            "for": rule["for"],
            "labels": rule["labels"],
            "annotations": rule["annotations"],
        }
        for rule in load_alert_rules()
    ]
    rules_file = tmp_path / "grafana-equivalents.yml"
    rules_file.write_text(yaml.safe_dump({"groups": [{"name": "grafana", "rules": alerts}]}), encoding="utf-8")
    suite = yaml.safe_load(RULES_TESTS.read_text(encoding="utf-8"))
    cases = []
    for case in suite["tests"]:
        checks = [check for check in case.get("alert_rule_test", []) if check["alertname"] in BUDGET_ALERTS]
        if checks:
            cases.append({**{k: v for k, v in case.items() if k != "promql_expr_test"}, "alert_rule_test": checks})
    assert cases, "rules.test.yml has no case for the budget alerts"
    tests_file = tmp_path / "grafana-equivalents.test.yml"
    tests_file.write_text(
        yaml.safe_dump({**suite, "rule_files": [rules_file.name], "tests": cases}, sort_keys=False), encoding="utf-8"
    )
    result = subprocess.run(
        ["promtool", "test", "rules", tests_file.name], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]


def test_promql_identifier_extraction():
    """The metric-name check itself: names inside strings, matchers, ranges and groupings are not metrics."""
    metrics, functions = promql_identifiers(
        'histogram_quantile(0.99, sum by (le, op) (rate(x_bucket{op=~"a|b", le!="1e-3"}[$__rate_interval])))'
        " / on (op) group_left () clamp_min(y, 1e-12) > bool 0 or on () vector(0)"
    )
    assert metrics == {"x_bucket", "y"}
    assert functions == {"histogram_quantile", "sum", "rate", "clamp_min", "vector"}
    assert promql_identifiers("scope:dpstream_budget_spent_ratio:max >= 0.999")[0] == {
        "scope:dpstream_budget_spent_ratio:max"
    }
