"""A real `dpstream worker --web-port` (and `dpstream exporter`) on the session Kafka and Redis: /metrics passes
`promtool check metrics`, /health answers, the split roles serve their own families, and a canary shows that no
unit id, data-derived key or true aggregate reaches any metric or log line (DESIGN §1 "Trust boundary", §7).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dpstream.topology.loader import load_topology
from dpstream.workers.localstack import free_port
from dpstream.workers.pipeline.events import REASONS
from dpstream.workers.release.outcomes import ReleaseOutcome
from dpstream.workers.telemetry.classes import METRIC_CLASSES, MetricClass
from tests.e2e.harness import poll, releases, send

pytestmark = pytest.mark.e2e

WINDOW = 10

TOPOLOGY = """\
version: 1
start: {start}
sources:
  clicks:
    topic: {prefix}.clicks
    privacy_unit: user_id
    timestamp: ts
    allowed_lateness: 2s
    keyed_by_unit: true
budgets:
  b:
    epsilon: 1.0
    delta: 1.0e-6
    accounting: zcdp
    period: 1d
metrics:
  pages:                     # keys from the data: partition selection
    source: clicks
    budget: b
    weight: 1
    window: {{tumbling: {window}s}}
    aggregate: count
    group_by: page
    contribution: {{max_keys: 1, max_per_key: 1}}
    mechanism: gaussian
  basket:
    source: clicks
    budget: b
    weight: 1
    window: {{tumbling: {window}s}}
    aggregate: sum
    value: basket_eur
    bounds: [0, 1000]
    contribution: {{max_per_key: 1}}
    mechanism: gaussian
  session:
    source: clicks
    budget: b
    weight: 1
    window: {{tumbling: {window}s}}
    aggregate: mean
    value: session_s
    bounds: [0, 3600]
    contribution: {{max_per_key: 1}}
    mechanism: gaussian
  top_pages:
    source: clicks
    budget: b
    weight: 1
    window: {{tumbling: {window}s}}
    aggregate: top_k
    k: 1
    group_by: page
    contribution: {{max_keys: 1, max_per_key: 1}}
    mechanism: exponential
sinks:
  releases: {prefix}.releases
  dead_letter: {prefix}.dlq
"""


class Stack:
    """One test's topology, its worker and exporter subprocesses and their logs."""

    def __init__(self, tmp_path: Path, bootstrap: str, redis_url: str) -> None:
        from dpstream.workers.runtime.topics import ensure_topics

        self.prefix = f"e2e-metrics-{uuid.uuid4().hex[:10]}"
        self.dir = tmp_path / self.prefix
        self.dir.mkdir(parents=True)
        self.path = self.dir / "topology.yaml"
        start = int(time.time()) // WINDOW * WINDOW
        self.path.write_text(TOPOLOGY.format(prefix=self.prefix, start=start, window=WINDOW))
        self.topology = load_topology(self.path)
        self.bootstrap = bootstrap
        self.redis_url = redis_url
        self.procs: list[subprocess.Popen] = []
        ensure_topics(bootstrap, self.topology)

    def start(self, name: str, argv: list[str]) -> int:
        """Start a `dpstream` subprocess with `--web-port`/`--port` P; returns P once /health answers."""
        port = free_port()
        log = open(self.dir / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        if argv[0] == "worker":
            argv = [
                *argv,
                str(self.path),
                "--bootstrap",
                self.bootstrap,
                "--redis",
                self.redis_url,
                "--worker-id",
                name,
                "--web-port",
                str(port),
                "--loglevel",
                "INFO",
            ]
        else:
            argv = [
                *argv,
                "--topology",
                str(self.path),
                "--redis",
                self.redis_url,
                "--port",
                str(port),
                "--loglevel",
                "INFO",
            ]
        proc = subprocess.Popen(
            [sys.executable, "-m", "dpstream.workers.cli", *argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(os.environ),
        )
        self.procs.append(proc)
        assert poll(lambda: proc.poll() is not None or _get(port, "/health")[0] == 200, timeout_s=90), self.log(name)
        assert proc.poll() is None, self.log(name)
        return port

    def log(self, name: str) -> str:
        return (self.dir / f"{name}.log").read_text(errors="replace")

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def released(self, start: int) -> set[str] | None:
        """Metrics with a release of the window starting at `start` (None until every metric has one)."""
        got = {
            r["metric"]
            for r in releases(self.bootstrap, self.topology.sinks.releases)
            if r["window"]["start_epoch"] == start
        }
        return got if got == set(self.topology.metrics) else None


def _get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=15) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
    except OSError:
        return 0, b""


def _scrape(port: int) -> str:
    status, body = _get(port, "/metrics")
    assert status == 200, body[:300]
    return body.decode()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def _families(text: str) -> set[str]:
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


def _promtool_clean(text: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool missing: apt-get install prometheus (workers/localstack/sysdeps.py)")
    check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    assert check.returncode == 0 and not (check.stdout + check.stderr).strip(), check.stdout + check.stderr


def _next_window() -> int:
    """Sleep into the start of the next window (so a burst of events lands in one window); its start."""
    start = (int(time.time()) // WINDOW + 1) * WINDOW
    time.sleep(max(0.0, start + 0.3 - time.time()))
    return start


BUDGET_FAMILIES = {
    "dpstream_ledger_up",
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
}
RELEASE_FAMILIES = {
    "dpstream_releases_total",
    "dpstream_release_latency_seconds",
    "dpstream_release_noise_stddev",
    "dpstream_release_lag_seconds",
    "dpstream_windows_pending",
    "dpstream_ledger_request_duration_seconds",
    "dpstream_ledger_errors_total",
}
EVENT_FAMILIES = {"dpstream_events_total", "dpstream_dead_letters_total"}


@pytest.fixture
def stack(tmp_path: Path, kafka_broker, fresh_redis):
    s = Stack(tmp_path, kafka_broker.bootstrap, fresh_redis.url)
    yield s
    s.stop()


def _token(number: str) -> re.Pattern[str]:
    """`number` as a whole number in text (not a digit run inside another number)."""
    return re.compile(rf"(?<![\d.]){re.escape(number)}(?:\.0+)?(?![\d.])")


def test_worker_metrics_promtool_health_and_no_canary_anywhere(stack: Stack) -> None:
    """A canary unit and a canary key go through a real worker (with 2,468 other users on the canary key, so the
    key's true count is 2,469, and 500 on another page): neither string, nor the key's true count, nor the true
    basket sum appears in the worker's or the exporter's /metrics or in either log (INFO)."""
    worker = stack.start("w-all", ["worker", "--role", "all", "--curator-metrics"])
    exporter = stack.start("exporter", ["exporter"])
    status, body = _get(worker, "/health")
    assert status == 200 and json.loads(body) == {"status": "ok", "role": "all"}
    # the public schedule runs: wait for a first release, so the release side is warm
    assert poll(lambda: releases(stack.bootstrap, stack.topology.sinks.releases), timeout_s=120), stack.log("w-all")

    canary_unit = f"canary-{uuid.uuid4().hex}"
    canary_key = f"canarykey-{uuid.uuid4().hex}"
    fillers, others = 2468, 500
    start = _next_window()
    ts = start + 1.0
    events = [
        (
            canary_unit.encode(),
            json.dumps(
                {"user_id": canary_unit, "ts": ts, "page": canary_key, "basket_eur": 987.654321, "session_s": 1234.5}
            ).encode(),
        )
    ]
    basket = 987.654321
    for i in range(fillers):
        user = f"u{i:05d}"
        events.append(
            (
                user.encode(),
                json.dumps(
                    {"user_id": user, "ts": ts, "page": canary_key, "basket_eur": 10.25, "session_s": 60}
                ).encode(),
            )
        )
        basket += 10.25
    for i in range(others):
        user = f"o{i:05d}"
        events.append(
            (
                user.encode(),
                json.dumps({"user_id": user, "ts": ts, "page": "home", "basket_eur": 3.5, "session_s": 30}).encode(),
            )
        )
        basket += 3.5
    events += [(b"x", b"not json")] * 11
    send(stack.bootstrap, stack.topology.sources["clicks"].topic, events)
    assert poll(lambda: stack.released(start), timeout_s=120), stack.log("w-all")[-3000:]
    true_count = fillers + 1

    def settled() -> dict | None:
        got = _samples(_scrape(worker))
        done = got[("dpstream_releases_total", (("metric", "pages"), ("outcome", "published")))] >= 1
        return (
            got
            if done
            and got[("dpstream_events_total", (("outcome", "accepted"), ("source", "clicks")))] == fillers + others + 1
            else None
        )

    got = poll(settled, timeout_s=60)
    assert got, _scrape(worker)
    worker_text, exporter_text = _scrape(worker), _scrape(exporter)
    (stack.dir / "worker.metrics.txt").write_text(worker_text)  # kept beside the logs for a failing run
    (stack.dir / "exporter.metrics.txt").write_text(exporter_text)

    # promtool: both scrapes are clean
    _promtool_clean(worker_text)
    _promtool_clean(exporter_text)

    # the canary: no unit id, no key from the data, no true aggregate, anywhere
    time.sleep(1.0)  # let the logs flush what the release of the canary window wrote
    texts = {
        "worker /metrics": worker_text,
        "exporter /metrics": exporter_text,
        "worker log": stack.log("w-all"),
        "exporter log": stack.log("exporter"),
    }
    for where, text in texts.items():
        for secret in (canary_unit, canary_key, canary_unit.split("-")[1], canary_key.split("-")[1]):
            assert secret not in text, f"{secret!r} in {where}"
    for where in ("worker /metrics", "exporter /metrics"):
        for number in (str(true_count), f"{basket:.2f}", f"{basket:.4f}", "987.654321"):
            assert not _token(number).search(texts[where]), f"true aggregate {number} in {where}"

    # what the worker serves (role all: budget, releases and events)
    families = _families(worker_text)
    assert BUDGET_FAMILIES | RELEASE_FAMILIES | EVENT_FAMILIES | {"dpstream_build_info"} <= families, families
    assert BUDGET_FAMILIES | {"dpstream_build_info", "dpstream_metric_privacy_info"} <= _families(exporter_text)
    curator_only = {n for n, c in METRIC_CLASSES.items() if c is MetricClass.CURATOR_ONLY}
    assert not _families(exporter_text) & curator_only  # the exporter never serves curator-only series
    assert got[("dpstream_ledger_up", ())] == 1.0
    assert got[("dpstream_budget_spent_ratio", (("scope", "b"),))] > 0
    for metric in stack.topology.metrics:
        for outcome in ReleaseOutcome:
            assert ("dpstream_releases_total", (("metric", metric), ("outcome", outcome.value))) in got
    assert got[("dpstream_release_latency_seconds_count", (("metric", "pages"),))] >= 1
    assert got[("dpstream_release_noise_stddev", (("metric", "pages"),))] > 0
    assert got[("dpstream_release_noise_stddev", (("metric", "session"),))] > 0  # a mean: its sum's σ
    assert ("dpstream_release_noise_stddev", (("metric", "top_pages"),)) not in got  # top-k has no σ
    assert 0 <= got[("dpstream_release_lag_seconds", (("metric", "pages"),))] < 60
    assert got[("dpstream_ledger_request_duration_seconds_count", (("op", "charge"),))] >= 4
    assert got[("dpstream_ledger_errors_total", (("op", "charge"),))] == 0
    assert got[("dpstream_events_total", (("outcome", "invalid"), ("source", "clicks")))] == 11
    assert got[("dpstream_dead_letters_total", (("reason", "not_json"), ("source", "clicks")))] == 11
    for reason in REASONS:
        assert ("dpstream_dead_letters_total", (("reason", reason), ("source", "clicks"))) in got
    # labels are topology names and fixed vocabularies only
    allowed = {
        "scope",
        "currency",
        "state",
        "metric",
        "outcome",
        "source",
        "reason",
        "op",
        "le",
        "version",
        "topology_version",
        "privacy_unit",  # dpstream_metric_privacy_info: the topology's field name (or `event`)
        "guarantee",  # and its fixed vocabulary: unit-level | event-level (weaker)
    }
    assert {name for key in got for name, _ in key[1]} <= allowed


def test_split_roles_each_serve_their_own_metrics_and_release_lag(stack: Stack) -> None:
    """--role release and --role ingest on their own ports: releases on one, events on the other, budget on both.

    Before the ingest runs, one partition's partial of the first window is on the partials topic: the window is
    closed and not released (three partials missing), so the release process shows it pending, with a lag that
    grows; once the ingest reports the other partitions the window is released and the lag is 0."""
    from kafka import KafkaProducer

    from dpstream.workers.pipeline.partials import WindowPartial

    release = stack.start("w-release", ["worker", "--role", "release", "--curator-metrics"])
    assert json.loads(_get(release, "/health")[1]) == {"status": "ok", "role": "release"}
    first = stack.topology.schedule_start
    source = stack.topology.sources["clicks"]
    partial = WindowPartial("pages", first, first + WINDOW, "clicks", source.topic, 0, {}, partitions=4)
    producer = KafkaProducer(bootstrap_servers=stack.bootstrap, acks="all")
    producer.send(stack.topology.sinks.partials_topic, value=partial.to_bytes(), key=partial.key)
    producer.flush()
    producer.close()
    pending = ("dpstream_windows_pending", (("metric", "pages"),))
    lag = ("dpstream_release_lag_seconds", (("metric", "pages"),))

    def lagging() -> dict | None:
        got = _samples(_scrape(release))
        return got if got[pending] == 1 and got[lag] > 0 else None

    got = poll(lagging, timeout_s=60)
    assert got, _scrape(release)
    # the age of the window: now - (end + allowed_lateness), within the scrape's second
    assert abs(got[lag] - (time.time() - (first + WINDOW + 2))) < 5
    assert got[("dpstream_windows_pending", (("metric", "basket"),))] == 0

    ingest = stack.start("w-ingest", ["worker", "--role", "ingest", "--curator-metrics"])
    assert json.loads(_get(ingest, "/health")[1]) == {"status": "ok", "role": "ingest"}
    start = _next_window()
    send(
        stack.bootstrap,
        source.topic,
        [
            (
                f"u{i}".encode(),
                json.dumps(
                    {"user_id": f"u{i}", "ts": start + 1, "page": "home", "basket_eur": 5, "session_s": 10}
                ).encode(),
            )
            for i in range(40)
        ],
    )

    def logs() -> str:
        return stack.log("w-release")[-2000:] + stack.log("w-ingest")[-2000:]

    assert poll(lambda: stack.released(first), timeout_s=150), logs()
    assert poll(lambda: stack.released(start), timeout_s=150), logs()
    published = ("dpstream_releases_total", (("metric", "pages"), ("outcome", "published")))
    assert poll(lambda: (g := _samples(_scrape(release)))[published] >= 2 and g[lag] == 0, timeout_s=30), _scrape(
        release
    )

    release_text, ingest_text = _scrape(release), _scrape(ingest)
    _promtool_clean(release_text)
    _promtool_clean(ingest_text)
    rel, ing = _families(release_text), _families(ingest_text)
    assert rel >= BUDGET_FAMILIES | RELEASE_FAMILIES and not rel & EVENT_FAMILIES, rel
    assert ing >= BUDGET_FAMILIES | EVENT_FAMILIES and not ing & RELEASE_FAMILIES, ing
    got = _samples(ingest_text)
    assert got[("dpstream_events_total", (("outcome", "accepted"), ("source", "clicks")))] == 40
    assert got[("dpstream_ledger_up", ())] == 1.0
