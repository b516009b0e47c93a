"""The ledger interface: one contract, shared logic, and the few primitives each backend implements.

Backends (`memory`, `redis`) only store and run the atomic steps (the `.lua` scripts, or the
in-process ledger's dict writes, its charges decided by `decision.decide`); pricing, periods,
status, history and reconciliation live here once.

A period's terms are its block's (`dpstream.workers.ledger`): pricing, status and every reserve
check read them once the block exists, the registered config's only before. Every charge carries the
caller's own accounting, cap and period length, and a block whose terms are not the caller's refuses
it, whatever registered last.

The per-release calls (`quote`, `charge`, `commit`, `stored_payload`) memoise what is a pure
function of values that repeat from release to release (period names, unit conversions of a
cost, scope-name checks that passed); what they answer is unchanged.
"""

from __future__ import annotations

__all__ = [
    "Ledger",
    "ChargeTerms",
    "RawCharge",
    "DEFAULT_RETENTION_S",
]

import json
import re
import time
from abc import ABC, abstractmethod
from calendar import timegm
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from datetime import datetime
from functools import lru_cache, partial
from typing import TypeVar

from dpstream.topology.accounting import conversion_delta, epsilon_equivalent
from dpstream.topology.errors import ConfigError, InternalError
from dpstream.topology.periods import period_id as _period_id_uncached
from dpstream.topology.periods import period_start as _period_start
from dpstream.topology.periods import periods_touched as _periods_touched
from dpstream.workers.ledger import topm
from dpstream.workers.ledger.allocation import Backlog, Snapshot, out_of_order, price_in_order, state_of
from dpstream.workers.ledger.config import ScopeConfig
from dpstream.workers.ledger.decision import Charge, ChargeTerms, RawCharge, spend_limit
from dpstream.workers.ledger.identity import check_ledger_id, new_ledger_id
from dpstream.workers.ledger.keys import LEDGER_ID_KEY, check_scope_name, version_schedule_start_key
from dpstream.workers.ledger.reporting import iso
from dpstream.workers.ledger.state import Op, ScopeState
from dpstream.workers.ledger.steps import (
    REGISTER_REFUSED,
    REGISTER_RETRY,
    RawRegister,
    decide_breaker,
    decide_grant,
    decide_park,
    decide_register,
    decide_retry,
    decide_schedule,
    decide_unpark,
)
from dpstream.workers.ledger.types import (
    AuditEntry,
    AuditKind,
    BreakerInfo,
    ChargeResult,
    Outcome,
    ParkedRelease,
    PendingRelease,
    PeriodReconcile,
    PeriodSummary,
    Quote,
    ReconcileReport,
    ReleaseRequest,
    ScopeStatus,
    State,
    StoredCharge,
)
from dpstream.workers.ledger.units import (
    cost_to_units,
    delta_to_units,
    delta_units_to_float,
    grant_to_units,
    units_to_float,
)

_A = TypeVar("_A")
_period_id = lru_cache(maxsize=4096)(_period_id_uncached)
"""`topology.periods.period_id`, memoised: every release of a period names the same period."""
_cost_units = lru_cache(maxsize=4096)(cost_to_units)
"""`cost_to_units`, memoised by exact cost (a period's releases are priced at a few costs)."""
_delta_units = lru_cache(maxsize=1024)(delta_to_units)
_VALID_SCOPES: set[str] = set()
"""Scope names that passed `check_scope_name` (a pure check: a name that passed always passes)."""


def _check_scope(scope: str) -> None:
    if scope not in _VALID_SCOPES:
        check_scope_name(scope)
        if len(_VALID_SCOPES) < 4096:
            _VALID_SCOPES.add(scope)


_ERROR_CLASS = re.compile(r"[A-Za-z0-9_.]{1,100}")
"""What `park` accepts as an error: a class name, so no message (which may quote data) is stored."""

_OUTCOMES = {o.value: o for o in Outcome}
_STATES = {st.value: st for st in State}

DEFAULT_RETENTION_S = 35 * 86_400
"""How long a release record (and so its idempotency) is kept: longer than any replay reaches back."""

HORIZON_MARGIN_S = 3600
"""How much sooner than its record could expire a window is past the idempotency horizon (at most a
tenth of the retention): a worker whose clock lags the charging one's by up to this still refuses
it instead of charging afresh."""

_SUMMARY_FIELDS = ("cap", "reserve", "spent", "granted", "refused", "grant", "delta_spent", "delta_cap")
"""The block fields a `PeriodSummary` reports, in its field order (after the period's id and start)."""

_PERIOD_FORMATS = ("%Y-%m-%d", "%Y-%m-%dT%H:%MZ", "%Y-%m-%dT%H:%M:%SZ")


def budget_left(cap: int, reserve: int, grant: int, spent: int) -> tuple[int, int]:
    """(pool left, reserve left) in units: ordinary metrics draw on the pool (cap − reserve, plus
    what operators granted of the reserve); the reserve left is the rest of what the cap has left,
    so the two always add up to cap − spent, however much was granted or drawn from the reserve."""
    left = max(0, cap - spent)
    pool_left = max(0, spend_limit(cap, reserve, grant, False) - spent)
    return pool_left, left - pool_left


def _terms(stored: Mapping[str, str], period: Mapping[str, str]) -> tuple[int, int, int]:
    """(cap, reserve, warn) units of a period: its block's once opened, else the registered config's."""
    return (
        int(period.get("cap", stored["cap"])),
        int(period.get("reserve", stored["reserve"])),
        int(period.get("warn", stored["warn"])),
    )


@lru_cache(maxsize=1024)
def period_start_of(period_s: int, pid: str) -> int:
    """The start (epoch s) of the period named `pid` (inverse of `topology.periods.period_id`)."""
    for fmt in _PERIOD_FORMATS:
        try:
            start = timegm(datetime.strptime(pid, fmt).timetuple())
        except ValueError:
            continue
        if _period_id(period_s, start) == pid and _period_start(period_s, start) == start:
            return start
    raise InternalError(f"period id {pid!r} does not name a {period_s} s period")


_UNCAPPED = (0, "")
"""`ScopeConfig.capped` of a metric without `max_windows`."""


class Ledger(ABC):
    """The budget ledger (see dpstream.workers.ledger). Every method is async; backends differ only in storage."""

    backend: str = "abstract"

    def __init__(
        self,
        configs: Mapping[str, ScopeConfig],
        *,
        clock: Callable[[], float] = time.time,
        retention_s: int = DEFAULT_RETENTION_S,
        schedule_start: int | None = None,
    ) -> None:
        self._configs = dict(configs)
        self._metric_scope = {p.name: cfg for cfg in self._configs.values() for p in cfg.metrics}
        self._scope_metrics = {name: [p.name for p in cfg.metrics] for name, cfg in self._configs.items()}
        self._scope_metric_names = {name: frozenset(names) for name, names in self._scope_metrics.items()}
        self._terms = {
            name: ChargeTerms(cfg.accounting.value, cfg.cap_units, cfg.period_s) for name, cfg in self._configs.items()
        }
        self._clock = clock
        self._retention_s = int(retention_s)
        self._schedule_start: int | None = None
        if schedule_start is not None:
            self.use_schedule_start(schedule_start)
        self._ledger_id: str | None = None
        self._ledger_id_known = False

    # ---- public contract -------------------------------------------------------------------

    async def register(self, actor: str = "ledger") -> list[str]:
        """Store every scope's config; returns the scopes whose config was new or changed (audited).

        The newest registration wins for future periods. While the current wall-clock period's
        block exists, a change of accounting or period length, or a smaller cap, is refused with
        a ConfigError (the block keeps its terms); so is a change of period length while any block
        lies in the new length's current period; other changes are stored and apply from the
        next period.
        """
        changed = []
        for name, cfg in self._configs.items():
            fields = cfg.stored_fields()
            for _ in range(5):
                stored = await self._read(name, lambda s: s.config.get("period_s"))
                period_s = int(stored) if stored else cfg.period_s
                pstart = _period_start(period_s, self._clock())
                pid = _period_id(period_s, pstart)
                now_ms = self._now_ms()
                step = partial(decide_register, fields=fields, actor=actor, now_ms=now_ms, pid=pid, period_s=period_s)
                raw = await self._step(name, (pid,), step)
                if raw.code != REGISTER_RETRY:
                    break
            else:
                raise InternalError(f"budget scope {name!r}: its period length kept changing during registration")
            if raw.code == REGISTER_REFUSED:
                if raw.what == "period":  # blocks of the old length lie in the new length's current period
                    now = self._clock()
                    new_start = _period_start(cfg.period_s, now)
                    end = max(pstart + period_s, new_start + cfg.period_s)
                    raise _refused_change(cfg, raw, _period_id(cfg.period_s, new_start), end)
                raise _refused_change(cfg, raw, pid, pstart + period_s)
            await self._index_scope(name)
            if raw.code == 1:
                changed.append(name)
        return changed

    async def version_schedule_start(
        self, topology_version: str, proposed: int, scopes: Iterable[str] | None = None
    ) -> int:
        """The recorded start (epoch s) of this topology version's deployment: `proposed` if none
        was recorded yet (stored atomically, set-if-absent), else the first one recorded, forever.
        It is also recorded with each of `scopes` (default: this ledger's topology's), see
        `record_schedule_start`."""
        _check_start(proposed)
        start = int(await self._set_nx(version_schedule_start_key(topology_version), str(proposed)) or proposed)
        await self.record_schedule_start(start, scopes)
        return start

    async def record_schedule_start(self, start: int, scopes: Iterable[str] | None = None) -> None:
        """Record S with each registered scope of `scopes` (default: this ledger's topology's); a
        scope keeps the first S recorded with it (`steps.decide_schedule`), so every reader of the scope, with
        or without the topology, projects its first period from one S. A scope not registered yet
        is skipped: its worker records S after registering it."""
        _check_start(start)
        for scope in sorted(self._configs) if scopes is None else list(scopes):
            check_scope_name(scope)
            await self._step(scope, (), partial(decide_schedule, start=start))

    async def recorded_schedule_start(self, scope: str) -> int | None:
        """The S recorded with `scope` (None: none yet); read only."""
        return _schedule_start_of(await self._stored(scope))

    async def recorded_version_schedule_start(self, topology_version: str) -> int | None:
        """The start recorded for this topology version, or None; read only (a scrape never records
        one: that would fix S at the first scrape instead of the first worker's start)."""
        raw = await self._get(version_schedule_start_key(topology_version))
        return None if raw is None else int(raw)

    async def resolve_ledger_id(self) -> str | None:
        """This ledger namespace's id (`ledger.identity`): created once (set-if-absent, so the first
        opener's proposal wins and every later open, here or elsewhere, reads it), then kept. None
        for the in-process ledger, which binds nothing: its records are charged to no ledger."""
        if not self._ledger_id_known:
            got = await self._set_nx(LEDGER_ID_KEY, new_ledger_id())
            self._ledger_id = None if got is None else check_ledger_id(got, f"{self.backend} ledger")
            self._ledger_id_known = True
        return self._ledger_id

    async def recorded_ledger_id(self) -> str | None:
        """The id stored for this namespace, or None; read only (`verify` never creates one)."""
        got = await self._get(LEDGER_ID_KEY)
        return None if got is None else check_ledger_id(got, f"{self.backend} ledger")

    @property
    def ledger_id(self) -> str | None:
        """The id `resolve_ledger_id` found (`open_ledger` resolves it): what each record's `ledger` says."""
        if not self._ledger_id_known:
            raise InternalError("the ledger id was not resolved (open the ledger with open_ledger; this is a bug)")
        return self._ledger_id

    @property
    def schedule_start(self) -> int | None:
        """The schedule start S this ledger prices with (None: every window of a period counts)."""
        return self._schedule_start

    def use_schedule_start(self, start: int) -> None:
        """Price from the schedule start S (the public schedule): no window starting before S is
        released, so none is counted among a period's releases still to come. Every
        process of one deployment must use the same S (`runtime.schedule`) to price alike."""
        _check_start(start)
        self._schedule_start = start

    @property
    def idempotency_horizon_s(self) -> int | None:
        """How long after a window's end the ledger still surely knows its release (s): its records
        are kept `retention_s` from the charge, which comes after the window's end; less a margin
        for clock skew. None when records are never dropped."""
        return self._retention_s - min(HORIZON_MARGIN_S, self._retention_s // 10)

    def past_horizon(self, window_end: int, now_s: float) -> bool:
        """True when a window ending at `window_end` is older than the idempotency horizon at `now_s`:
        its release record may be gone, so it is never charged (nor noised) again. The schedule is
        public, so refusing it says nothing about the data."""
        horizon = self.idempotency_horizon_s
        return horizon is not None and window_end + horizon <= now_s

    def _expired_reason(self) -> str:
        return (
            f"expired: the window ended more than {self.idempotency_horizon_s} s ago, past the ledger's "
            "idempotency horizon, so it is not released again"
        )

    def scope_of(self, metric: str) -> ScopeConfig:
        """The scope config a metric is charged to."""
        try:
            return self._metric_scope[metric]
        except KeyError:
            raise ConfigError(f"metric {metric!r} is not in the topology this ledger was opened with") from None

    async def quote(
        self,
        metric: str,
        window_start: int,
        window_end: int,
        *,
        before: Collection[str] = (),
        backlog: Backlog | None = None,
    ) -> Quote:
        """The adaptive allowance for the next release of `metric` (adaptive allocation), warning policy applied,
        priced in the canonical order of the period's releases (`allocation.price_in_order`).

        `before` names the metrics whose release of the same close comes first in that order. When the
        period's charges are not exactly those that come before this release (`allocation.out_of_order`)
        and no `backlog` is given, the quote says from where (`Quote.backlog_from`): read the period's
        charges from there (`charged_ends`), build its `Backlog` and quote again with it."""
        cfg = self._metric_scope.get(metric) or self.scope_of(metric)
        period_s = cfg.period_s
        if type(window_start) is int and type(period_s) is int and period_s > 0:
            pstart = window_start - window_start % period_s  # = period_start(period_s, window_start)
        else:
            pstart = _period_start(period_s, window_start)
        pid = _period_id(period_s, pstart)
        we = window_end if type(window_end) is int else int(window_end)
        snap = await self._quote_snapshot(cfg.name, pid, self._scope_metrics[cfg.name], we)
        if snap is None:
            raise InternalError(f"scope {cfg.name!r} is not registered: open_ledger registers it")
        # priced at the snapshot's spend version: a charge passing it back is refused as stale
        # (writing nothing) if any charge or grant of this period landed since, in any process
        ws = window_start if type(window_start) is int else int(window_start)
        quote = price_in_order(cfg, snap, metric, pid, pstart, ws, we, self._schedule_start, backlog)
        if backlog is None:
            start_s = self._schedule_start
            if start_s is not None and ws < start_s:
                start_s = None  # a window before S (a warm-up quote) is priced as in a whole period
            since = out_of_order(cfg, snap, pstart, we, start_s, before)
            if since is not None:
                quote = quote._replace(backlog_from=since)
        if self.past_horizon(we, self._clock()):
            return quote._replace(cost=0.0, cost_units=0, refused_reason=self._expired_reason(), expired=True)
        return quote

    async def charged_ends(
        self, scope: str, period_id: str, since: int | None = None
    ) -> tuple[int, dict[str, dict[str, int]]]:
        """(the period's spend version, per metric of the scope: release_id → window end of each release
        charged to the period, those ending at or after `since` when given), in one read: what a
        `Backlog` is built from."""
        return await self._charged_ends(scope, period_id, self._scope_metrics[scope], since)

    async def charge(self, req: ReleaseRequest) -> ChargeResult:
        """Charge one release atomically, or return its stored payload, or refuse (changing nothing),
        or, when `req.quoted_version` is set and the period's spend moved since, answer STALE_QUOTE
        (writing nothing at all), or, for a new release of a window past the idempotency horizon,
        answer EXPIRED (writing nothing at all)."""
        cfg = self._configs.get(req.scope)
        if cfg is None:
            raise ConfigError(f"budget scope {req.scope!r} is not in the topology this ledger was opened with")
        if type(req.metric) is not str or req.metric not in self._scope_metric_names[req.scope]:
            cfg.metric(req.metric)  # the one-line ConfigError of a metric not charged to this scope
        payload = req.payload
        if type(payload) is not bytes and not isinstance(payload, (bytes, bytearray)):
            raise InternalError("release payload must be bytes")
        rid, metric, pid, actor = req.release_id, req.metric, req.period_id, req.actor
        if not (
            type(rid) is str
            and type(metric) is str
            and type(pid) is str
            and type(actor) is str
            and rid
            and metric
            and pid
            and actor
            and "\n" not in rid
            and "\n" not in metric
            and "\n" not in pid
            and "\n" not in actor
        ):
            for name in ("release_id", "metric", "period_id", "actor"):
                value = getattr(req, name)
                if not value or "\n" in value:
                    raise InternalError(f"release {name} must be non-empty and on one line, got {value!r}")
        cost, delta = req.cost, req.delta
        units = _cost_units(cost) if type(cost) is float else cost_to_units(cost)
        delta_units = _delta_units(delta) if type(delta) is float else delta_to_units(delta)
        period_s = cfg.period_s
        pstart = period_start_of(period_s, pid)
        ws, we = req.window_start, req.window_end
        if req.extra_periods or type(ws) is not int or type(we) is not int or not ws < we <= pstart + period_s:
            _check_extra_periods(req, period_s, pstart)  # (else: a window inside its period touches no later one)
        v = req.quoted_version
        if v is not None and (type(v) is not int or v < 0):
            raise InternalError(f"release quoted_version must be a whole number >= 0 or None, got {v!r}")
        now = self._clock()
        expired = self.past_horizon(int(we), now)
        m, top_field = cfg.capped.get(metric, _UNCAPPED)
        charge = Charge(req, units, delta_units, pstart, cfg.digest, self._terms[req.scope], expired, int(now * 1000))
        raw = await self._charge(charge._replace(max_windows=m, top_field=top_field) if m else charge)
        return ChargeResult(
            _OUTCOMES.get(raw.outcome) or Outcome(raw.outcome),
            raw.payload,
            self._expired_reason() if raw.outcome == "expired" else raw.reason,
            raw.spent_units / raw.cap_units,
            _STATES.get(raw.state) or State(raw.state),
            raw.cost_units,
        )

    async def commit(self, scope: str, release_id: str) -> bool:
        """Mark a charged release published; False when it was already published or is unknown."""
        if scope not in _VALID_SCOPES:
            _check_scope(scope)
        return await self._commit(scope, release_id, int(self._clock() * 1000)) == 1

    async def running_steps(self, scope: str, metric: str, period_id: str) -> dict[int, bytes]:
        """A running total's stored step states in `period_id` under this ledger's topology version:
        window start → the state its charge stored (`ReleaseRequest.running_state`), in one read."""
        if scope not in _VALID_SCOPES:
            _check_scope(scope)
        cfg = self._configs.get(scope)
        if cfg is None:
            raise InternalError(f"scope {scope!r} is not registered with this ledger")
        _, top_field = cfg.capped.get(metric, _UNCAPPED)
        if not top_field:
            raise InternalError(f"metric {metric!r} of scope {scope!r} is not a running total")
        at = (period_id, top_field)
        steps = await self._read(scope, lambda s: dict(s.running.get(at, {})), running=at)
        return {int(start): bytes(state) for start, state in steps.items()}

    async def stored_payload(self, scope: str, release_id: str) -> bytes | None:
        """The final stored payload of a known release_id (None if unknown or past retention).

        Lets a retry of a known window republish its stored bytes even when a fresh quote would
        refuse (budget spent since, breaker open): the charge was made, the value is fixed.
        """
        stored = await self.stored_charge(scope, release_id)
        return None if stored is None else stored.payload

    async def stored_charge(self, scope: str, release_id: str) -> StoredCharge | None:
        """The stored payload of a known release_id and the units its period paid for it (None if unknown
        or past retention): what pricing the other releases of its close in their canonical order takes out."""
        if scope not in _VALID_SCOPES:
            _check_scope(scope)
        return (await self._stored_charges(scope, (release_id,))).get(release_id)

    async def stored_charges(self, scope: str, release_ids: Sequence[str]) -> dict[str, StoredCharge]:
        """`stored_charge` of each of `release_ids`, in one read (the unknown ones left out)."""
        if scope not in _VALID_SCOPES:
            _check_scope(scope)
        return await self._stored_charges(scope, release_ids) if release_ids else {}

    async def pending(self, older_than_s: float) -> list[PendingRelease]:
        """Releases charged longer than `older_than_s` ago and not yet published (for the sweeper)."""
        before = self._now_ms() - int(older_than_s * 1000)
        out: list[PendingRelease] = []
        for scope in await self.scopes():
            out.extend(await self._read(scope, partial(_pending_of, scope, before), before_ms=before))
        return sorted(out, key=lambda p: (p.charged_at_ms, p.release_id))

    async def scopes(self) -> list[str]:
        """Scopes of this ledger's topology, or every registered scope when opened without one."""
        return sorted(self._configs) if self._configs else sorted(await self._scopes())

    async def status(self, scope: str, schedule_start: int | None = None) -> ScopeStatus:
        """Where the scope stands in its current (wall-clock) period. The projection to the period
        end runs at the rate since the period start, or since the schedule start S when S falls
        inside this period (its first: nothing was spent before S); S is `schedule_start`, else the
        one recorded with the scope (`record_schedule_start`: the same for every reader), else the
        one this ledger prices with (a ledger whose workers recorded none with the scope yet)."""
        now = self._clock()
        stored, period_s, pstart, pid = await self._current(scope, now)
        start = schedule_start
        if start is None:
            start = _schedule_start_of(stored)
        if start is None:
            start = self._schedule_start
        since = start if start is not None and pstart < start < now else pstart
        period, breaker = await self._read(
            scope, lambda s: (dict(s.periods.get(pid, {})), _breaker_for(s.breaker, pid)), (pid,)
        )
        cap, reserve, warn = _terms(stored, period)
        accounting = period.get("accounting") or stored["accounting"]
        spent, grant = int(period.get("spent", 0)), int(period.get("grant", 0))
        projected = spent * (pstart + period_s - since) / max(1.0, now - since)
        pool_left, reserve_left = budget_left(cap, reserve, grant, spent)
        spent_f = units_to_float(spent)
        zcdp = accounting == "zcdp"
        delta_cap = int(period.get("delta_cap", stored.get("delta_cap", 0)))
        # at the δ the cap was converted at: the scope's δ less the selection share when a metric selects
        equiv = epsilon_equivalent(zcdp, spent_f, conversion_delta(zcdp, float(stored["delta"]), delta_cap > 0))
        return ScopeStatus(
            scope=scope,
            accounting=accounting,
            period_id=pid,
            period_start=pstart,
            period_end=pstart + period_s,
            cap=units_to_float(cap),
            spent=spent_f,
            ratio=spent / cap,
            epsilon_equiv=equiv.epsilon,
            delta=equiv.delta,
            state=state_of(spent, warn, breaker is not None),
            charged=int(period.get("granted", 0)),
            refused=int(period.get("refused", 0)),
            reserve_left=units_to_float(reserve_left),
            pool_left=units_to_float(pool_left),
            seconds_to_period_end=int(pstart + period_s - now),
            projected_spend=units_to_float(int(projected)),
            projected_ratio=projected / cap,
            warn_at=float(stored["warn_at"]),
            breaker=breaker,
            cap_units=cap,
            spent_units=spent,
            delta_spent=delta_units_to_float(int(period.get("delta_spent", 0))),
            delta_cap=delta_units_to_float(delta_cap),
            schedule_start=start,
        )

    async def history(self, scope: str, limit: int = 30) -> list[PeriodSummary]:
        """The scope's period blocks, newest first."""
        await self._stored(scope)
        newest = partial(sorted, key=_by_start, reverse=True)
        index = await self._read(scope, lambda s: newest(s.period_index.items()), periods=limit)
        blocks = await self._blocks(scope, [pid for pid, _ in index[:limit]])
        return [
            PeriodSummary(pid, start, *(int(blocks[pid].get(name, 0)) for name in _SUMMARY_FIELDS))
            for pid, start in index[:limit]
        ]

    async def audit(self, scope: str, since_ms: int = 0, limit: int | None = None) -> list[AuditEntry]:
        """The scope's audit trail from `since_ms` (epoch ms), oldest first."""
        check_scope_name(scope)
        since = int(since_ms)
        rows = await self._read(
            scope,
            lambda s: [(i, dict(f)) for i, f in s.audit if int(i.split("-")[0]) >= since][:limit],
            since_ms=since,
            limit=limit,
        )
        return [AuditEntry(id=i, kind=AuditKind(f["kind"]), fields=f) for i, f in rows]

    async def reconcile(self, scope: str) -> ReconcileReport:
        """Rebuild each period's spend from the audit stream's charges and compare with the stored spend."""
        await self._stored(scope)
        audited: dict[str, list[int]] = {}
        for entry in await self.audit(scope):
            if entry.kind is AuditKind.CHARGE:
                sums = audited.setdefault(entry.fields["period"], [0, 0])
                sums[0] += int(entry.fields["cost"])
                sums[1] += 1
        pids = sorted(await self._read(scope, lambda s: set(s.period_index), periods=-1) | set(audited))
        blocks = await self._blocks(scope, pids)
        rows = []
        for pid in pids:
            f = blocks[pid]
            a = audited.get(pid, [0, 0])
            rows.append(PeriodReconcile(pid, int(f.get("spent", 0)), a[0], int(f.get("granted", 0)), a[1]))
        return ReconcileReport(scope, tuple(rows))

    async def open_breaker(self, scope: str, reason: str, actor: str) -> bool:
        """Operator opens the scope's breaker (stays open across periods until closed); True if it changed."""
        return await self._operator_breaker(scope, "open", reason, actor)

    async def close_breaker(self, scope: str, reason: str, actor: str) -> bool:
        """Operator closes the breaker (manual and automatic); True if it changed."""
        return await self._operator_breaker(scope, "close", reason, actor)

    async def grant_reserve(self, scope: str, amount: float, reason: str, actor: str) -> int:
        """Operator lets ordinary metrics draw `amount` of the reserve in the current period (audited);
        the period's total grant in units. Refused (ConfigError, nothing written) when more is asked
        than is left to grant: the reserve not yet granted, and no more than the cap has left."""
        _need_reason(reason, actor)
        _, _, pstart, pid = await self._current(scope, self._clock())
        units = grant_to_units(amount)
        outcome, figures = await self._step(scope, (pid,), lambda s: decide_grant(s, pid, pstart, units, reason, actor))
        if outcome == "granted":
            return figures[0]
        left, spent, cap, ungranted = (units_to_float(u) for u in figures)
        if left <= 0:
            why = "the cap is spent" if spent >= cap else "the reserve is already granted in full"
            raise ConfigError(f"budget grant --scope {scope}: nothing left to grant in period {pid}: {why}")
        raise ConfigError(
            f"budget grant --amount {amount:g}: only {left:.6g} is left to grant in {scope}'s period {pid} "
            f"(reserve not yet granted {ungranted:.6g}, cap left {cap - spent:.6g}); grant at most that"
        )

    async def park(
        self,
        scope: str,
        release_id: str,
        metric: str,
        window: tuple[int, int],
        attempts: int,
        error: str,
        actor: str,
    ) -> bool:
        """Hold a window whose release failed `attempts` times on an internal error (`error`: the
        class name); audited. True when parked now, False when it was parked already."""
        _check_scope(scope)
        cfg = self.scope_of(metric) if self._configs else None
        start, end = window
        if not _ERROR_CLASS.fullmatch(error or ""):
            raise InternalError(f"park: error must be a class name, got {error!r}")
        if type(attempts) is not int or attempts < 1:
            raise InternalError(f"park: attempts must be a whole number >= 1, got {attempts!r}")
        for name, value in (("release_id", release_id), ("metric", metric), ("actor", actor)):
            if not value or "\n" in value:
                raise InternalError(f"park: {name} must be non-empty and on one line, got {value!r}")
        period_s = cfg.period_s if cfg is not None else int((await self._stored(scope))["period_s"])
        pid = _period_id(period_s, _period_start(period_s, start))
        step = partial(
            decide_park, release_id=release_id, metric=metric, window=(int(start), int(end)), attempts=attempts,
            error=error, actor=actor, pid=pid, now_ms=self._now_ms(),
        )  # fmt: skip
        return await self._step(scope, (), step, parked=True)

    async def parked(self, scope: str) -> list[ParkedRelease]:
        """The scope's parked windows (held, or waiting for the worker's retry), oldest first."""
        _check_scope(scope)
        rows = await self._read(
            scope, lambda s: [_parked_from_json(scope, r, json.loads(e)) for r, e in s.parked.items()]
        )
        return sorted(rows, key=lambda p: (p.parked_at_ms, p.release_id))

    async def retry_parked(self, scope: str, release_id: str | None, reason: str, actor: str) -> int:
        """Operator: let the worker retry one parked window (or all with None); audited with actor and
        reason. Returns how many went from parked to retry."""
        _need_reason(reason, actor)
        await self._stored(scope)
        step = partial(decide_retry, release_id=release_id or "", actor=actor, reason=reason, now_ms=self._now_ms())
        return await self._step(scope, (), step, parked=True)

    async def unpark(self, scope: str, release_id: str, outcome: str, actor: str) -> bool:
        """A retried parked window's release finished (`outcome`): it leaves the parked set; audited."""
        _check_scope(scope)
        return await self._step(
            scope, (), partial(decide_unpark, release_id=release_id, outcome=outcome, actor=actor), parked=True
        )

    async def close(self) -> None:  # noqa: B027 - an optional hook: a no-op unless a backend holds connections
        """Release connections (no-op for the in-process backend)."""

    # ---- helpers -------------------------------------------------------------------------------

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    async def _stored(self, scope: str) -> dict[str, str]:
        check_scope_name(scope)
        stored = await self._read(scope, lambda s: dict(s.config))
        if not stored:
            known = ", ".join(await self._scopes()) or "none"
            raise ConfigError(
                f"budget scope {scope!r} is not registered in the ledger (registered: {known}): "
                "check --scope, or start a worker with the topology first"
            )
        return stored

    async def _current(self, scope: str, now: float) -> tuple[dict[str, str], int, int, str]:
        """A registered scope's config and period length, and the start and id of its period at `now`."""
        stored = await self._stored(scope)
        period_s = int(stored["period_s"])
        pstart = _period_start(period_s, now)
        return stored, period_s, pstart, _period_id(period_s, pstart)

    async def _blocks(self, scope: str, pids: Sequence[str]) -> dict[str, dict[str, str]]:
        """The period blocks `pids` as stored (empty: not opened), in one read."""
        return await self._read(scope, lambda s: {pid: dict(s.periods.get(pid, {})) for pid in pids}, pids)

    async def _operator_breaker(self, scope: str, action: str, reason: str, actor: str) -> bool:
        _need_reason(reason, actor)
        pid = (await self._current(scope, self._clock()))[3]
        now_ms = self._now_ms()
        return await self._step(scope, (), lambda s: decide_breaker(s, action, reason, actor, pid, now_ms))

    # ---- backend primitives ---------------------------------------------------------------------

    async def _index_scope(self, scope: str) -> None:  # noqa: B027 - an optional hook: a no-op in process
        """List a registered scope in the namespace's scope index (Redis: its own key, another slot)."""

    @abstractmethod
    async def _set_nx(self, key: str, proposed: str) -> str | None:
        """Set the namespace-wide `key` (a deployment's start, the ledger id) to `proposed` if absent;
        the stored value either way (None: this backend keeps no such key)."""

    async def _get(self, key: str) -> str | None:
        """The value of a namespace-wide `key`, or None; a backend that does not answer it reads as None
        (the in-process ledger: its readers share the ledger object and read `schedule_start` instead)."""
        return None

    async def _quote_snapshot(self, scope: str, pid: str, metrics: Sequence[str], window_end: int) -> Snapshot | None:
        """What `quote` prices from, in one consistent read; None when the scope is not registered.

        Built from `_snapshot`'s hashes; a backend may answer it directly (without copying them)."""
        stored, breaker, period, counts, before, at = await self._snapshot(scope, pid, metrics, window_end)
        if not stored:
            return None
        cap, reserve, warn = _terms(stored, period)
        capped = self._configs[scope].capped
        return Snapshot(
            cap,
            reserve,
            warn,
            int(period.get("spent", 0)),
            int(period.get("grant", 0)),
            _breaker_for(breaker, pid),
            counts,
            int(period.get("version", 0)),
            {name: topm.parse(period.get(field)) for name, (_, field) in capped.items()} if capped else {},
            before,
            at,
        )

    @abstractmethod
    async def _snapshot(
        self, scope: str, pid: str, metrics: Sequence[str], window_end: int
    ) -> tuple[dict[str, str], dict[str, str], dict[str, str], dict[str, int], dict[str, int], dict[str, int]]:
        """(config, breaker, period, and per metric the counts of its charges of the period ending at or
        after `window_end`, before it, and at it) in one consistent read."""

    @abstractmethod
    async def _charged_ends(
        self, scope: str, pid: str, metrics: Sequence[str], since: int | None
    ) -> tuple[int, dict[str, dict[str, int]]]:
        """(the period's spend version, per metric: release_id → window end of its charges of the
        period, those ending at or after `since` when given) in one consistent read."""

    @abstractmethod
    async def _charge(self, charge: Charge) -> RawCharge:
        """Decide `charge` (`decision.decide`) on the scope as stored and apply its writes, atomically."""

    @abstractmethod
    async def _commit(self, scope: str, release_id: str, now_ms: int) -> int: ...

    @abstractmethod
    async def _stored_charges(self, scope: str, release_ids: Sequence[str]) -> dict[str, StoredCharge]:
        """The stored charge of each known release of `release_ids`, in one read."""

    @abstractmethod
    async def _step(
        self,
        scope: str,
        pids: Sequence[str],
        decide: Callable[[ScopeState], tuple[_A, Sequence[Op]]],
        *,
        parked: bool = False,
    ) -> _A:
        """Read the scope (its config, breaker, period index, the blocks `pids`, and with `parked` its
        parked windows), `decide`, and apply the writes decided, atomically; the answer decided."""

    async def _read(
        self,
        scope: str,
        read: Callable[[ScopeState], _A],
        pids: Sequence[str] = (),
        *,
        periods: int = 0,
        since_ms: int | None = None,
        before_ms: int | None = None,
        limit: int | None = None,
        running: tuple[str, str] | None = None,
    ) -> _A:
        """`read` of the scope's state as one read that writes nothing: its config, breaker, parked
        windows and blocks `pids`; the `periods` newest entries of its period index (-1: all); with
        `since_ms` its audit entries from then (at most `limit`), with `before_ms` its releases pending
        since then at the latest, and their records; with `running` (period id, top field) that running
        total's stored steps. A backend holding the whole `ScopeState` (in
        process) answers it as a step deciding no write, everything in reach."""
        return await self._step(scope, pids, lambda s: (read(s), ()), parked=True)

    @abstractmethod
    async def _scopes(self) -> list[str]: ...


def _check_extra_periods(req: ReleaseRequest, period_s: int, pstart: int) -> None:
    """A window is charged to every period it touches: `extra_periods` must name exactly the
    periods after `req.period_id` that [window_start, window_end) overlaps."""
    ws, we = req.window_start, req.window_end
    if not req.extra_periods and type(ws) is int and type(we) is int and ws < we <= pstart + period_s:
        return  # the common case: a non-empty window that ends inside its own period touches no later one
    touched = _periods_touched(period_s, req.window_start, req.window_end)
    expected = tuple((_period_id(period_s, p), p) for p in touched if p > pstart)
    given = tuple((str(pid), int(start)) for pid, start in req.extra_periods)
    if given != expected:
        raise InternalError(
            f"release {req.release_id}: window [{req.window_start}, {req.window_end}) touches later periods "
            f"{list(expected)}, the request names {list(given)}: "
            "a straddling window is charged to every period it touches"
        )


def _refused_change(cfg: ScopeConfig, raw: RawRegister, pid: str, period_end: int) -> ConfigError:
    """The one-line error of a registration that would change an open period's terms."""
    cap = units_to_float(raw.block_cap_units)
    if raw.what == "accounting":
        change = f"accounting {raw.block_accounting} -> {cfg.accounting.value}"
    elif raw.what == "cap":
        change = f"cap {cap:.6g} -> {units_to_float(cfg.cap_units):.6g} (smaller)"
    else:
        change = f"period {raw.stored_period_s} s -> {cfg.period_s} s"
    return ConfigError(
        f"budget scope {cfg.name!r}: {change} while period {pid} is open: the change takes effect only from "
        f"the next period; keep accounting {raw.block_accounting}, cap >= {cap:.6g} and period "
        f"{raw.stored_period_s} s until {iso(period_end)}, or use a new scope name"
    )


def _check_start(start: object) -> None:
    if isinstance(start, bool) or not isinstance(start, int) or start < 0:
        raise InternalError(f"schedule start must be whole epoch seconds >= 0, got {start!r}")


def _schedule_start_of(stored: Mapping[str, str]) -> int | None:
    """The S recorded with a scope (its config hash's `schedule_start`: `steps.decide_schedule`), or None."""
    raw = stored.get("schedule_start")
    return int(raw) if raw else None


def _need_reason(reason: str, actor: str) -> None:
    if not reason or not reason.strip():
        raise ConfigError('--reason "…": an operator action needs a reason (it goes to the audit trail)')
    if not actor or not actor.strip():
        raise ConfigError("--actor: an operator action needs an actor name (it goes to the audit trail)")


def _breaker_for(fields: Mapping[str, str], pid: str) -> BreakerInfo | None:
    """The breaker that holds period `pid` open: the manual one, or an automatic open of this period."""
    if fields.get("manual") == "1":
        return BreakerInfo(
            True, fields.get("manual_reason", ""), fields.get("manual_actor", ""), int(fields.get("manual_at", 0))
        )
    if fields.get("auto_period") == pid:
        return BreakerInfo(False, fields.get("auto_reason", ""), "ledger", int(fields.get("auto_at", 0)), pid)
    return None


def _by_start(row: tuple[str, int]) -> tuple[int, str]:
    """A period index entry's sort key: by start, as the Redis sorted set (ties by period id)."""
    return row[1], row[0]


def _pending_of(scope: str, before_ms: int, s: ScopeState) -> list[PendingRelease]:
    """The scope's releases charged at `before_ms` or earlier and not yet published (a release whose
    record is gone, past retention, is left out)."""
    out = []
    for rid, at in s.pending.items():
        r = s.releases.get(rid)
        if at <= before_ms and r:
            cost, ws, we = int(r["cost"]), int(r["window_start"]), int(r["window_end"])
            out.append(PendingRelease(rid, scope, str(r["period"]), str(r["metric"]), ws, we, cost, at, r["payload"]))
    return out


def _parked_from_json(scope: str, release_id: str, doc: Mapping[str, object]) -> ParkedRelease:
    """A `ParkedRelease` from a parked window's JSON entry (`steps.decide_park`)."""

    def num(name: str) -> int:
        value = doc.get(name, 0)
        return int(value) if isinstance(value, (int, float, str)) else 0

    return ParkedRelease(
        release_id=release_id,
        scope=scope,
        metric=str(doc.get("metric", "")),
        window_start=num("window_start"),
        window_end=num("window_end"),
        attempts=num("attempts"),
        error=str(doc.get("error", "")),
        parked_at_ms=num("parked_at"),
        state=str(doc.get("state", "parked")),
        retry_actor=str(doc.get("retry_actor", "")),
        retry_reason=str(doc.get("retry_reason", "")),
    )
