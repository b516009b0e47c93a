"""Build the Faust app of one worker: the batch ingest service, the repartition hop, the release side.

Thin wiring: the topology says what to release, the settings where Kafka and Redis are; the core
(workers.pipeline / workers.release, reached through `workers.runtime.core`) does the work. With a
web port the app serves its own two pages, `/metrics` (workers.telemetry: budget gauges read from
the ledger at scrape time, plus this role's release or event counters) and `/health`.
"""

from __future__ import annotations

__all__ = ["READY_LINE", "Role", "Runtime", "build_runtime", "new_app", "run_worker", "web_settings"]

import asyncio
import logging
import os
import signal
import time
from dataclasses import dataclass
from enum import Enum
from typing import Any

import faust
from faust.transport.drivers.aiokafka import Producer as _FaustProducer
from mode import Service

from dpstream.topology.errors import ConfigError
from dpstream.topology.model import Topology
from dpstream.workers.runtime.admin import broker_count, replication_for
from dpstream.workers.runtime.ingest import IngestService
from dpstream.workers.runtime.recovery_watch import watch_recovery
from dpstream.workers.runtime.releases import ReleaseSide
from dpstream.workers.runtime.repartition import RepartitionService
from dpstream.workers.runtime.rewinding_consumer import RewindingConsumer
from dpstream.workers.runtime.settings import RuntimeSettings
from dpstream.workers.runtime.topics import ensure_topics, ingest_topic, partition_count

_log = logging.getLogger(__name__)


class Role(Enum):
    """Which half of the pipeline one worker process runs."""

    ALL = "all"
    """Ingest and releases in one process (the default; one process per core)."""
    INGEST = "ingest"
    """Only the batch hot path (and the repartition hop): events in, partials out."""
    RELEASE = "release"
    """Only the release agent and sweeper: partials in, charged releases out. Running it in its own
    process keeps its ledger and producer round trips off the GIL the ingest batches hold."""


@dataclass
class Runtime:
    """The app and the parts a caller (CLI, bench, tests) may want to look at."""

    app: faust.App
    ingest: IngestService | None
    releases: ReleaseSide | None
    repartition: RepartitionService | None
    telemetry: Any = None
    """The `/metrics` registry (workers.telemetry.web.Telemetry) when the app has a web port."""


class _Lifecycle(Service):
    """Starts the release side's producer and ledger with the app, and closes them on shutdown."""

    def __init__(self, releases: ReleaseSide, **kwargs: Any) -> None:
        self._releases = releases
        super().__init__(**kwargs)

    async def on_start(self) -> None:
        await self._releases.start()

    async def on_stop(self) -> None:
        await self._releases.stop()


def _expected_partials(topology: Topology, settings: RuntimeSettings) -> dict[str, int]:
    """metric → partitions of its source's ingest topic (each reports one partial per window)."""
    counts: dict[str, int] = {}

    async def _count() -> None:
        for name, metric in topology.metrics.items():
            topic = ingest_topic(topology.sources[metric.source])
            counts[name] = await partition_count(settings.bootstrap, topic, settings.kafka_security)

    asyncio.run(_count())
    return counts


_BUILTIN_VIEWS_OFF: dict[str, bool] = {
    # Faust's own views (faust/web/base.py BLUEPRINT_FLAGS). The port is curator-side, but even there
    # no endpoint may carry a true aggregate (the trust boundary of dpstream.topology), so every one that serves
    # data is off; views the app adds itself (`@app.page`) are not gated by these and still serve.
    "web_tables_enabled": False,  # /table/<name>/<key>/: table values, i.e. the un-noised merger state
    "web_router_enabled": False,  # /router/: which worker owns a table key, every worker's URL
    "web_stats_enabled": False,  # / and /assignment/: sensor counters, partition assignment
    "web_graph_enabled": False,  # /graph/: the worker's service tree
    "web_metrics_enabled": False,  # /performance/: monitor throughput, lag and table statistics
}


class IdempotentProducer(_FaustProducer):
    """Faust's producer (table changelog writes) with `enable_idempotence` and `acks=all` always, not only
    inside transactions: a retried changelog write is neither duplicated nor reordered."""

    def _settings_extra(self) -> dict[str, Any]:
        return {"acks": "all", "enable_idempotence": True}


def web_settings(settings: RuntimeSettings) -> dict[str, Any]:
    """Faust web settings of a worker: on only with a port, bound to `settings.web_bind` over TCP,
    no built-in view (with stats off, `/` is Faust's plain `{"status": "OK"}` index)."""
    return {
        "web_enabled": settings.web_port is not None,
        "web_port": settings.web_port or 6066,
        "web_bind": settings.web_bind,
        "web_transport": "tcp://",
        **_BUILTIN_VIEWS_OFF,
    }


def new_app(app_id: str, settings: RuntimeSettings, replicas: int = 1) -> faust.App:
    """The worker's Faust app (no broker contacted), its web settings pinned; topics Faust creates (the
    table changelog) get `replicas` replicas."""
    web = web_settings(settings)
    datadir: dict[str, Any] = {"datadir": settings.datadir} if settings.datadir else {}
    credentials = settings.kafka_security.faust_credentials()
    auth: dict[str, Any] = {"broker_credentials": credentials} if credentials is not None else {}
    app = faust.App(
        app_id,
        broker=f"kafka://{settings.bootstrap}",
        store="memory://",
        topic_partitions=settings.partitions,
        table_standby_replicas=0,
        producer_linger_ms=0,
        producer_acks=-1,
        topic_replication_factor=replicas,
        consumer_auto_offset_reset="earliest",
        # A killed member holds the release agent's partials and changelog partitions until its session
        # expires (Faust's default 60 s delayed releases by a minute per SIGKILL). Environment variables
        # BROKER_SESSION_TIMEOUT / BROKER_HEARTBEAT_INTERVAL still win, as for any Faust setting.
        broker_session_timeout=settings.session_timeout_s,
        broker_heartbeat_interval=settings.heartbeat_interval_s,
        **datadir,
        **auth,
        **web,
    )
    # Faust lets environment variables (WEB_BIND, APP_WEB_TABLES_ENABLED, APP_WEB_ENABLED, ...) win over
    # keyword settings: set ours again so no stray variable widens the bind or reopens a view. Done before
    # anything touches `app.web`, which picks its blueprints when it is created.
    for name, value in web.items():
        setattr(app.conf, name, value)
    # The instance attribute shadows the transport's class-level Producer; only this app's transport changes.
    app.transport.Producer = IdempotentProducer  # type: ignore[misc]  # ClassVar set on one instance on purpose
    app.transport.Consumer = RewindingConsumer  # type: ignore[misc]  # as the Producer: this app's transport only
    return app


def build_runtime(topology: Topology, settings: RuntimeSettings, role: Role = Role.ALL) -> Runtime:
    """Create missing topics, then the Faust app with the services, agents, tables and timers of `role`."""
    ensure_topics(settings.bootstrap, topology, settings.partitions, settings.kafka_security)
    # An ingest-only process runs no agent: its Faust app must not join the release agents' group.
    app_id = settings.group_id(topology) + ("-ingest-only" if role is Role.INGEST else "")
    brokers = broker_count(settings.bootstrap, security=settings.kafka_security)
    if brokers < 1:  # never size the changelog's replication on a failed read (it would be 1)
        raise ConfigError(
            f"Kafka at {settings.bootstrap}: the cluster's brokers could not be listed (to size the changelog's "
            "replication); check that the brokers run and try again"
        )
    replicas, durable = replication_for(brokers)
    app = new_app(app_id, settings, replicas)
    releases = ingest = repartition = None
    if role is not Role.INGEST:
        releases = ReleaseSide(app, topology, settings, _expected_partials(topology, settings))
        # The changelog holds merged true aggregates: replicated like the internal topics (read lazily at start).
        table: Any = releases.table  # a faust.Table; the TableT protocol does not declare this attribute
        table.extra_topic_configs = durable
        app.service(_Lifecycle(releases, loop=None))  # type: ignore[arg-type]  # faust types service() for classes; an instance is started with the app just the same
    if role is not Role.RELEASE:
        ingest = IngestService(topology, settings, offload=role is Role.ALL)
        if releases is not None:  # one process, one clock: publication holds on the ingest's skew reading
            releases.share_clock_skew(ingest.clock_skew)
        app.service(ingest)  # type: ignore[arg-type]  # faust types service() for classes; an instance is started with the app just the same
        hop_sources = [s for s in topology.sources.values() if ingest_topic(s) != s.topic]
        repartition = None
        if hop_sources:
            repartition = RepartitionService(topology, settings, hop_sources, counts=ingest.hop_counts)
        if repartition is not None:
            app.service(repartition)  # type: ignore[arg-type]  # faust types service() for classes; an instance is started with the app just the same
    telemetry = None
    if settings.web_port is not None:
        from dpstream.workers.telemetry.web import install_worker_pages, worker_telemetry

        telemetry = worker_telemetry(
            topology,
            settings.redis_url,
            role.value,
            ingest=ingest,
            releases=releases,
            curator=settings.curator_metrics,
        )
        install_worker_pages(app, telemetry)
    return Runtime(app, ingest, releases, repartition, telemetry)


READY_LINE = "worker ready: group joined, table state recovered, services started"
"""dpstream's INFO line once a worker runs (Faust's own "Ready" is held at WARNING with its logger)."""


class _Worker(faust.Worker):
    """Faust's worker, logging `READY_LINE` once the app is fully started (the benches wait for it)."""

    async def on_startup_finished(self) -> None:
        await super().on_startup_finished()
        _log.info(READY_LINE)


class _RecoveryWatch(Service):
    """Runs `recovery_watch.watch_recovery` on the app from the worker's start (the app's own services
    start only after its first table recovery, which the watch must cover too)."""

    def __init__(self, app: faust.App, **kwargs: Any) -> None:
        self._app = app
        super().__init__(**kwargs)

    async def on_start(self) -> None:
        self.add_future(watch_recovery(self._app, time.monotonic))


def run_worker(runtime: Runtime, loglevel: str = "WARNING") -> int:
    """Run the Faust worker in this process until SIGTERM/SIGINT; returns the exit code. A release side
    that refuses its releases topic once it reaches the ledger stops the worker, and its ConfigError is
    raised here (the CLI's one line, exit 2)."""
    services = [_RecoveryWatch(runtime.app)] if runtime.releases is not None else []
    worker = _Worker(runtime.app, *services, loglevel=loglevel, quiet=True, redirect_stdouts=False)
    releases = runtime.releases
    if releases is not None:
        releases.on_refused = lambda: os.kill(os.getpid(), signal.SIGTERM)  # Faust's own graceful stop
    code = 0
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        code = int(exc.code or 0)
    if releases is not None and releases.refused is not None:
        raise releases.refused
    return code
