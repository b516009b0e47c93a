"""The in-process ledger backend (offline `replay`, unit tests): the `.lua` scripts ported to Python.

Same contract as the Redis backend, checked by one contract test suite. Each step runs without
awaiting, under a lock, so it is atomic for every task and thread of the process. Nothing is
durable and release records never expire.
"""

from __future__ import annotations

__all__ = ["MemoryLedger"]

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from workers.ledger.base import Ledger, RawReserve
from workers.ledger.types import RATIO_TOKEN, PendingRelease, ReleaseRequest

_ALWAYS = ("kind", "period", "spent", "ratio", "actor")
"""Audit fields every reserve entry carries; other empty fields are left out (as reserve.lua does)."""


@dataclass
class _Scope:
    """Everything one scope's Redis keys hold, as Python values."""

    config: dict[str, str] = field(default_factory=dict)
    breaker: dict[str, str] = field(default_factory=dict)
    periods: dict[str, dict[str, str]] = field(default_factory=dict)
    period_index: dict[str, int] = field(default_factory=dict)
    releases: dict[str, dict[str, object]] = field(default_factory=dict)
    ends: dict[tuple[str, str], dict[str, int]] = field(default_factory=dict)
    audit: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    pending: dict[str, int] = field(default_factory=dict)


def _incr(h: dict[str, str], name: str, by: int) -> int:
    value = int(h.get(name, 0)) + by
    h[name] = str(value)
    return value


class MemoryLedger(Ledger):
    """A ledger held in this process's memory."""

    backend = "memory"

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._lock = threading.Lock()
        self._store: dict[str, _Scope] = {}
        self._last_id = (0, -1)

    def _scope(self, scope: str) -> _Scope:
        return self._store.setdefault(scope, _Scope())

    def _xadd(self, s: _Scope, now_ms: int, fields: dict[str, str]) -> None:
        ms, seq = self._last_id
        self._last_id = (now_ms, 0) if now_ms > ms else (ms, seq + 1)
        entry = {k: v for k, v in fields.items() if v != "" or k in _ALWAYS}
        s.audit.append((f"{self._last_id[0]}-{self._last_id[1]}", entry))

    # ---- the scripts -------------------------------------------------------------------------

    async def _register(self, scope: str, fields: dict[str, str], actor: str, now_ms: int) -> bool:
        with self._lock:
            s = self._scope(scope)
            old = s.config.get("digest")
            if old == fields["digest"]:
                return False
            s.config.update(fields)
            s.config["registered_at"] = str(now_ms)
            reason = f"config changed {old} -> {fields['digest']}" if old else f"config registered {fields['digest']}"
            self._xadd(s, now_ms, {"kind": "config", "cost": s.config["cap"], "reason": reason, "actor": actor})
            return True

    async def _reserve(self, req: ReleaseRequest, cost_units: int, period_start: int, now_ms: int) -> RawReserve:
        with self._lock:
            return self._reserve_locked(req, cost_units, period_start, now_ms)

    def _reserve_locked(self, req: ReleaseRequest, cost: int, pstart: int, now_ms: int) -> RawReserve:
        s = self._scope(req.scope)
        pid, rid = req.period_id, req.release_id
        if not s.config:
            from topology.errors import InternalError

            raise InternalError(f"reserve: scope not registered ({req.scope})")
        cap, reserve, warn = int(s.config["cap"]), int(s.config["reserve"]), int(s.config["warn"])
        br = s.breaker
        per = s.periods.get(pid, {})
        spent, grant = int(per.get("spent", 0)), int(per.get("grant", 0))
        manual = br.get("manual") == "1"
        auto_here = br.get("auto_period") == pid
        auto_stale = "auto_period" in br and not auto_here and int(br["auto_start"]) < pstart

        def state_of(x: int, is_open: bool) -> str:
            return "open" if is_open else ("warning" if x >= warn else "normal")

        def ratio_of(x: int) -> str:
            return "%.6f" % (x / cap)

        known = s.releases.get(rid)
        if known is not None:
            return RawReserve("duplicate", known["payload"], "", spent, cap, state_of(spent, manual or auto_here), 0)  # type: ignore[arg-type]

        def audit(kind: str, **fields: str) -> None:
            base = {"kind": kind, "period": pid, "spent": str(spent), "ratio": ratio_of(spent), "actor": req.actor}
            base.update(fields)
            self._xadd(s, now_ms, base)

        def touch_period() -> dict[str, str]:
            block = s.periods.setdefault(pid, {})
            if pid not in s.period_index:
                s.period_index[pid] = pstart
                block.update(cap=s.config["cap"], reserve=s.config["reserve"], start=str(pstart))
                audit("period", reason="period block opened", actor="ledger", state=state_of(spent, manual))
            return block

        if auto_stale:
            old = br["auto_period"]
            for name in ("auto_period", "auto_start", "auto_reason", "auto_at"):
                br.pop(name, None)
            audit("breaker_close", reason=f"period rollover: automatic open of {old} ends", actor="ledger",
                  state=state_of(spent, manual))

        def refuse(reason: str, open_now: bool) -> RawReserve:
            block = touch_period()
            _incr(block, "refused", 1)
            is_open = manual or auto_here or open_now
            audit("refusal", release_id=rid, metric=req.metric, cost=str(cost), reason=reason,
                  state=state_of(spent, is_open))
            if open_now and not (manual or auto_here):
                br.update(auto_period=pid, auto_start=str(pstart), auto_reason=reason, auto_at=str(now_ms))
                audit("breaker_open", reason=reason, actor="ledger", state="open")
            return RawReserve("refused", b"", reason, spent, cap, state_of(spent, is_open), 0)

        if manual:
            return refuse("breaker open (manual): " + br.get("manual_reason", ""), False)
        if auto_here:
            return refuse("breaker open (automatic): " + br.get("auto_reason", ""), False)
        if spent + cost > cap:
            return refuse(f"budget exhausted: cost {cost} exceeds the {cap - spent} units left of the cap", True)
        limit = cap - reserve + grant
        if req.may_use_reserve or limit > cap:
            limit = cap
        if spent + cost > limit:
            return refuse(
                f"pool exhausted: cost {cost} exceeds the {max(0, limit - spent)} units left outside the reserve "
                "(only may_use_reserve metrics or an operator grant draw on it)",
                False,
            )

        before = state_of(spent, False)
        block = touch_period()
        after_spent = _incr(block, "spent", cost)
        _incr(block, "granted", 1)
        ratio = ratio_of(after_spent)
        payload = bytes(req.payload).replace(RATIO_TOKEN, b'"ratio_after":' + ratio.encode(), 1)
        s.releases[rid] = {
            "state": "reserved", "period": pid, "metric": req.metric, "window_start": str(req.window_start),
            "window_end": str(req.window_end), "cost": str(cost), "payload": payload, "ratio_after": ratio,
            "reserved_at": str(now_ms),
        }
        s.ends.setdefault((pid, req.metric), {})[rid] = int(req.window_end)
        s.pending[rid] = now_ms
        spent = after_spent
        after = state_of(after_spent, False)
        audit("charge", release_id=rid, metric=req.metric, cost=str(cost), state=after)
        if after != before:
            audit("state", reason=f"{before} -> {after} at ratio {ratio}", actor="ledger", state=after)
        return RawReserve("granted", payload, "", after_spent, cap, after, cost)

    async def _commit(self, scope: str, release_id: str, now_ms: int) -> int:
        with self._lock:
            rel = self._scope(scope).releases.get(release_id)
            if rel is None:
                return 0
            if rel["state"] == "published":
                return 2
            rel.update(state="published", published_at=str(now_ms))
            self._scope(scope).pending.pop(release_id, None)
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

    async def _grant(self, scope: str, pid: str, pstart: int, units: int, reason: str, actor: str, now_ms: int) -> int:
        with self._lock:
            s = self._scope(scope)
            block = s.periods.setdefault(pid, {})
            block.update(cap=s.config["cap"], reserve=s.config["reserve"], start=str(pstart))
            s.period_index.setdefault(pid, pstart)
            total = _incr(block, "grant", units)
            self._xadd(s, now_ms, {"kind": "grant", "period": pid, "cost": str(units), "reason": reason, "actor": actor})
            if s.breaker.get("auto_period") == pid:
                for name in ("auto_period", "auto_start", "auto_reason", "auto_at"):
                    s.breaker.pop(name, None)
                self._xadd(s, now_ms, {"kind": "breaker_close", "period": pid, "reason": "reserve granted: " + reason,
                                       "actor": actor})
            return total

    # ---- reads -----------------------------------------------------------------------------------

    async def _snapshot(
        self, scope: str, pid: str, metrics: Sequence[str], window_end: int
    ) -> tuple[dict[str, str], dict[str, str], dict[str, str], dict[str, int]]:
        with self._lock:
            s = self._scope(scope)
            counts = {m: sum(1 for end in s.ends.get((pid, m), {}).values() if end >= window_end) for m in metrics}
            return dict(s.config), dict(s.breaker), dict(s.periods.get(pid, {})), counts

    async def _stored_payload(self, scope: str, release_id: str) -> bytes | None:
        with self._lock:
            rel = self._scope(scope).releases.get(release_id)
            return bytes(rel["payload"]) if rel is not None else None  # type: ignore[arg-type]

    async def _pending(self, scope: str, before_ms: int) -> list[PendingRelease]:
        with self._lock:
            s = self._scope(scope)
            out = []
            for rid, at in sorted(s.pending.items(), key=lambda kv: (kv[1], kv[0])):
                if at > before_ms:
                    continue
                r = s.releases[rid]
                out.append(PendingRelease(rid, scope, str(r["period"]), str(r["metric"]), int(r["window_start"]),  # type: ignore[arg-type]
                                          int(r["window_end"]), int(r["cost"]), at, r["payload"]))  # type: ignore[arg-type]
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
