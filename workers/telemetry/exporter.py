"""`dpstream exporter`: budget gauges straight from the ledger, for when no worker is up (or many are).

A small aiohttp server (`/metrics`, `/health`). Each scrape reads the ledger (read-only: the ledger is
opened without registering any scope) for the topology's scopes and renders the budget families of
workers.telemetry.budget plus `dpstream_ledger_up`, `dpstream_build_info` and
`dpstream_metric_privacy_info`. With Redis down the exporter still answers, with `dpstream_ledger_up 0`
and no budget gauge; it reconnects at the next scrape. A budget therefore shows once per ledger,
however many workers run. It serves data-independent families only (workers.telemetry.classes): the
parked-window count the budget collector also reads is curator-only, and left to workers asked for it.

The feed (`ExporterFeed`): the exporter also reads the topology's public releases topic (broker and
TLS/SASL as a worker gets them), dedupes it by release_id (`workers.feed.Dedupe`: the first record
wins; a later one that differs is counted) and serves each metric's latest release by window end:

    dpstream_release_value{metric,key}                  the noisy value of each key of that release
    dpstream_release_ci_half_width{metric,key}          its 95 % CI half-width
    dpstream_release_window_end_timestamp_seconds{metric}
    dpstream_release_ratio_after{metric,scope}          the scope's budget.ratio_after the record carries
    dpstream_release_conflicts_total{metric}            later records of a known release_id with other bytes

Only the latest release's keys are served (a key absent from it leaves the gauge); no sample carries
an explicit timestamp (Prometheus's staleness and 5-minute lookback then work for windows of any
length). All of it is a function of the public topic as of P(w) (`workers.feed.latest`), so
data-independent. Kafka unreachable: the budget gauges are served as ever, the feed retries.
"""

from __future__ import annotations

__all__ = ["ExporterFeed", "FeedCollector", "exporter_telemetry", "make_app", "serve"]

import asyncio
import contextlib
import logging
import math
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeGuard

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dpstream.topology.model import Topology
from dpstream.workers.feed import (
    Dedupe,
    FeedUnavailable,
    LatestReleases,
    Verdict,
    feed_starts,
    read_releases,
    seek_time,
)
from dpstream.workers.release.display import half_width
from dpstream.workers.runtime.kafka_security import KafkaSecurity
from dpstream.workers.telemetry.budget import BudgetCollector, BudgetReader, LedgerSource
from dpstream.workers.telemetry.info import TopologyInfo
from dpstream.workers.telemetry.web import CONTENT_TYPE, Telemetry

_log = logging.getLogger(__name__)


_RETRY_S = (1.0, 30.0)
"""The feed's first and longest wait before it reads the topic again after Kafka failed."""


class ExporterFeed:
    """The releases topic, deduped, as each metric's latest release (`run` reads it; `FeedCollector`
    serves it). `clock` is the time P(w) is compared with (injected by tests).

    `dpstream_release_ratio_after` is the ratio a record carries, so it counts only charges whose P(w)
    has passed, as the other public ledger-derived series do: it is exposed only once the record is on
    the topic, where the release agent puts it at or after P(w) (`runtime.releases` holds a record until
    its `published_at`), and `LatestReleases` holds a record read before its `published_at` until then."""

    def __init__(
        self, topology: Topology, security: KafkaSecurity | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.topology = topology
        self.security = security or KafkaSecurity.from_env(kafka=topology.kafka)
        self.clock = clock
        self.dedupe = Dedupe()
        self.latest = LatestReleases(topology)

    def offer(self, payload: bytes) -> Verdict:
        """One record read from the topic: deduped, and kept when it is the release."""
        seen = self.dedupe.offer(payload)
        if seen.verdict is Verdict.FIRST and seen.record is not None:
            self.latest.add(seen.record)
        elif seen.verdict is Verdict.CONFLICT:
            _log.error(
                "releases topic: release %s of %s republished with other bytes (conflict)", seen.release_id, seen.metric
            )
        return seen.verdict

    def since(self) -> int:
        """The topic time to read from: the first window of the previous period of the earliest metric
        (so the latest release is found just after a period starts too)."""
        return seek_time(feed_starts(self.topology, self.topology.metrics, self.clock(), periods_back=1))

    async def run(self) -> None:
        """Read the topic for ever; Kafka failing is logged and retried (records seen again are repeats)."""
        wait = _RETRY_S[0]
        topic = self.topology.sinks.releases
        while True:
            try:
                async for payload in read_releases(self.topology.kafka.bootstrap, topic, self.security, self.since()):
                    self.offer(payload)
                    wait = _RETRY_S[0]
            except FeedUnavailable as exc:
                _log.warning("feed: %s; retrying in %.0f s", exc, wait)
            except Exception as exc:  # a broker failure mid-read: the budget gauges must stay up
                _log.warning(
                    "feed: reading %s failed (%s: %s); retrying in %.0f s", topic, type(exc).__name__, exc, wait
                )
            await asyncio.sleep(wait)
            wait = min(2 * wait, _RETRY_S[1])


def _finite(value: object) -> TypeGuard[float]:
    """A finite JSON number (not a bool): what a feed gauge may show."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class FeedCollector(Collector):
    """The feed families of one `ExporterFeed`, rendered at each scrape from the releases shown by then."""

    def __init__(self, feed: ExporterFeed) -> None:
        self.feed = feed

    def collect(self) -> Iterator[Metric]:
        latest = self.feed.latest.latest(self.feed.clock())
        value = GaugeMetricFamily(
            "dpstream_release_value",
            "Noisy value of each key of the metric's latest release by window end (public releases topic)",
            labels=["metric", "key"],
        )
        half = GaugeMetricFamily(
            "dpstream_release_ci_half_width",
            "95 % CI half-width of each key's noisy value in the metric's latest release",
            labels=["metric", "key"],
        )
        end = GaugeMetricFamily(
            "dpstream_release_window_end_timestamp_seconds",
            "Window end (UTC epoch seconds) of the metric's latest release",
            labels=["metric"],
        )
        ratio = GaugeMetricFamily(
            "dpstream_release_ratio_after",
            "The scope's spend / cap after the latest release's charge (its budget.ratio_after)",
            labels=["metric", "scope"],
        )
        for name in sorted(latest):
            _add_release(name, latest[name], value, half, end, ratio)
        conflicts = CounterMetricFamily(
            "dpstream_release_conflicts",
            "Records of a known release_id whose bytes differ from the first one (never shown)",
            labels=["metric"],
        )
        counts = self.feed.dedupe.conflicts
        for name in sorted(set(self.feed.topology.metrics) | set(counts)):
            conflicts.add_metric([name], counts.get(name, 0))
        yield from (value, half, end, ratio, conflicts)


def _add_release(
    name: str,
    record: dict[str, Any],
    value: GaugeMetricFamily,
    half: GaugeMetricFamily,
    end: GaugeMetricFamily,
    ratio: GaugeMetricFamily,
) -> None:
    """One metric's latest release into the families (a key without a finite value is left out)."""
    for key, noisy in (record.get("values") or {}).items():
        if not _finite(noisy):
            continue
        value.add_metric([name, str(key)], float(noisy))
        width = half_width(record, key)
        if _finite(width):
            half.add_metric([name, str(key)], float(width))
    end.add_metric([name], float(record["window"]["end_epoch"]))
    budget = record.get("budget") or {}
    if _finite(budget.get("ratio_after")) and isinstance(budget.get("scope"), str):
        ratio.add_metric([name, budget["scope"]], float(budget["ratio_after"]))


def exporter_telemetry(
    topology: Topology, redis_url: str, *, allow_volatile: bool = False, feed: ExporterFeed | None = None
) -> Telemetry:
    """The exporter's registry: the data-independent budget gauges of the topology's scopes, ledger_up,
    the topology's info gauges and, with `feed`, the feed series. Never a curator-only family: the
    exporter has no flag for them."""
    budget = BudgetCollector(LedgerSource(redis_url, allow_volatile=allow_volatile), BudgetReader(topology))
    collectors: list[Collector] = [TopologyInfo(topology)]
    if feed is not None:
        collectors.append(FeedCollector(feed))
    return Telemetry("exporter", budget, collectors, curator=False)


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


async def serve(
    telemetry: Telemetry,
    bind: str,
    port: int,
    ready: asyncio.Event | None = None,
    feed: ExporterFeed | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT (or cancellation), reading `feed`'s topic meanwhile."""
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
    reading = asyncio.create_task(feed.run()) if feed is not None else None
    if ready is not None:
        ready.set()
    try:
        await stop.wait()
    finally:
        if reading is not None:
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading
        await runner.cleanup()
