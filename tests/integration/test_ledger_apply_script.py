"""`lua/apply.lua` on real Redis holds the ledger's invariants whatever Python decided: a decision
made on a false view (spend 0 when the cap is nearly spent, a block not yet open, a stale seq, a
known release, another process's turn) writes nothing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dpstream.topology.errors import InternalError
from dpstream.topology.periods import period_id
from dpstream.workers.ledger import Outcome, ReleaseRequest, open_ledger
from dpstream.workers.ledger.decision import Charge, View, decide, writes
from dpstream.workers.ledger.redis_backend import RedisLedger
from dpstream.workers.ledger.testing import one_scope_topology
from dpstream.workers.ledger.units import cost_to_units

DAY = 86_400
P0 = (1_796_000_000 // DAY) * DAY
PID = period_id(DAY, P0)
RECORD = b'{"release_id":"%s","budget":{"ratio_after":null}}'


async def _spent(ledger: RedisLedger) -> int:
    return int((await ledger._blocks("s", [PID]))[PID].get("spent", 0))


def _req(rid: str, cost: float) -> ReleaseRequest:
    return ReleaseRequest(rid, "s", PID, "m", P0, P0 + DAY, cost, RECORD % rid.encode())


async def _apply(ledger: RedisLedger, charge: Charge, view: View, seq: str, writer: str, new_writer: str) -> Any:
    """Decide `charge` on `view` (true or not) and run apply.lua with it at (`seq`, `writer`)."""
    decision = decide(view, charge)
    ops = writes(charge, decision, 3600)
    keys, args = ledger._encode("s", charge, decision, ops, seq, writer, new_writer)
    return await ledger._guard(ledger._scripts["apply"](keys=keys, args=args))


async def _setup(url: str) -> tuple[RedisLedger, View, Charge, str, str]:
    """A scope with 0.9 of its cap spent, and a charge of 0.5 decided on a view that says nothing was spent."""
    ledger = await open_ledger(url, one_scope_topology(epsilon=1.0, reserve=0.0))
    assert isinstance(ledger, RedisLedger)
    assert (await ledger.charge(_req("first", 0.9))).outcome is Outcome.CHARGED
    k = ledger._keys("s")
    config = {key.decode(): value.decode() for key, value in (await ledger._client.hgetall(k.config)).items()}
    false_view = View(config, {}, {}, {}, None)  # no block, no spend: the 0.9 charged is not in it
    terms = ledger._terms["s"]
    charge = Charge(_req("second", 0.5), cost_to_units(0.5), 0, P0, config["digest"], terms, False, 1)
    return ledger, false_view, charge, config["seq"], config["writer"]


def test_apply_refuses_an_overspend_decided_on_a_false_view(fresh_redis: Any) -> None:
    """Python decided a grant that would take spend past the cap: the script refuses it, writes nothing."""

    async def body() -> None:
        ledger, view, charge, seq, writer = await _setup(fresh_redis.url)
        assert decide(view, charge).answer.outcome == "charged"  # the false view lets it through
        with pytest.raises(InternalError, match="overspend"):  # (checked before its block-opens-once check)
            await _apply(ledger, charge, view, seq, writer, "p.1")
        view_with_block = View(view.config, {}, {PID: {**view.config, "start": str(P0)}}, {PID: P0}, None)
        with pytest.raises(InternalError, match="overspend"):
            await _apply(ledger, charge, view_with_block, seq, writer, "p.2")
        assert await _spent(ledger) == cost_to_units(0.9) and await ledger.stored_payload("s", "second") is None
        await ledger.close()

    asyncio.run(body())


def test_apply_writes_nothing_when_stale_known_or_not_its_turn(fresh_redis: Any) -> None:
    """A seq or writer that moved, a known release id, or another process's turn: nothing is written."""

    async def body() -> None:
        ledger, view, charge, seq, writer = await _setup(fresh_redis.url)
        small = charge._replace(req=_req("second", 0.05), cost=cost_to_units(0.05))
        true_view = await ledger._view("s", [(small, None)])  # type: ignore[list-item]  # (the future is unused)
        state = true_view.state
        now = View(state.config, state.breaker, state.periods, state.period_index, None)
        assert (await _apply(ledger, small, now, str(int(seq) - 1), writer, "p.1"))[0] == b"stale"
        assert (await _apply(ledger, small, now, seq, "someone-else.7", "p.2"))[0] == b"stale"
        known = small._replace(req=_req("first", 0.05))
        reply = await _apply(ledger, known, now, seq, writer, "p.3")
        assert reply[0] == b"duplicate" and b'"release_id":"first"' in reply[1]
        await ledger._client.set(ledger._keys("s").turn, "other-process", px=10_000)
        assert (await _apply(ledger, small, now, seq, writer, "p.4"))[0] == b"stale"
        await ledger._client.delete(ledger._keys("s").turn)
        assert await ledger.stored_payload("s", "second") is None and await _spent(ledger) == cost_to_units(0.9)
        reply = await _apply(ledger, small, now, seq, writer, "p.5")  # the same step, now at its state: written
        assert reply[0] == b"ok" and await _spent(ledger) == cost_to_units(0.9) + cost_to_units(0.05)
        await ledger.close()

    asyncio.run(body())


def test_apply_refuses_a_max_windows_charge_that_pays_less_than_it_raises(fresh_redis: Any) -> None:
    """Under `max_windows`, Python decided on a view that does not hold the metric's largest charges
    (a larger charge than the m-th largest looks free): the script computes the raise from what is
    stored, refuses the decision, and writes nothing; the true decision is written."""

    async def body() -> None:
        topology = one_scope_topology(epsilon=1.0, reserve=0.0, max_windows={"m": 1})
        ledger = await open_ledger(fresh_redis.url, topology)
        assert isinstance(ledger, RedisLedger)
        assert (await ledger.charge(_req("first", 0.1))).outcome is Outcome.CHARGED
        m, field = ledger.scope_of("m").capped["m"]
        state = (await ledger._read_view("s", [PID])).state
        view = View(state.config, state.breaker, state.periods, state.period_index, None)
        terms, digest = ledger._terms["s"], state.config["digest"]
        charge = Charge(_req("second", 0.3), cost_to_units(0.3), 0, P0, digest, terms, False, 1, m, field)
        seq, writer = state.config["seq"], state.config["writer"]
        lying = {PID: {**state.periods[PID], field: str(cost_to_units(0.3))}}  # "0.3 is paid already"
        false_view = view._replace(blocks=lying)
        assert decide(false_view, charge).answer.cost_units == 0
        with pytest.raises(InternalError, match="raises the largest charges"):
            await _apply(ledger, charge, false_view, seq, writer, "p.1")
        assert await _spent(ledger) == cost_to_units(0.1) and await ledger.stored_payload("s", "second") is None
        assert (await _apply(ledger, charge, view, seq, writer, "p.2"))[0] == b"ok"
        assert await _spent(ledger) == cost_to_units(0.3)  # the one largest: 0.3 (raised by 0.2)
        await ledger.close()

    asyncio.run(body())


def test_apply_refuses_a_running_total_step_before_its_lump(fresh_redis: Any) -> None:
    """A running total's later step decided on a view that claims the period's lump is charged (it is
    not): the script finds no stored charge, refuses, and writes nothing; the first step then goes."""

    async def body() -> None:
        topology = one_scope_topology(epsilon=1.0, reserve=0.0, running_totals={"m": 10})
        ledger = await open_ledger(fresh_redis.url, topology)
        assert isinstance(ledger, RedisLedger)
        m, field = ledger.scope_of("m").capped["m"]
        state = (await ledger._read_view("s", [PID])).state
        view = View(state.config, state.breaker, state.periods, state.period_index, None)
        terms, digest = ledger._terms["s"], state.config["digest"]
        later = _req("step-2", 0.3)._replace(needs_lump=True)
        charge = Charge(later, cost_to_units(0.3), 0, P0, digest, terms, False, 1, m, field)
        seq, writer = state.config["seq"], state.config["writer"]
        opened = {**state.config, "start": str(P0), field: str(cost_to_units(0.3))}  # "the lump is paid"
        false_view = view._replace(blocks={PID: opened}, starts={PID: P0})
        assert decide(false_view, charge).answer.outcome == "charged"
        with pytest.raises(InternalError, match="before its lump"):
            await _apply(ledger, charge, false_view, seq, writer, "p.1")
        assert await ledger.stored_payload("s", "step-2") is None
        assert decide(view, charge).answer.outcome == "refused"  # the true view: Python refuses it too
        first = charge._replace(req=_req("step-1", 0.3))
        assert (await _apply(ledger, first, view, seq, writer, "p.2"))[0] == b"ok"
        assert await _spent(ledger) == cost_to_units(0.3)
        await ledger.close()

    asyncio.run(body())


def test_a_payload_of_any_bytes_is_stored_and_answered_byte_for_byte(fresh_redis: Any) -> None:
    """The ops travel to apply.lua as one MessagePack argument: a payload of any bytes (not UTF-8, NUL,
    longer than 64 KiB) is stored as it was given, and a second charge of its release id answers it."""

    async def body() -> None:
        ledger = await open_ledger(fresh_redis.url, one_scope_topology(epsilon=1.0, reserve=0.0))
        try:
            for n, size in enumerate((0, 31, 300, 70_000)):
                rid = f"bytes-{n}"
                payload = bytes(range(256)) * (size // 256) + b"\xff\x00\xfe"[: size % 256 or 3]
                req = ReleaseRequest(rid, "s", PID, "m", P0, P0 + DAY, 0.001, payload)
                first = await ledger.charge(req)
                assert first.outcome is Outcome.CHARGED and first.payload == payload
                again = await ledger.charge(req)
                assert again.outcome is Outcome.DUPLICATE and again.payload == payload
        finally:
            await ledger.close()

    asyncio.run(body())


def test_a_batch_charges_after_the_scripts_were_flushed(fresh_redis: Any) -> None:
    """The batch path queues a bare EVALSHA (no SCRIPT EXISTS first): on a Redis that lost its scripts
    (restarted, failed over) the NOSCRIPT reply loads them again and every charge lands, once."""

    async def body() -> None:
        ledger = await open_ledger(fresh_redis.url, one_scope_topology(epsilon=1.0, reserve=0.0))
        assert isinstance(ledger, RedisLedger)
        await ledger._client.script_flush()
        results = await asyncio.gather(*(ledger.charge(_req(f"r{i}", 0.01)) for i in range(8)))
        assert [r.outcome for r in results] == [Outcome.CHARGED] * 8
        assert await _spent(ledger) == 8 * cost_to_units(0.01)
        again = await ledger.charge(_req("r3", 0.01))
        assert again.outcome is Outcome.DUPLICATE and await _spent(ledger) == 8 * cost_to_units(0.01)
        await ledger.close()

    asyncio.run(body())
