"""`/metrics` and `/health` of one process: a per-process CollectorRegistry and the pages serving it.

A worker adds both as Faust pages on its web port (`install_worker_pages`); `dpstream exporter`
serves the same handlers from a bare aiohttp app (workers.telemetry.exporter). A scrape awaits the
budget ledger first (bounded by a timeout, on the process's event loop), then renders everything
with `prometheus_client.generate_latest` — no Redis round trip happens inside the render.
`/health` says only that the process serves and which role it runs: no figure, no data. Which
families a scrape serves follows workers.telemetry.classes: curator-only ones only where asked.
"""

from __future__ import annotations

__all__ = ["Telemetry", "install_worker_pages", "worker_telemetry"]

import logging
from collections.abc import Sequence
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from dpstream.topology.model import Topology
from dpstream.workers.telemetry.budget import BudgetCollector, BudgetReader, LedgerSource
from dpstream.workers.telemetry.classes import ClassFilter

_log = logging.getLogger(__name__)

CONTENT_TYPE = CONTENT_TYPE_LATEST
"""The text exposition format's content type (`text/plain; version=…; charset=utf-8`)."""


class Telemetry:
    """One process's registry: the budget collector (refreshed per scrape) and in-process collectors.

    Every collector is served through `ClassFilter`: data-independent families always, curator-only
    ones only when `curator` is set (workers.telemetry.classes holds which is which)."""

    def __init__(
        self,
        role: str,
        budget: BudgetCollector | None,
        collectors: Sequence[Collector] = (),
        *,
        curator: bool = False,
    ) -> None:
        self.role = role
        self.budget = budget
        self.curator = curator
        self.registry = CollectorRegistry(auto_describe=False)
        for collector in ([budget] if budget is not None else []) + list(collectors):
            self.registry.register(ClassFilter(collector, curator=curator))

    async def render(self) -> bytes:
        """The exposition of one scrape: read the ledger (awaited), then render every collector."""
        if self.budget is None:
            return generate_latest(self.registry)
        async with self.budget.lock:
            await self.budget.refresh()
            return generate_latest(self.registry)

    def health(self) -> dict[str, str]:
        """The `/health` document: the process answers, and its role."""
        return {"status": "ok", "role": self.role}

    async def close(self) -> None:
        """Close the budget ledger connection this process opened for scrapes."""
        if self.budget is not None:
            await self.budget.source.close()


def worker_telemetry(
    topology: Topology,
    redis_url: str,
    role: str,
    *,
    ingest: Any = None,
    releases: Any = None,
    curator: bool = False,
) -> Telemetry:
    """A worker's telemetry: budget gauges (its own read-only ledger connection) and the topology's
    info gauges for every role, release metrics where the release side runs, event metrics where the
    ingest runs. Curator-only families (most of the last two) only with `curator` (`--curator-metrics`)."""
    from dpstream.workers.telemetry.info import TopologyInfo
    from dpstream.workers.telemetry.worker import WorkerCollector

    shared = (lambda: getattr(releases, "_ledger", None)) if releases is not None else None
    budget = BudgetCollector(LedgerSource(redis_url, shared=shared), BudgetReader(topology))
    collectors = [TopologyInfo(topology), WorkerCollector(topology, ingest=ingest, releases=releases)]
    return Telemetry(role, budget, collectors, curator=curator)


def install_worker_pages(app: Any, telemetry: Telemetry) -> None:
    """Add `/metrics` and `/health` to a Faust app (its built-in views stay off), and close the
    telemetry's ledger connection when the app stops."""
    from mode import Service

    @app.page("/metrics", name="dpstream-metrics")
    async def metrics(view: Any, request: Any) -> Any:
        body = await telemetry.render()
        return view.bytes(body, headers={"Content-Type": CONTENT_TYPE})

    @app.page("/health", name="dpstream-health")
    async def health(view: Any, request: Any) -> Any:
        return view.json(telemetry.health())

    class TelemetryLifecycle(Service):
        async def on_stop(self) -> None:
            await telemetry.close()

    app.service(TelemetryLifecycle(loop=None))
