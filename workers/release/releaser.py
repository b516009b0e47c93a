"""`Releaser`: the release protocol (see dpstream.workers.release) for one merged window — exactly one noisy value.

known release_id → republish its stored bytes (duplicate) | quote → (expired: past the ledger's
idempotency horizon, no noise drawn, nothing charged | thinned or refused:
refused_budget / refused_breaker, recorded by the ledger, nothing published) → mechanism at the
quoted cost → noise → record bytes → atomic `charge` (a known release_id returns its stored bytes)
→ publish the *stored* bytes with key = release_id → `commit`. A crash after the charge leaves the
release `charged` in the ledger; `sweep` republishes it with the same bytes. Ledger errors
propagate (fail closed), counted as ledger_unavailable; any other error as failed.

Per release the releaser reuses what only depends on the topology and the cost: the mechanism
of each (metric, cost) it was quoted (the factory's own cache would hash the whole metric, its
declared keys included, on every release), each metric's selection δ, and the later periods of
a window that cannot reach past its own period (none), and the JSON text of the record fields
the topology, the metric and the cost fix (`record_bytes`).
"""

from __future__ import annotations

__all__ = ["MAX_STALE_QUOTES", "Publish", "MechanismFactory", "Releaser", "sweep"]

from collections.abc import Awaitable, Callable
from typing import Any

from dpstream.topology.errors import InternalError
from dpstream.topology.model import Budget, Metric, Topology
from dpstream.topology.periods import period_id, periods_touched
from dpstream.topology.plan import build_plan
from dpstream.topology.running_total import steps_per_period
from dpstream.topology.schedule import Schedule
from dpstream.topology.selection import conversion_delta, selection_delta_per_release
from dpstream.workers.ledger.allocation import Backlog
from dpstream.workers.ledger.errors import LedgerUnavailable
from dpstream.workers.ledger.types import ChargeResult, Outcome, Quote, ReleaseRequest, fill_ratio
from dpstream.workers.ledger.units import cost_to_units, ledger_delta
from dpstream.workers.pipeline.merger import MergedWindow
from dpstream.workers.release import faults, running
from dpstream.workers.release.ids import release_id as make_release_id
from dpstream.workers.release.ordering import CanonicalOrder, OrderKey, Ticket, order_key
from dpstream.workers.release.outcomes import ReleaseCounts, ReleaseOutcome, ReleaseResult, refusal_outcome
from dpstream.workers.release.ports import MechanismFactory, ReleaseLedger, ReleaseMechanism
from dpstream.workers.release.record import charged_cost_of, record_bytes, true_values_for

MAX_STALE_QUOTES = 100
"""Quote → charge rounds one release tries before giving up (each stale one means another process
charged the scope meanwhile, so the scope as a whole always progresses)."""

Publish = Callable[[bytes, bytes], Awaitable[Any]]
"""async publish(value, key): send one record to the releases topic (idempotent producer)."""


def _default_factory() -> MechanismFactory:
    from dpstream.workers.noise import build_release_mechanism

    return build_release_mechanism


class Releaser:
    """Runs the release protocol against one ledger for every metric of a topology."""

    def __init__(
        self,
        topology: Topology,
        ledger: ReleaseLedger,
        *,
        mechanism_factory: MechanismFactory | None = None,
        actor: str = "worker",
    ) -> None:
        """`actor`: who charges, in each charge's audit entry (the worker id, or `replay:<user>`)."""
        self.topology = topology
        self._actor = actor
        self._metrics = list(topology.metrics.values())
        plan = build_plan(topology)
        self._planned_cost = {m.name: plan.metric(m.name).per_release_cost for m in self._metrics}
        self.version = topology.topology_version
        self.ledger = ledger
        self._factory = mechanism_factory or _default_factory()
        self.counts = ReleaseCounts()
        self._orders: dict[str, CanonicalOrder] = {}
        self._mechanisms: dict[tuple[str, float], ReleaseMechanism] = {}
        self._selection_deltas: dict[str, float] = {}
        self._scope_metrics = {b: topology.metrics_of(b) for b in topology.budgets}
        self._closes: dict[tuple[str, int, int], tuple[str, ...]] = {}
        """(metric, start, end) → `_same_close`'s answer (it depends on the topology and S only)."""
        self._histories: dict[tuple[str, str], running.PeriodHistory] = {}
        """(running-total metric, period id) → the steps this releaser holds (`running.PeriodHistory`)."""
        self._conversion_deltas = {b.name: conversion_delta(b, self._metrics) for b in topology.budgets.values()}
        """Per scope: the δ its cap was converted at, so a record's ε-equivalent is at that δ too."""

    def prepare(self, metric: Metric, cost: float | None = None) -> None:
        """Build (and cache) the mechanism of `metric` at `cost` (default: the planned cost), so the
        first release does not pay OpenDP's first-use cost; nothing is sampled."""
        if metric.running_total:
            return  # its σ is fixed per period by its lump (`running`): nothing to build ahead
        budget = self.topology.budgets[metric.budget]
        price = cost if cost is not None and cost > 0 else self._planned_cost[metric.name]
        mechanism = self._factory(metric, budget.accounting, price, delta=self._selection_delta(metric, budget))
        if len(self._mechanisms) < 1024:
            self._mechanisms[(metric.name, price)] = mechanism

    def _selection_delta(self, metric: Metric, budget: Budget) -> float:
        """The partition-selection δ of one release of `metric`, as calibrated and as charged: the
        topology's share rounded down to the ledger's δ unit, so a period's releases fit its cap."""
        delta = self._selection_deltas.get(metric.name)
        if delta is None:
            delta = self._selection_deltas[metric.name] = ledger_delta(
                selection_delta_per_release(metric, budget, self._metrics)
            )
        return delta

    def _mechanism(self, m: Metric, budget: Budget, cost: float, selection_delta: float) -> ReleaseMechanism:
        """The factory's mechanism for `m` at `cost`, kept per (metric, cost) for this topology."""
        key = (m.name, cost)
        mechanism = self._mechanisms.get(key)
        if mechanism is None:
            if len(self._mechanisms) >= 1024:
                self._mechanisms.clear()
            mechanism = self._mechanisms[key] = self._factory(m, budget.accounting, cost, delta=selection_delta)
        return mechanism

    def release_id(self, metric: str, window_start: int, window_end: int) -> str:
        """The deterministic id of this topology's release of (metric, window)."""
        return make_release_id(self.version, metric, window_start, window_end)

    async def release_merged(self, merged: MergedWindow, publish: Publish) -> ReleaseResult:
        """Release a merged window (declared keys zero-filled, empty windows included)."""
        metric = self.topology.metrics[merged.metric]
        values = true_values_for(metric, merged.values)
        return await self.release(metric, (merged.start, merged.end), values, publish)

    async def release(
        self,
        metric: Metric | str,
        window: tuple[int, int],
        true_values: dict[str, Any],
        publish: Publish,
    ) -> ReleaseResult:
        """Run the protocol for one window; raises (counted as failed) when the ledger or publish fails."""
        m = self.topology.metrics[metric] if isinstance(metric, str) else metric
        start, end = window
        rid = self.release_id(m.name, start, end)
        order = self._order_of(m.budget)
        key = order_key(self.topology, m, end)
        ticket = order.enter(key)  # before the first await: releases ready together are priced in order
        try:
            result = await self._release(m, start, end, rid, true_values, publish, order, ticket)
        except LedgerUnavailable:
            self.counts.error(ReleaseOutcome.LEDGER_UNAVAILABLE)
            raise
        except Exception:
            self.counts.error(ReleaseOutcome.FAILED)
            raise
        finally:
            order.leave(ticket)
        self.counts.add(result)
        return result

    async def _release(
        self,
        m: Metric,
        start: int,
        end: int,
        rid: str,
        true_values: dict[str, Any],
        publish: Publish,
        order: CanonicalOrder,
        ticket: Ticket,
    ) -> ReleaseResult:
        budget = self.topology.budgets[m.budget]
        known = await self.ledger.stored_payload(budget.name, rid)
        if known is not None:  # a retry, a replay or another worker: same bytes, no fresh noise
            order.leave(ticket)  # nothing to price
            await publish(known, rid.encode())
            await self.ledger.commit(budget.name, rid)
            return ReleaseResult(ReleaseOutcome.DUPLICATE, rid, m.name, start, end, "", known)
        await order.turn(ticket)
        try:
            charged = await self._price_and_charge(m, budget, start, end, rid, true_values)
        finally:
            order.leave(ticket)  # the later releases are priced while this one publishes
        if isinstance(charged, ReleaseResult):
            return charged
        stored = charged.payload
        if faults.ARMED:  # chaos tests only (off unless armed): charged, not yet published
            faults.crash_point("after_charge")
        await publish(stored, rid.encode())
        if faults.ARMED:  # chaos tests only: published, not yet committed
            faults.crash_point("after_publish")
        await self.ledger.commit(budget.name, rid)
        outcome = ReleaseOutcome.PUBLISHED if charged.outcome is Outcome.CHARGED else ReleaseOutcome.DUPLICATE
        return ReleaseResult(outcome, rid, m.name, start, end, "", stored)

    def _order_of(self, scope: str) -> CanonicalOrder:
        """Quote → charge of one scope run one at a time in this process and in the public order of
        the releases pending (`ordering`), so concurrent releases neither make each other's quotes
        stale nor change each other's prices; across processes the ledger's spend version answers
        a charge quoted at an old version STALE_QUOTE, and it is priced again."""
        order = self._orders.get(scope)
        if order is None:
            order = self._orders[scope] = CanonicalOrder()
        return order

    async def _price_and_charge(
        self,
        m: Metric,
        budget: Budget,
        start: int,
        end: int,
        rid: str,
        true_values: dict[str, Any],
    ) -> ReleaseResult | ChargeResult:
        """Quote, draw the noise at the quoted cost and charge, again from a fresh quote while the
        quote goes stale: the ledger's charge result, or the final result when nothing is to be
        published (thinned, refused)."""
        for _ in range(MAX_STALE_QUOTES):
            charged = await self._quote_draw_charge(m, budget, start, end, rid, true_values)
            if charged is not None:
                return charged
            # STALE_QUOTE: another process charged or granted in this period between our quote and
            # our charge, so the split of what is left changed; quote again from the new state and
            # redraw. The discarded noisy value was never stored, published or logged (the charge
            # wrote nothing), so dropping it leaks nothing, and the ledger still charges once.
        raise InternalError(
            f"release of {m.name} [{start}, {end}): {MAX_STALE_QUOTES} quotes in a row went stale "
            "(other processes kept charging this scope); retried later"
        )

    def _same_close(self, m: Metric, budget: Budget, start: int, end: int) -> tuple[str, ...]:
        """The metrics of the scope whose release of this close time (a window of the public schedule
        ending at `end`, starting in the same period) comes before [start, end) of `m` in the canonical
        (window end, P(w), metric) order."""
        if len(self._scope_metrics[budget.name]) < 2:
            return ()  # the scope's only metric: no other release shares its close
        key = (m.name, start, end)
        cached = self._closes.get(key)
        if cached is not None:
            return cached
        period_s = budget.period_s
        schedule_start = getattr(self.ledger, "schedule_start", None)
        mine = order_key(self.topology, m, end)
        before: list[str] = []
        for other in self._scope_metrics[budget.name]:
            s = end - other.window.size_s
            if other.name == m.name or s % other.window.every_s or s // period_s != start // period_s:
                continue
            if schedule_start is not None and s < schedule_start:
                continue  # not in the public schedule: never released
            if order_key(self.topology, other, end) < mine:
                before.append(other.name)
        found = tuple(before)
        if len(self._closes) >= 4096:
            self._closes.clear()
        self._closes[key] = found
        return found

    async def _quote(self, m: Metric, budget: Budget, start: int, end: int) -> Quote:
        """The ledger's quote for [start, end) of `m`, priced in the canonical (window end, P(w), metric)
        order of its period: as if the releases that come before it were charged first and the ones
        after it not yet, whichever of them did run first (so a charge that differs from its quote, as
        under `stretch`, moves no other release's cost). When the period's charges are not exactly those
        that come before it (`Quote.backlog_from`), it is priced again with the period's backlog."""
        before = self._same_close(m, budget, start, end)
        quote = await (
            self.ledger.quote(m.name, start, end, before=before) if before else self.ledger.quote(m.name, start, end)
        )
        since = quote.backlog_from
        return quote if since is None else await self._quote_in_order(m, budget, start, end, since)

    async def _quote_in_order(self, m: Metric, budget: Budget, start: int, end: int, since: int) -> Quote:
        """The quote with the period's `Backlog` (`allocation.price_in_order`) read from the window end
        `since`, at one spend version: priced again when a charge landed between that read and the quote's."""
        for _ in range(MAX_STALE_QUOTES):
            version, backlog = await self._backlog(m, budget, start, end, since if since >= end else None)
            quote = await self.ledger.quote(m.name, start, end, backlog=backlog)
            if quote.version == version:
                return quote
        raise InternalError(f"release of {m.name} [{start}, {end}): its period's charges kept changing; retried later")

    async def _backlog(
        self, m: Metric, budget: Budget, start: int, end: int, since: int | None = None
    ) -> tuple[int, Backlog]:
        """(the period's spend version, its `Backlog` seen from the release of `m` over [start, end)): the
        timeline from the first release of the schedule before it not charged yet, in canonical (window
        end, P(w), metric) order, with the charges after that start and what each was charged. `since`:
        every window ending before it is charged, so only the charges ending at or after it are read
        (all of them when one of a `max_windows` metric or running total is taken out)."""
        pstart = start - start % budget.period_s
        version, charged = await self.ledger.charged_ends(budget.name, period_id(budget.period_s, pstart), since)
        schedule_start = getattr(self.ledger, "schedule_start", None)
        if schedule_start is not None and start < schedule_start:
            schedule_start = None  # a window before S is priced as in a whole period (`allocation.price`)
        mine = order_key(self.topology, m, end)
        gaps: list[tuple[OrderKey, tuple[str, int, int, int | None, int | None]]] = []
        made: list[tuple[OrderKey, str, int, int, str]] = []
        for other in self._scope_metrics[budget.name]:
            size, ends = other.window.size_s, charged.get(other.name, {})
            for rid, e in ends.items():
                made.append((order_key(self.topology, other, e), other.name, e - size, e, rid))
            seen = set(ends.values())
            first_start = pstart if since is None else max(pstart, since - size)
            for s in Schedule.of(other, schedule_start).starts(since=first_start):
                key = order_key(self.topology, other, s + size)
                if key >= mine:
                    break
                if s + size not in seen:
                    gaps.append((key, (other.name, s, s + size, None, None)))
        first = min(gaps)[0] if gaps else mine
        steps = list(gaps)
        taken: list[tuple[OrderKey, tuple[str, int, int]]] = []
        ends_left: dict[str, list[int]] = {}
        kept_own: dict[str, list[int]] = {}
        capped = {other.name for other in self._scope_metrics[budget.name] if other.paid_windows is not None}
        ours = {rid for _, name, s, e, rid in made if rid == self.release_id(name, s, e)}
        read = [
            rid for key, name, _, _, rid in made if rid in ours and (key >= first or (name in capped and since is None))
        ]
        stored_of = await self.ledger.stored_charges(budget.name, read)
        for key, name, s, e, rid in made:
            mine_too = rid in ours  # another topology version's charge stays as it is
            if key < first or not mine_too:
                ends_left.setdefault(name, []).append(e)
                if name not in capped or not mine_too:
                    continue
            stored = stored_of.get(rid)
            if stored is None:  # past its retention: gone from the period too
                continue
            own, paid = cost_to_units(charged_cost_of(stored.payload)), stored.paid_units
            if key < first:
                kept_own.setdefault(name, []).append(own)
                continue
            if since is not None and name in capped:  # its m largest are rebuilt from all its charges
                return await self._backlog(m, budget, start, end)
            taken.append((key, (name, own, paid)))
            if key < mine:
                steps.append((key, (name, s, e, own, paid)))
        steps.sort()
        taken.sort(reverse=True)
        backlog = Backlog(
            tuple(t for _, t in taken),
            {n: tuple(o) for n, o in kept_own.items()},
            tuple(t for _, t in steps),
            {n: tuple(sorted(e)) for n, e in ends_left.items()},
        )
        return version, backlog

    async def _quote_draw_charge(
        self,
        m: Metric,
        budget: Budget,
        start: int,
        end: int,
        rid: str,
        true_values: dict[str, Any],
    ) -> ReleaseResult | ChargeResult | None:
        """One quote → noise → charge round, charged only at the spend version it was quoted at;
        None when the quote went stale before the charge (nothing was written)."""
        quote = await self._quote(m, budget, start, end)
        if quote.expired:  # past the idempotency horizon: no fresh noise, no charge, not retried
            return ReleaseResult(ReleaseOutcome.EXPIRED, rid, m.name, start, end, quote.refused_reason or "expired")
        needs_lump, state, clamped, appended = False, b"", 0, None
        if m.running_total:
            step = await self._running_step(m, budget, start, end, rid, quote, true_values)
            if isinstance(step, ReleaseResult):
                return step
            cost, needs_lump, noise_fields, state, appended = step
            selection_delta = 0.0  # declared keys only
        else:
            asked = self._cost_asked(m, quote, rid, start, end)
            if isinstance(asked, ReleaseResult):
                return asked
            cost = asked
            selection_delta = self._selection_delta(m, budget)
            mechanism = self._mechanism(m, budget, cost, selection_delta)
            clamped_before = mechanism.clamped
            noise_fields = mechanism.release(true_values).to_record_fields()
            clamped = mechanism.clamped - clamped_before
        payload = record_bytes(  # the record's canonical bytes, the fixed fields' text kept per cost
            release_id=rid,
            topology_version=self.version,
            metric=m,
            source=self.topology.sources[m.source],
            budget=budget,
            period_id=quote.period_id,
            window_start=start,
            window_end=end,
            cost=cost,
            noise_fields=noise_fields,
            ledger=self.ledger.ledger_id,  # the ledger this release is charged to (None: the in-process one)
            conversion_delta=self._conversion_deltas[budget.name],
            built_at=self.topology.publish_time(m, end),  # published_at = P(w): public, never processing time
        )
        request = ReleaseRequest(
            release_id=rid,
            scope=budget.name,
            period_id=quote.period_id,
            metric=m.name,
            window_start=start,
            window_end=end,
            cost=cost,
            payload=payload if quote.ratio_after is None else fill_ratio(payload, quote.ratio_after),
            may_use_reserve=m.may_use_reserve,
            actor=self._actor,
            delta=selection_delta,
            # a window straddling a period boundary is charged to every period it
            # touches, in the same atomic call as its main charge (all or nothing)
            extra_periods=_later_periods(budget.period_s, start, end),
            quoted_version=quote.version,
            needs_lump=needs_lump,
            running_state=state,
        )
        charge = await self.ledger.charge(request)
        if charge.outcome is Outcome.STALE_QUOTE:
            return None
        if charge.outcome is Outcome.EXPIRED:  # the horizon passed between quote and charge
            return ReleaseResult(ReleaseOutcome.EXPIRED, rid, m.name, start, end, charge.reason)
        if charge.outcome is Outcome.REFUSED:
            reason = charge.reason or quote.refused_reason or "refused"
            return ReleaseResult(refusal_outcome(reason), rid, m.name, start, end, reason)
        if clamped and charge.outcome is Outcome.CHARGED:  # counted once per charged release, not per attempt
            self.counts.clamped[m.name] += clamped
        if appended is not None and charge.outcome is Outcome.CHARGED:  # stored by this charge: the next step's past
            history, x, y = appended
            history.append_charged(x, y, cost)
        return charge

    def _cost_asked(self, m: Metric, quote: Quote, rid: str, start: int, end: int) -> float | ReleaseResult:
        """What a charge asks the ledger for: the quote's cost; the planned cost when nothing fits, so the
        ledger itself refuses the release atomically and records it (refused count, audit entry with its
        reason); or, for a window the warning policy thinned, the refusal (nothing is asked)."""
        if quote.thinned:
            return ReleaseResult(ReleaseOutcome.REFUSED_BUDGET, rid, m.name, start, end, "thinned")
        if quote.refused_reason is not None or quote.cost <= 0:
            return self._planned_cost[m.name]
        return quote.cost

    async def _running_step(
        self, m: Metric, budget: Budget, start: int, end: int, rid: str, quote: Quote, true_values: dict[str, Any]
    ) -> ReleaseResult | tuple[float, bool, dict[str, Any], bytes, tuple[running.PeriodHistory, Any, Any]]:
        """A running total's step (`running`): (its cost, whether it needs the period's lump, its noise
        fields, its state, what to add to the period's history once charged), or the result when it
        goes no further (its period's first step thinned). The first step is charged the quote (the
        lump); a later one the first step's stored cost, which raises the period's largest charge by
        nothing (none stored: the ledger refuses it). The history is read from the ledger unless this
        releaser holds every step before this one."""
        first = running.first_step(m, budget, start, getattr(self.ledger, "schedule_start", None))
        if start == first:
            asked = self._cost_asked(m, quote, rid, start, end)
            if isinstance(asked, ReleaseResult):
                return asked
            cost = asked
        key = (m.name, quote.period_id)
        history = self._histories.get(key)
        if history is None or history.first != first or not history.holds_before(start):
            steps = await self.ledger.running_steps(budget.name, m.name, quote.period_id)
            T, keys = steps_per_period(m, budget.period_s), len(true_values)
            history = running.PeriodHistory.of_stored(first, m.window.every_s, T, keys, steps, start)
            self._histories = {k: h for k, h in self._histories.items() if k[0] != m.name}  # one period a metric
            self._histories[key] = history
        if start != first:
            if history.lump is None:
                rid = self.release_id(m.name, first, first + end - start)
                stored = await self.ledger.stored_payload(budget.name, rid)
                history.lump = charged_cost_of(stored) if stored is not None else None
            cost = history.lump if history.lump is not None else self._planned_cost[m.name]
        step, x, y = running.running_step(m, budget, start, cost, true_values, history)
        return cost, start != first, step.noise_fields, step.state, (history, x, y)


def _later_periods(period_s: int, start: int, end: int) -> tuple[tuple[str, int], ...]:
    """(period_id, start) of every period after the first that [start, end) touches."""
    if type(start) is int and type(end) is int and start < end and start // period_s == (end - 1) // period_s:
        return ()  # ends inside the period it starts in (periods are whole multiples of period_s from 0)
    return tuple((period_id(period_s, p), p) for p in periods_touched(period_s, start, end)[1:])


async def sweep(
    ledger: ReleaseLedger,
    publish: Publish,
    older_than_s: float,
    counts: ReleaseCounts | None = None,
    skip: Callable[[str], bool] | None = None,
) -> int:
    """Republish every release charged longer than `older_than_s` ago with its stored bytes, then commit.

    `skip(release_id)` leaves a release to its owner (a parked window: held until `budget retry`).
    A release whose publish fails does not stop the round: the others are still swept, then the
    first error is raised (a poison record, always the oldest, would otherwise block every later one).
    """
    done = 0
    first_error: Exception | None = None
    for pending in await ledger.pending(older_than_s):
        if skip is not None and skip(pending.release_id):
            continue
        try:
            await publish(pending.payload, pending.release_id.encode())
            await ledger.commit(pending.scope, pending.release_id)
        except Exception as exc:  # raised after the round
            first_error = first_error or exc
            continue
        done += 1
    if counts is not None:
        counts.swept += done
    if first_error is not None:
        raise first_error
    return done
