"""Run the demo: the local stack with monitoring, what the demo topology costs and buys, a worker, an
exporter and a live feed at wall-clock time, the release table, a budget summary, a clean shutdown.

Only what the demo started is stopped at the end: services that were already up (e.g. from
`deploy/local/stack up`) are left running. The worker and the exporter are child processes
(`dpstream worker … --web-port P`, `dpstream exporter …`), exactly what an operator runs by hand; the
synthetic feed runs inside the demo so that it knows the truth it shows (labelled as demo-only).
"""

from __future__ import annotations

__all__ = ["DemoOptions", "run_demo", "demo_topology_path", "for_run", "schedule_start", "worker_command"]

import asyncio
import json
import logging
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpstream.topology.durations import format_duration
from dpstream.topology.model import Metric, Topology
from dpstream.topology.plan import MetricPlan, Plan
from dpstream.workers.demo.live import LiveResult, LiveSetup, run_live
from dpstream.workers.demo.sizing import (
    DemoPopulation,
    Typical,
    first_useful_step,
    planned_ci,
    relative_ci,
    typical_values,
)

if TYPE_CHECKING:  # the stack is imported when the demo runs, not when the CLI starts
    from dpstream.workers.localstack import Service, Stack, StackConfig

Say = Callable[[str], None]

_QUIET_LOGGERS = ("aiokafka", "kafka")
"""Client libraries whose warnings on a fresh broker (NotLeaderForPartitionError while a new topic elects
its leaders, metadata retries, coordinator moves) are retried by the library, not news for the user."""


def demo_topology_path() -> Path:
    """The shipped `demo.yaml` (package data of `topology`)."""
    from dpstream import topology

    return Path(topology.__file__).resolve().parent / "examples" / "demo.yaml"


@dataclass(frozen=True)
class DemoOptions:
    """What the demo runs, on which ports, for how long."""

    duration_s: float | None = None
    """Seconds of live feed after set-up; None runs until Ctrl-C."""
    home: Path | None = None
    kafka_port: int = 9092
    kafka_controller_port: int = 19093
    redis_port: int = 6379
    prometheus_port: int = 9090
    alertmanager_port: int = 9093
    worker_web_port: int = 6066
    exporter_port: int = 9464
    webhook_port: int = 9097
    """The demo's own Alertmanager webhook receiver (pager and ticket both land here)."""
    rate: float = 2000.0
    users: int = 100_000
    budget_every_s: float = 10.0
    topology_path: Path | None = None
    kafka_libs: Path | None = None
    """Kafka's jars when the home is not the default (tests share the machine's cache)."""
    monitoring: bool = True
    """Start Prometheus and Alertmanager too."""


class _Children:
    """Child processes of the demo, stopped in reverse order with SIGTERM, then SIGKILL."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self._procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen([sys.executable, "-m", "dpstream.workers.cli", *args], stdout=log, stderr=log)
        log.close()
        self._procs.append((name, proc))
        return proc

    def stop_all(self, grace_s: float = 15.0) -> None:
        for _name, proc in reversed(self._procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for _name, proc in reversed(self._procs):
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def died(self) -> str | None:
        """Name and log of a child that exited, if any (none of them should before the end)."""
        for name, proc in self._procs:
            code = proc.poll()
            if code is not None:
                return f"{name} exited with {code}; see {self.log_dir / (name + '.log')}"
        return None


def schedule_start(now: float, topology: Topology, margin_s: float = 1.0) -> int:
    """The run's public start S: the next boundary of every metric's window grid after now + margin, so the
    first window of each metric is a whole one (the feed is already running when it opens)."""
    grid = math.lcm(*(m.window.every_s for m in topology.metrics.values())) if topology.metrics else 1
    return int(-(-(now + margin_s) // grid) * grid)


def for_run(topology: Topology, run_id: str, start: int) -> Topology:
    """The topology a demo run uses: every topic suffixed with `run_id` and `start:` = `start`.

    Fresh topics, so a run never reads an earlier run's events; a public start, so the schedule begins
    now (without it a topology version's schedule runs from its first start, recorded in the ledger:
    a second run would owe every window since the first). Scopes, metrics and so the plan are unchanged.
    """
    sources = {name: replace(s, topic=f"{s.topic}.{run_id}") for name, s in topology.sources.items()}
    sinks = replace(
        topology.sinks,
        releases=f"{topology.sinks.releases}.{run_id}",
        dead_letter=f"{topology.sinks.dead_letter}.{run_id}",
        partials=f"{topology.sinks.partials}.{run_id}" if topology.sinks.partials else "",
    )
    return replace(topology, sources=sources, sinks=sinks, schedule_start=start)


@contextmanager
def _quiet_client_logs() -> Iterator[None]:
    """Kafka client chatter off for the demo's duration (restored afterwards)."""
    saved = {name: logging.getLogger(name).level for name in _QUIET_LOGGERS}
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


def _cost_lines(
    topology: Topology, plan: Plan, typical: dict[str, Typical], population: DemoPopulation, path: Path
) -> list[str]:
    """What the topology costs (ε per period, per day, per 30 days) and buys (CI vs typical value)."""
    from dpstream.topology.accounting import epsilon_equivalent
    from dpstream.topology.model import Accounting

    lines = [
        f"demo topology {path}: {population.users:,} synthetic users, {population.rate:,.0f} events/s"
        f" (full plan: dpstream plan {path})"
    ]
    for scope in plan.scopes:
        period = format_duration(scope.period_s)
        per_day = max(1, 86_400 // scope.period_s)
        zcdp = scope.accounting is Accounting.ZCDP
        day = epsilon_equivalent(zcdp, per_day * scope.pool, scope.conversion_delta).epsilon
        lines.append(
            f"what it costs: scope {scope.name} promises ε = {scope.epsilon:g} per user per {period} period "
            f"(δ = {scope.delta:g}); on plan it spends ε ≈ {scope.planned_epsilon:.2f} per period,"
        )
        verdict = (
            " That is weak protection by the common bar of ε ≤ 1: fine-grained live numbers about a few "
            "thousand people are expensive."
            if day > 1
            else ""
        )
        lines.append(
            f"  and periods compose: ≈ {day:.1f} per day, ≈ {scope.horizon.epsilon:.0f} over 30 days.{verdict}"
        )
    lines.append(
        "what it buys (plan, whole period): metric, window, noise σ, 95 % CI vs the typical true value "
        "of the demo's feed (after contribution bounding)"
    )
    for name, metric in topology.metrics.items():
        mp = plan.metric(name)
        t = typical.get(name)
        ci = planned_ci(metric, mp, t) if t is not None else None
        sigma = " / ".join(
            f"{c.component} {c.stddev:,.1f}" if len(mp.components) > 1 else f"{c.stddev:,.1f}"
            for c in mp.components
            if c.stddev is not None
        )
        quantile = mp.quantiles is not None  # scale and error in ranks: a value interval would leak
        if quantile:
            sigma = f"scale {max(c.scale for c in mp.components):,.1f} ranks"
        unit = " s" if metric.aggregate.value == "mean" else ""
        rel = f"{100 * ci / abs(t.value):.1f} %" if ci is not None and t is not None and t.value else "–"
        typical_text = f"{t.value:,.0f}{unit}" if t is not None else "–"
        if t is not None and metric.keys:
            typical_text += " per key"
        ci_text = "–" if ci is None else (f"±{ci:,.0f}{unit}" if ci >= 10 else f"±{ci:.1f}{unit}")
        if quantile and ci is not None:
            ci_text, typical_text = f"rank ±{ci:,.0f}", f"{t.value:,.0f} values" if t is not None else "–"
        if mp.running_total_steps is not None:  # σ of each step's y; CI and typical of the last step's total
            sigma = f"{mp.components[0].scale:,.0f}/step, {mp.running_total_max_stddev or 0:,.0f} last"
            typical_text = f"{t.value:,.0f} at step {mp.running_total_steps}" if t is not None else "–"
        lines.append(
            f"  {name:<16} {_window_text(metric):<16} σ {sigma:<28} 95 % CI {ci_text:<9} "
            f"typical {typical_text:<16} CI/typical {rel}"
        )
        if mp.running_total_steps is not None and t is not None:
            lines.append("    " + _running_total_text(metric, mp, t))
    return lines


def _running_total_text(metric: Metric, mp: MetricPlan, typical: Typical) -> str:
    """How a running total's CI compares with its typical total as the period goes (the CI grows as
    ‖c_<t‖₂, the total as t): at step 1, from the first step within 10 %, and at the last step."""
    steps = mp.running_total_steps or 1
    at = [1, first_useful_step(metric, mp, typical) or steps, steps]
    parts = []
    for step in sorted(set(at)):
        ci, rel = planned_ci(metric, mp, typical, step), relative_ci(metric, mp, typical, step)
        parts.append(f"±{ci or 0:,.0f} at step {step} ({100 * (rel or 0):.1f} % of ~{typical.total_at(step):,.0f})")
    return "a running total of the period so far, one lump a period charged with its first step: 95 % CI " + ", ".join(
        parts
    )


def _window_text(metric: Metric) -> str:
    w = metric.window
    if w.size_s == w.every_s:
        return f"tumbling {format_duration(w.size_s)}"
    return f"hopping {format_duration(w.size_s)}/{format_duration(w.every_s)}"


def _render_monitoring(options: DemoOptions, log_dir: Path, say: Say) -> tuple[Path, Path]:
    from dpstream.workers.demo.monitoring import alert_rules_path, render_alertmanager_config, render_prometheus_config

    rules = alert_rules_path()
    prometheus_yml = log_dir / "prometheus.yml"
    prometheus_yml.write_text(
        render_prometheus_config(
            options.prometheus_port, options.alertmanager_port, options.worker_web_port, options.exporter_port, rules
        )
    )
    alertmanager_yml = log_dir / "alertmanager.yml"
    shipped = render_alertmanager_config(alertmanager_yml, options.webhook_port)
    if rules is None:
        say("note: deploy/prometheus/rules.yml is not in this checkout: Prometheus runs without alert rules")
    if not shipped:
        say(
            "note: deploy/alertmanager/alertmanager.yml.tmpl is not in this checkout: Alertmanager runs the "
            "local stack's default (alerts kept, sent nowhere)"
        )
    return prometheus_yml, alertmanager_yml


def worker_command(options: DemoOptions, run_path: Path, bootstrap: str, redis_url: str) -> list[str]:
    """The demo worker's `dpstream` arguments. Its /metrics feeds the demo's shared dashboard (a wide
    audience), so never `--curator-metrics`: it serves the data-independent metrics only."""
    args = ["worker", str(run_path), "--bootstrap", bootstrap, "--redis", redis_url]
    args += ["--worker-id", "demo-worker", "--loglevel", "WARNING"]
    if options.monitoring:
        args += ["--web-port", str(options.worker_web_port)]
    return args


def run_demo(options: DemoOptions, say: Say = print) -> int:
    """The whole demo; returns 0 when releases were shown, 1 otherwise."""
    with _quiet_client_logs():
        return _run(options, say)


def _run(options: DemoOptions, say: Say) -> int:
    from dpstream.topology.loader import load_topology
    from dpstream.workers.localstack import Stack

    home = Path(options.home) if options.home else None
    log_dir = (home or _default_home()) / "demo"
    log_dir.mkdir(parents=True, exist_ok=True)
    services, config = _stack_config(options, home, log_dir, say)
    path = options.topology_path or demo_topology_path()
    # a topology the user can fix is refused before anything starts (loaded again below, with the
    # addresses of the services the stack actually runs)
    load_topology(
        path,
        env={
            **os.environ,
            "DPSTREAM_KAFKA": f"127.0.0.1:{options.kafka_port}",
            "DPSTREAM_REDIS": f"redis://127.0.0.1:{options.redis_port}/0",
        },
    )
    stack = Stack(config, progress=say)
    already_up = {s.service for s in stack.status(services) if s.up}
    children = _Children(log_dir)
    try:
        return _run_on_stack(options, path, stack, services, already_up, children, log_dir, say)
    finally:
        children.stop_all()
        stopped = [s for s in services if s not in already_up]
        if stopped:
            for status in stack.down(stopped):
                say(status.line())


def _stack_config(
    options: DemoOptions, home: Path | None, log_dir: Path, say: Say
) -> tuple[list[Service], StackConfig]:
    """The services the demo runs and the local stack's config for them (monitoring rendered in `log_dir`)."""
    from dpstream.workers.localstack import Ports, Service, StackConfig

    services = [Service.REDIS, Service.KAFKA]
    prometheus_yml = alertmanager_yml = None
    if options.monitoring:
        prometheus_yml, alertmanager_yml = _render_monitoring(options, log_dir, say)
        services += [Service.ALERTMANAGER, Service.PROMETHEUS]
    config = StackConfig(
        ports=Ports(
            kafka=options.kafka_port,
            kafka_controller=options.kafka_controller_port,
            redis=options.redis_port,
            prometheus=options.prometheus_port,
            alertmanager=options.alertmanager_port,
            worker_metrics=options.worker_web_port,
        ),
        prometheus_config=prometheus_yml,
        alertmanager_config=alertmanager_yml,
        kafka_libs=options.kafka_libs,
        **({"home": home} if home else {}),
    )
    return services, config


def _run_on_stack(
    options: DemoOptions,
    path: Path,
    stack: Stack,
    services: list[Service],
    already_up: set[Service],
    children: _Children,
    log_dir: Path,
    say: Say,
) -> int:
    """Bring the stack up, print the topology's costs, run a worker (and the exporter) on the run's
    topology for the demo's duration, then print the summary and write the report cards."""
    from dpstream.topology.dumper import dump_topology
    from dpstream.topology.loader import load_topology
    from dpstream.topology.plan import build_plan
    from dpstream.workers.localstack import Service
    from dpstream.workers.runtime.topics import ensure_topics

    for status in stack.up(services):
        say(status.line())
    if options.monitoring and Service.PROMETHEUS in already_up:
        say(
            "note: Prometheus was already running with its own config: it may not scrape this demo's worker "
            "and exporter (`deploy/local/stack down` first to let the demo start its own)"
        )
    bootstrap, redis_url = stack.kafka.bootstrap, stack.redis.url
    topology = load_topology(path, env={**os.environ, "DPSTREAM_KAFKA": bootstrap, "DPSTREAM_REDIS": redis_url})
    plan = build_plan(topology)
    population = DemoPopulation(users=options.users, rate=options.rate)
    typical = typical_values(topology, population)
    say("")
    for line in _cost_lines(topology, plan, typical, population, path):
        say(line)
    say("")
    prometheus_url = f"http://127.0.0.1:{options.prometheus_port}" if options.monitoring else None
    if prometheus_url is not None:
        for line in _monitoring_lines(topology, options, prometheus_url):
            say(line)
    start = schedule_start(time.time(), topology)
    run = for_run(topology, f"demo{start}", start)
    run_path = log_dir / "topology.yaml"
    run_path.write_text(dump_topology(run))
    ensure_topics(bootstrap, run)
    children.start("worker", worker_command(options, run_path, bootstrap, redis_url))
    if options.monitoring:
        children.start(
            "exporter",
            ["exporter", "--topology", str(run_path), "--redis", redis_url, "--port", str(options.exporter_port)],
        )
    say(f"worker{' and exporter' if options.monitoring else ''} started (logs and the run's topology in {log_dir})")
    setup = LiveSetup(
        topology=run,
        plan=plan,
        typical=typical,
        population=population,
        schedule_start=start,
        bootstrap=bootstrap,
        redis_url=redis_url,
        duration_s=options.duration_s,
        budget_every_s=options.budget_every_s,
        prometheus_url=prometheus_url,
        webhook_port=options.webhook_port if options.monitoring else None,
        died=children.died,
    )
    result = LiveResult()
    try:
        asyncio.run(run_live(setup, say, result))
    except KeyboardInterrupt:
        say("interrupted")
    say("")
    for line in _summary(result, prometheus_url):
        say(line)
    _write_reports(run, redis_url, log_dir, say)
    if not result.tally.total:
        say(f"no release arrived; the worker's log is {log_dir / 'worker.log'}")
        return 1
    return 0


def _monitoring_lines(topology: Topology, options: DemoOptions, prometheus_url: str) -> list[str]:
    """Where to look while the demo runs: the budget graph, the feed's query, alerts and /metrics."""
    from dpstream.workers.demo.monitoring import budget_graph_url, feed_query

    lines = [f"Prometheus, the budget ratio: {budget_graph_url(prometheus_url)}"]
    feed = feed_query(topology)
    if feed is not None:
        lines.append(f"  the feed (Grafana-ready PromQL): {feed}   graph: {budget_graph_url(prometheus_url, feed)}")
    lines.append(
        f"  alerts: {prometheus_url}/alerts   "
        f"Alertmanager: http://127.0.0.1:{options.alertmanager_port}/#/alerts "
        f"(critical → pager, warning → ticket; both print here)   "
        f"worker /metrics: http://127.0.0.1:{options.worker_web_port}/metrics"
    )
    lines.append(
        "  (a shared dashboard: data-independent metrics only, no --curator-metrics, so DPReleaseLag, "
        "DPReleasesRefused and DPReleasesParked stay silent here)"
    )
    return lines


def _write_reports(topology: Topology, redis_url: str, log_dir: Path, say: Say) -> None:
    """Write the report card of the run's period (JSON and page) per scope and print where."""
    from dpstream.topology.errors import ConfigError

    async def build() -> list[dict[str, Any]]:
        from dpstream.workers.ledger import open_ledger
        from dpstream.workers.report.build import build_report
        from dpstream.workers.report.collect import collect_period

        ledger = await open_ledger(redis_url, None)
        try:
            return [build_report(await collect_period(ledger, topology, s)) for s in sorted(topology.budgets)]
        finally:
            await ledger.close()

    try:
        import dp_accounting  # noqa: F401 - the report's extra: checked before the ledger is read

        from dpstream.workers.report.page import write_page

        for rep in asyncio.run(build()):
            stem = log_dir / f"report-{rep['scope']}-{rep['period']['id'].replace(':', '')}"
            stem.with_suffix(".json").write_text(json.dumps(rep, indent=1, ensure_ascii=False))
            page = write_page(rep, stem.with_suffix(".html"))
            say(f"report card of the period ({rep['scope']} {rep['period']['id']}): {page} (JSON beside it)")
    except ImportError as exc:
        say(f"report card skipped: {exc.name} is missing (pip install -e '.[report]')")
    except ConfigError as exc:
        say(f"report card skipped: {exc}")


def _default_home() -> Path:
    from dpstream.workers.localstack import default_home

    return default_home()


def _summary(result: LiveResult, prometheus_url: str | None) -> list[str]:
    """The closing budget summary: the ledger's figures, what this run showed, what Prometheus saw."""
    tally = result.tally
    lines = ["budget summary:"]
    for status in result.statuses:
        currency = "ρ" if status["accounting"] == "zcdp" else "ε"
        lines.append(
            f"  scope {status['scope']}, period {status['period']['id']} (from the ledger): spent {currency} "
            f"{status['spent']:.4g} of the cap {status['cap']:.4g} = {100 * status['ratio']:.2f} %, "
            f"ε-equivalent {status['epsilon_equiv']:.3f}; releases charged {status['releases']['charged']}, "
            f"refused {status['releases']['refused']}; state {status['state']}"
        )
    shown = ", ".join(f"{m} {n}" for m, n in sorted(tally.per_metric.items())) or "none"
    lines.append(f"  this run: {tally.total} releases shown ({shown}); {result.sent:,} events sent")
    if tally.compared:
        rel = ", ".join(f"{m} {100 * sorted(v)[len(v) // 2]:.1f} %" for m, v in sorted(tally.relative_ci.items()))
        lines.append(
            f"  truth inside the 95 % CI: {tally.covered} of {tally.compared} values "
            f"({100 * tally.covered / tally.compared:.0f} %; about 95 % expected); median CI / truth: {rel}"
        )
    if result.capped:
        cut = ", ".join(f"{m} {100 * f:.1f} %" for m, f in sorted(result.capped.items()) if f > 0)
        if cut:
            lines.append(f"  contribution bounding cut (events over a user's bound, per metric): {cut}")
    if prometheus_url is not None:
        view = result.prometheus
        if view is not None:
            lines.append(view.line().replace("  Prometheus:", "  Prometheus, last scrape:"))
        lines.append(
            f"  Prometheus (stopped with the demo; `deploy/local/stack up --with-monitoring` keeps one): "
            f"{prometheus_url}"
        )
    return lines
