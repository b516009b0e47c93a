"""The feed end to end: a real `dpstream worker` releases, a real `dpstream exporter --topology FILE` (no
other flag) reads the releases topic, a real Prometheus scrapes it, and every panel query of the
`dpstream-feed` Grafana dashboard, its variables expanded to each metric and key (and to "All"), returns
series whose values equal the released records' values.

The check is exact and free of races: every query is evaluated at one instant t, where Prometheus holds one
scrape of the exporter; `dpstream_release_window_end_timestamp_seconds` at t names the window of each
metric's latest release, and that record, read back from the topic (deduped by release_id, as the
exporter does), gives the expected value of every series: the noisy value, value ± CI half-width, the
scope's ratio_after, or t − window end. A panel query of another shape fails the test until it is taught.
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dpstream.topology.loader import load_topology
from dpstream.workers.feed import Dedupe, Verdict
from dpstream.workers.localstack import PrometheusHandle, free_port
from tests.e2e import _monitoring as mon
from tests.e2e.harness import read_all

pytestmark = pytest.mark.e2e

WINDOW = 5
FEED = mon.DASHBOARDS / "dpstream-feed.json"
KEYS = ("home", "cart")

TOPOLOGY = """\
# tests/e2e/test_feed_e2e.py: one keyed and one ungrouped metric, 5 s windows
version: 1
start: {start}
kafka: {{bootstrap: "{bootstrap}"}}
redis: {{url: "{redis}"}}
sources:
  clicks:
    topic: {prefix}.clicks
    privacy_unit: user_id
    timestamp: ts
    allowed_lateness: 1s
    keyed_by_unit: true
budgets:
  {scope}:
    epsilon: 2.0
    delta: 1.0e-6
    accounting: zcdp
    period: 1h
metrics:
  views:
    source: clicks
    budget: {scope}
    weight: 1
    window: {{tumbling: {window}s}}
    aggregate: count
    group_by: page
    keys: [home, cart]
    contribution: {{max_keys: 2, max_per_key: 3}}
    mechanism: gaussian
  basket:
    source: clicks
    budget: {scope}
    weight: 1
    window: {{tumbling: {window}s}}
    aggregate: sum
    value: basket_eur
    bounds: [0, 100]
    contribution: {{max_per_key: 2}}
    mechanism: gaussian
sinks:
  releases: {prefix}.releases
  dead_letter: {prefix}.dlq
"""

PROMETHEUS_YML = """\
# Written by tests/e2e/test_feed_e2e.py: 1 s scrapes of the exporter
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: dpstream-exporter
    static_configs:
      - targets: ["{host}:{port}"]
"""


class Clicks:
    """A few clicks a second for the worker, until stopped."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from kafka import KafkaProducer

        self.producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
        self.topic = topic
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="clicks", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        rng = random.Random(11)
        while not self._stop.is_set():
            for _ in range(6):
                user = f"u{rng.randrange(100)}"
                doc = {"user_id": user, "ts": time.time(), "page": rng.choice(KEYS), "basket_eur": rng.uniform(0, 90)}
                self.producer.send(self.topic, key=user.encode(), value=json.dumps(doc).encode())
            self._stop.wait(0.5)
        self.producer.flush()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.producer.close()


@dataclass
class Feed:
    root: Path
    releases_topic: str
    bootstrap: str
    prometheus: PrometheusHandle
    procs: mon.Processes

    def logs(self) -> str:
        return "\n".join(f"--- {name}.log (tail)\n{self.procs.log(name, 2500)}" for name in self.procs.procs)

    def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        """Instant query evaluated at `at` (epoch seconds)."""
        url = f"{self.prometheus.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}"})
        doc = mon.get_json(url)
        assert doc.get("status") == "success", doc
        return list(doc["data"]["result"])

    def released(self) -> dict[tuple[str, int], dict[str, Any]]:
        """(metric, window end) → the first record of its release_id on the topic (the dedupe rule)."""
        dedupe = Dedupe()
        out: dict[tuple[str, int], dict[str, Any]] = {}
        for _key, value in read_all(self.bootstrap, self.releases_topic):
            seen = dedupe.offer(value)
            if seen.verdict is Verdict.FIRST and seen.record is not None:
                out[(seen.record["metric"], seen.record["window"]["end_epoch"])] = seen.record
        assert not dedupe.conflicts, dedupe.conflicts
        return out


@pytest.fixture(scope="module")
def feed(tmp_path_factory: pytest.TempPathFactory, kafka_broker, redis_server) -> Iterator[Feed]:  # noqa: ANN001
    from dpstream.topology.errors import ConfigError
    from dpstream.workers.localstack import sysdeps
    from dpstream.workers.runtime.topics import ensure_topics

    try:
        sysdeps.ensure([sysdeps.PROMETHEUS])
    except ConfigError as exc:
        pytest.skip(str(exc))
    redis_server.flush()
    root = tmp_path_factory.mktemp("feed")
    prefix = f"e2e-feed-{uuid.uuid4().hex[:8]}"
    path = root / "topology.yaml"
    path.write_text(
        TOPOLOGY.format(
            start=int(time.time()) // WINDOW * WINDOW,
            bootstrap=kafka_broker.bootstrap,
            redis=redis_server.url,
            prefix=prefix,
            scope=f"feed_{uuid.uuid4().hex[:6]}",
            window=WINDOW,
        )
    )
    topology = load_topology(path)
    ensure_topics(kafka_broker.bootstrap, topology)
    exporter_port = free_port()
    prom_port = free_port(avoid=frozenset({exporter_port}))
    prom_config = root / "prometheus.yml"
    prom_config.write_text(PROMETHEUS_YML.format(host=mon.HOST, port=exporter_port))
    with contextlib.ExitStack() as stack:
        prom = PrometheusHandle(prom_port, root / "prometheus", prom_config)
        prom.start()
        stack.callback(prom.stop)
        procs = mon.Processes(root)
        stack.callback(procs.stop_all)
        procs.start("worker", ["worker", str(path), "--worker-id", "feed-w1"])
        procs.start("exporter", ["exporter", "--topology", str(path), "--port", str(exporter_port)])
        clicks = Clicks(kafka_broker.bootstrap, topology.sources["clicks"].topic)
        stack.callback(clicks.stop)
        run = Feed(root, topology.sinks.releases, kafka_broker.bootstrap, prom, procs)

        def serving() -> bool:
            for name in ("worker", "exporter"):
                assert procs.procs[name].poll() is None, f"{name} exited:\n{run.logs()}"
            got = run.query('count by (metric) (dpstream_release_value{job="dpstream-exporter"})', time.time())
            return {r["metric"]["metric"] for r in got} == {"views", "basket"}

        assert mon.poll(serving, 180, 1.0), f"Prometheus holds no feed series of both metrics:\n{run.logs()}"
        yield run


def _expected(expr: str, record: dict[str, Any], key: str, at: float) -> float:
    """What a feed panel query's series of (metric, key) equals at `at`, from the released record."""
    value = record["values"].get(key)
    half = record["ci"]["half_width"]
    half = half.get(key) if isinstance(half, dict) else half
    if "dpstream_release_ci_half_width" in expr:
        if " + " in expr:
            return value + half
        if " - " in expr:
            return value - half
    elif "dpstream_release_ratio_after" in expr:
        return float(record["budget"]["ratio_after"])
    elif "dpstream_release_window_end_timestamp_seconds" in expr and expr.replace(" ", "").startswith("time()-"):
        return at - record["window"]["end_epoch"]
    elif expr.startswith("dpstream_release_value{") and expr.endswith("}"):
        return float(value)
    raise AssertionError(f"a feed panel query of a shape this test does not know: {expr}")


def _variable_choices(run: Feed, at: float) -> list[dict[str, str]]:
    """Every expansion of the dashboard's variables: each metric, each of its keys, and "All"."""
    variables = {v["name"]: v for v in mon.dashboard_variables(FEED) if v.get("type") == "query"}
    assert set(variables) == {"metric", "key"}, variables
    combos: list[dict[str, str]] = []
    for metric in ("views", "basket"):
        keys = [r["metric"].get("key", "") for r in run.query(f'dpstream_release_value{{metric="{metric}"}}', at)]
        choices = [mon.regex_value([k]) for k in keys if k] + [variables["key"].get("allValue") or ".*"]
        combos += [{"metric": mon.regex_value([metric]), "key": k} for k in choices]
    combos.append(
        {"metric": variables["metric"].get("allValue") or ".*", "key": variables["key"].get("allValue") or ".*"}
    )
    return combos


def test_every_feed_panel_query_equals_the_released_records(feed: Feed) -> None:
    """At one instant, each series of each `dpstream-feed` panel query equals what the metric's latest
    release (by window end, first record of its release_id) says."""
    doc = json.loads(FEED.read_text(encoding="utf-8"))
    assert doc["uid"] == "dpstream-feed"
    queries = mon.dashboard_queries([FEED])
    assert len(queries) >= 3, queries

    def scraped() -> tuple[float, dict[str, int]] | None:
        """A scraped instant (Prometheus answers with the latest sample at or before it) showing both metrics."""
        at = round(time.time() - 1.0, 3)  # Prometheus evaluates at millisecond precision
        got = feed.query("dpstream_release_window_end_timestamp_seconds", at)
        ends = {r["metric"]["metric"]: int(float(r["value"][1])) for r in got}
        return (at, ends) if set(ends) == {"views", "basket"} else None

    found = mon.poll(scraped, 60)
    assert found, f"no instant with both metrics' window end:\n{feed.logs()}"
    at, ends = found
    assert set(ends) == {"views", "basket"}, ends

    def covering() -> dict[tuple[str, int], dict[str, Any]] | None:
        got = feed.released()
        return got if all((m, e) in got for m, e in ends.items()) else None

    released = mon.poll(covering, 30)
    assert released, f"the topic lacks the releases Prometheus shows: {ends}"
    latest = {m: released[(m, e)] for m, e in ends.items()}
    assert set(latest["views"]["values"]) == set(KEYS) and set(latest["basket"]["values"]) == {""}

    checked = 0
    for query in queries:
        for values in _variable_choices(feed, at):
            expr = mon.expand(query.expr, values)
            result = feed.query(expr, at)
            assert result, f"{query.where()}: no series for {expr}"
            for series in result:
                labels = series["metric"]
                metric, key = labels["metric"], labels.get("key", "")
                want = _expected(query.expr, latest[metric], key, at)
                got = float(series["value"][1])
                assert got == pytest.approx(want, rel=1e-12, abs=1e-9), (query.where(), expr, labels, got, want)
                checked += 1
    assert checked >= 3 * len(queries)


def test_the_dashboard_variables_list_the_feeds_metrics_and_keys(feed: Feed) -> None:
    """`label_values` of the metric and key variables give this run's metrics and the keyed metric's keys."""
    for var in mon.dashboard_variables(FEED):
        if var.get("type") != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        parsed = mon.LABEL_VALUES.match(mon.expand(query, {"metric": "views"}))
        assert parsed, query
        values = mon.Prometheus(feed.prometheus.url).label_values(parsed["label"], parsed["match"])
        expected = {"metric": {"views", "basket"}, "key": set(KEYS)}[var["name"]]
        assert expected <= set(values), (var["name"], values)
