"""The in-process ledger backend (offline `replay`, unit tests): the `.lua` scripts ported to Python.

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
from dpstream.workers.ledger.allocation import Snapshot
from dpstream.workers.ledger.base import (
    REGISTER_REFUSED,
    REGISTER_RETRY,
    ChargeTerms,
    Ledger,
    RawCharge,
    RawRegister,
    _breaker_for,
    parked_from_json,
)
from dpstream.workers.ledger.types import RATIO_TOKEN, ParkedRelease, PendingRelease, ReleaseRequest

_EMPTY: dict[str, str] = {}
"""A period block not opened yet (read only)."""

_ALWAYS = ("kind", "period", "spent", "ratio", "actor")
"""Audit fields every reserve entry carries; other empty fields are left out (as charge.lua does)."""


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


@dataclass
class _Period:
    """One period a reserve touches, as charge.lua's `load_period` reads it (the terms as stored
    strings, and as numbers, converted once as the script's `tonumber` does)."""

    pid: str
    pstart: int
    cap_s: str
    reserve_s: str
    warn_s: str
    acc: str
    dcap_s: str
    spent: int
    grant: int
    dspent: int
    opened: bool = False
    """The block exists (its terms are its own, not the config's)."""
    plen_s: str = ""
    """The block's period length (the registered one when the block does not record its own)."""
    cap: int = field(init=False)
    reserve: int = field(init=False)
    warn: int = field(init=False)
    dcap: int = field(init=False)

    def __post_init__(self) -> None:
        self.cap, self.reserve = int(self.cap_s), int(self.reserve_s)
        self.warn, self.dcap = int(self.warn_s), int(self.dcap_s)


def _payload(release: dict[str, str | bytes]) -> bytes:
    payload = release["payload"]
    assert isinstance(payload, bytes)  # the reserve step stores it as bytes
    return payload


def _state_of(p: _Period, x: int, is_open: bool) -> str:
    return "open" if is_open else ("warning" if x >= p.warn else "normal")


def _ratio_of(p: _Period, x: int) -> str:
    return "%.6f" % (x / p.cap)


class _ChargeScript:
    """One run of charge.lua's port (`MemoryLedger._charge_script`), step by step: what the script
    reads first (the periods the window touches, the breaker), then each of its stages as a method.
    Runs under the ledger's lock, like the script itself."""

    def __init__(
        self,
        ledger: MemoryLedger,
        s: _Scope,
        req: ReleaseRequest,
        cost: int,
        delta: int,
        pstart: int,
        now_ms: int,
        terms: ChargeTerms,
    ) -> None:
        self.ledger, self.s, self.req, self.now_ms, self.terms = ledger, s, req, now_ms, terms
        self.cfg = s.config
        self.cost, self.delta = cost, delta
        self.cost_s, self.delta_s = str(cost), str(delta)
        self.plen_s = str(terms.period_s)
        pid = req.period_id
        self.periods = [self.load_period(pid, pstart)] + [
            self.load_period(p_id, int(p_start)) for p_id, p_start in req.extra_periods
        ]
        self.main = self.periods[0]
        br = self.br = s.breaker
        self.manual = br.get("manual") == "1"
        self.auto_here = br.get("auto_period") == pid
        self.auto_touched = next((p for p in self.periods if br.get("auto_period") == p.pid), None)
        self.auto_stale = "auto_period" in br and self.auto_touched is None and int(br["auto_start"]) < pstart

    def load_period(self, p_id: str, p_start: int) -> _Period:
        """charge.lua's `load_period`: the block's terms, or the config's for a block not opened yet."""
        f, cfg = self.s.periods.get(p_id, {}), self.cfg
        return _Period(
            p_id,
            p_start,
            f.get("cap", cfg["cap"]),
            f.get("reserve", cfg["reserve"]),
            f.get("warn", cfg["warn"]),
            f.get("accounting", cfg.get("accounting", "")),
            f.get("delta_cap", cfg.get("delta_cap", "0")),
            int(f.get("spent", 0)),
            int(f.get("grant", 0)),
            int(f.get("delta_spent", 0)),
            "cap" in f,
            f.get("period_s", cfg.get("period_s", "")),
        )

    def answered_unwritten(self, expired: bool) -> RawCharge | None:
        """A known release id (its first payload), an expired window or a stale quote: answered
        before anything is written (None: none of these)."""
        main, req = self.main, self.req
        state = _state_of(main, main.spent, self.manual or self.auto_here)
        known = self.s.releases.get(req.release_id)
        if known is not None:
            return RawCharge("duplicate", _payload(known), "", main.spent, main.cap, state, 0)
        if expired:  # charge.lua's expired window: nothing written
            return RawCharge("expired", b"", "expired", main.spent, main.cap, state, 0)
        version = int(self.s.periods.get(req.period_id, {}).get("version", 0))
        if req.quoted_version is not None and version != req.quoted_version:  # charge.lua's stale quote
            reason = f"stale quote: the period's spend version is now {version}"
            return RawCharge("stale_quote", b"", reason, main.spent, main.cap, state, 0)
        return None

    def audit(self, p: _Period, kind: str, **fields: str) -> None:
        """An audit entry about period `p` (its spend and ratio as they are now); `fields` add or override."""
        base = {
            "kind": kind,
            "period": p.pid,
            "spent": str(p.spent),
            "ratio": _ratio_of(p, p.spent),
            "actor": self.req.actor,
        }
        base.update(fields)
        self.ledger._xadd(self.s, self.now_ms, base)

    def touch_period(self, p: _Period) -> dict[str, str]:
        """`p`'s block, opened with its terms (and audited) if it is not opened yet."""
        s = self.s
        block = s.periods.setdefault(p.pid, {})
        if p.pid not in s.period_index:
            s.period_index[p.pid] = p.pstart
            block.update(
                cap=p.cap_s,
                reserve=p.reserve_s,
                warn=p.warn_s,
                accounting=p.acc,
                delta_cap=p.dcap_s,
                start=str(p.pstart),
                period_s=self.plen_s,
            )
            state = _state_of(p, p.spent, self.manual)
            self.audit(p, "period", reason="period block opened", actor="ledger", state=state)
        return block

    def close_stale_automatic_open(self) -> None:
        """An automatic breaker open of an earlier period, which this window does not touch, ends."""
        if not self.auto_stale:
            return
        br, main = self.br, self.main
        old = br["auto_period"]
        for name in ("auto_period", "auto_start", "auto_reason", "auto_at"):
            br.pop(name, None)
        self.audit(
            main,
            "breaker_close",
            reason=f"period rollover: automatic open of {old} ends",
            actor="ledger",
            state=_state_of(main, main.spent, self.manual),
        )

    def refuse(self, p: _Period, reason: str, open_now: bool) -> RawCharge:
        """Refused in period `p`: its refusal counted and audited, and the automatic breaker opened
        when `open_now` (the cap itself ran out) and no breaker is open yet."""
        req, br, manual = self.req, self.br, self.manual
        block = self.touch_period(p)
        _incr(block, "refused", 1)
        is_open = manual or br.get("auto_period") == p.pid or open_now
        self.audit(
            p,
            "refusal",
            release_id=req.release_id,
            metric=req.metric,
            cost=self.cost_s,
            delta=self.delta_s,
            reason=reason,
            state=_state_of(p, p.spent, is_open),
        )
        if open_now and not (manual or self.auto_touched is not None):
            br.update(auto_period=p.pid, auto_start=str(p.pstart), auto_reason=reason, auto_at=str(self.now_ms))
            _incr(block, "version", 1)
            self.audit(p, "breaker_open", reason=reason, actor="ledger", state="open")
        return RawCharge("refused", b"", reason, p.spent, p.cap, _state_of(p, p.spent, is_open), 0)

    def where(self, p: _Period) -> str:
        return "" if p is self.main else f" (in later period {p.pid}, which this window also touches)"

    def conflict(self, p: _Period) -> tuple[_Period, str] | None:
        """charge.lua's `conflict`: the block whose fixed terms are not the caller's."""
        if p.opened:
            return self.terms_conflict(p)
        return self.overlap_conflict(p)

    def terms_conflict(self, p: _Period) -> tuple[_Period, str] | None:
        """An opened block: its accounting, cap and length against the caller's."""
        terms, plen_s = self.terms, self.plen_s
        if p.acc != terms.accounting:
            return p, f"accounting {p.acc}, this worker {terms.accounting}"
        if p.cap > terms.cap_units:
            return p, f"cap {p.cap_s} units, this worker {terms.cap_units} (smaller)"
        if p.plen_s != plen_s:
            return p, f"period {p.plen_s} s, this worker {plen_s} s"
        return None

    def overlap_conflict(self, p: _Period) -> tuple[_Period, str] | None:
        """A block not opened yet: it must not overlap a block of another length."""
        s = self.s
        end = p.pstart + self.terms.period_s
        inside = sorted((start, b) for b, start in s.period_index.items() if p.pstart <= start < end)
        found = inside[0] if inside else None
        if found is None:
            before = [(start, b) for b, start in s.period_index.items() if start < p.pstart]
            if before:
                start, b = max(before)
                if start + int(s.periods.get(b, {}).get("period_s", self.cfg.get("period_s", "0"))) > p.pstart:
                    found = (start, b)
        if found is not None and found[1] != p.pid:
            q = self.load_period(found[1], found[0])
            return q, f"period {q.plen_s} s, this worker {self.plen_s} s, whose period {p.pid} overlaps it"
        return None

    def refusal(self, digest: str) -> RawCharge | None:
        """The first reason to refuse, in charge.lua's order (None: the charge is granted): the
        topology digest, period terms, the breakers, then each period's cap, pool and selection δ."""
        cfg, main = self.cfg, self.main
        if digest != cfg.get("digest"):
            registered = cfg.get("digest", "?")
            return self.refuse(
                main,
                f"topology disagrees with the scope's registered terms (digest {registered}, "
                f"this worker {digest}): restart it with the current topology",
                False,
            )
        for p in self.periods:
            clash = self.conflict(p)
            if clash is not None:
                q, what = clash
                return self.refuse(
                    q,
                    f"period terms differ: block {q.pid} keeps {what}: a period keeps the terms it opened with; "
                    "release its windows under those terms, or use a new scope name",
                    False,
                )
        if self.manual:
            return self.refuse(main, "breaker open (manual): " + self.br.get("manual_reason", ""), False)
        auto = self.auto_touched
        if auto is not None:
            return self.refuse(
                auto, "breaker open (automatic): " + self.br.get("auto_reason", "") + self.where(auto), False
            )
        for p in self.periods:
            refused = self.budget_refusal(p)
            if refused is not None:
                return refused
        return None

    def budget_refusal(self, p: _Period) -> RawCharge | None:
        """Period `p` cannot take the cost: its cap (which opens the breaker), its pool outside the
        reserve, or its selection δ."""
        cost, delta = self.cost, self.delta
        if p.spent + cost > p.cap:
            return self.refuse(
                p,
                f"budget exhausted: cost {cost} exceeds the {p.cap - p.spent} units left of the cap" + self.where(p),
                True,
            )
        limit = p.cap - p.reserve + p.grant
        if self.req.may_use_reserve or limit > p.cap:
            limit = p.cap
        if p.spent + cost > limit:
            return self.refuse(
                p,
                f"pool exhausted: cost {cost} exceeds the {max(0, limit - p.spent)} units left outside the reserve "
                "(only may_use_reserve metrics or an operator grant draw on it)" + self.where(p),
                False,
            )
        if p.dspent + delta > p.dcap:
            return self.refuse(
                p,
                f"selection delta exhausted: delta {delta} exceeds the {max(0, p.dcap - p.dspent)} units (1e-18) "
                "left of the period's selection delta cap" + self.where(p),
                False,
            )
        return None

    def grant(self) -> RawCharge:
        """Charged in every period the window touches (blocks opened as needed), the release
        recorded as reserved, each period's charge (and state change) audited."""
        s, req, P, main = self.s, self.req, self.periods, self.main
        rid, cost_s, delta_s = req.release_id, self.cost_s, self.delta_s
        before = []
        blocks = []
        for p in P:
            before.append(_state_of(p, p.spent, False))
            blocks.append(self.touch_period(p))
        for p, block in zip(P, blocks, strict=True):
            p.spent = _incr(block, "spent", self.cost)
            _incr(block, "version", 1)
            p.dspent = _incr(block, "delta_spent", self.delta)
            _incr(block, "granted", 1)
            _zadd(s, (p.pid, req.metric), rid, int(req.window_end))
        ratio = _ratio_of(main, main.spent)
        payload = bytes(req.payload).replace(RATIO_TOKEN, b'"ratio_after":' + ratio.encode(), 1)
        s.releases[rid] = {
            "state": "reserved",
            "period": req.period_id,
            "metric": req.metric,
            "window_start": str(req.window_start),
            "window_end": str(req.window_end),
            "cost": cost_s,
            "delta": delta_s,
            "extra_periods": " ".join(p.pid for p in P[1:]),
            "payload": payload,
            "ratio_after": ratio,
            "reserved_at": str(self.now_ms),
        }
        s.pending[rid] = self.now_ms
        for p, was in zip(P, before, strict=True):
            after = _state_of(p, p.spent, False)
            self.audit(p, "charge", release_id=rid, metric=req.metric, cost=cost_s, delta=delta_s, state=after)
            if after != was:
                self.audit(
                    p, "state", reason=f"{was} -> {after} at ratio {_ratio_of(p, p.spent)}", actor="ledger", state=after
                )
        return RawCharge("granted", payload, "", main.spent, main.cap, _state_of(main, main.spent, False), self.cost)


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
        with self._lock:
            if not req.extra_periods and not expired:
                granted = self._grant_in_open_period(req, cost_units, delta_units, digest, now_ms, terms)
                if granted is not None:
                    return granted
            return self._charge_script(req, cost_units, delta_units, period_start, digest, now_ms, terms, expired)

    def _grant_in_open_period(
        self, req: ReleaseRequest, cost: int, delta: int, digest: str, now_ms: int, terms: ChargeTerms
    ) -> RawCharge | None:
        """The common charge, straight: a new release of one already opened period whose terms are
        the caller's, no breaker state at all, the quoted version current, the cost within cap, pool
        and selection δ. It writes exactly what `_charge_script` writes then; in any other case it
        writes nothing and answers None (the script's port decides)."""
        s = self._store.get(req.scope)
        if s is None:
            return None
        cfg, pid, rid, metric = s.config, req.period_id, req.release_id, req.metric
        block = s.periods.get(pid)
        if not cfg or s.breaker or block is None or pid not in s.period_index or digest != cfg.get("digest"):
            return None
        if not rid or not metric or rid in s.releases:
            return None
        version = int(block.get("version", 0))
        if req.quoted_version is not None and req.quoted_version != version:
            return None
        cap_s, reserve_s, warn_s, dcap_s = (
            block.get("cap"),
            block.get("reserve"),
            block.get("warn"),
            block.get("delta_cap"),
        )
        if cap_s is None or reserve_s is None or warn_s is None or dcap_s is None:
            return None  # an opened block holds its terms; the port reads the config's otherwise
        cap = int(cap_s)
        if (
            block.get("accounting", cfg.get("accounting", "")) != terms.accounting
            or cap > terms.cap_units
            or block.get("period_s", cfg.get("period_s", "")) != str(terms.period_s)
        ):
            return None  # the port refuses: the block's terms are not the caller's
        spent = int(block.get("spent", 0)) + cost
        limit = cap - int(reserve_s) + int(block.get("grant", 0))
        if req.may_use_reserve or limit > cap:
            limit = cap
        dspent = int(block.get("delta_spent", 0)) + delta
        if spent > cap or spent > limit or dspent > int(dcap_s):
            return None
        warn = int(warn_s)
        was = "warning" if spent - cost >= warn else "normal"
        after = "warning" if spent >= warn else "normal"
        spent_s, cost_s, delta_s = str(spent), str(cost), str(delta)
        block["spent"] = spent_s
        block["version"] = str(version + 1)
        block["delta_spent"] = str(dspent)
        block["granted"] = str(int(block.get("granted", 0)) + 1)
        key = (pid, metric)
        members, scores = s.ends.get(key), s.ends_sorted.get(key)
        if members is None or scores is None or rid in members:
            _zadd(s, key, rid, int(req.window_end))
        else:  # ZADD of a new member: `_zadd` without looking for a score to replace
            end = int(req.window_end)
            members[rid] = end
            if not scores or scores[-1] <= end:
                scores.append(end)  # = insort (bisect right), without the bisection: windows mostly close in order
            else:
                insort(scores, end)
        ratio = "%.6f" % (spent / cap)
        payload = bytes(req.payload).replace(RATIO_TOKEN, b'"ratio_after":' + ratio.encode(), 1)
        s.releases[rid] = {
            "state": "reserved",
            "period": pid,
            "metric": metric,
            "window_start": str(req.window_start),
            "window_end": str(req.window_end),
            "cost": cost_s,
            "delta": delta_s,
            "extra_periods": "",
            "payload": payload,
            "ratio_after": ratio,
            "reserved_at": str(now_ms),
        }
        s.pending[rid] = now_ms
        # every value is non-empty (checked above), so `_xadd`'s filter would keep them all
        ms, seq = self._last_id  # `_next_audit_id`, inline
        self._last_id = last = (now_ms, 0) if now_ms > ms else (ms, seq + 1)
        s.audit.append(
            (
                f"{last[0]}-{last[1]}",
                {
                    "kind": "charge",
                    "period": pid,
                    "spent": spent_s,
                    "ratio": ratio,
                    "actor": req.actor,
                    "release_id": rid,
                    "metric": metric,
                    "cost": cost_s,
                    "delta": delta_s,
                    "state": after,
                },
            )
        )
        if after != was:
            fields = {"kind": "state", "period": pid, "spent": spent_s, "ratio": ratio, "actor": "ledger"}
            fields.update(reason=f"{was} -> {after} at ratio {ratio}", state=after)
            self._xadd(s, now_ms, fields)
        return RawCharge("granted", payload, "", spent, cap, after, cost)

    def _charge_script(
        self,
        req: ReleaseRequest,
        cost: int,
        delta: int,
        pstart: int,
        digest: str,
        now_ms: int,
        terms: ChargeTerms,
        expired: bool,
    ) -> RawCharge:
        """charge.lua, ported: every case (duplicates, expired windows, stale quotes, period terms,
        breakers, refusals, period blocks opened, windows straddling periods), in `_ChargeScript`'s steps."""
        s = self._scope(req.scope)
        if not s.config:
            raise InternalError(f"reserve: scope not registered ({req.scope})")
        script = _ChargeScript(self, s, req, cost, delta, pstart, now_ms, terms)
        answer = script.answered_unwritten(expired)
        if answer is not None:
            return answer
        script.close_stale_automatic_open()
        refusal = script.refusal(digest)
        if refusal is not None:
            return refusal
        return script.grant()

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

    async def _quote_snapshot(self, scope: str, pid: str, metrics: Sequence[str], window_end: int) -> Snapshot | None:
        """`_snapshot` as `quote` reads it, from the stored fields themselves (no copies)."""
        with self._lock:
            s = self._store.get(scope) or self._scope(scope)
            cfg = s.config
            if not cfg:
                return None
            period = s.periods.get(pid) or _EMPTY
            br = s.breaker
            ends = s.ends_sorted
            counts = {}
            for m in metrics:  # ZCOUNT ends(pid, m) window_end +inf
                scores = ends.get((pid, m))
                if not scores or scores[-1] < window_end:
                    counts[m] = 0  # windows mostly close in order: none charged ends this late
                else:
                    counts[m] = len(scores) - bisect_left(scores, window_end)
            return Snapshot(
                int(period.get("cap", cfg["cap"])),
                int(period.get("reserve", cfg["reserve"])),
                int(period.get("warn", cfg["warn"])),
                int(period.get("spent", 0)),
                int(period.get("grant", 0)),
                _breaker_for(br, pid) if br else None,
                counts,
                int(period.get("version", 0)),
            )

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
