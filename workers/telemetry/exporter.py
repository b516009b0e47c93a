"""`dpstream exporter`: budget gauges straight from the ledger, for when no worker is up (or many are).

A small aiohttp server (`/metrics`, `/health`). Each scrape reads the ledger (read-only: the ledger is
opened without registering any scope) for the topology's scopes and renders the budget families of
workers.telemetry.budget plus `dpstream_ledger_up`, `dpstream_build_info` and
`dpstream_metric_privacy_info`. With Redis down the exporter still answers, with `dpstream_ledger_up 0`
and no budget gauge; it reconnects at the next scrape. A budget therefore shows once per ledger,
however many workers run. It serves data-independent families only (workers.telemetry.classes): the
parked-window count the budget collector also reads is curator-only, and left to workers asked for it.
"""

from __future__ import annotations

__all__ = ["exporter_telemetry", "make_app", "serve"]

import asyncio
import contextlib
import logging
import signal

from dpstream.topology.model import Topology
from dpstream.workers.telemetry.budget import BudgetCollector, BudgetReader, LedgerSource
from dpstream.workers.telemetry.info import TopologyInfo
from dpstream.workers.telemetry.web import CONTENT_TYPE, Telemetry

_log = logging.getLogger(__name__)


def exporter_telemetry(topology: Topology, redis_url: str, *, allow_volatile: bool = False) -> Telemetry:
    """The exporter's registry: the data-independent budget gauges of the topology's scopes, ledger_up
    and the topology's info gauges. Never a curator-only family: the exporter has no flag for them."""
    budget = BudgetCollector(LedgerSource(redis_url, allow_volatile=allow_volatile), BudgetReader(topology))
    return Telemetry("exporter", budget, [TopologyInfo(topology)], curator=False)


def make_app(telemetry: Telemetry):  # aiohttp.web.Application, imported lazily
    """The aiohttp application: GET /metrics and GET /health, nothing else."""
    from aiohttp import web

    async def metrics(_request: web.Request) -> web.Response:
        body = await telemetry.render()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    async def health(_request: web.Request) -> web.Response:
        return web.json_response(telemetry.health())

    async def close(_app: web.Application) -> None:
        await telemetry.close()

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/health", health)
    app.on_cleanup.append(close)
    return app


async def serve(telemetry: Telemetry, bind: str, port: int, ready: asyncio.Event | None = None) -> None:
    """Serve until SIGTERM or SIGINT (or cancellation)."""
    from aiohttp import web

    runner = web.AppRunner(make_app(telemetry), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, bind, port)
    await site.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread (tests)
            loop.add_signal_handler(sig, stop.set)
    if ready is not None:
        ready.set()
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
