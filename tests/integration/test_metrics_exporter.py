"""`dpstream exporter` on a real Redis: budget gauges equal `dpstream budget status --json` after real charges,
`promtool check metrics` is clean on a real scrape, and a stopped Redis gives `dpstream_ledger_up 0`, not an error.

The exporter runs as a subprocess (`python -m dpstream.workers.cli exporter`); charges go through the ledger
API (`open_ledger(url, topology)` registers the scopes as a worker would, then `charge`).
"""

from __future__ import annotations

import asyncio
import calendar
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dpstream.topology.loader import load_topology
from dpstream.topology.periods import period_id
from dpstream.workers.ledger import Outcome, ReleaseRequest, open_ledger
from dpstream.workers.localstack import RedisHandle, free_port

TOPOLOGY = """\
version: 1
sources:
  clicks: {{topic: metrics-exporter.clicks, privacy_unit: user_id, timestamp: ts}}
budgets:
  web-daily: {{epsilon: 1.0, delta: 1.0e-6, accounting: zcdp, period: 1d}}
  partner-hourly: {{epsilon: 2.0, accounting: pure, period: 1h, reserve: 0.1, warn_at: 0.9}}
metrics:
  views:
    source: clicks
    budget: web-daily
    weight: 1
    window: {{tumbling: 1h}}
    aggregate: count
    contribution: {{max_per_key: 1}}
    mechanism: gaussian
  partner_views:
    source: clicks
    budget: partner-hourly
    weight: 1
    window: {{tumbling: 5m}}
    aggregate: count
    contribution: {{max_per_key: 1}}
    mechanism: laplace
redis:
  url: {redis}
sinks: {{releases: metrics-exporter.releases, dead_letter: metrics-exporter.dlq}}
"""


def _write_topology(tmp_path: Path, redis_url: str) -> Path:
    path = tmp_path / "topology.yaml"
    path.write_text(TOPOLOGY.format(redis=redis_url))
    return path


def _get(port: int, path: str, timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


class Exporter:
    """A `dpstream exporter` subprocess on a free port; its log in the test's tmp dir."""

    def __init__(self, topology: Path, redis_url: str | None, log: Path) -> None:
        self.port = free_port()
        argv = [
            sys.executable,
            "-m",
            "dpstream.workers.cli",
            "exporter",
            "--topology",
            str(topology),
            "--port",
            str(self.port),
        ]
        if redis_url:
            argv += ["--redis", redis_url]
        self.log = log
        self._out = open(log, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(argv, stdout=self._out, stderr=subprocess.STDOUT, env=dict(os.environ))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, log.read_text()
            try:
                if _get(self.port, "/health", timeout=2)[0] == 200:
                    return
            except OSError:
                time.sleep(0.2)
        raise AssertionError(f"exporter did not answer: {log.read_text()}")

    def scrape(self) -> tuple[str, dict[str, str]]:
        status, headers, body = _get(self.port, "/metrics")
        assert status == 200, body[:500]
        return body.decode(), headers

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._out.close()


@pytest.fixture
def topology_file(tmp_path: Path, fresh_redis) -> Path:
    return _write_topology(tmp_path, fresh_redis.url)


@pytest.fixture
def exporter(tmp_path: Path, topology_file: Path, fresh_redis) -> Iterator[Exporter]:
    exp = Exporter(topology_file, fresh_redis.url, tmp_path / "exporter.log")
    yield exp
    exp.stop()


_charged = itertools.count()  # one release id and window per charge across calls made in the same second


async def _charge(url: str, topology_file: Path, charges: list[tuple[str, float]]) -> None:
    """Register the topology's scopes (as a worker does) and charge one release per (metric, cost), each
    for its own window of the current period."""
    topology = load_topology(topology_file)
    ledger = await open_ledger(url, topology, actor="test")
    try:
        now = int(time.time())
        for metric, cost in charges:
            i = next(_charged)
            m = topology.metrics[metric]
            period_s = topology.budgets[m.budget].period_s
            size = m.window.size_s
            pstart = now - now % period_s
            start = pstart + (i % (period_s // size)) * size
            req = ReleaseRequest(
                f"{metric}-{now}-{i}", m.budget, period_id(period_s, start), metric, start, start + size, cost, b"{}"
            )
            assert (await ledger.charge(req)).outcome is Outcome.CHARGED
    finally:
        await ledger.close()


def _budget_status(topology_file: Path, url: str) -> dict[str, dict]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "dpstream.workers.cli",
            "budget",
            "status",
            "--json",
            "--topology",
            str(topology_file),
            "--redis",
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return {s["scope"]: s for s in json.loads(out.stdout)["scopes"]}


def test_exporter_budget_gauges_equal_budget_status_after_real_charges(
    exporter: Exporter,
    topology_file: Path,
    fresh_redis,
) -> None:
    text, _ = exporter.scrape()
    got = _samples(text)
    assert got[("dpstream_ledger_up", ())] == 1.0
    assert not any(k[0].startswith("dpstream_budget_") for k in got)  # no scope registered yet: nothing to show

    for charges in (
        [("views", 1e-3), ("partner_views", 0.05)],
        [("views", 2.5e-3), ("views", 7e-4), ("partner_views", 0.3)],
    ):
        asyncio.run(_charge(fresh_redis.url, topology_file, charges))
        got = _samples(exporter.scrape()[0])
        status = _budget_status(topology_file, fresh_redis.url)
        assert set(status) == {"web-daily", "partner-hourly"}
        for scope, s in status.items():
            currency = {"zcdp": "rho", "pure": "epsilon"}[s["accounting"]]
            assert s["ratio"] > 0
            assert got[("dpstream_budget_spent_ratio", (("scope", scope),))] == s["ratio"]  # exactly, same instant
            assert got[("dpstream_budget_spent", (("currency", currency), ("scope", scope)))] == s["spent"]
            assert got[("dpstream_budget_cap", (("currency", currency), ("scope", scope)))] == s["cap"]
            assert got[("dpstream_budget_warn_ratio", (("scope", scope),))] == s["warn_at"]
            assert got[("dpstream_budget_epsilon_spent", (("scope", scope),))] == s["epsilon_equiv"]
            # one period so far: the counter across periods equals this period's spend
            assert got[("dpstream_budget_spent_total", (("currency", currency), ("scope", scope)))] == s["spent"]
            assert got[("dpstream_budget_state", (("scope", scope), ("state", s["state"])))] == 1.0
            assert got[("dpstream_breaker_open", (("scope", scope),))] == 0.0
            end = time.strptime(s["period"]["end"], "%Y-%m-%dT%H:%M:%SZ")
            assert got[("dpstream_budget_period_end_timestamp_seconds", (("scope", scope),))] == calendar.timegm(end)
            assert 0.0 <= got[("dpstream_budget_planned_ratio", (("scope", scope),))] <= 1.0
    assert got[("dpstream_budget_period_seconds", (("scope", "web-daily"),))] == 86_400
    assert got[("dpstream_budget_period_seconds", (("scope", "partner-hourly"),))] == 3_600
    assert abs(got[("dpstream_budget_reserve_ratio", (("scope", "partner-hourly"),))] - 0.1) < 1e-9


def test_exporter_scrape_passes_promtool_check_metrics(exporter: Exporter, topology_file: Path, fresh_redis) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool missing: apt-get install prometheus (workers/localstack/sysdeps.py)")
    asyncio.run(_charge(fresh_redis.url, topology_file, [("views", 1e-3), ("partner_views", 0.05)]))
    text, headers = exporter.scrape()
    assert headers["Content-Type"].startswith("text/plain; version=")
    assert "dpstream_budget_spent_ratio{" in text and "dpstream_build_info{" in text
    check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    assert check.returncode == 0 and not (check.stdout + check.stderr).strip(), check.stdout + check.stderr


def test_exporter_answers_with_ledger_down_when_its_redis_stops(tmp_path: Path) -> None:
    """A Redis of its own (the session's stays up): up → stopped (ledger_up 0, /health 200) → up again."""
    handle = RedisHandle(free_port(), tmp_path / "own-redis")
    handle.start()
    exp = None
    try:
        topology_file = _write_topology(tmp_path, handle.url)
        asyncio.run(_charge(handle.url, topology_file, [("views", 1e-3)]))
        exp = Exporter(topology_file, None, tmp_path / "exporter.log")  # the Redis URL from the topology
        got = _samples(exp.scrape()[0])
        assert got[("dpstream_ledger_up", ())] == 1.0
        assert ("dpstream_budget_spent_ratio", (("scope", "web-daily"),)) in got

        handle.stop()
        started = time.monotonic()
        text, _ = exp.scrape()
        assert time.monotonic() - started < 10  # bounded, never hangs the scraper
        got = _samples(text)
        assert got[("dpstream_ledger_up", ())] == 0.0
        assert not any(k[0].startswith("dpstream_budget_") for k in got)  # no stale gauge
        assert any(k[0] == "dpstream_build_info" for k in got)
        status, _, body = _get(exp.port, "/health")
        assert status == 200 and json.loads(body) == {"status": "ok", "role": "exporter"}

        handle.start()
        got = _samples(exp.scrape()[0])
        assert got[("dpstream_ledger_up", ())] == 1.0
        assert got[("dpstream_budget_spent_ratio", (("scope", "web-daily"),))] > 0
        assert exp.proc.poll() is None
    finally:
        if exp is not None:
            exp.stop()
        handle.stop()


def test_exporter_refuses_a_bad_port_with_one_line(tmp_path: Path, fresh_redis) -> None:
    topology_file = _write_topology(tmp_path, fresh_redis.url)
    out = subprocess.run(
        [sys.executable, "-m", "dpstream.workers.cli", "exporter", "--topology", str(topology_file), "--port", "70000"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0 and "--port 70000" in out.stderr
