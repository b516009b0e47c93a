"""A window older than the ledger's idempotency horizon is never released again: outcome `expired`,
no noise drawn, nothing charged, stored, published or audited. Against a real Redis ledger, whose
release records expire; the in-process ledger keeps them forever and has no horizon."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from dpstream.topology.model import Accounting, Metric
from dpstream.topology.periods import period_id
from dpstream.workers.ledger import Outcome, ReleaseRequest, open_ledger
from dpstream.workers.ledger.testing import ManualClock, one_scope_topology
from dpstream.workers.noise import build_release_mechanism
from dpstream.workers.release import ReleaseOutcome, Releaser

HOUR, DAY = 3600, 86_400
T0 = 1_796_000_400  # an hour boundary
TOPOLOGY = one_scope_topology(metrics=(("m", 1.0, HOUR, HOUR, False),))


class _CountingFactory:
    """The real mechanism factory, counting every noisy value drawn."""

    def __init__(self) -> None:
        self.draws = 0

    def __call__(self, metric: Metric, accounting: Accounting, cost: float, *, delta: float = 0.0) -> Any:
        inner = build_release_mechanism(metric, accounting, cost, delta=delta)
        outer = self

        class _Counted:
            clamped = 0

            def release(self, true_values: Mapping[str, Any]) -> Any:
                outer.draws += 1
                return inner.release(true_values)

        return _Counted()


class _Sink:
    def __init__(self) -> None:
        self.sent: list[tuple[bytes, bytes]] = []

    async def __call__(self, value: bytes, key: bytes) -> None:
        self.sent.append((value, key))


def test_a_window_past_the_idempotency_horizon_is_expired_never_noised_or_charged(fresh_redis: Any) -> None:
    """Past the horizon, a window never released is counted `expired` with no noise drawn and nothing
    charged, stored, published or audited; a window released before still gets its stored bytes."""

    async def body() -> None:
        clock = ManualClock(T0)
        ledger = await open_ledger(fresh_redis.url, TOPOLOGY, clock=clock)
        factory = _CountingFactory()
        releaser = Releaser(TOPOLOGY, ledger, mechanism_factory=factory)
        sink = _Sink()
        old = (T0 - HOUR, T0)
        first = await releaser.release("m", old, {"": 7}, sink)
        assert first.outcome is ReleaseOutcome.PUBLISHED and factory.draws == 1
        horizon = ledger.idempotency_horizon_s
        assert horizon is not None and DAY < horizon < 35 * DAY  # the records' retention, less a clock margin
        clock.now = T0 + horizon  # the window ended exactly one horizon ago

        again = await releaser.release("m", old, {"": 9}, sink)  # its record is still there: answered first
        assert (again.outcome, again.payload) == (ReleaseOutcome.DUPLICATE, first.payload)

        audit, status = await ledger.audit("s"), await ledger.status("s", schedule_start=0)
        never = (T0 - 2 * HOUR, T0 - HOUR)  # never released, ended even longer ago
        expired = await releaser.release("m", never, {"": 7}, sink)
        assert expired.outcome is ReleaseOutcome.EXPIRED and expired.reason.startswith("expired: ")
        assert "\n" not in expired.reason and expired.payload == b""
        assert factory.draws == 1  # no fresh noise for it
        assert [v for v, _ in sink.sent] == [first.payload, first.payload]
        assert await ledger.audit("s") == audit
        assert await ledger.stored_payload("s", expired.release_id) is None
        assert (await ledger.status("s", schedule_start=0)).spent_units == status.spent_units
        snapshot = releaser.counts.snapshot()
        assert (snapshot["expired"], snapshot["published"], snapshot["duplicate"]) == (1, 1, 1)

        direct = await ledger.charge(  # a caller that charges without quoting is refused the same way
            ReleaseRequest("x", "s", period_id(DAY, never[0]), "m", never[0], never[1], 0.01, b"{}")
        )
        assert (direct.outcome, direct.cost_units, direct.payload) == (Outcome.EXPIRED, 0, b"")
        assert await ledger.audit("s") == audit and await ledger.stored_payload("s", "x") is None

        clock.now = never[1] + horizon - 1  # one second inside the horizon: released as usual
        inside = await releaser.release("m", never, {"": 7}, sink)
        assert inside.outcome is ReleaseOutcome.PUBLISHED and factory.draws == 2
        await ledger.close()

    asyncio.run(body())


def test_the_in_process_ledger_keeps_every_record_so_nothing_expires() -> None:
    """The in-process ledger never drops a release record: any old window is charged (offline replay)."""

    async def body() -> None:
        clock = ManualClock(T0 + 400 * DAY)
        ledger = await open_ledger("memory", TOPOLOGY, clock=clock)
        assert ledger.idempotency_horizon_s is None
        quote = await ledger.quote("m", T0 - HOUR, T0)
        assert not quote.expired and quote.ok
        await ledger.close()

    asyncio.run(body())


def test_a_short_retention_keeps_most_of_its_horizon(fresh_redis: Any) -> None:
    """The clock-skew margin is at most a tenth of the retention, so a short retention still releases
    a window that just closed (the horizon never shrinks to nothing)."""

    async def body() -> None:
        clock = ManualClock(T0 + 100)
        ledger = await open_ledger(fresh_redis.url, TOPOLOGY, clock=clock, retention_s=600)
        assert ledger.idempotency_horizon_s == 540
        assert not (await ledger.quote("m", T0 - HOUR, T0)).expired
        clock.now = T0 + 540
        assert (await ledger.quote("m", T0 - HOUR, T0)).expired
        await ledger.close()

    asyncio.run(body())
