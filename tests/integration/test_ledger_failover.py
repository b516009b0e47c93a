"""The ledger under Redis Sentinel (primary + replica, Debian's redis-server and redis-sentinel):
nothing is published on a charge a failover could forget, and a SIGKILL of the primary under a
steady release load loses no published release, doubles no payload and strands no spend."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from dpstream.topology.errors import ConfigError
from dpstream.topology.model import Metric, Topology
from dpstream.workers.ledger import Ledger, LedgerUnavailable, open_ledger
from dpstream.workers.ledger.keys import ScopeKeys
from dpstream.workers.ledger.testing import ManualClock, one_scope_topology
from dpstream.workers.localstack.sentinel import SentinelLedger
from dpstream.workers.release import Releaser, sweep

DAY = 86_400
T0 = 1_796_000_000  # a fixed UTC day: the test does not depend on the wall clock's date
P0 = (T0 // DAY) * DAY
WINDOW = 60


@pytest.fixture
def group(tmp_path: Path) -> Iterator[SentinelLedger]:
    """A primary, one replica and one sentinel (fails over ~1 s after the primary stops answering)."""
    g = SentinelLedger(tmp_path, replicas=1, sentinels=1, down_after_ms=1000, failover_timeout_ms=3000)
    g.start()
    try:
        yield g
    finally:
        g.stop()


def _topology() -> Topology:
    """One pure-ε scope, one count metric released every minute (1,440 windows a day)."""
    return one_scope_topology(epsilon=1000.0, metrics=(("m", 1.0, WINDOW, WINDOW, False),))


class Published:
    """The releases topic stand-in: every (release_id, payload) published, in order."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, bytes]] = []

    async def __call__(self, value: bytes, key: bytes) -> None:
        self.rows.append((key.decode(), bytes(value)))

    def payloads(self) -> dict[str, set[bytes]]:
        """release_id → the distinct payloads published under it."""
        out: dict[str, set[bytes]] = defaultdict(set)
        for rid, payload in self.rows:
            out[rid].add(payload)
        return out


def _window(i: int) -> tuple[int, int]:
    return (P0 + i * WINDOW, P0 + (i + 1) * WINDOW)


async def _open(url: str, wait_ms: int) -> tuple[Ledger, Releaser]:
    ledger = await open_ledger(f"{url}?wait_timeout_ms={wait_ms}", _topology(), clock=ManualClock(T0))
    return ledger, Releaser(_topology(), ledger)


def _ledger_state(port: int, scope: str = "s") -> tuple[int, dict[str, dict[bytes, bytes]]]:
    """(spent units of the period, release_id → release hash) read straight from the node on `port`."""
    keys = ScopeKeys(scope)
    client = redis.Redis(port=port)
    try:
        spent = int(client.hget(keys.period("2026-11-30"), "spent") or 0)
        prefix = keys.release("")
        releases = {
            key.decode()[len(prefix) :]: client.hgetall(key) for key in client.scan_iter(match=prefix + "*", count=500)
        }
    finally:
        client.close()
    return spent, releases


def test_replica_durability_is_checked_at_start(group: SentinelLedger) -> None:
    """A replica without `appendfsync always` is refused like a non-durable primary: a failover would
    make it the ledger; the primary's URL is found through Sentinel and the replica is named."""
    with redis.Redis(port=group.nodes[1].port) as replica:
        replica.config_set("appendfsync", "everysec")
    not_durable = r"\(replica 127\.0\.0\.1:\d+\): not durable: appendonly=yes, appendfsync=everysec"
    with pytest.raises(ConfigError, match=not_durable):
        asyncio.run(open_ledger(group.url, _topology()))


def test_charge_not_on_a_replica_is_not_published(group: SentinelLedger) -> None:
    """While the replica cannot confirm (SIGSTOP), a release, its retry (which finds the stored bytes)
    and the sweeper publish nothing and fail closed; once it confirms, the sweeper and the retry
    publish the bytes stored by the failed attempt."""
    replica = group.nodes[1]
    assert replica.pid is not None
    group.wait_replicas(1)  # in sync before the first release, whose WAIT must be confirmed

    async def body() -> None:
        # long enough for a loaded machine's replica to confirm the first release; each WAIT while the
        # replica is stopped costs this much
        ledger, releaser = await _open(group.url, wait_ms=1500)
        published = Published()
        metric: Metric = _topology().metrics["m"]
        try:
            await releaser.release(metric, _window(0), {"": 10}, published)
            assert [rid for rid, _ in published.rows] == [releaser.release_id("m", *_window(0))]
            os.kill(replica.pid, signal.SIGSTOP)
            try:
                with pytest.raises(LedgerUnavailable, match="0 of the 1 replicas"):
                    await releaser.release(metric, _window(1), {"": 11}, published)  # the charge's WAIT
                with pytest.raises(LedgerUnavailable, match="0 of the 1 replicas"):
                    await releaser.release(metric, _window(1), {"": 11}, published)  # the retry's: bytes found
                with pytest.raises(LedgerUnavailable, match="0 of the 1 replicas"):
                    await sweep(ledger, published, older_than_s=0)
                assert len(published.rows) == 1, "published while the only replica could not confirm"
            finally:
                os.kill(replica.pid, signal.SIGCONT)
            rid1 = releaser.release_id("m", *_window(1))
            stored = await ledger.stored_payload("s", rid1)  # the failed attempt's charge, kept
            assert stored is not None
            assert await sweep(ledger, published, older_than_s=0) == 1
            await releaser.release(metric, _window(1), {"": 11}, published)
            assert published.payloads()[rid1] == {stored}
            assert [rid for rid, _ in published.rows].count(rid1) == 2  # swept, then the retry's duplicate
        finally:
            await ledger.close()

    asyncio.run(body())


def test_primary_sigkill_under_load_keeps_every_published_release(group: SentinelLedger) -> None:
    """A release load against the Sentinel ledger; the primary is SIGKILLed, Sentinel promotes the
    replica, the old primary comes back as a replica. Then: every published release_id is in the new
    primary with its stored payload, no release_id was published with two payloads, and the period's
    spend equals the sum of its charges, published or not."""
    old = group.primary()
    total, kill_after, workers = 120, 30, 4
    figures: dict[str, Any] = {}

    async def body() -> None:
        ledger, releaser = await _open(group.url, wait_ms=500)
        published = Published()
        metric = _topology().metrics["m"]
        todo: asyncio.Queue[int] = asyncio.Queue()
        for i in range(total):
            todo.put_nowait(i)
        done: set[int] = set()
        failures: defaultdict[str, int] = defaultdict(int)

        async def worker() -> None:
            while len(done) < total:
                try:
                    i = todo.get_nowait()
                except asyncio.QueueEmpty:
                    await asyncio.sleep(0.05)
                    continue
                try:
                    await releaser.release(metric, _window(i), {"": i}, published)
                    done.add(i)
                except Exception as exc:  # fail closed: count it, retry the window later
                    failures[type(exc).__name__] += 1
                    await asyncio.sleep(0.1)
                    todo.put_nowait(i)

        async def sweeper() -> None:
            while len(done) < total:
                try:
                    await sweep(ledger, published, older_than_s=0.5)
                except Exception as exc:  # the sweeper retries next round
                    failures["sweep " + type(exc).__name__] += 1
                await asyncio.sleep(0.3)

        async def chaos() -> None:
            while len(done) < kill_after:
                await asyncio.sleep(0.02)
            figures["published_before_kill"] = len(published.rows)
            t_kill = time.monotonic()
            await asyncio.to_thread(old.kill)
            new = await asyncio.to_thread(group.wait_failover, old.port, 120.0)
            figures["failover_s"] = round(time.monotonic() - t_kill, 2)
            figures["new_primary"] = new.port
            await asyncio.to_thread(old.start)  # back on its AOF; Sentinel makes it a replica of the new one
            await asyncio.to_thread(group.wait_replicas, 1, 120.0)
            figures["back_in_sync_s"] = round(time.monotonic() - t_kill, 2)

        try:
            await asyncio.gather(*(worker() for _ in range(workers)), sweeper(), chaos())
            await sweep(ledger, published, older_than_s=0)
        finally:
            await ledger.close()
        figures["failures"] = dict(failures)
        figures["published_rows"] = len(published.rows)
        assert done == set(range(total))
        figures["payloads"] = published.payloads()

    asyncio.run(body())
    print(f"\nfailover figures: { {k: v for k, v in figures.items() if k != 'payloads'} }")
    payloads: dict[str, set[bytes]] = figures["payloads"]
    assert sum(figures["failures"].values()) > 0, "the kill did not interrupt the load: nothing was tested"
    assert figures["new_primary"] != old.port  # Sentinel promoted the replica
    # on a loaded machine Sentinel may fail over again (the promoted node missed its pings, and the
    # old primary, back in sync, was promoted): the invariants must hold on whichever node is primary
    spent, releases = _ledger_state(group.primary().port)
    twice = {rid for rid, p in payloads.items() if len(p) > 1}
    assert not twice, f"{len(twice)} release_ids published with two payloads"
    missing = [rid for rid in payloads if rid not in releases]
    assert not missing, f"{len(missing)} published release_ids are not in the new primary"
    wrong = [rid for rid, p in payloads.items() if releases[rid][b"payload"] not in p]
    assert not wrong, f"{len(wrong)} published release_ids have another payload in the new primary"
    assert len(payloads) == total
    charged = {rid: r for rid, r in releases.items() if r[b"state"] in (b"reserved", b"published")}
    assert set(payloads) <= set(charged)
    assert spent == sum(int(r[b"cost"]) for r in charged.values())
