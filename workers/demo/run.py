"""Run the demo: local stack up, plan printed, a worker and a synthetic feed, a live table, clean shutdown.

Only what the demo started is stopped at the end: a stack that was already up (e.g. by
`deploy/local/stack up`) is left running. The worker and the producer are child processes
(`dpstream worker`, `dpstream produce`), exactly what an operator would run by hand.
"""

from __future__ import annotations

__all__ = ["DemoOptions", "run_demo", "example_topology_path"]

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from dpstream.topology.errors import DpstreamError
from dpstream.topology.model import Topology

from dpstream.workers.demo.feed import ReleaseTally, format_budget, format_release

Say = Callable[[str], None]


def example_topology_path() -> Path:
    """The shipped `web-analytics.yaml` (package data of `topology`)."""
    from dpstream import topology

    return Path(topology.__file__).resolve().parent / "examples" / "web-analytics.yaml"


@dataclass(frozen=True)
class DemoOptions:
    """What the demo runs and for how long."""

    duration_s: float | None = None
    """Seconds of live feed after setup; None runs until Ctrl-C."""
    home: Path | None = None
    kafka_port: int = 9092
    kafka_controller_port: int = 19093
    redis_port: int = 6379
    rate: float = 2000.0
    users: int = 5000
    speedup: float = 60.0
    """Event-time seconds per wall second: 60 closes a 1-minute window every second."""
    budget_every_s: float = 10.0
    topology_path: Path | None = None
    kafka_libs: Path | None = None
    """Kafka's jars when the home is not the default (tests share the machine's cache)."""


class _Children:
    """Child processes of the demo, stopped in reverse order with SIGTERM, then SIGKILL."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self._procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen([sys.executable, "-m", "dpstream.workers.cli", *args], stdout=log, stderr=log)
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
        """Name of a child that exited with an error, if any (the producer finishing is fine)."""
        for name, proc in self._procs:
            code = proc.poll()
            if code not in (None, 0):
                return f"{name} exited with {code}; see {self.log_dir / (name + '.log')}"
        return None


def accelerated(topology: Topology, speedup: float, feed_s: int, run_id: str) -> Topology:
    """The topology a demo run uses: topics suffixed with `run_id`, and every source's `max_future`
    stretched to cover a feed whose event time runs `speedup`× the wall clock for `feed_s` seconds.

    Fresh topics, because an earlier run's events ran up to an hour ahead of the clock: a worker
    resuming them would take this run's events as late. A longer `max_future`, because otherwise
    the worker would dead-letter the feed's later events as future_timestamp. The plan is unchanged.
    """
    ahead = int(speedup * feed_s) + 3600
    sources = {name: replace(s, topic=f"{s.topic}.{run_id}", max_future_s=max(s.max_future_s, ahead))
               for name, s in topology.sources.items()}
    sinks = replace(topology.sinks, releases=f"{topology.sinks.releases}.{run_id}",
                    dead_letter=f"{topology.sinks.dead_letter}.{run_id}",
                    partials=f"{topology.sinks.partials}.{run_id}" if topology.sinks.partials else "")
    return replace(topology, sources=sources, sinks=sinks)


async def _live_feed(options: DemoOptions, bootstrap: str, redis_url: str, releases_topic: str,
                     children: _Children, say: Say) -> ReleaseTally:
    """Print every release as it arrives and the budget every few seconds, until the duration ends."""
    import logging

    from aiokafka import AIOKafkaConsumer

    from dpstream.workers.ledger import open_ledger
    from dpstream.workers.ledger.reporting import status_json

    logging.getLogger("aiokafka").setLevel(logging.ERROR)  # leader moves on fresh topics are retried, not news
    tally = ReleaseTally()
    consumer = AIOKafkaConsumer(releases_topic, bootstrap_servers=bootstrap, auto_offset_reset="latest",
                                enable_auto_commit=False)
    await consumer.start()
    ledger = await open_ledger(redis_url, None)
    try:
        await consumer.seek_to_end()
        say(f"{'metric':<18} {'window':<11}  {'budget':<7}  noisy values ± 95 % CI (true values are never shown)")
        started = time.monotonic()
        next_budget = started + options.budget_every_s
        while options.duration_s is None or time.monotonic() - started < options.duration_s:
            problem = children.died()
            if problem:
                raise DpstreamError(problem)
            batches = await consumer.getmany(timeout_ms=500)
            for records in batches.values():
                for record in records:
                    line = format_release(record.value)
                    if line:
                        tally.add(record.value)
                        say(line)
            if time.monotonic() >= next_budget:
                next_budget += options.budget_every_s
                for scope in await ledger.scopes():
                    say(format_budget(status_json(await ledger.status(scope))))
    finally:
        await consumer.stop()
        await ledger.close()
    return tally


def run_demo(options: DemoOptions, say: Say = print) -> int:
    """The whole demo; returns 0 when releases were shown, 1 otherwise."""
    from dpstream.topology.loader import load_topology
    from dpstream.topology.plan import build_plan
    from dpstream.topology.dumper import dump_topology
    from dpstream.topology.plan_render import render_plan
    from dpstream.workers.localstack import Ports, Service, Stack, StackConfig
    from dpstream.workers.runtime.topics import ensure_topics

    config = StackConfig(
        ports=Ports(kafka=options.kafka_port, kafka_controller=options.kafka_controller_port,
                    redis=options.redis_port),
        kafka_libs=options.kafka_libs,
        **({"home": options.home} if options.home else {}),
    )
    stack = Stack(config, progress=say)
    core = (Service.REDIS, Service.KAFKA)
    already_up = {s.service for s in stack.status(core) if s.up}
    log_dir = Path(config.home) / "demo"
    log_dir.mkdir(parents=True, exist_ok=True)
    children = _Children(log_dir)
    tally = ReleaseTally()
    try:
        for status in stack.up(core):
            say(status.line())
        bootstrap, redis_url = stack.kafka.bootstrap, stack.redis.url
        feed_s = int(options.duration_s) + 5 if options.duration_s is not None else 24 * 3600
        topology = load_topology(options.topology_path or example_topology_path(),
                                 env={**os.environ, "DPSTREAM_KAFKA": bootstrap, "DPSTREAM_REDIS": redis_url})
        topology = accelerated(topology, options.speedup, feed_s, run_id=f"demo{int(time.time())}")
        path = log_dir / "topology.yaml"
        path.write_text(dump_topology(topology))
        say("")
        say(render_plan(build_plan(topology)))
        ensure_topics(bootstrap, topology)
        children.start("worker", ["worker", str(path), "--bootstrap", bootstrap, "--redis", redis_url,
                                  "--worker-id", "demo-worker", "--loglevel", "WARNING"])
        children.start("producer", ["produce", str(path), "--bootstrap", bootstrap, "--rate", str(options.rate),
                                    "--users", str(options.users), "--duration", f"{feed_s}s",
                                    "--speedup", str(options.speedup), "--malformed", "0.001"])
        say(f"worker and producer started (logs in {log_dir}); event time runs {options.speedup:g}× wall clock")
        try:
            tally = asyncio.run(_live_feed(options, bootstrap, redis_url, topology.sinks.releases, children, say))
        except KeyboardInterrupt:
            say("interrupted")
    finally:
        children.stop_all()
        stopped = [s for s in core if s not in already_up]
        if stopped:
            for status in stack.down(stopped):
                say(status.line())
    shown = ", ".join(f"{m} {n}" for m, n in sorted(tally.per_metric.items())) or "none"
    say(f"demo done: {tally.total} releases shown ({shown})")
    if tally.total == 0:
        say(f"no release arrived; the worker's log is {log_dir / 'worker.log'}")
        return 1
    return 0
