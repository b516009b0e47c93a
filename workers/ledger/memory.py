"""The in-process ledger backend (offline `replay`, unit tests): the scripts' writes on dicts.

A charge reads a `decision.View` of the scope's dicts, `decide`s and applies the `Decision`;
the other steps (`steps`) and every read (`Ledger._read`) run on the scope's `ScopeState` itself.

Same contract as the Redis backend, checked by one contract test suite. Each step runs without
awaiting, under a lock, so it is atomic for every task and thread of the process. Nothing is
durable and release records never expire.
"""

from __future__ import annotations

__all__ = ["MemoryLedger"]

import math
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from dpstream.topology.errors import InternalError
from dpstream.workers.ledger.base import Ledger, RawCharge
from dpstream.workers.ledger.decision import Charge, View, decide, writes
from dpstream.workers.ledger.keys import LEDGER_ID_KEY
from dpstream.workers.ledger.state import Op, ScopeState, apply_ops, zcount_from
from dpstream.workers.ledger.types import StoredCharge

_A = TypeVar("_A")


def _payload(release: dict[str, Any]) -> bytes:
    payload = release["payload"]
    assert isinstance(payload, bytes)  # the charge step stores it as bytes
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
        self._store: dict[str, ScopeState] = {}
        self._deploy: dict[str, str] = {}
        self._last_id = (0, -1)

    def _scope(self, scope: str) -> ScopeState:
        s = self._store.get(scope)
        if s is None:
            s = self._store[scope] = ScopeState()
        return s

    def _next_audit_id(self, now_ms: int) -> str:
        """XADD's id `*`: `ms-seq`, strictly increasing even when the clock stands still or steps back."""
        ms, seq = self._last_id
        self._last_id = last = (now_ms, 0) if now_ms > ms else (ms, seq + 1)
        return f"{last[0]}-{last[1]}"

    # ---- the scripts -------------------------------------------------------------------------

    async def _set_nx(self, key: str, proposed: str) -> str | None:
        if key == LEDGER_ID_KEY:
            return None  # the in-process ledger binds no id: its records are charged to no ledger
        with self._lock:
            return self._deploy.setdefault(key, proposed)

    async def _charge(self, charge: Charge) -> RawCharge:
        req = charge.req
        with self._lock:  # read the view, decide, apply: no await in between
            s = self._store.get(req.scope)
            if s is None or not s.config:
                raise InternalError(f"charge: scope not registered ({req.scope})")
            known = s.releases.get(req.release_id)
            view = View(s.config, s.breaker, s.periods, s.period_index, None if known is None else _payload(known))
            decision = decide(view, charge)
            apply_ops(s, writes(charge, decision, self._retention_s), lambda: self._next_audit_id(charge.now_ms))
            return decision.answer

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

    async def _step(
        self,
        scope: str,
        pids: Sequence[str],
        decide: Callable[[ScopeState], tuple[_A, Sequence[Op]]],
        *,
        parked: bool = False,
    ) -> _A:
        with self._lock:
            s = self._scope(scope)
            answer, ops = decide(s)
            now_ms = self._now_ms()
            apply_ops(s, ops, lambda: self._next_audit_id(now_ms))
            return answer

    # ---- reads -----------------------------------------------------------------------------------

    async def _snapshot(
        self, scope: str, pid: str, metrics: Sequence[str], window_end: int
    ) -> tuple[dict[str, str], dict[str, str], dict[str, str], dict[str, int], dict[str, int], dict[str, int]]:
        with self._lock:
            s = self._scope(scope)
            counts = {m: zcount_from(s, (pid, m), window_end) for m in metrics}
            before = {m: len(s.ends_sorted.get((pid, m), ())) - counts[m] for m in metrics}
            at = {m: counts[m] - zcount_from(s, (pid, m), window_end + 1) for m in metrics}
            return dict(s.config), dict(s.breaker), dict(s.periods.get(pid, {})), counts, before, at

    async def _charged_ends(
        self, scope: str, pid: str, metrics: Sequence[str], since: int | None
    ) -> tuple[int, dict[str, dict[str, int]]]:
        low = -math.inf if since is None else since
        with self._lock:
            s = self._scope(scope)
            version = int(s.periods.get(pid, {}).get("version", 0))
            return version, {m: {r: e for r, e in s.ends.get((pid, m), {}).items() if e >= low} for m in metrics}

    async def _stored_charges(self, scope: str, release_ids: Sequence[str]) -> dict[str, StoredCharge]:
        with self._lock:
            s = self._store.get(scope) or self._scope(scope)
            found = {rid: s.releases.get(rid) for rid in release_ids}
            return {rid: StoredCharge(bytes(_payload(r)), int(r["cost"])) for rid, r in found.items() if r is not None}

    async def _scopes(self) -> list[str]:
        with self._lock:
            return sorted(name for name, s in self._store.items() if s.config)
