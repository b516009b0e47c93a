"""Every metric has one class; the exporter and a worker without `--curator-metrics` serve only the
data-independent ones; the README's metrics table says the same class as the code's table; the
topology info gauge labels event-level metrics."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dpstream.topology.errors import ConfigError
from dpstream.topology.loader import load_topology_text
from dpstream.topology.model import EVENT_LEVEL_LABEL
from dpstream.workers.pipeline.counters import EventCounts
from dpstream.workers.release.outcomes import ReleaseCounts
from dpstream.workers.runtime.clock_skew import ClockSkewGate
from dpstream.workers.telemetry.budget import ScopeFigures
from dpstream.workers.telemetry.classes import METRIC_CLASSES, MetricClass, metric_class
from dpstream.workers.telemetry.exporter import exporter_telemetry
from dpstream.workers.telemetry.histogram import LabelledHistogram
from dpstream.workers.telemetry.ledger_proxy import LedgerTimings
from dpstream.workers.telemetry.web import Telemetry, worker_telemetry

ROOT = Path(__file__).resolve().parents[2]
TELEMETRY = ROOT / "workers" / "telemetry"

_YAML = """
version: 1
sources:
  people: {topic: t1, privacy_unit: user_id, timestamp: ts}
  clicks: {topic: t2, privacy_unit: event, timestamp: ts}
budgets:
  b: {epsilon: 1.0, delta: 1.0e-6, period: 1d}
metrics:
  views:
    source: people
    budget: b
    weight: 1
    window: {tumbling: 1h}
    aggregate: count
    contribution: {max_per_key: 1}
    mechanism: gaussian
  taps:
    source: clicks
    budget: b
    weight: 1
    window: {tumbling: 1h}
    aggregate: count
    mechanism: gaussian
sinks: {releases: r, dead_letter: d}
"""


def _topology():
    return load_topology_text(_YAML)


def _registered_names() -> set[str]:
    """Every metric name workers/telemetry/* builds a family with, from the source (as exposed:
    a CounterMetricFamily's name with `_total`)."""
    names: set[str] = set()
    for path in sorted(TELEMETRY.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            first = node.args[0]
            if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
                continue
            func = node.func
            called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if called.endswith("MetricFamily") or called in {"family", "gauge"}:
                name = first.value
                if called == "CounterMetricFamily" and not name.endswith("_total"):
                    name += "_total"
                names.add(name)
    return {n for n in names if n.startswith("dpstream_")}


def test_every_registered_metric_has_exactly_one_class_and_the_table_lists_nothing_else() -> None:
    """The code's class table covers each metric name the telemetry modules build, and no other."""
    names = _registered_names()
    assert len(names) >= 25  # the scan found the families (guards against a scan that finds nothing)
    assert names == set(METRIC_CLASSES), (names - set(METRIC_CLASSES), set(METRIC_CLASSES) - names)
    for name in names:
        assert isinstance(METRIC_CLASSES[name], MetricClass)


def test_an_unlisted_name_is_curator_only() -> None:
    """A family nobody classed is never widened to the data-independent audience."""
    assert metric_class("dpstream_something_new") is MetricClass.CURATOR_ONLY


def _readme_classes() -> Counter[tuple[str, str]]:
    """(metric, class) pairs of the README's metrics table (the one whose header has a `class` column)."""
    lines = (ROOT / "README.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"^\| metric \| class \|", line))
    pairs: Counter[tuple[str, str]] = Counter()
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        for name in re.findall(r"`(dpstream_[a-z_]+)`", cells[0]):
            pairs[(name, cells[1])] += 1
    return pairs


def test_the_readme_table_names_every_metric_once_with_the_codes_class() -> None:
    """Each metric appears once in the README's metrics table, with the class the code serves it under."""
    pairs = _readme_classes()
    assert all(n == 1 for n in pairs.values()), [p for p, n in pairs.items() if n > 1]
    assert dict(pairs.keys()) == {name: cls.value for name, cls in METRIC_CLASSES.items()}


# ---- what a scrape serves ---------------------------------------------------------------------


def _figures(scope: str = "b") -> list[ScopeFigures]:
    return [
        ScopeFigures(
            scope=scope,
            currency="rho",
            cap=0.01,
            spent=0.001,
            ratio=0.1,
            warn_ratio=0.8,
            epsilon_spent=0.2,
            period_start=0,
            period_end=86_400,
            state="normal",
            breaker_open=False,
            projected_ratio=0.3,
            spent_total=0.001,
            reserve_ratio=0.2,
            planned_ratio=0.1,
            planned_spend_rate=1e-7,
            parked=3,
        )
    ]


def _served(telemetry: Telemetry) -> set[str]:
    """Exposed metric names of one render (no ledger round trip: the budget figures are set)."""
    assert telemetry.budget is not None
    telemetry.budget.figures = _figures()
    telemetry.budget.ledger_up = True
    text = generate_latest(telemetry.registry).decode()
    out = set()
    for fam in text_string_to_metric_families(text):
        out.add(fam.name + "_total" if fam.type == "counter" else fam.name)
    return out


class _Releases:
    def __init__(self, topology) -> None:
        self.stats = SimpleNamespace(
            outcomes=Counter(),
            retries=Counter(),
            parked=Counter(),
            publish_misses=Counter(),
            last_payload={"views": b'{"noise":{"stddev":2}}'},
        )
        self.latency = LabelledHistogram("metric", topology.metrics, (0.1, 1.0))
        self.ledger_timings = LedgerTimings()
        self.releaser = SimpleNamespace(counts=ReleaseCounts())
        self._ledger = None

    def open_windows(self) -> dict[str, list[int]]:
        return {}


class _Ingest:
    revoked_counts: dict[str, EventCounts] = {}
    hop_counts: dict[str, EventCounts] = {}
    clock_skew = ClockSkewGate(0.5, 30.0)

    def pipelines(self) -> list:
        return []


def _worker(curator: bool) -> Telemetry:
    topology = _topology()
    return worker_telemetry(
        topology, "redis://127.0.0.1:1/0", "all", ingest=_Ingest(), releases=_Releases(topology), curator=curator
    )


def _of(cls: MetricClass) -> set[str]:
    return {n for n, c in METRIC_CLASSES.items() if c is cls}


def test_the_exporter_serves_no_curator_only_series() -> None:
    """`dpstream exporter`'s registry renders the budget and info gauges, and no curator-only family
    (not the parked-window count its budget collector reads either)."""
    served = _served(exporter_telemetry(_topology(), "redis://127.0.0.1:1/0"))
    assert not served & _of(MetricClass.CURATOR_ONLY), served & _of(MetricClass.CURATOR_ONLY)
    assert {"dpstream_budget_spent_ratio", "dpstream_ledger_up", "dpstream_metric_privacy_info"} <= served


def test_a_worker_without_the_flag_serves_only_data_independent_series() -> None:
    """Without `--curator-metrics` a worker's /metrics holds no curator-only family."""
    served = _served(_worker(curator=False))
    assert served <= _of(MetricClass.DATA_INDEPENDENT), served - _of(MetricClass.DATA_INDEPENDENT)
    assert {"dpstream_budget_spent_ratio", "dpstream_release_noise_stddev", "dpstream_build_info"} <= served


def test_a_worker_with_the_flag_serves_both_classes() -> None:
    """With `--curator-metrics` a worker serves the curator-only families (events, releases, lag,
    parked windows, ledger timings) beside the data-independent ones."""
    served = _served(_worker(curator=True))
    expected = {
        "dpstream_events_total",
        "dpstream_dead_letters_total",
        "dpstream_releases_total",
        "dpstream_release_lag_seconds",
        "dpstream_windows_pending",
        "dpstream_releases_parked",
        "dpstream_ledger_request_duration_seconds",
        "dpstream_budget_spent_ratio",
        "dpstream_build_info",
    }
    assert expected <= served, expected - served
    assert served <= set(METRIC_CLASSES), served - set(METRIC_CLASSES)


def test_the_worker_command_takes_the_flag_and_needs_a_web_port(monkeypatch: pytest.MonkeyPatch) -> None:
    """`dpstream worker --curator-metrics` parses (off by default); without --web-port it is a one-line error."""
    from dpstream.workers.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["worker", "t.yaml"]).curator_metrics is False
    args = parser.parse_args(["worker", "t.yaml", "--curator-metrics"])
    assert args.curator_metrics is True
    with pytest.raises(ConfigError, match="--curator-metrics: .*--web-port"):
        args.func(args)


# ---- event-level DP in Prometheus -------------------------------------------------------------


def test_the_privacy_info_gauge_labels_event_level_metrics_weaker() -> None:
    """`dpstream_metric_privacy_info` says the event-level label for a metric of a `privacy_unit: event`
    source and `unit-level` for the others, on a worker and on the exporter."""
    for telemetry in (_worker(curator=False), exporter_telemetry(_topology(), "redis://127.0.0.1:1/0")):
        telemetry.budget.figures, telemetry.budget.ledger_up = [], False
        text = generate_latest(telemetry.registry).decode()
        rows = {
            s.labels["metric"]: s.labels
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
            if s.name == "dpstream_metric_privacy_info"
        }
        assert rows["taps"]["guarantee"] == EVENT_LEVEL_LABEL == "event-level (weaker)"
        assert rows["taps"]["privacy_unit"] == "event" and rows["taps"]["scope"] == "b"
        assert rows["views"]["guarantee"] == "unit-level" and rows["views"]["privacy_unit"] == "user_id"


# ---- where the curator-only series are served --------------------------------------------------

DEPLOY = ROOT / "deploy"
_CURATOR = {n for n, c in METRIC_CLASSES.items() if c is MetricClass.CURATOR_ONLY}


def _metric_names(text: str) -> set[str]:
    """dpstream metric names in a text, histogram suffixes folded into their family's name."""
    return {re.sub(r"_(bucket|sum|count)$", "", n) for n in re.findall(r"dpstream_[a-z_]+", text)}


def test_the_operators_compose_and_k8s_workers_serve_curator_metrics() -> None:
    """compose and deploy/k8s (whose Prometheus is the operator's own) run both worker roles with
    `--curator-metrics`, and never give the exporter a flag it does not have."""
    import yaml

    compose = yaml.safe_load((DEPLOY / "compose" / "compose.yaml").read_text())["services"]
    for role in ("ingest", "release"):
        assert "--curator-metrics" in compose[f"worker-{role}"]["command"], role
        (container,) = yaml.safe_load((DEPLOY / "k8s" / f"deployment-worker-{role}.yaml").read_text())["spec"][
            "template"
        ]["spec"]["containers"]
        assert "--curator-metrics" in container["args"], role
    assert "--curator-metrics" not in compose["exporter"]["command"]


def test_the_demo_worker_feeding_the_shared_dashboard_serves_no_curator_metrics(tmp_path: Path) -> None:
    """The demo's worker (scraped by the demo's Prometheus, a shared dashboard) runs without the flag."""
    from dpstream.workers.demo.run import DemoOptions, worker_command

    args = worker_command(DemoOptions(), tmp_path / "t.yaml", "127.0.0.1:9092", "redis://127.0.0.1:6379/0")
    assert args[0] == "worker" and "--web-port" in args
    assert "--curator-metrics" not in args


def test_alerts_and_runbooks_on_curator_only_series_say_they_need_the_flag() -> None:
    """Every alert rule whose expression reads a curator-only series, and every runbook that queries
    one, names `--curator-metrics` in its runbook (else it would stay silent on a shared Prometheus)."""
    import yaml

    rules = yaml.safe_load((DEPLOY / "prometheus" / "rules.yml").read_text())
    alerts = {r["alert"]: r["expr"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    needing = {name for name, expr in alerts.items() if _metric_names(expr) & _CURATOR}
    assert {"DPReleaseLag", "DPReleasesRefused", "DPReleasesParked"} <= needing
    for name in needing:
        assert "--curator-metrics" in (DEPLOY / "runbooks" / f"{name}.md").read_text(), name
    for path in sorted((DEPLOY / "runbooks").glob("*.md")):
        text = path.read_text()
        if _metric_names(text) & _CURATOR:
            assert "--curator-metrics" in text, path.name


def test_the_budget_dashboard_and_grafana_alerts_read_data_independent_series_only() -> None:
    """The budget dashboard and Grafana's managed alerts work on a shared Prometheus (no curator-only
    series); each of the releases, ingest and ledger dashboards reads some (they need the flag)."""
    dashboards = DEPLOY / "grafana" / "dashboards"
    assert not _metric_names((dashboards / "dpstream-budget.json").read_text()) & _CURATOR
    for name in ("releases", "ingest", "ledger"):
        assert _metric_names((dashboards / f"dpstream-{name}.json").read_text()) & _CURATOR, name
    for path in (DEPLOY / "grafana" / "provisioning" / "alerting").glob("*.yaml"):
        assert not _metric_names(path.read_text()) & _CURATOR, path.name
