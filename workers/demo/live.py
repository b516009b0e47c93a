"""The demo's live part, in one event loop: the synthetic feed, the release table, budget and alert lines.

The feed runs in this process (so the demo knows its truth): each tick's events are stamped with the wall
clock, sent to the source topic keyed by user, and then added to the `TruthBook`. Releases are read from the
run's releases topic as the worker publishes them; every `budget_every_s` the ledger's status and what
Prometheus sees (ratio, targets, active alerts) are printed; Alertmanager's notifications print as they come.
"""

from __future__ import annotations

__all__ = ["LiveSetup", "LiveResult", "run_live"]

import asyncio
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dpstream.topology.errors import DpstreamError
from dpstream.topology.model import Topology
from dpstream.topology.periods import period_start
from dpstream.topology.plan import Plan
from dpstream.topology.schedule import Schedule
from dpstream.workers.demo.expected import Expectation, expect, explain_release
from dpstream.workers.demo.feed import ReleaseTally, format_budget, format_release, header_lines
from dpstream.workers.demo.monitoring import PromView, WebhookReceiver, prometheus_view
from dpstream.workers.demo.sizing import DemoPopulation, Typical
from dpstream.workers.demo.truth import TruthBook

Say = Callable[[str], None]


@dataclass(frozen=True)
class LiveSetup:
    """Everything the live part needs from the set-up."""

    topology: Topology
    """The run's topology (its own topics, `start:` = the schedule start)."""
    plan: Plan
    typical: dict[str, Typical]
    population: DemoPopulation
    schedule_start: int
    bootstrap: str
    redis_url: str
    duration_s: float | None
    budget_every_s: float
    prometheus_url: str | None
    webhook_port: int | None
    died: Callable[[], str | None]
    """Name and log of a child process that exited with an error, if any."""


@dataclass
class LiveResult:
    """What the live part showed, for the closing summary."""

    tally: ReleaseTally = field(default_factory=ReleaseTally)
    statuses: list[dict[str, Any]] = field(default_factory=list)
    prometheus: PromView | None = None
    sent: int = 0
    capped: dict[str, float] = field(default_factory=dict)
    """Per metric: fraction of the well-formed events sent that contribution bounding cut."""
    notifications: int = 0


_DRAIN_S = 8.0
"""At the end, how long to wait for the releases of windows that closed during the demo."""


def _closed_windows(topology: Topology, start: int, now: float) -> set[tuple[str, int]]:
    """(metric, window start) of every scheduled window whose close time passed by `now`."""
    out = set()
    for name, m in topology.metrics.items():
        lateness = topology.sources[m.source].allowed_lateness_s
        s = Schedule.of(m, start).first_window()
        while s + m.window.size_s + lateness <= now:
            out.add((name, s))
            s += m.window.every_s
    return out


def _first_window(start: int, size: int, every: int) -> tuple[int, int]:
    first = Schedule(size, every, start).first_window()
    return first, first + size


async def _expectations(ledger: Any, setup: LiveSetup) -> dict[str, Expectation]:
    """The grant each metric's releases should get from the schedule's start on, given the ledger's spend."""
    from dpstream.workers.ledger.types import State

    statuses = {scope: await ledger.status(scope) for scope in setup.topology.budgets}
    out = {}
    for name, metric in setup.topology.metrics.items():
        status = statuses[metric.budget]
        out[name] = expect(
            setup.topology,
            setup.plan,
            metric,
            setup.typical.get(name),
            setup.schedule_start,
            status.spent,
            warning=status.state is State.WARNING,
        )
    return out


def _expectation_lines(expected: dict[str, Expectation], setup: LiveSetup) -> list[str]:
    lines = [
        "noise at this point of the period (adaptive allocation: what is left of the pool over the windows "
        "left), vs the plan's whole-period figure:"
    ]
    reasons = set()
    for name, e in expected.items():
        metric = setup.topology.metrics[name]
        unit = " s" if metric.aggregate.value == "mean" else ""
        sigma = 1.0 / math.sqrt(e.ratio) if e.ratio > 0 else math.nan
        ci = (
            f"95 % CI ±{_short(e.expected_ci)}{unit} (plan ±{_short(e.planned_ci)}{unit})"
            if e.expected_ci is not None
            else ""
        )
        if e.steps is not None:  # a running total: one lump for the period, a CI that grows with the step
            ci = (
                f"95 % CI ±{_short(e.first_step_ci)} at step 1, ±{_short(e.expected_ci)} at step {e.steps} "
                f"(plan ±{_short(e.planned_ci)} at the period's last)"
                if e.expected_ci is not None
                else ""
            )
            lines.append(
                f"  {name:<16} ρ {e.expected_cost:.3g} for the period, charged with its first step "
                f"(plan {e.planned_cost:.3g}, ×{e.ratio:.2f}), σ ×{sigma:.2f} of the plan's, {ci}"
            )
        else:
            lines.append(
                f"  {name:<16} ρ {e.expected_cost:.3g} per release (plan {e.planned_cost:.3g}, ×{e.ratio:.2f}),"
                f" σ ×{sigma:.2f} of the plan's, {ci}"
            )
        if e.reason():
            reasons.add(e.reason())
    lines += [f"  why: {r}" for r in sorted(reasons)] or ["  as planned: the period's spend is on plan"]
    return lines


def _short(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x:,.0f}" if x >= 10 else f"{x:.1f}"


async def run_live(setup: LiveSetup, say: Say, result: LiveResult) -> LiveResult:
    """Feed, show and summarise into `result` until the duration ends (or Ctrl-C: `result` then holds what
    was shown so far); the caller stops the processes."""
    import aiohttp
    from aiokafka import AIOKafkaConsumer

    from dpstream.workers.ledger import open_ledger
    from dpstream.workers.ledger.reporting import status_json
    from dpstream.workers.synthetic.generator import EventGenerator
    from dpstream.workers.synthetic.producer import produce_async

    topology = setup.topology
    ledger = await open_ledger(setup.redis_url, topology, actor="demo")
    consumer = AIOKafkaConsumer(
        topology.sinks.releases,
        bootstrap_servers=setup.bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3))
    webhook: WebhookReceiver | None = None
    stop = asyncio.Event()
    feed: asyncio.Task[Any] | None = None
    try:
        windows = {
            name: _first_window(setup.schedule_start, m.window.size_s, m.window.every_s)
            for name, m in topology.metrics.items()
        }
        expected = await _expectations(ledger, setup)
        for line in _expectation_lines(expected, setup):
            say(line)
        by_period: dict[tuple[str, str], Expectation] = {(e.period_id, name): e for name, e in expected.items()}
        if setup.webhook_port is not None:
            webhook = _alert_receiver(setup.webhook_port, result, say)
            await webhook.start()
        await consumer.start()

        truth = TruthBook(topology, setup.schedule_start)

        def on_sent(events: list[Any], acked_at: float) -> None:
            truth.observe(events, acked_at)
            truth.close_through(acked_at)

        population = setup.population
        generator = EventGenerator(topology, None, population.generator_config())
        feed_s = setup.duration_s + 5 if setup.duration_s is not None else 7 * 86_400
        feed = asyncio.create_task(produce_async(setup.bootstrap, generator, population.rate, feed_s, stop, on_sent))
        _say_feed_start(setup, windows, say)
        started = time.monotonic()
        next_budget = started + setup.budget_every_s
        shown: set[tuple[str, int]] = set()

        async def consume_once() -> None:
            _raise_if_stopped(setup, feed)
            batches = await consumer.getmany(timeout_ms=500)
            for records in batches.values():
                for message in records:
                    record = json.loads(message.value)
                    if record.get("charge_only"):
                        continue
                    shown.add((record["metric"], record["window"]["start_epoch"]))
                    await _show(record, truth, setup, by_period, result, say)

        while setup.duration_s is None or time.monotonic() - started < setup.duration_s:
            await consume_once()
            if time.monotonic() >= next_budget:
                next_budget += setup.budget_every_s
                await _budget_lines(ledger, session, setup, result, status_json, say)
        # every window that closed while the demo ran is shown before it ends (a release takes a second or two)
        due = _closed_windows(topology, setup.schedule_start, time.time())
        drain_until = time.monotonic() + _DRAIN_S
        while not due <= shown and time.monotonic() < drain_until:
            await consume_once()
        stop.set()
        stats = await feed
        result.sent = stats.events
        await _budget_lines(ledger, session, setup, result, status_json, lambda _line: None)
        result.capped = {name: truth.capped(name) / truth.events for name in topology.metrics if truth.events}
    finally:
        stop.set()
        if feed is not None and not feed.done():
            feed.cancel()
            await asyncio.gather(feed, return_exceptions=True)
        await consumer.stop()
        await session.close()
        if webhook is not None:
            await webhook.stop()
        await ledger.close()
    return result


def _alert_receiver(port: int, result: LiveResult, say: Say) -> WebhookReceiver:
    """Alertmanager's webhook on `port` (not started): each notification printed and counted into `result`."""

    def on_alert(receiver: str, status: str, name: str, scope: str) -> None:
        result.notifications += 1
        say(f"  Alertmanager → {receiver}: {name} {status}{f' (scope {scope})' if scope else ''}")

    return WebhookReceiver(port, on_alert)


def _say_feed_start(setup: LiveSetup, windows: dict[str, tuple[int, int]], say: Say) -> None:
    """The feed's rate and population, when the schedule starts and the first windows close; the table header."""
    topology, population = setup.topology, setup.population
    first_close = min(w[1] for w in windows.values()) + min(s.allowed_lateness_s for s in topology.sources.values())
    say(
        f"feeding {population.rate:,.0f} events/s from {population.users:,} synthetic users (event time = wall "
        f"clock); the public schedule starts {time.strftime('%H:%M:%S', time.gmtime(setup.schedule_start))} UTC, "
        f"the first windows close at {time.strftime('%H:%M:%S', time.gmtime(first_close))}"
    )
    say("")
    for line in header_lines():
        say(line)


def _raise_if_stopped(setup: LiveSetup, feed: asyncio.Task[Any]) -> None:
    """A child process that exited with an error, or a feed that stopped early, ends the demo with that error."""
    problem = setup.died()
    if problem:
        raise DpstreamError(problem)
    if feed.done():
        feed.result()  # raises what stopped the feed
        raise DpstreamError("the synthetic feed stopped early")


async def _show(
    record: dict[str, Any],
    truth: TruthBook,
    setup: LiveSetup,
    by_period: dict[tuple[str, str], Expectation],
    result: LiveResult,
    say: Say,
) -> None:
    """Print one release (with its truth, and a note if its noise is not what was predicted)."""
    name, window = record["metric"], record["window"]
    period = (record.get("budget") or {}).get("period", "")
    expected = by_period.get((period, name))
    if expected is None and name in setup.topology.metrics:  # a period that began after the schedule: fresh pool
        metric = setup.topology.metrics[name]
        budget = setup.topology.budgets[metric.budget]
        pstart = period_start(budget.period_s, window["start_epoch"])
        expected = expect(setup.topology, setup.plan, metric, setup.typical.get(name), pstart, 0.0)
        if expected.period_id == period:
            if not any(p == period for p, _ in by_period):
                say(
                    f"  new budget period {period} of scope {metric.budget}: a fresh pool over a whole period of "
                    f"windows, so releases cost what the plan says again (ρ ×{expected.ratio:.2f})"
                )
            by_period[(period, name)] = expected
        else:
            expected = None
    cost = record.get("cost") or {}
    note = explain_release(float(cost.get("rho", cost.get("epsilon", 0.0)) or 0.0), expected)
    values = truth.released(record)
    result.tally.add(record, values)
    for line in format_release(record, values, note):
        say(line)


async def _budget_lines(
    ledger: Any, session: Any, setup: LiveSetup, result: LiveResult, status_json: Any, say: Say
) -> None:
    result.statuses = [status_json(await ledger.status(scope)) for scope in sorted(setup.topology.budgets)]
    for status in result.statuses:
        say(format_budget(status))
    if setup.prometheus_url is not None:
        result.prometheus = await prometheus_view(session, setup.prometheus_url)
        say(result.prometheus.line())
