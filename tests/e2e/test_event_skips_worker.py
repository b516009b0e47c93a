"""A real `dpstream worker --curator-metrics` on the session Kafka and Redis: events whose producer mis-names a
metric's value field (`basket` for `basket_eur`) raise `dpstream_events_skipped_total{source,metric,reason}` on
/metrics, and DPMetricEventsSkipped fires under `promtool test rules` on series of exactly the shape scraped."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.e2e.harness import poll, send
from tests.e2e.test_metrics_worker import Stack, _promtool_clean, _samples, _scrape

pytestmark = pytest.mark.e2e

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "rules.yml"
SKIPPED = "dpstream_events_skipped_total"
ACCEPTED = ("dpstream_events_total", (("outcome", "accepted"), ("source", "clicks")))


def _key(metric: str, reason: str) -> tuple:
    return (SKIPPED, (("metric", metric), ("reason", reason), ("source", "clicks")))


@pytest.fixture
def stack(tmp_path: Path, kafka_broker, fresh_redis):
    s = Stack(tmp_path, kafka_broker.bootstrap, fresh_redis.url)
    yield s
    s.stop()


def _series(name: str, labels: tuple[tuple[str, str], ...], instance: str) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in (("job", "dpstream-worker"), ("instance", instance), *labels))
    return f"{name}{{{inner}}}"


def _alert_rule(name: str) -> dict:
    doc = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    (rule,) = [r for g in doc["groups"] for r in g["rules"] if r.get("alert") == name]
    return rule


def _promtool_fires(tmp_path: Path, got: dict, instance: str) -> None:
    """Replay the scraped counters as if the worker kept that pace for 30 minutes (each scraped value added per
    minute) and check, with promtool, that DPMetricEventsSkipped fires for exactly the metric that skips."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool missing: apt-get install prometheus (workers/localstack/sysdeps.py)")
    series = [
        {"series": _series(name, labels, instance), "values": f"0+{int(value)}x30"}
        for (name, labels), value in sorted(got.items())
        if name == SKIPPED or (name, labels) == ACCEPTED
    ]
    rule = _alert_rule("DPMetricEventsSkipped")

    def render(text: str) -> str:
        return text.replace("{{ $labels.metric }}", "basket").replace("{{ $labels.source }}", "clicks")

    test = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {
                        "eval_time": "20m",
                        "alertname": "DPMetricEventsSkipped",
                        "exp_alerts": [
                            {
                                "exp_labels": {"source": "clicks", "metric": "basket", "severity": "warning"},
                                "exp_annotations": {k: render(v) for k, v in rule["annotations"].items()},
                            }
                        ],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "skips.test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False), encoding="utf-8")
    done = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr + path.read_text()


def test_a_misnamed_value_field_raises_the_skip_counter_and_the_alert(stack: Stack, tmp_path: Path) -> None:
    """30 well-formed events and 10 whose producer sends `basket` for `basket_eur`: all 40 are accepted, the
    `basket` sum skips the 10 (`missing_value_field`), no other metric skips any, and promtool fires
    DPMetricEventsSkipped for basket alone on those series."""
    worker = stack.start("w-ingest", ["worker", "--role", "ingest", "--curator-metrics"])
    before = _samples(_scrape(worker))
    for metric in stack.topology.metrics:
        for reason in ("missing_group_field", "undeclared_key", "missing_value_field"):
            assert before[_key(metric, reason)] == 0, (metric, reason)

    ts = time.time()
    events = []
    for i in range(40):
        user = f"u{i:03d}"
        doc = {"user_id": user, "ts": ts, "page": "home", "session_s": 30}
        doc["basket" if i % 4 == 0 else "basket_eur"] = 12.5  # every 4th: the mis-named field
        events.append((user.encode(), json.dumps(doc).encode()))
    send(stack.bootstrap, stack.topology.sources["clicks"].topic, events)

    got = poll(lambda: (g := _samples(_scrape(worker)))[ACCEPTED] == 40 and g or None, timeout_s=90)
    assert got, _scrape(worker) + stack.log("w-ingest")[-3000:]
    assert got[_key("basket", "missing_value_field")] == 10
    others = {k: v for k, v in got.items() if k[0] == SKIPPED and k != _key("basket", "missing_value_field")}
    assert others and set(others.values()) == {0.0}, others
    text = _scrape(worker)
    _promtool_clean(text)
    assert "basket_eur" not in text and "u000" not in text  # labels are names and reasons, never event content

    _promtool_fires(tmp_path, got, f"127.0.0.1:{worker}")
