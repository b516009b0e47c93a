"""Durability against real Redis: SIGKILL + restart keeps every acknowledged charge; an outage fails closed."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dpstream.topology.errors import ConfigError
from dpstream.topology.periods import period_id
from dpstream.workers.ledger import LedgerUnavailable, Outcome, ReleaseRequest, open_ledger
from dpstream.workers.ledger.testing import one_scope_topology

DAY = 86_400
P0 = (1_796_000_000 // DAY) * DAY
PID = period_id(DAY, P0)


def _req(rid: str, cost: float = 1e-6) -> ReleaseRequest:
    return ReleaseRequest(rid, "s", PID, "m", P0, P0 + DAY, cost, b'{"id":"%s","ratio_after":null}' % rid.encode())


def test_sigkill_mid_run_keeps_every_acknowledged_charge(fresh_redis: Any) -> None:
    """Charges acknowledged before a SIGKILL are all there after restart on the same AOF, with the same bytes."""

    async def body() -> None:
        ledger = await open_ledger(fresh_redis.url, one_scope_topology())
        acked: dict[str, bytes] = {}
        stop = asyncio.Event()

        async def client(c: int) -> None:
            i = 0
            while not stop.is_set():
                rid = f"c{c}-{i}"
                i += 1
                try:
                    r = await ledger.charge(_req(rid))
                except LedgerUnavailable:
                    await asyncio.sleep(0.05)
                    continue
                assert r.outcome is Outcome.CHARGED
                acked[rid] = r.payload

        tasks = [asyncio.create_task(client(c)) for c in range(8)]
        while len(acked) < 300:
            await asyncio.sleep(0.01)
        await asyncio.to_thread(fresh_redis.kill)
        before_restart = dict(acked)
        await asyncio.to_thread(fresh_redis.start)
        while len(acked) < len(before_restart) + 50:  # traffic resumes after the restart
            await asyncio.sleep(0.01)
        stop.set()
        await asyncio.gather(*tasks)
        await ledger.close()

        ledger = await open_ledger(fresh_redis.url, one_scope_topology())
        for rid, payload in acked.items():
            again = await ledger.charge(_req(rid))
            assert again.outcome is Outcome.DUPLICATE and again.payload == payload
        hist = await ledger.history("s")
        assert hist[0].spent_units >= len(acked) * 1_000_000
        assert (await ledger.reconcile("s")).ok
        await ledger.close()

    asyncio.run(body())


def test_redis_down_raises_ledger_unavailable_and_charges_nothing(fresh_redis: Any) -> None:
    """With Redis stopped every call raises LedgerUnavailable (from the redis error); nothing is charged."""

    async def body() -> None:
        ledger = await open_ledger(fresh_redis.url, one_scope_topology())
        await asyncio.to_thread(fresh_redis.kill)
        try:
            for call in (
                ledger.charge(_req("down")),
                ledger.quote("m", P0, P0 + DAY),
                ledger.status("s"),
                ledger.commit("s", "down"),
                ledger.pending(0),
            ):
                with pytest.raises(LedgerUnavailable) as info:
                    await call
                assert info.value.__cause__ is not None
        finally:
            await asyncio.to_thread(fresh_redis.start)
        assert (await ledger.history("s")) == []
        await ledger.close()
        with pytest.raises(LedgerUnavailable):
            await open_ledger("redis://127.0.0.1:1/0", one_scope_topology())

    asyncio.run(body())


def test_non_durable_server_is_refused_unless_allow_volatile(
    fresh_redis: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """appendfsync everysec is refused with a one-line ConfigError; --allow-volatile runs and warns on stderr."""
    with fresh_redis.client() as client:
        client.config_set("appendfsync", "everysec")
        try:
            with pytest.raises(ConfigError, match="appendfsync=everysec.*`appendfsync always` in its redis.conf"):
                asyncio.run(open_ledger(fresh_redis.url, one_scope_topology()))
            ledger = asyncio.run(open_ledger(fresh_redis.url, one_scope_topology(), allow_volatile=True))
            assert "NON-DURABLE" in capsys.readouterr().err
            asyncio.run(ledger.close())
        finally:
            client.config_set("appendfsync", "always")
