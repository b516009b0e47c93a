"""The in-process ledger backend (offline `replay`, unit tests): the scripts' writes on dicts.

A charge reads a `decision.View` of the scope's dicts, `decide`s and applies the `Decision`;
the other steps are the small `.lua` scripts ported to Python.

Same contract as the Redis backend, checked by one contract test suite. Each step runs without
awaiting, under a lock, so it is atomic for every task and thread of the process. Nothing is
durable and release records never expire.
"""

from __future__ import annotations

__all__ = ["MemoryLedger"]

import threading
from bisect import bisect_left, insort
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dpstream.topology.errors import InternalError
from dpstream.workers.ledger.base import (
    REGISTER_REFUSED,
    REGISTER_RETRY,
    ChargeTerms,
    Ledger,
    RawCharge,
    RawRegister,
    parked_from_json,
)
from dpstream.workers.ledger.decision import Charge, Decision, View, decide
from dpstream.workers.ledger.types import ParkedRelease, PendingRelease, ReleaseRequest

_ALWAYS = ("kind", "period", "spent", "ratio", "actor")
"""Audit fields every entry carries; other empty fields are left out (as the scripts' XADD does)."""

_AUTO_FIELDS = ("auto_period", "auto_start", "auto_reason", "auto_at")
"""The breaker's automatic open."""


@dataclass
class _Scope:
    """Everything one scope's Redis keys hold, as Python values."""

    config: dict[str, str] = field(default_factory=dict)
    breaker: dict[str, str] = field(default_factory=dict)
    periods: dict[str, dict[str, str]] = field(default_factory=dict)
    period_index: dict[str, int] = field(default_factory=dict)
    releases: dict[str, dict[str, str | bytes]] = field(default_factory=dict)
    """A release's hash: text fields, and `payload` as bytes."""
    ends: dict[tuple[str, str], dict[str, int]] = field(default_factory=dict)
    ends_sorted: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    """The scores of each `ends` zset in order, so ZCOUNT end +inf is a bisection, not a scan."""
    audit: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    pending: dict[str, int] = field(default_factory=dict)
    parked: dict[str, dict[str, Any]] = field(default_factory=dict)
    """park.lua's hash: release id → its (JSON) entry."""
    view: View = field(init=False, repr=False, compare=False)
    """What a charge reads of a new release id: the dicts above themselves (never replaced, only
    changed in place), so a charge builds no View unless its release id is known."""

    def __post_init__(self) -> None:
        self.view = View(self.config, self.breaker, self.periods, self.period_index, None)


def _zadd(s: _Scope, key: tuple[str, str], member: str, score: int) -> None:
    """ZADD key score member: a member's score is replaced, never counted twice."""
    members = s.ends.get(key)
    if members is None:
        members = s.ends[key] = {}
    scores = s.ends_sorted.get(key)
    if scores is None:
        scores = s.ends_sorted[key] = []
    old = members.get(member)
    if old is not None:
        del scores[bisect_left(scores, old)]
    members[member] = score
    if not scores or scores[-1] <= score:
        scores.append(score)  # = insort, without the bisection: windows mostly close in order
    else:
        insort(scores, score)


def _zcount_from(s: _Scope, key: tuple[str, str], low: int) -> int:
    """ZCOUNT key low +inf."""
    scores = s.ends_sorted.get(key)
    if not scores or scores[-1] < low:
        return 0  # none ends this late (the common case: a bisection touches the whole list's cache lines)
    return len(scores) - bisect_left(scores, low)


def _incr(h: dict[str, str], name: str, by: int) -> int:
    value = int(h.get(name, 0)) + by
    h[name] = str(value)
    return value


def _payload(release: dict[str, str | bytes]) -> bytes:
    payload = release["payload"]
    assert isinstance(payload, bytes)  # the reserve step stores it as bytes
    return payload


class MemoryLedger(Ledger):
    """A ledger held in this process's memory."""

    backend = "memory"

    @property
    def idempotency_horizon_s(self) -> int | None:
        """None: release records are never dropped here, so no window is past the horizon."""
        return None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()
        self._store: dict[str, _Scope] = {}
        self._deploy: dict[str, int] = {}
        self._last_id = (0, -1)

    def _scope(self, scope: str) -> _Scope:
        s = self._store.get(scope)
        if s is None:
            s = self._store[scope] = _Scope()
        return s

    def _next_audit_id(self, now_ms: int) -> str:
        """XADD's id `*`: `ms-seq`, strictly increasing even when the clock stands still or steps back."""
        ms, seq = self._last_id
        self._last_id = last = (now_ms, 0) if now_ms > ms else (ms, seq + 1)
        return f"{last[0]}-{last[1]}"

    def _xadd(self, s: _Scope, now_ms: int, fields: dict[str, str]) -> None:
        entry = {k: v for k, v in fields.items() if v != "" or k in _ALWAYS}
        s.audit.append((self._next_audit_id(now_ms), entry))

    # ---- the scripts -------------------------------------------------------------------------

    async def _register(
        self, scope: str, fields: dict[str, str], actor: str, now_ms: int, pid: str, period_s: int
    ) -> RawRegister:
        with self._lock:
            s = self._scope(scope)
            old = s.config.get("digest")
            if old == fields["digest"]:
                return RawRegister(0)
            if old:
                stored_period = s.config.get("period_s")
                if stored_period != str(period_s):
                    return RawRegister(REGISTER_RETRY)
                blk = s.periods.get(pid, {})
                if "cap" in blk:
                    acc = blk.get("accounting") or s.config.get("accounting", "")
                    what = ""
                    if fields["accounting"] != acc:
                        what = "accounting"
                    elif int(fields["cap"]) < int(blk["cap"]):
                        what = "cap"
                    elif fields["period_s"] != stored_period:
                        what = "period"
                    if what:
                        return RawRegister(REGISTER_REFUSED, what, acc, int(blk["cap"]), int(stored_period))
                length = int(fields["period_s"])
                if fields["period_s"] != stored_period and length > 0:  # register.lua: a block inside the new period
                    start = now_ms // 1000 - now_ms // 1000 % length
                    if any(start <= b < start + length for b in s.period_index.values()):
                        acc = s.config.get("accounting", "")
                        return RawRegister(REGISTER_REFUSED, "period", acc, int(s.config["cap"]), int(stored_period))
            s.config.update(fields)
            s.config["registered_at"] = str(now_ms)
            reason = f"config changed {old} -> {fields['digest']}" if old else f"config registered {fields['digest']}"
            self._xadd(s, now_ms, {"kind": "config", "cost": s.config["cap"], "reason": reason, "actor": actor})
            return RawRegister(1)

    async def _deployment_start(self, key: str, proposed: int) -> int:
        with self._lock:
            return self._deploy.setdefault(key, proposed)

    async def _scope_schedule_start(self, scope: str, start: int) -> int | None:
        with self._lock:  # schedule.lua: a registered scope keeps the first S recorded with it
            s = self._store.get(scope)
            if s is None or "digest" not in s.config:
                return None
            return int(s.config.setdefault("schedule_start", str(start)))

    async def _charge(
        self,
        req: ReleaseRequest,
        cost_units: int,
        delta_units: int,
        period_start: int,
        digest: str,
        now_ms: int,
        terms: ChargeTerms,
        expired: bool,
    ) -> RawCharge:
        with self._lock:  # read the view, decide, apply: no await in between
            s = self._store.get(req.scope)
            if s is None or not s.config:
                raise InternalError(f"reserve: scope not registered ({req.scope})")
            known = s.releases.get(req.release_id)
            view = s.view if known is None else s.view._replace(known=_payload(known))
            charge = Charge(req, cost_units, delta_units, period_start, digest, terms, expired, now_ms)
            decision = decide(view, charge)
            self._apply(s, charge, decision)
            return decision.answer

    def _apply(self, s: _Scope, c: Charge, d: Decision) -> None:
        """Make a decision's writes, in charge.lua's order (blocks, counters, breaker, release, audit)."""
        periods, req, now_ms = s.periods, c.req, c.now_ms
        for pid, start, terms in d.opened:
            s.period_index[pid] = start
            periods.setdefault(pid, {}).update(terms)
        rid, metric, end = req.release_id, req.metric, int(req.window_end)
        for pid, (spent, delta_spent, granted, version) in zip(d.charged, d.counters, strict=True):
            block = periods[pid]
            block["spent"], block["delta_spent"], block["granted"], block["version"] = (
                spent,
                delta_spent,
                granted,
                version,
            )
            _zadd(s, (pid, metric), rid, end)
        if d.refused_in is not None:
            _incr(periods.setdefault(d.refused_in, {}), "refused", 1)
        if d.breaker_drop_auto:
            for name in _AUTO_FIELDS:
                s.breaker.pop(name, None)
        if d.breaker_set:
            s.breaker.update(d.breaker_set)
            _incr(periods.setdefault(d.breaker_set["auto_period"], {}), "version", 1)
        if d.release is not None:
            s.releases[rid] = d.release
            s.pending[rid] = now_ms
        audit, next_id = s.audit, self._next_audit_id
        for entry in d.audit:
            audit.append((next_id(now_ms), entry))

    async def _commit(self, scope: str, release_id: str, now_ms: int) -> int:
        with self._lock:
            s = self._scope(scope)
            rel = s.releases.get(release_id)
            if rel is None:
                return 0
            if rel["state"] == "published":
                return 2
            rel["state"] = "published"
            rel["published_at"] = str(now_ms)
            s.pending.pop(release_id, None)
            return 1

    async def _breaker(self, scope: str, action: str, reason: str, actor: str, pid: str, now_ms: int) -> bool:
        with self._lock:
            s = self._scope(scope)
            br = s.breaker
            fields = {"period": pid, "reason": reason, "actor": actor}
            if action == "open":
                if br.get("manual") == "1":
                    return False
                br.update(manual="1", manual_reason=reason, manual_actor=actor, manual_at=str(now_ms))
                self._xadd(s, now_ms, {**fields, "kind": "breaker_open", "state": "open"})
                return True
            if br.get("manual") != "1" and "auto_period" not in br:
                return False
            br.clear()
            self._xadd(s, now_ms, {**fields, "kind": "breaker_close", "state": "closed"})
            return True

    async def _grant(
        self, scope: str, pid: str, pstart: int, units: int, reason: str, actor: str, now_ms: int
    ) -> tuple[str, list[int]]:
        with self._lock:
            s = self._scope(scope)
            if not s.config:
                raise InternalError(f"grant: scope not registered ({scope})")
            # what is left to grant (grant.lua): the block's own terms once opened, the config's before
            terms = s.periods.get(pid, {})
            cap = int(terms.get("cap", s.config["cap"]))
            reserve = int(terms.get("reserve", s.config["reserve"]))
            spent = int(terms.get("spent", 0))
            ungranted = max(0, reserve - int(terms.get("grant", 0)))
            left = max(0, min(ungranted, cap - spent))
            if units > left:
                return "refused", [left, spent, cap, ungranted]
            block = s.periods.setdefault(pid, {})
            if pid not in s.period_index:  # a block opened here takes the config's terms, as reserve's would
                s.period_index[pid] = pstart
                cfg = s.config
                block.update(
                    cap=cfg["cap"],
                    reserve=cfg["reserve"],
                    warn=cfg["warn"],
                    accounting=cfg.get("accounting", ""),
                    delta_cap=cfg.get("delta_cap", "0"),
                    start=str(pstart),
                )
                if "period_s" in cfg:  # the block's own length, which every later charge checks (grant.lua)
                    block["period_s"] = cfg["period_s"]
                self._xadd(
                    s, now_ms, {"kind": "period", "period": pid, "reason": "period block opened", "actor": "ledger"}
                )
            total = _incr(block, "grant", units)
            _incr(block, "version", 1)
            self._xadd(
                s, now_ms, {"kind": "grant", "period": pid, "cost": str(units), "reason": reason, "actor": actor}
            )
            if s.breaker.get("auto_period") == pid:
                for name in ("auto_period", "auto_start", "auto_reason", "auto_at"):
                    s.breaker.pop(name, None)
                self._xadd(
                    s,
                    now_ms,
                    {"kind": "breaker_close", "period": pid, "reason": "reserve granted: " + reason, "actor": actor},
                )
            return "granted", [total]

    async def _park(
        self,
        scope: str,
        release_id: str,
        metric: str,
        start: int,
        end: int,
        attempts: int,
        error: str,
        actor: str,
        pid: str,
        now_ms: int,
    ) -> bool:
        with self._lock:
            s = self._scope(scope)
            old = s.parked.get(release_id)
            if old is not None and old["state"] == "parked":
                return False
            s.parked[release_id] = {
                "metric": metric,
                "window_start": start,
                "window_end": end,
                "period": pid,
                "attempts": attempts,
                "error": error,
                "parked_at": now_ms,
                "state": "parked",
                "actor": actor,
            }
            self._xadd(
                s,
                now_ms,
                {
                    "kind": "park",
                    "period": pid,
                    "release_id": release_id,
                    "metric": metric,
                    "window_start": str(start),
                    "window_end": str(end),
                    "attempts": str(attempts),
                    "error": error,
                    "actor": actor,
                    "state": "parked",
                    "reason": f"release failed {attempts} times on an internal error ({error}): "
                    "parked until `dpstream budget retry`",
                },
            )
            return True

    async def _retry_parked(self, scope: str, release_id: str, actor: str, reason: str, now_ms: int) -> int:
        with self._lock:
            s = self._scope(scope)
            ids = [release_id] if release_id else list(s.parked)
            n = 0
            for rid in ids:
                e = s.parked.get(rid)
                if e is None or e["state"] != "parked":
                    continue
                e.update(state="retry", retry_actor=actor, retry_reason=reason, retry_at=now_ms)
                self._xadd(
                    s,
                    now_ms,
                    {
                        "kind": "retry",
                        "period": e["period"],
                        "release_id": rid,
                        "metric": e["metric"],
                        "attempts": str(e["attempts"]),
                        "actor": actor,
                        "state": "retry",
                        "reason": reason,
                    },
                )
                n += 1
            return n

    async def _unpark(self, scope: str, release_id: str, outcome: str, actor: str, now_ms: int) -> bool:
        with self._lock:
            s = self._scope(scope)
            e = s.parked.pop(release_id, None)
            if e is None:
                return False
            self._xadd(
                s,
                now_ms,
                {
                    "kind": "unpark",
                    "period": e["period"],
                    "release_id": release_id,
                    "metric": e["metric"],
                    "actor": actor,
                    "state": outcome,
                    "reason": f"parked window released after a retry ({outcome})",
                },
            )
            return True

    # ---- reads -----------------------------------------------------------------------------------

    async def _parked(self, scope: str) -> list[ParkedRelease]:
        with self._lock:
            return [parked_from_json(scope, rid, dict(e)) for rid, e in self._scope(scope).parked.items()]

    async def _snapshot(
        self, scope: str, pid: str, metrics: Sequence[str], window_end: int
    ) -> tuple[dict[str, str], dict[str, str], dict[str, str], dict[str, int]]:
        with self._lock:
            s = self._scope(scope)
            counts = {m: _zcount_from(s, (pid, m), window_end) for m in metrics}
            return dict(s.config), dict(s.breaker), dict(s.periods.get(pid, {})), counts

    async def _stored_payload(self, scope: str, release_id: str) -> bytes | None:
        with self._lock:
            s = self._store.get(scope) or self._scope(scope)
            rel = s.releases.get(release_id)
            return None if rel is None else bytes(_payload(rel))

    async def _pending(self, scope: str, before_ms: int) -> list[PendingRelease]:
        with self._lock:
            s = self._scope(scope)
            out = []
            for rid, at in sorted(s.pending.items(), key=lambda kv: (kv[1], kv[0])):
                if at > before_ms:
                    continue
                r = s.releases[rid]
                out.append(
                    PendingRelease(
                        rid,
                        scope,
                        str(r["period"]),
                        str(r["metric"]),
                        int(r["window_start"]),
                        int(r["window_end"]),
                        int(r["cost"]),
                        at,
                        _payload(r),
                    )
                )
            return out

    async def _config_fields(self, scope: str) -> dict[str, str]:
        with self._lock:
            return dict(self._store[scope].config) if scope in self._store else {}

    async def _breaker_fields(self, scope: str) -> dict[str, str]:
        with self._lock:
            return dict(self._scope(scope).breaker)

    async def _period_fields(self, scope: str, pid: str) -> dict[str, str]:
        with self._lock:
            return dict(self._scope(scope).periods.get(pid, {}))

    async def _period_ids(self, scope: str, limit: int | None) -> list[tuple[str, int]]:
        with self._lock:
            rows = sorted(self._scope(scope).period_index.items(), key=lambda kv: (-kv[1], kv[0]))
            return rows if limit is None else rows[:limit]

    async def _audit(self, scope: str, since_ms: int, limit: int | None) -> list[tuple[str, dict[str, str]]]:
        with self._lock:
            rows = [(i, dict(f)) for i, f in self._scope(scope).audit if int(i.split("-")[0]) >= since_ms]
            return rows if limit is None else rows[:limit]

    async def _scopes(self) -> list[str]:
        with self._lock:
            return sorted(name for name, s in self._store.items() if s.config)
